"""Every fact an operation asks on a converged host is declared by its own module.

``operations/run/survey.py`` answers a no-op run's facts in one command per host from what each
operations module declares beside its asks (``survey_parts(spec)``). A fact an operation asks
that its module does not declare is still answered right, only by a command of its own: one
more command per host on every no-op run, which nothing else notices short of a lab run. Here
every operation of every module (and every helper the deploys call that asks facts) runs with
the op harness on the facts of a converged host, as the deploys call it, and each fact it
asks must be among its module's ``survey_parts``.

A converged host: every fact answers what the operation wants. Contents the operations compare
by a sum or a text (a rendered file's sha1, a marker, the apt source list) answer with
:class:`Same`, a text equal to any text; each run must then change nothing (checked: a case
that yields commands is not a converged host and fails the test).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.facts.server import Groups, Users

from p40fleet import apex_build, hashlock, preflight, verl_patches
from p40fleet.facts.artifacts import ArtifactFile, ArtifactState, UnsafeParent
from p40fleet.facts.conda import (
    CONDA_HEALTHY,
    TOS_PLUGIN,
    CondaInstall,
    CondaState,
    CondaTos,
    CondaTosState,
)
from p40fleet.facts.cuda import CudaInstall, CudaToolkit, NvccRelease
from p40fleet.facts.cudnn import (
    CudnnExtracted,
    CudnnFile,
    CudnnFiles,
    CudnnHeaderVersion,
    PathDevice,
)
from p40fleet.facts.driver import SMI_OK, InstalledDriverVersion, NvidiaSmi, SmiGpu, SmiResult
from p40fleet.facts.env import (
    ENV_OK,
    Dist,
    EnvDistributions,
    EnvPython,
    EnvPythonState,
    MarkerText,
    env_dir,
    env_python,
)
from p40fleet.facts.gpu import PciGpu, PciGpus
from p40fleet.facts.home import UserFile, UserFileState
from p40fleet.facts.host import KernelHeaders, KernelInfo
from p40fleet.facts.mirror import AptSources, AptSourceState
from p40fleet.facts.nouveau import FileStamp, FileStampFact, InitramfsMtime, NouveauLoaded
from p40fleet.facts.packages import DebInstalled
from p40fleet.facts.run_lock import RunLock, RunLockState
from p40fleet.facts.survey import key, part
from p40fleet.facts.training import ModelConfig, StagedDir, StagedDirState
from p40fleet.facts.verl import GitCheckout, GitState, VerlPatchCheck
from p40fleet.gpu_catalog import lookup
from p40fleet.operations import (
    apex,
    artifacts,
    conda,
    cuda,
    cudnn,
    driver,
    mirror,
    nouveau,
    proxy,
    run_lock,
    torch,
    training,
    training_user,
    verl,
)
from p40fleet.operations.run import survey
from p40fleet.privdrop import STAGE_DIR
from p40fleet.proxy import PROXY_FILE
from p40fleet.run_lock import DEFAULT_PATH
from p40fleet.spec import ARTIFACTS, Mirror, StackSpec, cuda_release_of, load_spec
from p40fleet.training import staged_dir
from tests.opharness import OpResult, at, run_op
from tests.test_homesafe import _operations
from tests.test_training import CONFIG, DATA_FILES, MODEL_FILES
from tests.test_training import STACK as TRAINING_STACK

REPO = Path(__file__).resolve().parent.parent
FILES = REPO / "files"
P40 = 0x1B38

#: Operations no converged run of the surveyed deploys asks anything through.
NOT_SURVEYED = {
    "refuse.refuse": "stops the host: never part of a converged run",
    "ray.ray_member": "deploy/ray.py: its facts are asked live (not in the survey)",
    "ray.ray_left_out": "deploy/ray.py: its facts are asked live (not in the survey)",
    **{
        f"uninstall.{name}": "deploy/uninstall.py: changes a converged host (asked live)"
        for name in (
            "account_removed",
            "apt_aside_restored",
            "apt_mirror_removed",
            "cuda_link_removed",
            "driver_removed",
            "home_removed",
            "nouveau_restored",
            "path_removed",
            "ray_unit_removed",
        )
    },  # fmt: skip
}


class Same(str):
    """A text equal to any text: what an operation compares a host's content with (a sum, a
    marker, a rendered file) is what it wants, as on a converged host."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__

    def strip(self, chars: str | None = None) -> Same:  # noqa: ARG002 - str's signature
        return self

    rstrip = lstrip = lower = strip


