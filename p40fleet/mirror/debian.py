"""Reading an apt repository: deb822 paragraphs, Release sums, Debian versions, relations, and
the dependency closure of a set of packages resolved from Packages indexes (issue 27).

What the resolver simplifies (an air-gapped host's apt does the real resolution against the
mirror; the closure only has to hold every package that resolution can pick):

- it follows ``Pre-Depends`` and ``Depends`` only: not ``Recommends`` (apt installs them by
  default but skips one no source has, without an error), ``Suggests``, ``Conflicts`` or
  ``Breaks``;
- one candidate per package name: the highest version across every index read (as apt's
  default pin, all suites at priority 500); an older version named by ``(<< V)`` is an error
  that names the relation, not a search through older versions;
- alternatives ``a | b``: a group already satisfied by the closure adds nothing, else the first
  alternative that a real package (or, for a virtual name, the provider first by name)
  satisfies; ``Provides: x (= V)`` satisfies a versioned relation on ``x``, an unversioned
  ``Provides`` only an unversioned one (Debian policy 7.5);
- architecture: the indexes of one architecture (``binary-amd64``, whose ``Architecture: all``
  packages they list too); a qualifier ``:any`` / ``:native`` is dropped; ``Multi-Arch`` is
  not looked at;
- the closure holds everything reached, Essential packages a stock host already has included
  (libc6 and the like): more bytes, never a missing dependency.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: The operators of a versioned relation (``<`` and ``>`` are the obsolete spellings of
#: ``<=`` and ``>=``, still accepted by dpkg).
_OPS = ("<<", "<=", "=", ">=", ">>", "<", ">")
_RELATION = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9+.-]*)(?::(?P<arch>[a-z0-9-]+))?\s*"
    r"(?:\(\s*(?P<op><<|<=|>=|>>|=|<|>)\s*(?P<version>[^)\s]+)\s*\))?\s*"
    r"(?:\[[^\]]*\])?\s*(?:<[^>]*>\s*)*$"
)


class AptError(ValueError):
    """A repository file that does not parse, or a relation the indexes cannot satisfy."""


def paragraphs(text: str) -> list[dict[str, str]]:
    """The deb822 paragraphs of ``text`` (a Packages index, a Release file): field names as
    written, continuation lines joined with newlines (their leading space dropped)."""
    out: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            if current:
                out.append(current)
            current, last = {}, None
        elif line.startswith("#") and not current:
            continue
        elif line[0] in " \t":
            if last is None:
                raise AptError(f"line {number}: a continuation line outside a field")
            current[last] += "\n" + line[1:]
        else:
            name, colon, value = line.partition(":")
            if not colon or not name or " " in name:
                raise AptError(f"line {number}: expected 'Field: value', got {line[:60]!r}")
            last = name
            current[name] = value.strip()
    if current:
        out.append(current)
    return out


def field_of(stanza: Mapping[str, str], name: str) -> str | None:
    """Field ``name`` of a paragraph, ignoring case (deb822 field names are case-insensitive)."""
    lowered = name.lower()
    return next((v for k, v in stanza.items() if k.lower() == lowered), None)


def release_sums(text: str) -> dict[str, tuple[str, int]]:
    """``{path: (sha256, size)}`` from a Release file's ``SHA256`` field."""
    sums = release_hashes(text, "SHA256")
    if sums is None:
        raise AptError("no SHA256 field (apt needs SHA256 sums; MD5Sum/SHA1 are not enough)")
    return sums


#: The hex length of each hash field of a Release file.
_HASH_LENGTHS = {"MD5Sum": 32, "SHA1": 40, "SHA256": 64, "SHA512": 128}


def release_hashes(text: str, field: str) -> dict[str, tuple[str, int]] | None:
    """``{path: (hex, size)}`` from a Release file's hash field ``field`` (``SHA256``,
    ``MD5Sum``, ...), None when the Release has no such field."""
    if text.startswith("-----BEGIN PGP SIGNED MESSAGE-----"):
        raise AptError("an InRelease (clearsigned) text: give the plain Release file")
    fields = paragraphs(text)
    value = field_of(fields[0], field) if fields else None
    if value is None:
        return None
    digits = _HASH_LENGTHS.get(field, 64)
    sums = {}
    for line in value.splitlines():
        parts = line.split()
        if not parts:
            continue
        if (len(parts) != 3 or not re.fullmatch(rf"[0-9a-f]{{{digits}}}", parts[0])
                or not parts[1].isdigit()):  # fmt: skip
            raise AptError(f"{field} line {line.strip()!r}: expected 'SUM SIZE PATH'")
        sums[parts[2]] = (parts[0], int(parts[1]))
    return sums


# -- Debian versions (Debian policy 5.6.12, dpkg's verrevcmp) --------------------------------


def _split(version: str) -> tuple[int, str, str]:
    epoch, colon, rest = version.partition(":")
    if not colon:
        epoch, rest = "0", version
    if not epoch.isdigit():
        raise AptError(f"version {version!r}: the epoch is not a number")
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, ""
    return int(epoch), upstream, revision


