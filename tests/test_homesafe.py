"""Root never acts inside the training user's home (security review N1, N2, N3, S3): every
operation walked with the op harness, facts in, commands out, and the copy-in run for real.

The rule: a command that names a path under ``user.home`` runs as the training user (inside
``su -s /bin/sh USER -c '...'``), no upload's destination and no download's source is under it.
"""

from __future__ import annotations

import importlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from pyinfra.api import FileDownloadCommand, FileUploadCommand, StringCommand
from pyinfra.facts.files import Directory, File
from pyinfra.facts.server import Users

from p40fleet import apex_build, verl_patches
from p40fleet.facts.artifacts import ArtifactFile, ArtifactState
from p40fleet.facts.footprint import PathKinds
from p40fleet.facts.home import UserFile, UserFileState
from p40fleet.facts.host import FreeSpace, FreeSpaceInfo
from p40fleet.facts.training import StagedDir, StagedDirState
from p40fleet.launch import plan_launch
from p40fleet.operations import training, training_user
from p40fleet.operations.util import as_user
from p40fleet.privdrop import STAGE_DIR, copy_in_script
from p40fleet.spec import load_spec
from p40lab import training_data
from tests.opharness import OpResult, at, run_op
from tests.test_training import STACK

REPO = Path(__file__).resolve().parent.parent
SPEC = load_spec("lab1", STACK)  # with model and data archives: staging has work to do
USER, HOME = SPEC.user.name, SPEC.user.home
UNDER = HOME.rstrip("/") + "/"
ENV = SPEC.env
PY = f"{ENV.conda_prefix}/envs/{ENV.name}/bin/python"
CACHE = f"{HOME}/.cache/p40fleet"
KEY = "k" * 16
WORK = apex_build.host_work_dir(HOME, KEY)
P40 = 0x1B38
REQS = str(REPO / "files" / "verl-requirements-lab.txt")

#: ``su -s /bin/sh USER -c 'ARG'`` with ARG as shlex.quote writes it ('...'"'"'...').
_SU_ARG = re.compile(rf"su -s /bin/sh {USER} -c '[^']*'(?:\"'\"'[^']*')*")

#: Operations that never take a path under the home: what they act on, and why it is root's.
ROOT_ONLY = {
    "apex.put_sum": "the controller's sum, into the root-owned artifact cache",
    "mirror.mirror": "/etc/apt",
    "artifacts.fetch": "the root-owned artifact cache",
    "artifacts.artifact": "the root-owned artifact cache",
    "artifacts.push": "the root-owned artifact cache (its 0700 staging dir)",
    "cuda.toolkit": "the CUDA dir",
    "cuda.symlink": "/usr/local/cuda",
    "cuda.profile": "/etc/profile.d",
    "cuda.verify": "the CUDA dir",
    "cudnn.same_filesystem": "cudnn_extract_dir and the CUDA dir",
    "cudnn.extract": "cudnn_extract_dir",
    "cudnn.link": "the CUDA dir",
    "cudnn.verify": "the CUDA dir",
    "driver.supported_gpus": "sysfs",
    "driver.build_prereqs": "apt",
    "driver.install": "the kernel module",
    "driver.loaded": "the kernel module",
    "driver.verify": "nvidia-smi",
    "nouveau.blacklist": "/etc/modprobe.d",
    "nouveau.initramfs": "/boot",
    "nouveau.unloaded": "the kernel module",
    "proxy.credentials": "/etc/p40fleet (root-only proxy credentials)",
    "ray.ray_member": "the unit and the root-only token in /etc (the member runs as the user)",
    "ray.ray_left_out": "the systemd unit and the token in /etc (stopped and removed)",
    "refuse.refuse": "nothing: it stops the host",
    "run_lock.take": "/var/lib/p40fleet",
    "uninstall.account_removed": "the Apex build account (its home is under /var/lib)",
    "uninstall.apt_aside_restored": "/etc/apt",
    "uninstall.apt_mirror_removed": "/etc/apt",
    "uninstall.cuda_link_removed": "/usr/local/cuda",
    "uninstall.driver_removed": "the kernel module (NVIDIA's uninstaller)",
    "uninstall.nouveau_restored": "/etc/modprobe.d and /boot",
    "uninstall.path_removed": "root-owned footprint paths the spec keeps outside user.home",
    "uninstall.ray_unit_removed": "the systemd unit and the token in /etc",
}