SAME = Same(" ".join(conda.TOS_CHANNELS))  # the ToS marker splits it into its channels


def _key_file() -> str:
    """The apt mirror's key on the controller (the spec wants an existing file)."""
    fd, path = tempfile.mkstemp(prefix="p40fleet-survey-parts-", suffix=".gpg")
    os.write(fd, b"key")
    os.close(fd)
    atexit.register(os.unlink, path)
    return path


KEY_FILE = _key_file()

SPECS = {
    # no mirror, no proxy, conda's ToS accepted (the ToS facts asked), no training archives
    "upstream": load_spec("lab1", {"policy": {"conda_tos": "accept"}}),
    # a mirror for everything (apt signed by a key), a proxy with a password, training archives
    "mirror": load_spec("lab1", {
        **TRAINING_STACK,
        "mirror": {
            "artifacts_url": "http://10.231.0.1:8111/artifacts",
            "conda_channel": "https://10.231.0.1:8443/conda",
            "apt": {"url": "http://10.231.0.1:8111/ubuntu", "suite": "focal",
                    "components": ["main"], "extra_suites": ["focal-updates"],
                    "signed_by": KEY_FILE},
        },
        "proxy": {"http": "http://bob:pw@proxy.lab:3128"},
    }),
}  # fmt: skip


def _gpus() -> list[PciGpu]:
    return [
        PciGpu(f"0000:0{i}:00.0", 0x10DE, P40, 0x030200, 0x10DE, 0x11D9, lookup(P40))
        for i in range(4)
    ]


def converged(spec: StackSpec) -> dict:
    """The facts of a host where every step of ``spec`` is done (op harness keys)."""
    user, env, paths = spec.user, spec.env, spec.paths
    sums = {artifacts.artifact_path(spec, item): spec.artifact(item).sha256 for item in ARTIFACTS}
    release = cuda_release_of(spec.cuda.version)
    linked = CudnnFile(device=2049, inode=7, symlink=False)
    smi = SmiResult(SMI_OK, tuple(
        SmiGpu(i, "Tesla P40", f"0000:0{i}:00.0", P40, (6, 1), 23040, spec.driver.version)
        for i in range(4)
    ))  # fmt: skip
    dists = {
        "torch": Dist(spec.torch.version),
        **({"torchvision": Dist(spec.torch.torchvision)} if spec.torch.torchvision else {}),
        **({"torchaudio": Dist(spec.torch.torchaudio)} if spec.torch.torchaudio else {}),
        "apex": Dist("0.1"),
        "verl": Dist(spec.verl.version, editable=env.verl_checkout),
    }
    # the torch lock's build tools (ninja, for the Apex build) are in a converged env too
    locked = hashlock.pinned(preflight.torch_lock_path(spec).read_text())
    dists |= {name: Dist(locked[name]) for name in torch.BUILD_TOOLS}
    staged = {}
    for which, files in (("model", MODEL_FILES), ("data", DATA_FILES)):
        archive = getattr(spec.training, which).archive
        marker = archive.sha256.lower() if archive else None
        staged[at(StagedDir, path=staged_dir(spec, which), user=user.name)] = StagedDirState(
            exists=True, marker=marker, files=files
        )
    mine = {"user": user.name, "group": user.name, "mode": 750}
    return {
        PciGpus: _gpus(),
        ArtifactState: lambda path: ArtifactFile(
            size=1, mtime=1, marker_size=1, marker_mtime=1, marker_sha256=sums[path].lower()
        ),
        CudaToolkit: CudaInstall(True, f"{release}.20220929", True),
        Link: {"link_target": paths.cuda_dir, "user": "root", "group": "root"},
        File: {"user": "root", "group": "root", "mode": SAME},
        at(File, path=PROXY_FILE): (
            {"user": "root", "group": "root", "mode": 600}
            if spec.proxy is not None and spec.proxy.has_secret
            else None
        ),
        Sha1File: SAME,
        NvccRelease: f"{release}.89",
        PathDevice: 2049,
        UnsafeParent: None,
        CudnnHeaderVersion: ".".join(spec.cudnn.version.split(".")[:3]),
        CudnnExtracted: (spec.cudnn.sha256 or "0" * 64).lower(),
        CudnnFiles: {
            "src": {"include/cudnn.h": linked, "lib/libcudnn.so.8": linked},
            "dst": {"include/cudnn.h": linked, "lib64/libcudnn.so.8": linked},
        },
        FileStampFact: FileStamp(mtime=100, text=nouveau.BLACKLIST_TEXT),
        InitramfsMtime: 200,
        NouveauLoaded: False,
        KernelHeaders: KernelInfo("5.4.0-150-generic", "/usr/src/linux-headers", True),
        DebInstalled: {name: "1" for name in driver.BUILD_PACKAGES},
        InstalledDriverVersion: spec.driver.version,
        NvidiaSmi: smi,
        AptSources: AptSourceState(mirror_list=SAME, key_sha256=SAME),
        Users: {user.name: {"uid": user.uid, "home": user.home, "shell": "/bin/bash",
                            "group": user.name}},
        Groups: [user.name],
        Directory: mine,
        CondaInstall: CondaState(CONDA_HEALTHY, "24.11.1"),
        CondaTos: CondaTosState(TOS_PLUGIN),
        MarkerText: SAME,
        EnvPython: EnvPythonState(ENV_OK, spec.python_version),
        EnvDistributions: dists,
        GitCheckout: GitState(True, True, spec.verl.commit, spec.git_remote("verl")),
        UserFile: UserFileState("file", mode=SAME, owner=user.name, sha1=SAME),
        VerlPatchCheck: str(verl.PATCH_EXIT["no-change"]),
        **staged,
        ModelConfig: CONFIG,
        RunLock: RunLockState(False, "", "boot-1"),
    }  # fmt: skip