def _order(char: str) -> int:
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _verrevcmp(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def compare_versions(a: str, b: str) -> int:
    """<0, 0, >0 as Debian version ``a`` sorts before, as, after ``b`` (dpkg's order)."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return ea - eb
    return _verrevcmp(ua, ub) or _verrevcmp(ra, rb)


def satisfies(version: str, op: str, wanted: str) -> bool:
    c = compare_versions(version, wanted)
    return {
        "<<": c < 0,
        "<=": c <= 0,
        "<": c <= 0,
        "=": c == 0,
        ">=": c >= 0,
        ">": c >= 0,
        ">>": c > 0,
    }[op]


# -- relations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Relation:
    name: str
    op: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        return f"{self.name} ({self.op} {self.version})" if self.op else self.name


def relations(value: str | None) -> list[list[Relation]]:
    """A ``Depends``-style field: the comma-separated groups, each its ``|`` alternatives."""
    groups = []
    for group in (value or "").replace("\n", " ").split(","):
        if not group.strip():
            continue
        alternatives = []
        for alt in group.split("|"):
            match = _RELATION.match(alt.strip())
            if match is None:
                raise AptError(f"relation {alt.strip()!r}: expected NAME [(OP VERSION)]")
            alternatives.append(Relation(match["name"], match["op"], match["version"]))
        groups.append(alternatives)
    return groups


# -- the closure ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Package:
    """One binary package of an index: its paragraph and where the index came from."""

    stanza: Mapping[str, str]
    base_url: str  # the repository root its Filename is relative to
    flat: bool = False  # from a flat repository's index (its .deb kept under the mirror's pool/)

    @property
    def name(self) -> str:
        return self.stanza["Package"]

    @property
    def version(self) -> str:
        return self.stanza["Version"]

    def provides(self) -> list[Relation]:
        return [group[0] for group in relations(field_of(self.stanza, "Provides"))]


def installed_packages(status_text: str) -> list[Package]:
    """The installed packages of a dpkg status file (``/var/lib/dpkg/status``): the paragraphs
    whose ``Status`` ends in ``installed``."""
    return [
        Package(stanza, "")
        for stanza in paragraphs(status_text)
        if "Package" in stanza
        and "Version" in stanza
        and (field_of(stanza, "Status") or "").split()[-1:] == ["installed"]
    ]


class Index:
    """The packages of several Packages indexes: one candidate per name (the highest version)
    and who provides each virtual name."""

    def __init__(self, packages: Iterable[Package]):
        self.candidates: dict[str, Package] = {}
        for package in packages:
            other = self.candidates.get(package.name)
            if other is None or compare_versions(package.version, other.version) > 0:
                self.candidates[package.name] = package
        self.providers: dict[str, list[tuple[Package, Relation]]] = {}
        for package in sorted(self.candidates.values(), key=lambda p: p.name):
            for provided in package.provides():
                self.providers.setdefault(provided.name, []).append((package, provided))

    def _real(self, rel: Relation) -> Package | None:
        package = self.candidates.get(rel.name)
        if package is None:
            return None
        if rel.op is None or satisfies(package.version, rel.op, rel.version or ""):
            return package
        return None

    def _provider(self, rel: Relation, among: Mapping[str, Package] | None = None):
        for package, provided in self.providers.get(rel.name, []):
            if among is not None and among.get(package.name) is not package:
                continue
            if rel.op is None:
                return package
            if provided.op == "=" and satisfies(provided.version or "", rel.op, rel.version or ""):
                return package
        return None

    def _satisfied_by(self, rel: Relation, chosen: Mapping[str, Package]) -> bool:
        package = chosen.get(rel.name)
        if package is not None and (
            rel.op is None or satisfies(package.version, rel.op, rel.version or "")
        ):
            return True
        return self._provider(rel, chosen) is not None

    def closure(self, roots: Iterable[str], installed: Index | None = None) -> dict[str, Package]:
        """Every package ``roots`` need (Pre-Depends, Depends), by name; raises
        :class:`AptError` naming each relation nothing satisfies and who asked for it.
        ``installed``: what every host already has (its dpkg status): a dependency one of
        those satisfies is not mirrored, nor what it needs; the roots always are."""
        chosen: dict[str, Package] = {}
        problems: list[str] = []
        queue: list[tuple[list[Relation], str]] = [([Relation(r)], "asked for") for r in roots]
        while queue:
            group, by = queue.pop(0)
            if any(self._satisfied_by(rel, chosen) for rel in group):
                continue
            if (
                installed is not None
                and by != "asked for"
                and any(installed._real(rel) or installed._provider(rel) for rel in group)
            ):
                continue
            pick = next(
                (p for rel in group for p in (self._real(rel) or self._provider(rel),) if p),
                None,
            )
            if pick is None:
                alts = " | ".join(map(str, group))
                problems.append(f"{alts} ({by}): no package of the upstream indexes has it")
                continue
            chosen[pick.name] = pick
            for name in ("Pre-Depends", "Depends"):
                for sub in relations(field_of(pick.stanza, name)):
                    queue.append((sub, f"{name} of {pick.name} {pick.version}"))
        if problems:
            raise AptError("\n".join(problems))
        return chosen
