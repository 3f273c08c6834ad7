"""Each layer's facts, as its operations ask them on a host where nothing is to change.

``deploy/preflight.py`` (which every deploy includes first) asks :func:`survey_host` once per
host: one command answers every fact the preflight, system, Python and training layers ask
on a converged host (``facts.survey``), so a no-op run of ``deploy/full.py`` or of the four
deploys named in one call sends one fact command per host. A fact missing here is still
right, only asked on its own (``facts.survey.ask``); a host that changes asks live.

Each list follows its deploy file and the operations' own asks (same classes, same
arguments): change them together. The guards for pyinfra's own file operations
(``operations.util.unchanged``) decide "nothing to do" from the same answers.
"""

from __future__ import annotations

import posixpath
from typing import Any

from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.facts.server import Groups, Users

from facts.apt_source import AptSources
from facts.artifacts import ArtifactState, UnsafeParent
from facts.conda import (
    CondaInstall,
    CondaTos,
    EnvDistributions,
    EnvPython,
    MarkerText,
    env_dir,
    env_python,
)
from facts.cuda import CudaToolkit, NvccRelease
from facts.cudnn import CudnnExtracted, CudnnFiles, CudnnHeaderVersion, PathDevice
from facts.driver import InstalledDriverVersion, NvidiaSmi
from facts.gpu import PciGpus
from facts.home import UserFile
from facts.host import Cpus, FreeSpace, KernelHeaders, LinuxDistribution, MemTotal
from facts.nouveau import FileStampFact, InitramfsMtime, NouveauLoaded
from facts.packages import DebInstalled
from facts.run_lock import RunLock
from facts.survey import Part, part, survey
from facts.training import ModelConfig, StagedDir
from facts.verl import GitCheckout, VerlPatchCheck
from p40fleet.proxy import PROXY_FILE
from p40fleet.run_lock import DEFAULT_PATH
from p40fleet.spec import ARTIFACTS, StackSpec
from p40fleet.training import staged_dir

__all__ = ["layer_parts", "survey_host"]


def _artifact_path(spec: StackSpec, item: str) -> str:
    from operations.artifacts import artifact_path

    return artifact_path(spec, item)


def preflight_parts(spec: StackSpec, lock: str | None) -> list[Part]:
    """deploy/preflight.py and the run lock (``operations.run_lock.hold``)."""
    parts = [
        part(PciGpus),
        *(part(ArtifactState, path=_artifact_path(spec, item)) for item in ARTIFACTS),
        part(CudaToolkit, cuda_dir=spec.paths.cuda_dir),
        part(FreeSpace, path=spec.paths.artifact_cache),
        part(LinuxDistribution),
        part(File, path=PROXY_FILE),  # operations.proxy.credentials
    ]
    if spec.proxy is not None and spec.proxy.has_secret:
        parts.append(part(Sha1File, path=PROXY_FILE))
    return parts + ([part(RunLock, path=lock)] if lock else [])


def system_parts(spec: StackSpec) -> list[Part]:
    """deploy/system.py on a converged host."""
    from operations import apt_source, cuda, cudnn, driver, nouveau

    paths = spec.paths
    tree = cudnn.extracted_dir(paths.cudnn_extract_dir, _artifact_path(spec, "cudnn"))
    parts = [
        part(PathDevice, path=paths.cudnn_extract_dir),
        part(UnsafeParent, path=paths.cudnn_extract_dir),
        part(PathDevice, path=paths.cuda_dir),
        part(FileStampFact, path=nouveau.BLACKLIST_FILE),
        part(InitramfsMtime),
        part(NouveauLoaded),
        part(KernelHeaders),
        part(DebInstalled, packages=driver.BUILD_PACKAGES),
        part(InstalledDriverVersion),
        part(NvidiaSmi),
        part(Link, path=paths.cuda_link),
        part(File, path=cuda.PROFILE_FILE),
        part(Sha1File, path=cuda.PROFILE_FILE),
        part(NvccRelease, cuda_dir=paths.cuda_dir),
        part(CudnnHeaderVersion, path=f"{tree}/include/cudnn_version.h"),
        part(CudnnExtracted, tree=tree),
        part(CudnnFiles, src_dir=tree, cuda_dir=paths.cuda_dir),
        part(CudnnHeaderVersion, path=f"{paths.cuda_dir.rstrip('/')}/include/cudnn_version.h"),
    ]
    apt = spec.mirror.apt if spec.mirror is not None else None
    if apt is not None:
        key = apt_source.key_dest(apt.signed_by) if apt.signed_by else None
        parts.append(part(AptSources, key_path=key))
    return parts