def _call(helper: Callable[..., Any], **kwargs: Any):
    """A helper the deploys call (no operation): run by the harness like one."""

    def run():
        helper(**kwargs)
        return
        yield  # pragma: no cover - a generator that yields nothing

    return run


def cases(spec: StackSpec) -> dict[str, list[tuple[Callable[..., Any], dict]]]:
    """Per operation (``module.name``): how the deploys call it for ``spec`` (the helpers that
    ask facts too, named ``module.helper()``)."""
    user, env, paths = spec.user, spec.env, spec.paths
    by_user = {"user": user.name}
    python = env_python(env.conda_prefix, env.name)
    the_env = env_dir(env.conda_prefix, env.name)
    cache = f"{user.home}/.cache/p40fleet"
    variant = spec.requirements_variant
    mirror_channel = spec.mirror.conda_channel if spec.mirror is not None else None
    apt = spec.mirror.apt if spec.mirror is not None else None
    build = spec.apex_build(_gpus())
    host_tar = f"{apex_build.host_work_dir(user.home, build.key)}/{apex_build.WHEEL_TAR}"
    local_tar = apex_build.controller_wheel(build.key)
    wheel_sum = apex_build.host_sum(paths.artifact_cache, build.key)
    cudnn_tar = artifacts.artifact_path(spec, "cudnn")

    def make_plan(config):
        return training.host_plan(spec, model_config=config, cluster=None)

    driver_art = spec.artifact("driver")
    push_mirror = (spec.mirror or Mirror()).model_copy(update={"push_from_controller": True})
    pushed = spec.model_copy(update={"mirror": push_mirror})
    return {
        "proxy.credentials": [(proxy.credentials, {"proxy": spec.proxy})],
        "run_lock.take": [(run_lock.take, {"path": DEFAULT_PATH})],
        # deploy/system.py
        "driver.supported_gpus": [(driver.supported_gpus, {"version": spec.driver.version})],
        "cudnn.same_filesystem": [(cudnn.same_filesystem, {
            "extract_dir": paths.cudnn_extract_dir, "cuda_dir": paths.cuda_dir})],
        "artifacts.artifact": [(artifacts.artifact, {"item": item, "spec": spec})
                               for item in ARTIFACTS],
        "artifacts.fetch": [(artifacts.fetch, {
            "url": spec.artifact_url("driver"), "sha256": driver_art.sha256,
            "dest_dir": paths.artifact_cache, "filename": driver_art.filename,
            "size": driver_art.size, "proxy": spec.proxy})],
        # stack.mirror.push_from_controller: the same fact, no other
        "artifacts.push": [(artifacts.push, {
            "url": spec.artifact_url("driver"), "sha256": driver_art.sha256,
            "dest_dir": paths.artifact_cache, "filename": driver_art.filename,
            "size": driver_art.size})] + [(artifacts.artifact, {"item": item, "spec": pushed})
                                          for item in ARTIFACTS],
        "mirror.mirror": [(mirror.mirror, {
            "url": apt.url, "suite": apt.suite, "components": list(apt.components),
            "key_file": apt.signed_by, "trusted": apt.trusted,
            "air_gapped": spec.mirror.air_gapped, "extra_suites": list(apt.extra_suites),
            "proxy": spec.proxy, "lock_wait_s": spec.policy.dpkg_lock_wait_s})]
        if apt is not None else [],
        "nouveau.blacklist": [(nouveau.blacklist, {})],
        "nouveau.initramfs": [(nouveau.initramfs, {})],
        "nouveau.unloaded": [(nouveau.unloaded, {"allow_reboot": spec.policy.allow_reboot})],
        "driver.build_prereqs": [(driver.build_prereqs, {
            "lock_wait_s": spec.policy.dpkg_lock_wait_s, "proxy": spec.proxy})],
        "driver.install": [(driver.install, {
            "runfile": artifacts.artifact_path(spec, "driver"), "version": spec.driver.version})],
        "driver.loaded": [(driver.loaded, {
            "version": spec.driver.version, "allow_reboot": spec.policy.allow_reboot})],
        "driver.verify": [(driver.verify, {"version": spec.driver.version})],
        "cuda.toolkit": [(cuda.toolkit, {
            "runfile": artifacts.artifact_path(spec, "cuda"), "version": spec.cuda.version,
            "cuda_dir": paths.cuda_dir, "tmpdir": paths.artifact_cache,
            "tmp_bytes": spec.cuda.tmp_bytes(), "max_gcc": spec.max_gcc})],
        "cuda.symlink": [(cuda.symlink, {"cuda_dir": paths.cuda_dir,
                                         "cuda_link": paths.cuda_link})],
        "cuda.profile": [(cuda.profile, {"cuda_home": paths.cuda_dir,
                                         "version": spec.cuda.version})],
        "cuda.verify": [(cuda.verify, {"cuda_dir": paths.cuda_dir, "version": spec.cuda.version})],
        "cudnn.extract": [(cudnn.extract, {
            "archive": cudnn_tar, "extract_dir": paths.cudnn_extract_dir,
            "version": spec.cudnn.version, "sha256": spec.cudnn.sha256})],
        "cudnn.link": [(cudnn.link, {
            "src_dir": cudnn.extracted_dir(paths.cudnn_extract_dir, cudnn_tar),
            "cuda_dir": paths.cuda_dir})],
        "cudnn.verify": [(cudnn.verify, {"cuda_dir": paths.cuda_dir,
                                         "version": spec.cudnn.version})],
        # deploy/python.py
        "conda.env_fresh()": [(_call(conda.env_fresh, prefix=env.conda_prefix, name=env.name,
                                     python_version=spec.python_version, user=user.name,
                                     lock_sum=preflight.conda_lock_sum(spec)), {})],
        "apex.needed()": [(_call(apex.needed, python=python, env_dir=the_env, key=build.key,
                                 user=user.name), {})],
        "verl.checkout_moves()": [(_call(verl.checkout_moves, path=env.verl_checkout,
                                         commit=spec.verl.commit, user=user.name), {})],
        "training_user.training_user": [(training_user.training_user, {
            "user": user.name, "uid": user.uid, "home": user.home})],
        "training_user.directory": [(training_user.directory, {
            "path": path, "user": user.name, "group": user.name, "mode": "750"})
            for path in (env.data_dir, env.model_dir)],
        "conda.miniconda": [(conda.miniconda, {
            "installer": artifacts.artifact_path(spec, "miniconda"),
            "prefix": env.conda_prefix, **by_user})],
        "conda.condarc": [(conda.condarc, {"prefix": env.conda_prefix,
                                           "channel": mirror_channel, **by_user})]
        if mirror_channel else [],
        "conda.conda_tos": [(conda.conda_tos, {
            "prefix": env.conda_prefix, "policy": spec.policy.conda_tos,
            "mirror_channel": mirror_channel, "proxy": spec.proxy, **by_user})],
        "conda.env": [(conda.env, {
            "prefix": env.conda_prefix, "env_name": env.name,
            "python_version": spec.python_version,
            "lock": str(preflight.conda_lock_path(spec)),
            "lock_dest": f"{paths.artifact_cache}/conda-env-{variant}.txt",
            "lock_channel": mirror_channel, "proxy": spec.proxy, **by_user})],
        "torch.torch": [(torch.torch, {
            "python": python, "version": spec.torch.version,
            "torchvision": spec.torch.torchvision, "torchaudio": spec.torch.torchaudio,
            "lock": str(preflight.torch_lock_path(spec)),
            "lock_dest": f"{paths.artifact_cache}/torch-requirements-{variant}.txt",
            "proxy": spec.proxy, **by_user})],
        "apex.build_wheel": [(apex.build_wheel, {
            "python": python, "env_dir": the_env, "remote": spec.git_remote("apex"),
            "ref": spec.apex.ref, "commit": spec.apex.commit, "key": build.key,
            "cuda_home": paths.cuda_dir, "arch_list": build.arch_list, "max_jobs": 2,
            "cuda_ext": build.cuda_ext, "needed": False, "user": user.name})],
        "apex.fetch_wheel": [(apex.fetch_wheel, {
            "remote_tar": apex_build.built_tar(STAGE_DIR, build.key), "local_tar": local_tar,
            "needed": False})],
        "apex.put_wheel": [(apex.put_wheel, {"local_tar": local_tar, "remote_tar": host_tar,
                                             "user": user.name, "needed": False})],
        "apex.put_sum": [(apex.put_sum, {"local_tar": local_tar, "remote_sum": wheel_sum,
                                         "needed": False})],
        "apex.install": [(apex.install, {
            "python": python, "wheel_tar": host_tar, "key": build.key, "env_dir": the_env,
            "verify": build.verify_code, "sha256_file": wheel_sum, **by_user})],
        "verl.checkout": [(verl.checkout, {
            "path": env.verl_checkout, "remote": spec.git_remote("verl"), "ref": spec.verl.ref,
            "commit": spec.verl.commit, "proxy": spec.proxy, **by_user})],
        "verl.patch": [(verl.patch, {
            "python": python, "checkout": env.verl_checkout,
            "script_src": str(FILES / "verl_patches.py"),
            "rules_json": verl_patches.ruleset_json(spec.verl.ref, "pascal"),
            "work_dir": f"{cache}/verl-patch", **by_user})],
        "verl.requirements": [(verl.requirements, {
            "python": python, "src": str(preflight.verl_requirements_path(spec)),
            "dest": f"{cache}/verl-requirements-{variant}.txt", "env_dir": the_env,
            "proxy": spec.proxy, **by_user})],
        "verl.install": [(verl.install, {"python": python, "checkout": env.verl_checkout,
                                         "version": spec.verl.version, **by_user})],
        # deploy/training.py (run alone: the user is not queued by this run)
        "training.stage": [(training.stage, {"which": which, "spec": spec})
                           for which in ("model", "data")],
        "training.needs_staging()": [(_call(training.needs_staging, spec=spec, which=which), {})
                                     for which in ("model", "data")],
        "training.launch_script": [(training.launch_script, {
            "spec": spec, "make_plan": make_plan, "user_queued": queued})
            for queued in (False, True)],
    }  # fmt: skip