def _operations() -> set[str]:
    """Every ``@operation`` of operations/ (util/ and run/ included) as ``module.name``."""
    found = set()
    for path in sorted((REPO / "operations").rglob("*.py")):
        dotted = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        module = importlib.import_module(dotted)
        for name, obj in vars(module).items():
            if hasattr(obj, "_inner") and getattr(obj, "__module__", "") == module.__name__:
                found.add(f"{path.stem}.{name}")
    return found


def _under_home(path: str) -> bool:
    return os.path.normpath(path).startswith(UNDER)


def home_violations(result: OpResult) -> list[str]:
    """What of ``result`` acts under the home as root: a command naming a path there outside
    the user's ``su`` argument, an upload to it, a download from it."""
    bad = []
    for command in result.raw:
        if isinstance(command, FileUploadCommand) and _under_home(command.dest):
            bad.append(f"root uploads to {command.dest}")
        elif isinstance(command, FileDownloadCommand) and _under_home(command.src):
            bad.append(f"root reads {command.src}")
        elif isinstance(command, StringCommand):
            text = command.get_raw_value()
            if UNDER in _SU_ARG.sub("", text):
                bad.append(f"as root: {text[:300]}")
        elif isinstance(command, str) and UNDER in command:
            bad.append(f"as root: {command[:300]}")
    return bad


def _lab_plan(config):  # noqa: ARG001 - a plan as make_plan gives it
    return plan_launch(SPEC, [P40] * 4)