def python_parts(spec: StackSpec) -> list[Part]:
    """deploy/python.py on a converged host (every GPU profile's verl rule set: the host's
    GPUs are not known before this survey answers)."""
    from operations import apex, conda, verl
    from p40fleet import verl_patches
    from p40fleet.verl_patches import VerlPatchError

    user, env = spec.user, spec.env
    as_user = {"user": user.name}
    prefix = env.conda_prefix
    python = env_python(prefix, env.name)
    the_env = env_dir(prefix, env.name)
    cache = f"{user.home}/.cache/p40fleet"
    parts = [
        part(Users),
        part(Groups),
        part(Directory, path=user.home),
        part(Directory, path=env.data_dir),
        part(Directory, path=env.model_dir),
        part(ArtifactState, path=_artifact_path(spec, "miniconda")),
        part(CondaInstall, prefix=prefix, **as_user),
        part(CondaTos, prefix=prefix, **as_user),
        part(MarkerText, path=f"{prefix.rstrip('/')}/.condarc", **as_user),
        part(MarkerText, path=f"{prefix.rstrip('/')}/{conda.TOS_MARKER}", **as_user),
        part(EnvPython, prefix=prefix, env_name=env.name, **as_user),
        part(MarkerText, path=f"{the_env}/{conda.LOCK_MARKER}", **as_user),
        part(EnvDistributions, python=python, **as_user),
        part(MarkerText, path=f"{the_env}/{apex.KEY_FILE}", **as_user),
        part(Cpus),
        part(MemTotal),
        part(GitCheckout, path=env.verl_checkout, **as_user),
        part(Directory, path=f"{cache}/verl-patch"),
        part(Directory, path=cache),
        part(MarkerText, path=f"{the_env.rstrip('/')}/{verl.REQUIREMENTS_MARKER}", **as_user),
    ]
    script = posixpath.join(f"{cache}/verl-patch", "verl_patch.py")
    parts.append(part(UserFile, path=script, **as_user))
    for profile in verl_patches.PROFILES:
        try:
            rules_json = verl_patches.ruleset_json(spec.verl.ref, profile)
        except VerlPatchError:
            continue  # no rules for this profile: the host is refused before the patch
        _, rules = verl.patch_files(f"{cache}/verl-patch", rules_json)
        parts.append(part(UserFile, path=rules, **as_user))
        parts.append(
            part(
                VerlPatchCheck,
                python=python,
                script=script,
                rules=rules,
                checkout=env.verl_checkout,
                **as_user,
            )  # fmt: skip
        )
    dest = f"{cache}/verl-requirements-{spec.requirements_variant}.txt"
    return parts + [part(UserFile, path=dest, **as_user)]


def training_parts(spec: StackSpec) -> list[Part]:
    """deploy/training.py on a converged host."""
    from operations import launch

    as_user = {"user": spec.user.name}
    script = launch.script_path(spec.user.home)
    return [
        part(StagedDir, path=staged_dir(spec, "model"), **as_user),
        part(StagedDir, path=staged_dir(spec, "data"), **as_user),
        part(ModelConfig, path=staged_dir(spec, "model"), **as_user),
        part(NvidiaSmi),
        part(UserFile, path=script, **as_user),
    ]


#: ``layer_parts`` per (spec, lock): every deploy, the Ray shape and the Apex election ask a
#: host's survey again (a no-op once answered), so the list is built once per spec object.
_PARTS: dict[tuple[int, str | None], tuple[StackSpec, tuple[Part, ...]]] = {}


def layer_parts(spec: StackSpec, lock: str | None = None) -> tuple[Part, ...]:
    """Every layer a run of these deploys uses (see the module doc)."""
    cached = _PARTS.get((id(spec), lock))
    if cached is not None and cached[0] is spec:
        return cached[1]
    parts = (
        *preflight_parts(spec, lock),
        *system_parts(spec),
        *python_parts(spec),
        *training_parts(spec),
    )
    _PARTS[(id(spec), lock)] = (spec, parts)  # the spec kept: its id is not reused
    return parts


def survey_host(target: Any, spec: StackSpec) -> int:
    """Ask ``target``'s survey: once per run (a part already asked is not asked again), also
    for another host than the current one (its lock path from its own data)."""
    from operations.run_lock import PATH_KEY

    lock = str(target.data.get(PATH_KEY) or DEFAULT_PATH)
    return survey(target, layer_parts(spec, lock))