def declared(module: str, spec: StackSpec) -> set:
    """The survey keys ``operations.<module>`` declares for ``spec``."""
    mod = importlib.import_module(f"p40fleet.operations.{module}")
    if mod is run_lock:
        return set(run_lock.survey_parts(spec, DEFAULT_PATH))
    return set(mod.survey_parts(spec))


def undeclared(name: str, spec: StackSpec, result: OpResult) -> list[str]:
    """What ``result`` (a run of ``name``) asked that its module does not declare."""
    module = name.split(".")[0]
    parts = declared(module, spec)
    missing = []
    for asked in result.asked:
        if key(asked.cls, dict(asked.kwargs)) not in parts:
            missing.append(
                f"operations.{module}: {name} asks {asked} on a converged host; "
                f"operations/{module}.py's survey_parts does not declare it (a no-op run "
                "asks it in a command of its own: add it there)"
            )
    return missing


@pytest.mark.parametrize("which", sorted(SPECS))
def test_every_fact_an_operation_asks_on_a_converged_host_is_its_modules(which):
    spec = SPECS[which]
    facts = converged(spec)
    problems, changed = [], []
    for name, calls in cases(spec).items():
        for op, kwargs in calls:
            result = run_op(op, facts=facts, **kwargs)
            if result.changed:
                changed.append(f"{name}: {result.commands} {result.failures}")
            problems += undeclared(name, spec, result)
    assert not changed, "not a converged host for these (fix converged()):\n" + "\n".join(changed)
    assert not problems, "\n".join(dict.fromkeys(problems))


