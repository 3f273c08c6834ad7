"""The check vocabulary: one :class:`Check` per verified fact, its statuses, a host's verdict.

Statuses: ``PASS`` (checked, as specified), ``FAIL`` (checked, wrong: ``remedy`` says what to
do), ``SKIP`` (cannot be checked here, with the reason, e.g. ``simulated host``: never a faked
PASS). A host passes when no check FAILs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FAIL",
    "PASS",
    "SIMULATED",
    "SIM_DATA",
    "SIM_MARKERS",
    "SKIP",
    "STATUSES",
    "Check",
    "force_reinstall",
    "host_verdict",
    "no_answer",
    "simulated_in_inventory",
    "spec_failure",
]

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
STATUSES = (PASS, FAIL, SKIP)

SIMULATED = "simulated host"
#: Host data that marks a host of the simulated lab (``inventories/sim.py`` sets it). Only the
#: inventory says a host is simulated: a lab marker left on a real host's disk (a leftover lab
#: image) never turns its GPU checks into SKIPs.
SIM_DATA = "p40lab_sim"
#: The directories a p40lab host has (``facts.verify.SIMULATED_HOST_TEST`` looks for them).
SIM_MARKERS = ("/etc/p40lab-sim", "/var/lib/p40lab-sim")


def simulated_in_inventory(data: Any) -> bool:
    """Whether the host's inventory data (pyinfra ``host.data``) marks it simulated."""
    return (data.get(SIM_DATA) if data is not None else None) is True


def force_reinstall(component: str, deploy: str) -> str:
    """The remedy that reinstalls ``component``: force it in the spec, then run ``deploy``."""
    return f"put '{component}' in stack.policy.force_reinstall and {deploy}"


@dataclass(frozen=True)
class Check:
    """One verified fact about a host. ``remedy`` is set on FAIL."""

    name: str
    status: str
    detail: str
    remedy: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict[str, str]:
        return {
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            "remedy": self.remedy,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Check:
        return cls(
            name=str(data["name"]),
            status=str(data["status"]),
            detail=str(data.get("detail", "")),
            remedy=str(data.get("remedy", "")),
        )


def host_verdict(checks: Iterable[Check]) -> str:
    """``FAIL`` when any check failed (or there is none), else ``PASS`` (SKIPs pass)."""
    checks = list(checks)
    if not checks or any(c.status == FAIL for c in checks):
        return FAIL
    return PASS


def spec_failure(lines: Iterable[str]) -> list[Check]:
    """The only check of a host whose stack spec does not validate (nothing else is probed)."""
    return [
        Check(
            "stack spec",
            FAIL,
            "; ".join(lines) or "invalid stack spec",
            "correct the value in the inventory (stack_host) or inventories/group_data/all.py "
            "(stack); the defaults in p40fleet/spec/pins.py are the real pins",
        )
    ]


def no_answer(name: str, what: str, remedy: str) -> Check:
    """The FAIL of a check whose probe section is missing."""
    return Check(name, FAIL, f"the probe gave no answer for {what}", remedy)


def data_flag(value: object) -> bool:
    """Whether a host-data switch (``verify_smoke``, ``verify_collective``) is on: ``--data``
    gives a string."""
    return value is True or str(value).strip().lower() in ("1", "yes", "true", "on")


def seconds_from_data(value: object, key: str, default: int, minimum: int) -> int:
    """A bound from host data ``key`` (None or "": ``default``); raises ValueError naming the
    key for anything but whole seconds >= ``minimum``."""
    if value is None or value == "":
        return default
    text = str(value).strip()
    if not text.isdigit() or int(text) < minimum:
        raise ValueError(
            f"{key}={value!r}: expected whole seconds >= {minimum} (default {default})"
        )
    return int(text)