def _scenarios(tmp: Path) -> dict[str, list[tuple[dict, dict]]]:
    """Per operation: (arguments, facts) that make it act (nothing there yet, or a planted
    symlink / wrong file where it writes)."""
    wheel = tmp / "apex-wheel.tar"
    wheel.write_bytes(b"tar")
    rules = verl_patches.ruleset_json(SPEC.verl.ref, "pascal")
    link = UserFileState("link")
    users = {USER: {"uid": SPEC.user.uid, "home": HOME, "shell": "/bin/bash", "group": USER}}
    # a symlink planted where root wrote (pyinfra's File fact says False for a link)
    planted = {UserFile: link, File: False, Directory: None}
    missing = {UserFile: UserFileState(), Directory: None}
    staging = {
        StagedDir: StagedDirState(),
        ArtifactState: ArtifactFile(),
        FreeSpace: FreeSpaceInfo("/var/cache/p40fleet", "/var", "/", 10**12, 10**11),
    }
    lock = str(REPO / "files" / "torch-requirements-lab.txt")
    return {
        "apex.build_wheel": [({"python": PY, "env_dir": f"{ENV.conda_prefix}/envs/{ENV.name}",
                               "remote": "http://m/apex.git", "ref": "25.09", "commit": "0" * 40,
                               "key": KEY, "cuda_home": "/usr/local/cuda", "arch_list": "6.1",
                               "max_jobs": 2, "cuda_ext": True, "user": USER}, {})],
        "apex.fetch_wheel": [({"remote_tar": apex_build.built_tar(STAGE_DIR, KEY),
                               "local_tar": str(tmp / "ctl" / apex_build.WHEEL_TAR)},
                              {})],  # S8: root's copy on the builder, never the user's
        "apex.put_wheel": [({"local_tar": str(wheel), "remote_tar": f"{WORK}/apex-wheel.tar",
                             "user": USER}, f) for f in (missing, planted)],
        "apex.install": [({"python": PY, "wheel_tar": f"{WORK}/apex-wheel.tar", "key": KEY,
                           "env_dir": f"{ENV.conda_prefix}/envs/{ENV.name}",
                           "sha256_file": "/var/cache/p40fleet/apex-k.sha256", "user": USER},
                          {})],
        "conda.condarc": [({"prefix": ENV.conda_prefix, "channel": "http://m/conda",
                            "user": USER}, {})],
        "conda.miniconda": [({"installer": "/var/cache/p40fleet/m.sh",
                              "prefix": ENV.conda_prefix, "user": USER}, {})],
        "conda.conda_tos": [({"prefix": ENV.conda_prefix, "policy": "accept", "user": USER},
                             {})],
        "conda.env": [({"prefix": ENV.conda_prefix, "env_name": ENV.name,
                        "python_version": "3.10.12", "user": USER,
                        "lock": str(REPO / "files" / "conda-env-v0.5.0.txt"),
                        "lock_dest": f"{SPEC.paths.artifact_cache}/conda-env-v0.5.0.txt"},
                       {})],
        "torch.torch": [({"python": PY, "version": "2.13.0+cpu", "lock": lock,
                          "lock_dest": f"{SPEC.paths.artifact_cache}/torch-requirements-lab.txt",
                          "user": USER}, {})],
        "training.stage": [({"which": which, "spec": SPEC}, staging)
                           for which in ("model", "data")],
        "training.launch_script": [({"spec": SPEC, "make_plan": _lab_plan, "user_queued": queued},
                                    {Users: users, **f, at(Directory, path=HOME): {"mode": 750}})
                                   for queued in (False, True) for f in (missing, planted)],
        "training_user.training_user": [({"user": USER, "uid": SPEC.user.uid, "home": HOME},
                                         {Users: {}, Directory: None})],
        "training_user.directory": [({"path": path, "user": USER, "group": USER, "mode": "750"},
                                     {Directory: state})
                                    for path in (ENV.data_dir, ENV.model_dir)
                                    for state in (None, {"user": USER, "group": "x", "mode": 755})],
        "verl.checkout": [({"path": ENV.verl_checkout, "remote": "http://m/verl.git",
                            "ref": "v0.5.0", "commit": "0" * 40, "user": USER}, {})],
        "verl.patch": [({"python": PY, "checkout": ENV.verl_checkout,
                         "script_src": str(REPO / "files" / "verl_patches.py"), "rules_json": rules,
                         "work_dir": f"{CACHE}/verl-patch", "user": USER}, f)
                       for f in (missing, planted)],
        "verl.requirements": [({"python": PY, "src": REQS,
                                "dest": f"{CACHE}/verl-requirements-lab.txt",
                                "env_dir": f"{ENV.conda_prefix}/envs/{ENV.name}", "user": USER},
                               f) for f in (missing, planted)],
        "verl.install": [({"python": PY, "checkout": ENV.verl_checkout, "version": "0.5.0",
                           "user": USER}, {})],
        "uninstall.home_removed": [({"user": USER, "home": HOME, "policy": "remove"},
                                    {Users: users, PathKinds: {HOME: "dir"}})],
    }  # fmt: skip


def test_every_operation_is_walked_or_named_root_only():
    """A new operation must be walked below or say why it never touches the home."""
    walked = set(_scenarios(Path(tempfile.mkdtemp())))
    assert _operations() == walked | set(ROOT_ONLY), (
        sorted(_operations() - walked - set(ROOT_ONLY)),
        sorted((walked | set(ROOT_ONLY)) - _operations()),
    )
    assert not walked & set(ROOT_ONLY)


def test_no_operation_acts_under_the_home_as_root(tmp_path):
    """N1, N2, N3: every command naming a path under the home runs as the training user; no
    upload lands there and no download is read from there."""
    bad, acted = {}, set()
    for name, cases in _scenarios(tmp_path).items():
        module, op = name.split(".")
        operation = getattr(importlib.import_module(f"p40fleet.operations.{module}"), op)
        for kwargs, facts in cases:
            result = run_op(operation, facts=facts, default_facts=True, **kwargs)
            assert "function _fail" not in result.commands, (name, result.failures)
            if result.commands:
                acted.add(name)
            if problems := home_violations(result):
                bad.setdefault(name, []).extend(problems)
    assert not bad, "\n".join(f"{n}: {p}" for n, ps in bad.items() for p in ps)
    # the walk did reach the writes: each of these acted in at least one case
    assert {"apex.put_wheel", "apex.fetch_wheel", "training.stage", "training.launch_script",
            "training_user.directory", "verl.patch", "verl.requirements",
            "training_user.training_user",
            "uninstall.home_removed"} <= acted  # fmt: skip