def test_every_operation_is_run_or_named_outside_the_survey():
    """A new operation must be run above (or say why a converged run never asks through it)."""
    ops = {name for spec in SPECS.values() for name, calls in cases(spec).items() if calls}
    ops = {name for name in ops if not name.endswith("()")}
    assert _operations() == ops | set(NOT_SURVEYED), (
        sorted(_operations() - ops - set(NOT_SURVEYED)),
        sorted((ops | set(NOT_SURVEYED)) - _operations()),
    )
    assert not ops & set(NOT_SURVEYED)


def test_every_module_that_declares_parts_is_in_the_survey():
    """survey_parts of a module left out of operations.run.survey.MODULES would be asked by no
    survey; every module of MODULES declares them, and the survey is their concatenation."""
    declaring = set()
    for path in sorted((REPO / "operations").glob("*.py")):
        module = importlib.import_module(f"p40fleet.operations.{path.stem}")
        if callable(getattr(module, "survey_parts", None)):
            declaring.add(module)
    assert declaring == {*survey.MODULES, run_lock}
    lock = "/var/lib/p40fleet-test/lock"
    for spec in SPECS.values():
        parts = survey.layer_parts(spec, lock)
        built = [*survey.deploy_parts(spec), *run_lock.survey_parts(spec, lock)]
        for module in survey.MODULES:
            built += module.survey_parts(spec)
        assert parts == tuple(dict.fromkeys(built))  # the declarations, nothing kept by hand
        assert part(RunLock, path=lock) in parts


