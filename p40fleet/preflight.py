"""Preflight decisions: everything that refuses a host, decided before any host is changed.

Pure functions over facts already gathered, so they are unit-tested without hosts. The deploy
``deploy/preflight.py`` gathers the facts and turns each ``Refusal`` into a failing operation
for that host alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from p40fleet import condalock, hashlock, paths, verl_patches
from p40fleet.profile import HostGpuSummary
from p40fleet.spec import ARTIFACTS, SUPPORTED_OS, StackSpec

#: The repository's files/: the hash-locked requirement files the Python layer installs.
FILES = paths.FILES


@dataclass(frozen=True)
class Refusal:
    """One reason a host cannot be provisioned: the step, the cause and the fix."""

    step: str
    reason: str
    remedy: str


def _gib(count: int) -> str:
    return f"{count / 2**30:.1f} GiB"


def gpu_refusal(summary: HostGpuSummary) -> Refusal | None:
    """No GPU, an unknown one, a capability out of range or a GPU the driver branch lacks."""
    if summary.ok:
        return None
    return Refusal(
        step="GPU check",
        reason=f"GPUs {summary.gpus_str}: {summary.refused}",
        remedy="provision this host with another stack (or remove it from the inventory); "
        "`pyinfra INVENTORY deploy/facts.py` shows what each host has",
    )


def verl_refusal(ref: str, summary: HostGpuSummary) -> Refusal | None:
    """A verl ref the project has no rules for, or one that cannot serve the host's profile
    (62549582 on Pascal: no HF rollout there, and vLLM needs compute capability >= 7.0)."""
    if not summary.ok or summary.profile is None:
        return None  # the GPU check refuses this host already
    try:
        verl_patches.rule_set(ref, summary.profile)
    except verl_patches.VerlPatchError as exc:
        return Refusal(
            step="verl ref",
            reason=f"GPUs {summary.gpus_str}: {exc}",
            remedy=f"set stack.verl.ref to one that serves {summary.profile} (v0.5.0, the "
            "default: its HF rollout runs on Pascal), or take this host out of the inventory",
        )
    return None


def os_refusal(os_label: str) -> Refusal | None:
    """An OS the driver/CUDA pins are not meant for."""
    if os_label in SUPPORTED_OS:
        return None
    return Refusal(
        step="OS check",
        reason=f"{os_label} is not supported (supported: {', '.join(SUPPORTED_OS)})",
        remedy="reinstall the host with Ubuntu 20.04, or remove it from the inventory",
    )


def outside_the_stack(summary: HostGpuSummary, verl_ref: str, os_label: str) -> list[Refusal]:
    """The refusals that put a host outside this stack (GPUs, verl ref, OS): what verify says
    instead of probing it. Space and mirror refusals are not among them (a deploy fixes those)."""
    found = [gpu_refusal(summary), verl_refusal(verl_ref, summary), os_refusal(os_label)]
    return [r for r in found if r is not None]


def space_needed(spec: StackSpec, verified: Mapping[str, bool], cuda_installed: bool) -> int:
    """Bytes the artifact cache needs: artifacts not yet verified there, plus CUDA's unpack."""
    needed = 0
    for item in ARTIFACTS:
        size = spec.artifact(item).size
        if size and not verified.get(item, False):
            needed += size
    if not cuda_installed:
        needed += spec.cuda.tmp_bytes()
    return needed


def space_refusal(path: str, available: int | None, needed: int) -> Refusal | None:
    """Too little room in the artifact cache (downloads plus the CUDA unpack)."""
    if available is None or available >= needed:
        return None
    return Refusal(
        step="free space",
        reason=f"{path} has {_gib(available)} free, the downloads and the CUDA unpack need "
        f"{_gib(needed)} ({_gib(needed - available)} missing)",
        remedy="free space there, or point stack.paths.artifact_cache at a bigger filesystem",
    )


def heads_to_ask(spec: StackSpec, verified: Mapping[str, bool]) -> list[str]:
    """The artifacts whose URL the host asks (``facts.mirror.UrlHead``) before any change: those
    not verified in its cache; none with ``mirror.push_from_controller`` (the controller fetches
    and uploads them: the host need not reach any URL)."""
    if spec.mirror is not None and spec.mirror.push_from_controller:
        return []
    return [item for item in ARTIFACTS if not verified.get(item, False)]


def mirror_refusals(answers: Iterable[tuple[str, str, int, str]]) -> list[Refusal]:
    """``(item, url, http status, error)`` for each artifact still to download → refusals."""
    refusals = []
    for item, url, status, error in answers:
        if 200 <= status < 300 or status < 0:  # < 0: not asked (facts.mirror.UrlHead)
            continue
        if status == 0:
            reason = f"{url} did not answer ({error or 'no connection'})"
            remedy = "start the mirror (or check the host's route to it) and re-run"
        else:
            reason = f"{url} answered HTTP {status}: the {item} artifact is not there"
            remedy = f"put {url.rsplit('/', 1)[-1]} into the mirror (with its sha256) and re-run"
        refusals.append(Refusal(step=f"{item} artifact", reason=reason, remedy=remedy))
    return refusals