def test_the_violation_check_sees_what_root_did_before():
    """The walk's own check, on the commands today's fix replaced (so it can fail)."""
    from pyinfra.api import QuoteString

    def fake(*commands):
        return OpResult(raw=list(commands))

    script = f"{HOME}/launch-ppo.sh"
    assert home_violations(fake(FileUploadCommand("x", script)))
    assert home_violations(fake(FileDownloadCommand(f"{WORK}/apex-wheel.tar", "/tmp/x")))
    assert home_violations(fake(StringCommand("chown", f"{USER}:{USER}", QuoteString(script))))
    assert home_violations(fake(StringCommand("sh -c", QuoteString(f"tar -xf a -C {HOME}/m"))))
    wrapped = as_user.as_user(USER, StringCommand("mkdir -p", QuoteString(f"{HOME}/d")))
    assert not home_violations(fake(wrapped))
    assert home_violations(fake(StringCommand(wrapped, "&& chmod 750", QuoteString(f"{HOME}/d"))))


def test_the_deploys_pass_no_upload_destination_under_the_home():
    """torch's lock goes to the artifact cache (root-owned) in the Python layer's steps."""
    text = (REPO / "p40fleet" / "deploys" / "steps" / "python.py").read_text()
    assert 'lock_dest=f"{spec.paths.artifact_cache}/' in text


# -- N3: ~/data and ~/models ---------------------------------------------------------------


def test_data_and_model_dirs_are_made_and_fixed_by_the_user():
    for state in (None, {"user": USER, "group": "root", "mode": 755}):
        r = run_op(training_user.directory, path=ENV.data_dir, user=USER, group=USER, mode="750",
                   facts={Directory: state})  # fmt: skip
        assert r.commands == [
            f"su -s /bin/sh {USER} -c 'mkdir -p {ENV.data_dir} && chgrp {USER} {ENV.data_dir} "
            f"&& chmod 750 {ENV.data_dir}'"
        ], r.commands
    ok = {"user": USER, "group": USER, "mode": 750}
    r = run_op(training_user.directory, path=ENV.data_dir, user=USER, group=USER, mode="750",
               facts={Directory: ok})  # fmt: skip
    assert not r.changed and r.noops


def test_a_symlink_or_a_root_owned_dir_at_data_refuses_the_host_alone():
    """N6 (the symlink at ~/data refuses the host, naming path and fix, instead of pyinfra
    raising in the prepare stage for the whole run) and N3 (root never chowns there)."""
    r = run_op(training_user.directory, path=ENV.data_dir, user=USER, group=USER, mode="750",
               facts={Directory: False})  # fmt: skip
    assert r.commands == ["function _fail"]
    assert ENV.data_dir in r.failures[0] and "not a directory" in r.failures[0]
    assert "move it away" in r.failures[0]
    r = run_op(training_user.directory, path=ENV.model_dir, user=USER, group=USER, mode="750",
               facts={Directory: {"user": "root", "group": "root", "mode": 755}})  # fmt: skip
    assert r.commands == ["function _fail"] and "belongs to root" in r.failures[0]
    assert f"chown {USER}:{USER} {ENV.model_dir}" in r.failures[0]


# -- the copy-in, for real ---------------------------------------------------------------


@pytest.fixture
def scratch():
    path = tempfile.mkdtemp(prefix="p40fleet-homesafe-")
    os.chmod(path, 0o755)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _copy_in(dest: Path, data: bytes, mode: str = "755") -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", copy_in_script(str(dest), mode)], input=data,
                          capture_output=True)  # fmt: skip


def test_copy_in_replaces_a_planted_symlink_and_leaves_its_target_alone(scratch):
    victim = scratch / "victim"
    victim.write_text("root's secret\n")
    victim.chmod(0o600)
    dest = scratch / "launch-ppo.sh"
    dest.symlink_to(victim)
    proc = _copy_in(dest, b"#!/bin/bash\necho train\n")
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "root's secret\n" and (victim.stat().st_mode & 0o777) == 0o600
    assert not dest.is_symlink() and dest.read_bytes() == b"#!/bin/bash\necho train\n"
    assert dest.stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in scratch.iterdir()) == ["launch-ppo.sh", "victim"]