def test_the_check_names_module_operation_and_fact():
    """The check itself: a fact outside the module's parts is reported with all three."""
    spec = SPECS["upstream"]
    result = OpResult(asked=[at(NvccRelease, cuda_dir="/opt/elsewhere")])
    (problem,) = undeclared("cuda.verify", spec, result)
    assert "operations.cuda" in problem and "cuda.verify" in problem
    assert "NvccRelease(cuda_dir='/opt/elsewhere')" in problem
    declared_one = at(NvccRelease, cuda_dir=spec.paths.cuda_dir)
    assert undeclared("cuda.verify", spec, OpResult(asked=[declared_one])) == []


def test_the_deploy_files_own_asks_are_in_the_survey():
    """deploy/preflight.py and deploy/python.py ask some facts themselves (outside any
    operation): each fact class they ask (but UrlHead, asked only for an artifact not in the
    cache) is among survey.deploy_parts."""
    import ast

    asked = set()
    for name in ("preflight", "system", "python", "training"):
        tree = ast.parse((REPO / "p40fleet" / "deploys" / "steps" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "ask"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Name)
            ):
                asked.add(node.args[1].id)
    assert asked >= {"PciGpus", "ArtifactState", "LinuxDistribution", "Cpus", "MemTotal"}
    in_parts = {cls.__name__ for spec in SPECS.values() for cls, _ in survey.deploy_parts(spec)}
    assert asked - {"UrlHead"} <= in_parts, sorted(asked - {"UrlHead"} - in_parts)


def test_same_answers_any_comparison_of_contents():
    assert SAME == "0" * 40 and not (SAME != hashlib.sha1(b"x").hexdigest())
    assert SAME.strip() is SAME and set(SAME.split()) == set(conda.TOS_CHANNELS)
