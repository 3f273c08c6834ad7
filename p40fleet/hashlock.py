"""Hash-locked requirement files (``name==version --hash=sha256:HEX ...``, one line each).

pip installs them with ``--require-hashes``; these helpers read them (tests, the lab's
wheelhouse, the torch step) and add sums that the stack spec supplies for lines that have none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

__all__ = ["LockLine", "parse", "pinned", "problems", "with_sums"]

_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})\b")


@dataclass(frozen=True)
class LockLine:
    """One requirement of a lock file: the requirement text, its name and its sha256 sums."""

    requirement: str  # without options, e.g. ``ray[default]==2.48.0``
    name: str  # canonical distribution name
    hashes: tuple[str, ...]

    @property
    def version(self) -> str | None:
        """The ``==`` version, or None when the line is not an exact pin."""
        specs = list(Requirement(self.requirement).specifier)
        if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
            return specs[0].version
        return None


def parse(text: str) -> list[LockLine]:
    """The requirement lines of ``text`` (comments and blank lines skipped, order kept)."""
    out: list[LockLine] = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        requirement = line.split(" --", 1)[0].strip()
        name = canonicalize_name(Requirement(requirement).name)
        out.append(LockLine(requirement, name, tuple(_HASH.findall(line))))
    return out


def pinned(text: str) -> dict[str, str | None]:
    """``{canonical name: == version}`` of a lock file."""
    return {line.name: line.version for line in parse(text)}


def with_sums(text: str, sums: dict[str, str]) -> str:
    """``text`` with ``--hash=sha256:SUM`` added to the line of each ``{name: SUM}``."""
    wanted = {canonicalize_name(name): value.lower() for name, value in sums.items()}
    out = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            name = canonicalize_name(Requirement(line.split(" --", 1)[0].strip()).name)
            extra = wanted.get(name)
            if extra and extra not in _HASH.findall(line):
                raw = f"{line} --hash=sha256:{extra}"
        out.append(raw)
    return "\n".join(out) + "\n"


def problems(text: str, pins: dict[str, str]) -> list[str]:
    """What stops ``pip install --require-hashes`` of ``text`` from installing ``pins``.

    A line without a sum, a line that is not an exact pin, or a pin the lock does not hold at
    that version (PEP 440 equality).
    """
    lines = parse(text)
    out = [f"{line.requirement} has no --hash=sha256:" for line in lines if not line.hashes]
    out += [f"{line.requirement} is not pinned with ==" for line in lines if line.version is None]
    have = {line.name: line.version for line in lines}
    for name, pin in pins.items():
        got = have.get(canonicalize_name(name))
        if got is None or Version(got) != Version(pin):
            out.append(f"the lock has {name}=={got}, the spec pins {name}=={pin}")
    return out
