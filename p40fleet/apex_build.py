"""Apex build arithmetic: the build key, its inputs, the wheel's paths, the builder rule. Pure.

A build key names everything the compiled wheel depends on: apex commit, torch pin, CUDA
toolkit (or ``none`` without CUDA extensions), the GPU arches present (TORCH_CUDA_ARCH_LIST),
the env's python minor (cp tag) and the extension set. Per key and run, one host builds
(:func:`first_builder`); ``operations/apex.py`` holds the operations,
``operations/run/apex_fleet.py`` asks the inventory's hosts for the rule's inputs. No pyinfra
here.
"""

from __future__ import annotations

import os
import re
import tarfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from p40fleet import controller

if TYPE_CHECKING:  # the spec is only read here, never built: no import cycle, no load cost
    from p40fleet.spec import StackSpec

__all__ = [
    "BUILD_ACCOUNT",
    "BUILD_HOME",
    "BUILD_LOG_DIR",
    "GIB_PER_JOB",
    "KEY_FILE",
    "WHEEL_TAR",
    "ApexBuild",
    "arch_list",
    "built_tar",
    "complete_wheel_tar",
    "controller_wheel",
    "controller_wheel_ok",
    "first_builder",
    "for_spec",
    "host_sum",
    "host_work_dir",
    "max_jobs",
    "recorded_sum",
    "sha256_of",
]

#: Name of the key file in the env dir: the build key of the installed apex.
KEY_FILE = ".p40fleet-apex-key"
#: The built wheel travels as a tar holding exactly one ``apex-*.whl`` (its name is only known
#: after the build; the tar's name is fixed so files.get/put can name it beforehand).
WHEEL_TAR = "apex-wheel.tar"
#: S8: the account the wheel is compiled as: a system account nothing else runs as (no login
#: shell, no password), created for each build in a fresh home and removed after it.
BUILD_ACCOUNT = "p40fleet-apex"
#: Its home and the build's only directory (env snapshot, source, wheels, log), outside /home.
BUILD_HOME = "/var/lib/p40fleet/apex-build"
#: Root keeps each build's log here (the build's home is removed after the build).
BUILD_LOG_DIR = "/var/log/p40fleet"
#: Peak memory of one nvcc job compiling apex's CUDA kernels is roughly 2-4 GiB.
GIB_PER_JOB = 4
#: Extension modules a CUDA build adds to ``apex, apex_C`` (imported to prove the install).
CUDA_EXT_MODULES = ("amp_C", "fused_layer_norm_cuda")


def arch_list(capabilities: Iterable[tuple[int, int]]) -> str:
    """TORCH_CUDA_ARCH_LIST of the arches present, sorted: ``"6.1"``, ``"6.0;6.1"``."""
    return ";".join(f"{major}.{minor}" for major, minor in sorted(set(capabilities)))


def max_jobs(cpus: int | None, mem_bytes: int | None) -> int:
    """MAX_JOBS = min(cpus, memory GiB // 4), at least 1 (unknown values do not limit)."""
    limits = []
    if cpus:
        limits.append(cpus)
    if mem_bytes:
        limits.append(mem_bytes // (GIB_PER_JOB * 1024**3))
    return max(1, min(limits)) if limits else 1


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+_-]+", "-", text).strip("-")


@dataclass(frozen=True)
class ApexBuild:
    """Everything the compiled wheel depends on; ``key`` names it (a directory-safe string)."""

    ref: str
    commit: str
    torch: str
    cuda: str | None  # toolkit version when cuda_ext, else None
    arch_list: str
    python: str  # X.Y (the wheel's cp tag)
    cuda_ext: bool

    @property
    def key(self) -> str:
        arches = self.arch_list.replace(";", "-") or "none"
        exts = "cpp+cuda" if self.cuda_ext else "cpp"
        return _safe(
            f"{self.ref}-{self.commit[:12]}_torch{self.torch}_cuda{self.cuda or 'none'}"
            f"_sm{arches}_py{self.python}_{exts}"
        )

    @property
    def verify_code(self) -> str:
        """Python that imports the real extension modules of this build (FusedLayerNorm's
        import is lazy and proves nothing)."""
        modules = ("torch", "apex", "apex_C", *(CUDA_EXT_MODULES if self.cuda_ext else ()))
        return "import " + ", ".join(modules)