def torch_lock_path(spec: StackSpec) -> Path:
    """``files/torch-requirements-<variant>.txt``: the lock the torch step installs from."""
    return FILES / f"torch-requirements-{spec.requirements_variant}.txt"


def verl_requirements_path(spec: StackSpec) -> Path:
    """``files/verl-requirements-<variant>.txt``: verl's pinned dependencies."""
    return FILES / f"verl-requirements-{spec.requirements_variant}.txt"


def conda_lock_path(spec: StackSpec) -> Path:
    """``files/conda-env-<variant>.txt``: the explicit lock the conda env is created from."""
    return FILES / f"conda-env-{spec.requirements_variant}.txt"


def conda_lock(spec: StackSpec, lock: Path | None = None) -> tuple[str, list[str]]:
    """The lock ``conda create --file`` gets for ``spec`` (the variant's file, its URLs on the
    mirror's conda channel when set) and what stops it (``condalock.problems``)."""
    lock = lock or conda_lock_path(spec)
    channel = spec.mirror.conda_channel if spec.mirror is not None else None
    return condalock.load(str(lock), spec.python_version, channel)


def conda_lock_sum(spec: StackSpec) -> str | None:
    """sha256 of the rendered lock (what a healthy env records), None when it is refused."""
    text, found = conda_lock(spec)
    return None if found else condalock.digest(text)


def conda_refusal(spec: StackSpec, lock: Path | None = None) -> Refusal | None:
    """The env could not be created from a checked lock: no lock for the variant, a line
    without a sum, no python at the pin."""
    lock = lock or conda_lock_path(spec)
    _, found = conda_lock(spec, lock)
    if not found:
        return None
    return Refusal(
        step="conda lock",
        reason=f"{lock.name}: " + "; ".join(found),
        remedy=f"make the lock on a trusted machine that reaches the channel: conda create -n "
        f"lock python={spec.python_version} -y, then conda list -n lock --explicit --sha256 > "
        f"files/{lock.name} (--md5 for a conda older than 24.9; see files/conda-env-v0.5.0.txt's "
        "header)",
    )


def torch_lock(spec: StackSpec, lock: Path | None = None) -> tuple[str, list[str]]:
    """The lock text the torch step uploads for ``spec`` and what stops it (``hashlock.render``
    of the variant's file: its selection for the spec's pins, the spec's sums added)."""
    lock = lock or torch_lock_path(spec)
    try:
        text = lock.read_text()
    except OSError as exc:  # e.g. stack.verl.requirements names a variant without a torch lock
        return "", [f"cannot read it ({exc.strerror})"]
    return hashlock.render(text, spec.torch.pins(), spec.torch.sha256.given())


def torch_refusal(spec: StackSpec, lock: Path | None = None) -> Refusal | None:
    """The torch step could not install the spec's pins: a pinned package whose lock line has
    no sum (torchvision/torchaudio +cu118 unless stack.torch.sha256 has it), a pin the lock
    does not hold, a lock that is not there."""
    lock = lock or torch_lock_path(spec)
    _, problems = torch_lock(spec, lock)
    if not problems:
        return None
    return Refusal(
        step="torch lock",
        reason=f"{lock.name}: " + "; ".join(problems),
        remedy="put the sha256 of each named wheel (as its index publishes it, or `sha256sum` "
        "of a copy) in stack.torch.sha256, leave out what you do not need (stack.torch."
        "torchvision/torchaudio = None), or regenerate the lock for the spec's torch pins "
        "(see the file's header)",
    )


def requirements_refusal(spec: StackSpec, path: Path | None = None) -> Refusal | None:
    """No verl requirements lock for the spec's variant (``stack.verl.requirements``)."""
    path = path or verl_requirements_path(spec)
    if path.is_file():
        return None
    return Refusal(
        step="verl requirements",
        reason=f"{path.name} does not exist in files/ (variant {spec.requirements_variant!r})",
        remedy="set stack.verl.requirements to a variant with a file in files/ (or unset it)",
    )


def python_layer_refusals(spec: StackSpec, summary: HostGpuSummary) -> list[Refusal]:
    """Every reason deploy/python.py would stop this host, decided from the spec and the GPUs:
    the verl ref, the conda lock, the torch lock, the verl requirements lock."""
    found = [
        verl_refusal(spec.verl.ref, summary),
        conda_refusal(spec),
        torch_refusal(spec),
        requirements_refusal(spec),
    ]
    return [r for r in found if r is not None]
