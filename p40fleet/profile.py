"""Pure decisions from GPU identity: stack profile, driver-branch support, host summary.

Capability -> profile (stack facts §3): < 5.0 refused, 5.x refused unless
``allow_maxwell``, 6.x ``pascal``, 7.x ``volta-turing``, >= 8.0 ``ampere-plus``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from p40fleet.gpu_catalog import (
    ADA,
    AMPERE,
    HOPPER,
    KEPLER,
    MAXWELL,
    PASCAL,
    TURING,
    VOLTA,
    GpuModel,
    lookup,
)

PASCAL_PROFILE = "pascal"
VOLTA_TURING_PROFILE = "volta-turing"
AMPERE_PLUS_PROFILE = "ampere-plus"
REFUSED = "refused"
PROFILES = (PASCAL_PROFILE, VOLTA_TURING_PROFILE, AMPERE_PLUS_PROFILE)

Capability = tuple[int, int]


def profile_for(capability: Capability, *, allow_maxwell: bool = False) -> str:
    """Return ``pascal``, ``volta-turing``, ``ampere-plus`` or ``refused``."""
    return _decide(capability, allow_maxwell)[0]


def refusal_reason(capability: Capability, *, allow_maxwell: bool = False) -> str | None:
    """Why :func:`profile_for` refuses this capability, or ``None``."""
    return _decide(capability, allow_maxwell)[1]


def _decide(capability: Capability, allow_maxwell: bool) -> tuple[str, str | None]:
    major, minor = capability
    cc = f"{major}.{minor}"
    if major < 5:
        return REFUSED, f"compute capability {cc} < 5.0: driver R525 and torch 2.6 do not target it"
    if major == 5:
        if allow_maxwell:
            return PASCAL_PROFILE, None
        return REFUSED, (
            f"compute capability {cc} (Maxwell) is refused by default; "
            "set stack.policy.allow_maxwell to try it"
        )
    if major == 6:
        return PASCAL_PROFILE, None
    if major == 7:
        return VOLTA_TURING_PROFILE, None
    return AMPERE_PLUS_PROFILE, None


@dataclass(frozen=True)
class BranchSupport:
    """GPUs one driver branch supports: whole architectures minus listed device ids."""

    archs: frozenset[str]
    excluded_ids: frozenset[int] = frozenset()
    #: Architectures that gained device ids after the branch: an id of these that the catalog
    #: lacks (recognised from pci.ids only) may be one the branch does not know.
    open_archs: frozenset[str] = frozenset()


# R525 supports Maxwell through Hopper H100, but not H200 / GH200 (Hopper ids
# added by later branches) and not Blackwell; Kepler ended with R470.
DRIVER_BRANCHES: dict[str, BranchSupport] = {
    "470": BranchSupport(archs=frozenset({KEPLER, MAXWELL, PASCAL, VOLTA, TURING, AMPERE})),
    "525": BranchSupport(
        archs=frozenset({MAXWELL, PASCAL, VOLTA, TURING, AMPERE, ADA, HOPPER}),
        excluded_ids=frozenset({0x2335, 0x2342}),
        open_archs=frozenset({ADA, HOPPER}),
    ),
}

_BRANCH = re.compile(r"^[Rr]?(\d{3})(?:\.\d+)*$")


def driver_branch(version: str) -> str | None:
    """``525`` from ``525``, ``R525`` or ``525.147.05``; ``None`` otherwise."""
    match = _BRANCH.match(version.strip())
    return match.group(1) if match else None


def driver_supports(branch: str, model: GpuModel | None) -> tuple[bool, str]:
    """Whether driver ``branch`` supports ``model``, with a one-line reason."""
    if model is None:
        return False, "unknown GPU: not in p40fleet.gpu_catalog"
    key = driver_branch(branch)
    support = DRIVER_BRANCHES.get(key or "")
    label = f"{model.name} ({model.pci_id_hex})"
    if support is None:
        return False, f"no GPU support data for driver branch {branch!r}"
    if model.arch not in support.archs:
        return False, f"driver R{key} does not support {model.arch} GPUs like {label}"
    if model.pci_id in support.excluded_ids:
        return False, f"driver R{key} does not support {label}"
    if model.derived_from is None:
        return True, f"driver R{key} supports {label}"
    if model.arch in support.open_archs:
        return False, (
            f"{label} is not in p40fleet/gpu_catalog.py ({model.derived_from}) and {model.arch} "
            f"gained ids after driver R{key}: check NVIDIA's supported-chips list for R{key}, "
            "then add the id to the catalog"
        )
    return True, f"driver R{key} supports {model.arch} GPUs like {label} ({model.derived_from})"


@dataclass(frozen=True)
class HostGpuSummary:
    """What one host's NVIDIA GPUs mean for the stack."""

    device_ids: tuple[int, ...]
    models: tuple[str, ...]
    lowest_capability: Capability | None
    profile: str | None
    refused: str | None
    driver_branch: str
    driver_supported: bool
    unknown_ids: tuple[int, ...]

    @property
    def gpu_count(self) -> int:
        return len(self.device_ids)

    @property
    def ok(self) -> bool:
        return self.refused is None

    @property
    def verdict(self) -> str:
        """``ready`` or ``refused: <why>``."""
        return "ready" if self.refused is None else f"refused: {self.refused}"

    @property
    def gpus_str(self) -> str:
        return ", ".join(self.models) if self.models else "none"

    @property
    def capability_str(self) -> str:
        cap = self.lowest_capability
        return f"{cap[0]}.{cap[1]}" if cap else "-"