def for_spec(spec: StackSpec, gpus: Iterable) -> ApexBuild:
    """The Apex build a host needs: its GPUs' arches, the torch/CUDA pins, python X.Y."""
    cuda_ext = spec.apex.cuda_ext
    if cuda_ext is None:  # CUDA extensions only for a CUDA torch build: a CPU torch has none
        cuda_ext = spec.torch_is_cuda
    return ApexBuild(
        ref=spec.apex.ref,
        commit=spec.apex.commit,
        torch=spec.torch.version,
        cuda=spec.cuda.version if cuda_ext else None,
        arch_list=arch_list(g.model.compute_capability for g in gpus if g.model),
        python=".".join(spec.python_version.split(".")[:2]),
        cuda_ext=cuda_ext,
    )


def first_builder(
    key: str,
    in_cache: bool,
    hosts: Iterable[str],
    key_of: Callable[[str], str | None],
    needs: Callable[[str], bool],
) -> str | None:
    """The host that builds ``key`` in this run, or None: nobody when the controller's cache
    has the wheel (``in_cache``), else the first of ``hosts`` (inventory order, so the same
    host every run) whose key it is (``key_of``: None = runs no Python layer) and that must
    install it (``needs``). Hosts after it are never asked: one builder per key."""
    if in_cache:
        return None
    for name in hosts:
        if key_of(name) == key and needs(name):
            return name
    return None


def host_work_dir(home: str, key: str) -> str:
    """Where the wheel tar for ``key`` is uploaded under the training user's home (every host,
    the builder too: the build itself runs as the build account, outside the home)."""
    return f"{home.rstrip('/')}/.cache/p40fleet/apex/{key}"


def built_tar(stage_dir: str, key: str) -> str:
    """Root's own copy of the wheel tar on the builder (taken out of the build's home once the
    build account is gone); its sha256, computed by root, is ``built_tar(...) + ".sha256"``."""
    return f"{stage_dir.rstrip('/')}/apex-{key}.tar"


def host_sum(artifact_cache: str, key: str) -> str:
    """Where a host keeps the controller's sum of the wheel: root-owned, not the user's."""
    return f"{artifact_cache}/apex-{key}.sha256"


def controller_wheel(key: str, cache_dir: str | None = None) -> str:
    """The controller's copy of the wheel tar, under :func:`p40fleet.controller.cache_dir`."""
    base = os.path.expanduser(cache_dir) if cache_dir else str(controller.cache_dir())
    return os.path.join(base, "apex", key, WHEEL_TAR)


sha256_of = controller.sha256_file  # the controller's copy of the wheel tar


def recorded_sum(path: str) -> str | None:
    """The sha256 at the start of the sum file ``path``; None when missing or not a sum."""
    try:
        with open(path) as handle:
            text = handle.read().split()
    except OSError:
        return None
    return text[0].lower() if text and re.fullmatch(r"[0-9a-fA-F]{64}", text[0]) else None


def controller_wheel_ok(local_tar: str) -> tuple[bool, str]:
    """(ok, why): the controller's tar exists and matches the sum recorded next to it."""
    if not os.path.isfile(local_tar):
        return False, f"{local_tar} is not on the controller"
    want = recorded_sum(f"{local_tar}.sha256")
    if want is None:
        return False, f"{local_tar} has no recorded sha256 ({local_tar}.sha256)"
    got = sha256_of(local_tar)
    if got != want:
        return (
            False,
            f"{local_tar} has sha256 {got}, its recorded sum is {want} (truncated or swapped)",
        )
    return True, f"{local_tar} matches its recorded sha256 {want}"


def complete_wheel_tar(path: str) -> str | None:
    """None when ``path`` is a tar of exactly one readable ``apex-*.whl``; else what is wrong."""
    try:
        with tarfile.open(path) as tar:
            members = tar.getmembers()
            names = [m.name for m in members]
            if len(members) != 1 or not re.fullmatch(r"apex-[^/]*\.whl", names[0]):
                return f"holds {names}, not exactly one apex-*.whl"
            handle = tar.extractfile(members[0])
            if handle is None:
                return f"{names[0]} is not a file"
            with zipfile.ZipFile(handle) as wheel:
                bad = wheel.testzip()
            return f"{names[0]}: {bad} is corrupt" if bad else None
    except (OSError, tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
        return f"not a complete wheel tar ({exc})"
