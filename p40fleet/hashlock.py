"""Hash-locked requirement files (``name==version --hash=sha256:HEX ...``, one line each).

pip installs them with ``--require-hashes``; these helpers read them (tests, the lab's
wheelhouse, the torch step), select the lines a spec installs and add sums that the stack spec
supplies for lines that have none.

A line may end with ``# opt-in: NAME [NAME ...]``: it is installed only when the spec pins one
of those packages (torchvision and what only it needs, say); a line without the mark always is.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

__all__ = ["LockLine", "parse", "pinned", "problems", "render", "select", "with_sums"]

_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})\b")
_OPT_IN = re.compile(r"\s#\s*opt-in:\s*([A-Za-z0-9._ -]+?)\s*$")


@dataclass(frozen=True)
class LockLine:
    """One requirement of a lock file: the requirement text, its name and its sha256 sums."""

    requirement: str  # without options, e.g. ``ray[default]==2.48.0``
    name: str  # canonical distribution name
    hashes: tuple[str, ...]
    opt_in: tuple[str, ...] = ()  # canonical names of ``# opt-in:``; () = always installed

    @property
    def version(self) -> str | None:
        """The ``==`` version, or None when the line is not an exact pin."""
        specs = list(Requirement(self.requirement).specifier)
        if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
            return specs[0].version
        return None


def _opt_in(raw: str) -> tuple[str, ...]:
    """The canonical names of a line's ``# opt-in: NAME ...`` mark (() without one)."""
    mark = _OPT_IN.search(raw)
    return tuple(canonicalize_name(name) for name in mark.group(1).split()) if mark else ()


def parse(text: str) -> list[LockLine]:
    """The requirement lines of ``text`` (comments and blank lines skipped, order kept)."""
    out: list[LockLine] = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        requirement = line.split(" --", 1)[0].strip()
        name = canonicalize_name(Requirement(requirement).name)
        out.append(LockLine(requirement, name, tuple(_HASH.findall(line)), _opt_in(raw)))
    return out


def select(text: str, wanted: Iterable[str]) -> str:
    """``text`` without the ``# opt-in:`` lines of packages not in ``wanted`` (comments kept).

    What is left is exactly what ``pip install -r`` of it installs for a spec pinning ``wanted``.
    """
    keep = {canonicalize_name(name) for name in wanted}
    out = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            marks = _opt_in(raw)
            if marks and not keep.intersection(marks):
                continue
        out.append(raw)
    return "\n".join(out) + "\n"


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
    that version (PEP 440 equality). ``text`` is what is installed (see ``select``).
    """
    lines = parse(text)
    out = [f"{line.requirement} has no --hash=sha256:" for line in lines if not line.hashes]
    out += [f"{line.requirement} is not pinned with ==" for line in lines if line.version is None]
    have = {line.name: line.version for line in lines}
    for name, pin in pins.items():
        key = canonicalize_name(name)
        if key not in have:
            out.append(f"the lock has no {name} line, the spec pins {name}=={pin}")
            continue
        got = have[key]
        if got is None or Version(got) != Version(pin):
            out.append(f"the lock has {name}=={got}, the spec pins {name}=={pin}")
    return out


def render(text: str, pins: dict[str, str], sums: dict[str, str]) -> tuple[str, list[str]]:
    """The lock a spec installs and what stops it: ``text``'s selection for ``pins`` (its
    unmarked lines and the ``# opt-in:`` lines of the packages pinned), with ``sums`` added,
    and ``problems`` of that (``[]``: ``pip install --require-hashes`` of it can go ahead).

    One function for the preflight and the torch step, so both decide alike. Each host's
    preflight and torch step render the same file with the same pins (parsing every line with
    ``packaging``): the answer is kept per (text, pins, sums), and each caller gets its own list.
    """
    installed, found = _render(text, tuple(sorted(pins.items())), tuple(sorted(sums.items())))
    return installed, list(found)


@functools.lru_cache(maxsize=32)
def _render(
    text: str, pins: tuple[tuple[str, str], ...], sums: tuple[tuple[str, str], ...]
) -> tuple[str, tuple[str, ...]]:
    installed = with_sums(select(text, dict(pins)), dict(sums))
    return installed, tuple(problems(installed, dict(pins)))