def _device_id(gpu: object) -> int:
    if isinstance(gpu, int):
        return gpu
    for attr in ("device_id", "pci_id"):
        value = getattr(gpu, attr, None)
        if isinstance(value, int):
            return value
    raise TypeError(f"not a GPU device id: {gpu!r}")


def _model(gpu: object, device_id: int) -> GpuModel | None:
    # a PCI fact carries its model (the catalog's, or one derived from the host's pci.ids name)
    model = getattr(gpu, "model", None)
    return model if isinstance(model, GpuModel) else lookup(device_id)


def _unknown_label(gpus: Iterable[object], device_id: int) -> str:
    name = next((getattr(g, "pci_name", None) for g in gpus if _device_id(g) == device_id), None)
    return f"10de:{device_id:04x} (pci.ids: {name!r})" if name else f"10de:{device_id:04x}"


def summarize_host(
    gpus: Iterable[int | object],
    *,
    branch: str = "525",
    allow_maxwell: bool = False,
) -> HostGpuSummary:
    """Summarize a host from its GPU functions (device ids, or objects with ``device_id``).

    The lowest capability picks the profile; any refused, unknown or
    driver-unsupported GPU refuses the whole host.
    """
    items = list(gpus)
    ids = tuple(_device_id(gpu) for gpu in items)
    models = [_model(gpu, i) for gpu, i in zip(items, ids, strict=True)]
    unknown = tuple(sorted({i for i, m in zip(ids, models, strict=True) if m is None}))
    known = [m for m in models if m is not None]

    counts = Counter(f"{m.name} ({m.derived_from})" if m.derived_from else m.name for m in known)
    labels = [f"{n}× {name}" for name, n in counts.items()]
    labels += [f"1× unknown 10de:{i:04x}" for i in ids if i in unknown]

    lowest = min((m.compute_capability for m in known), default=None)
    profile: str | None = None
    refused: str | None = None
    if lowest is not None:
        profile, refused = _decide(lowest, allow_maxwell)

    driver_ok = bool(known)
    for model in dict.fromkeys(known):
        supported, why = driver_supports(branch, model)
        if not supported:
            driver_ok = False
            refused = refused or why

    if not ids:
        refused = "no NVIDIA GPU found"
    elif unknown:
        driver_ok = False
        refused = refused or (
            "unknown NVIDIA device id(s) "
            + ", ".join(_unknown_label(items, i) for i in unknown)
            + ": neither p40fleet/gpu_catalog.py nor the chip family in the host's pci.ids "
            "name knows it; add it to the catalog (or update pci.ids: apt install pci.ids)"
        )

    return HostGpuSummary(
        device_ids=ids,
        models=tuple(labels),
        lowest_capability=lowest,
        profile=profile,
        refused=refused,
        driver_branch=driver_branch(branch) or branch,
        driver_supported=driver_ok,
        unknown_ids=unknown,
    )