def test_copy_in_stops_at_a_directory_naming_it(scratch):
    dest = scratch / "launch-ppo.sh"
    dest.mkdir()
    proc = _copy_in(dest, b"x")
    assert (
        proc.returncode == 1
        and b"is a directory" in proc.stderr
        and str(dest).encode() in proc.stderr
    )
    assert list(dest.iterdir()) == [] and sorted(p.name for p in scratch.iterdir()) == [dest.name]


def test_put_as_streams_root_stage_file_to_the_user_for_real(scratch):
    """The whole put_as command as root, the user ``nobody``: the file is nobody's, written
    through the drop; a symlink to a root-owned 0600 file is replaced, its target unchanged."""
    if os.geteuid() != 0 or shutil.which("su") is None:
        pytest.skip("needs root and su")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    home = scratch / "home"
    home.mkdir()
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    victim = scratch / "victim"
    victim.write_text("root only\n")
    victim.chmod(0o600)
    dest = home / "launch-ppo.sh"
    os.symlink(victim, dest)
    os.lchown(dest, nobody.pw_uid, nobody.pw_gid)
    stage = scratch / "stage"

    def op():
        yield from as_user.put_as("nobody", b"#!/bin/bash\n", str(dest), "755")

    r = run_op(op)
    upload = next(c for c in r.raw if isinstance(c, FileUploadCommand))
    staged = upload.dest
    assert staged.startswith(STAGE_DIR + "/")
    commands = [c.get_raw_value().replace(STAGE_DIR, str(stage)) for c in r.raw
                if isinstance(c, StringCommand)]  # fmt: skip
    subprocess.run(["sh", "-c", commands[0]], check=True)  # install -d -m 700 STAGE
    assert stage.stat().st_mode & 0o777 == 0o700 and stage.stat().st_uid == 0
    Path(staged.replace(STAGE_DIR, str(stage))).write_bytes(upload.src.getvalue())  # the upload
    proc = subprocess.run(["sh", "-c", commands[1]], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "root only\n" and victim.stat().st_uid == 0
    assert (victim.stat().st_mode & 0o777) == 0o600
    info = dest.lstat()
    assert not dest.is_symlink() and info.st_uid == nobody.pw_uid and info.st_mode & 0o777 == 0o755
    assert dest.read_bytes() == b"#!/bin/bash\n" and list(stage.iterdir()) == []


def test_staging_runs_as_the_user_with_the_archive_on_stdin():
    """N2: root opens only its own checked copy; tar, the marker and the rename are the user's."""
    r = run_op(training.stage, which="data", spec=SPEC, facts={
        StagedDir: StagedDirState(), ArtifactState: ArtifactFile(),
        FreeSpace: FreeSpaceInfo("/var/cache/p40fleet", "/var", "/", 10**12, 10**11)})  # fmt: skip
    unpack = r.commands[-1]
    assert unpack.startswith(f"su -s /bin/sh {USER} -c ")
    assert unpack.endswith(f"< /var/cache/p40fleet/{training_data.DATA_ARCHIVE}")
    assert not home_violations(OpResult(raw=[r.raw[-1]]))
    assert "chown" not in _SU_ARG.sub("", unpack)


# -- the unchanged-guards read the user's files as the user ---------------------------------


def test_the_survey_reads_no_file_under_the_home_as_root():
    """The guards' answers come from the survey (one command on a no-op run): every part that
    reads a file's content under the home is the user's ``UserFile``, never root's
    ``File``/``Sha1File`` (which follow a planted link and hang on a FIFO)."""
    from pyinfra.facts.files import Sha1File

    from p40fleet.operations.run.survey import layer_parts

    parts = layer_parts(SPEC)
    for cls, kwargs in parts:
        args = dict(kwargs)
        if cls in (File, Sha1File):
            assert not _under_home(args["path"]), (cls.__name__, args)
    user_files = {dict(k)["path"] for c, k in parts if c is UserFile}
    assert {
        f"{HOME}/launch-ppo.sh",
        f"{CACHE}/verl-patch/verl_patch.py",
        f"{CACHE}/verl-requirements-{SPEC.requirements_variant}.txt",
    } <= user_files
    assert all(dict(k)["user"] == USER for c, k in parts if c is UserFile)


def _user_file(path: Path) -> UserFileState:
    me = pwd.getpwuid(os.getuid()).pw_name
    fact = UserFile()
    out = subprocess.run(["sh", "-c", fact.command(path=str(path), user=me)],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    return fact.process(out.stdout.splitlines())


def test_user_file_fact_for_real(scratch):
    import hashlib

    f = scratch / "f"
    f.write_bytes(b"hello\n")
    f.chmod(0o755)
    me = pwd.getpwuid(os.getuid()).pw_name
    assert _user_file(f) == UserFileState("file", 755, me, hashlib.sha1(b"hello\n").hexdigest())
    (scratch / "link").symlink_to(f)
    assert _user_file(scratch / "link").kind == "link"  # never read through
    (scratch / "d").mkdir()
    assert _user_file(scratch / "d").kind == "dir"
    os.mkfifo(scratch / "fifo")
    assert _user_file(scratch / "fifo").kind == "other"  # answered, not hung on
    assert _user_file(scratch / "none").kind == "missing"


def test_the_deploys_call_only_the_walked_operations():
    """deploy/ and the deploys' steps call no pyinfra operation of their own (files.*,
    server.*): whatever a deploy does on a host goes through operations/, which the walk above
    covers."""
    steps = sorted((REPO / "p40fleet" / "deploys").rglob("*.py"))
    for path in [*sorted((REPO / "deploy").glob("*.py")), *steps]:
        code = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
        code = re.sub(r'"""(?:.|\n)*?"""', "", code)
        assert not re.search(r"\b(files|server|systemd|apt|pip|git)\.\w+\(", code), path.name


def test_staging_for_real_as_another_user_from_a_root_only_archive(scratch):
    """N2 for real: root (this test) runs the stage command with the training user ``nobody``;
    the archive is root's 0600 file, read only through stdin; a symlink the user planted at the
    staging dir's name points at a root-owned dir, which stays empty; every staged file is
    nobody's and no chown ran."""
    if os.geteuid() != 0 or shutil.which("su") is None:
        pytest.skip("needs root and su")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    archives = training_data.archives()
    cache = scratch / "cache"
    cache.mkdir(mode=0o700)
    archive = cache / training_data.DATA_ARCHIVE
    archive.write_bytes(archives[training_data.DATA_ARCHIVE])
    archive.chmod(0o600)
    home = scratch / "home"
    (home / "data").mkdir(parents=True)
    for path in (home, home / "data"):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    victim = scratch / "victim"
    victim.mkdir(mode=0o700)
    name = SPEC.training.data.name
    link = home / "data" / f".{name}.p40fleet-staging"
    os.symlink(victim, link)
    os.lchown(link, nobody.pw_uid, nobody.pw_gid)
    r = run_op(training.stage, which="data", spec=SPEC, facts={
        StagedDir: StagedDirState(), ArtifactState: ArtifactFile(),
        FreeSpace: FreeSpaceInfo("/var/cache/p40fleet", "/var", "/", 10**12, 10**11)})  # fmt: skip
    command = (
        r.commands[-1]
        .replace(f"su -s /bin/sh {USER} ", "su -s /bin/sh nobody ")
        .replace(HOME, str(home))
        .replace(f"/var/cache/p40fleet/{training_data.DATA_ARCHIVE}", str(archive))
    )
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert list(victim.iterdir()) == [] and victim.stat().st_uid == 0
    staged = home / "data" / name
    files = [staged, *staged.rglob("*")]
    assert {p.lstat().st_uid for p in files} == {nobody.pw_uid}, files
    assert (staged / "train.parquet").stat().st_size > 0
    assert sorted(p.name for p in (home / "data").iterdir()) == [name]
