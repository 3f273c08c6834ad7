"""What a fleet's specs need from upstream, and fetching it into a mirror dir, each byte checked.

:func:`needs_for` reads one validated spec: its four artifacts and training archives (by their
pinned sha256), every line of the hash-locked files the deploy installs (the torch lock as the
torch step renders it, the verl requirements lock: by each line's ``--hash``), and the git pins
(verl, Apex: by commit), and every package of the conda env's explicit lock
(``files/conda-env-<variant>.txt``: by each line's sha256, or its md5 where that is all the line
has). :func:`build` fetches what the mirror lacks; a second build fetches nothing. The wheel set
is the hosts' (the locks name the exact files the hosts install), never the controller's.
"""

from __future__ import annotations

import html
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from p40fleet import condalock, hashlock, preflight
from p40fleet.mirror import apt as apt_repo
from p40fleet.mirror.debian import AptError, Index, installed_packages
from p40fleet.mirror.fetch import FetchError, digest_of, fetch, sha256_of
from p40fleet.mirror.index import IndexFile, project_files
from p40fleet.mirror.manifest import Entry, Manifest, has_commit
from p40fleet.spec.pins import ARTIFACTS, GIT_PINS, PYPI_SIMPLE, StackSpec


class MirrorError(RuntimeError):
    """What the build could not get (every problem, one per line); what it got is kept
    (``result``: the build's record, when a build raised it)."""

    result: BuildResult | None = None


@dataclass(frozen=True)
class Need:
    """One thing the fleet fetches: an artifact, a locked wheel/sdist, a git pin, or a package
    of the conda lock."""

    kind: str  # artifact | wheel | git | conda
    # artifact: file name; wheel: canonical name==version; git: repo name; conda: SUBDIR/FILE
    name: str
    url: str | None = None  # artifact, git, conda: upstream; wheel: found on the indexes
    # artifact: (sha256,); wheel: the lock line's sums; conda: (sha256,), or () with md5
    hashes: tuple[str, ...] = ()
    size: int | None = None
    commit: str | None = None
    md5: str | None = None  # conda: the lock line's md5, when it has no sha256

    @property
    def project(self) -> str:
        return self.name.split("==", 1)[0]


def needs_for(
    spec: StackSpec, git_base_url: str | None = None, conda_upstream: str | None = None
) -> list[Need]:
    """Everything ``spec``'s hosts fetch: raises MirrorError when a lock cannot serve it.
    ``git_base_url``: clone the git pins from ``URL/NAME.git`` (a forge of yours, or the lab's
    stand-in for GitHub), not from their ``remote``. ``conda_upstream``: fetch the conda lock's
    files from ``URL/SUBDIR/FILE`` (a channel holding the same files), not from the lock's own
    channel."""
    needs = []
    for name in ARTIFACTS:
        artifact = getattr(spec, name)
        needs.append(Need("artifact", artifact.filename, str(artifact.url), (artifact.sha256,),
                          artifact.size))  # fmt: skip
    for which in ("model", "data"):
        archive = getattr(spec.training, which).archive
        if archive is not None and archive.url is not None:
            needs.append(Need("artifact", archive.filename, str(archive.url), (archive.sha256,),
                              archive.size))  # fmt: skip
    torch_text, problems = preflight.torch_lock(spec)
    if problems:
        raise MirrorError(f"{preflight.torch_lock_path(spec)}: " + "; ".join(problems))
    verl_lock = preflight.verl_requirements_path(spec)
    try:
        verl_text = verl_lock.read_text()
    except OSError as exc:
        raise MirrorError(f"{verl_lock}: cannot read it ({exc.strerror})") from None
    for line in hashlock.parse(torch_text) + hashlock.parse(verl_text):
        if not line.hashes or line.version is None:
            raise MirrorError(f"lock line {line.requirement!r} has no ==version and sha256")
        needs.append(Need("wheel", f"{line.name}=={line.version}", hashes=line.hashes))
    for name in GIT_PINS:
        pin = getattr(spec, name)
        remote = f"{git_base_url.rstrip('/')}/{name}.git" if git_base_url else str(pin.remote)
        needs.append(Need("git", name, remote, commit=pin.commit))
    return needs + conda_needs(spec, conda_upstream)


def conda_needs(spec: StackSpec, upstream: str | None = None) -> list[Need]:
    """The files of ``spec``'s conda lock, as the lock names them (its raw URLs: a
    ``stack.mirror.conda_channel`` only moves what the hosts are told, not where the mirror
    fetches from); raises MirrorError naming what stops ``conda create --file`` from it."""
    lock = preflight.conda_lock_path(spec)
    try:
        text = lock.read_text()
    except OSError as exc:
        raise MirrorError(f"{lock}: cannot read it ({exc.strerror})") from None
    problems = condalock.problems(text, spec.python_version)
    if problems:
        raise MirrorError(f"{lock}: " + "; ".join(problems))
    needs = []
    for package in condalock.parse(text):
        url = package.url
        if upstream:
            url = f"{upstream.rstrip('/')}/{package.subdir}/{package.filename}"
        hashes = (package.sha256,) if package.sha256 else ()
        needs.append(Need("conda", f"{package.subdir}/{package.filename}", url, hashes,
                          md5=None if package.sha256 else package.md5))  # fmt: skip
    return needs


def merge(needs: Iterable[Need]) -> list[Need]:
    """One of each; two specs that pin one name differently are an error (one mirror path)."""
    seen: dict[tuple[str, str], Need] = {}
    clashes = []
    for need in needs:
        key = (need.kind, need.name)
        other = seen.setdefault(key, need)
        if other != need and (other.hashes, other.commit, other.md5) != (
            need.hashes,
            need.commit,
            need.md5,
        ):
            clashes.append(f"{need.kind} {need.name}: pinned as {other.hashes or other.commit} "
                           f"and as {need.hashes or need.commit}")  # fmt: skip
    if clashes:
        raise MirrorError("\n".join(clashes))
    return list(seen.values())


@dataclass(frozen=True)
class AptPlan:
    """The apt part of a build: these packages and their closure, from ``upstream``."""

    packages: tuple[str, ...]
    upstream: apt_repo.Upstream = apt_repo.Upstream()
    refresh: bool = False  # read the upstream indexes again (else the cached ones)
    base_url: str = "http://MIRROR:8111"
    #: a host's dpkg status: what the hosts already have is not mirrored (their base system)
    installed: Path | None = None


@dataclass
class BuildResult:
    manifest: Manifest
    fetched: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind: (files, bytes)
    problems: list[str] = field(default_factory=list)
    apt: dict | None = None  # stack["mirror"]["apt"] once the apt repository is signed

    def count(self, kind: str, moved: int) -> None:
        files, size = self.fetched.get(kind, (0, 0))
        self.fetched[kind] = (files + 1, size + moved)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _kept(manifest: Manifest, path: str, hashes: Sequence[str], target: Path) -> bool:
    """Already in the mirror: recorded with one of ``hashes``, still that size and that sum
    (hashed again: a flipped byte is fetched again, not served; ~2 s per GB here)."""
    entry = manifest.entries.get(path)
    return (
        entry is not None
        and entry.sha256 in hashes
        and target.is_file()
        and target.stat().st_size == entry.size
        and sha256_of(target) == entry.sha256
    )


def build(
    mirror: Path,
    needs: Sequence[Need],
    *,
    indexes: Sequence[str] = (PYPI_SIMPLE,),
    progress: bool = True,
    apt: AptPlan | None = None,
) -> BuildResult:
    """Fetch into ``mirror`` what it lacks of ``needs`` (and, with ``apt``, the apt packages
    and their closure, republished signed); write the PEP 503 pages and the manifest. Every
    problem is collected (the rest is still fetched) and raised at the end."""
    mirror.mkdir(parents=True, exist_ok=True)
    result = BuildResult(Manifest.load(mirror))
    pages: dict[tuple[str, str], list[IndexFile]] = {}
    for need in needs:
        try:
            if need.kind == "artifact":
                _artifact(mirror, need, result, progress)
            elif need.kind == "wheel":
                _wheel(mirror, need, result, indexes, pages, progress)
            elif need.kind == "git":
                _git(mirror, need, result)
            elif need.kind == "conda":
                _conda(mirror, need, result, progress)
            else:
                raise MirrorError(f"unknown kind {need.kind!r}")
        except (FetchError, MirrorError) as exc:
            result.problems.append(f"{need.kind} {need.name}: {exc}")
        result.manifest.save(mirror)  # what is done stays done: a re-run resumes
    _write_index(mirror, result.manifest)
    if apt is not None:
        _apt(mirror, apt, result, progress)
    if result.problems:
        error = MirrorError("\n".join(result.problems))
        error.result = result
        raise error
    return result


def _artifact(mirror: Path, need: Need, result: BuildResult, progress: bool) -> None:
    path = f"artifacts/{need.name}"
    target = mirror / path
    if _kept(result.manifest, path, need.hashes, target):
        return
    if target.is_file() and sha256_of(target) == need.hashes[0]:
        moved = 0  # put there by hand (or an older build): checked, recorded
    else:
        _log(f"fetching {need.url}")
        moved = fetch(need.url or "", target, need.hashes[0], size=need.size, progress=progress)
        result.count("artifact", moved)
    result.manifest.add(Entry("artifact", need.name, path, need.url or "", need.hashes[0],
                              target.stat().st_size))  # fmt: skip


def _wheel(
    mirror: Path,
    need: Need,
    result: BuildResult,
    indexes: Sequence[str],
    pages: dict[tuple[str, str], list[IndexFile]],
    progress: bool,
) -> None:
    for entry in result.manifest.entries.values():
        if entry.kind == "wheel" and entry.name == need.name and entry.sha256 in need.hashes:
            if _kept(result.manifest, entry.path, need.hashes, mirror / entry.path):
                return
    tried = []
    for index in indexes:
        key = (index, need.project)
        if key not in pages:
            pages[key] = project_files(index, need.project)
        match = next((f for f in pages[key] if f.sha256 in need.hashes), None)
        tried.append(index)
        if match is None:
            continue
        path = f"simple/{need.project}/{match.filename}"
        target = mirror / path
        _log(f"fetching {match.url}")
        moved = fetch(match.url, target, match.sha256, progress=progress)
        result.count("wheel", moved)
        result.manifest.add(Entry("wheel", need.name, path, match.url, match.sha256,
                                  target.stat().st_size))  # fmt: skip
        return
    raise MirrorError(
        f"no index serves a file with the lock's sha256 ({', '.join(need.hashes)}); tried "
        f"{', '.join(tried)} — fix: add the index that has it (--index-url), or regenerate the lock"
    )


def _lock_sum_matches(target: Path, need: Need) -> bool:
    """``target`` has the sum the conda lock line gives (its sha256, else its md5)."""
    if need.hashes:
        return sha256_of(target) == need.hashes[0]
    return need.md5 is not None and digest_of(target, "md5") == need.md5


def _conda(mirror: Path, need: Need, result: BuildResult, progress: bool) -> None:
    """One package of the conda lock into ``DIR/conda/SUBDIR/FILE``: the path
    ``condalock.render`` moves the lock's URL to when ``conda_channel`` is ``BASE/conda``."""
    path = f"conda/{need.name}"
    target = mirror / path
    entry = result.manifest.entries.get(path)
    if (entry is not None and target.is_file() and target.stat().st_size == entry.size
            and sha256_of(target) == entry.sha256 and _lock_sum_matches(target, need)):  # fmt: skip
        return
    if target.is_file() and _lock_sum_matches(target, need):
        pass  # put there by hand (or an older build): checked, recorded
    else:
        _log(f"fetching {need.url}")
        moved = fetch(need.url or "", target, need.hashes[0] if need.hashes else None,
                      md5=need.md5, progress=progress)  # fmt: skip
        result.count("conda", moved)
    result.manifest.add(Entry("conda", need.name.rsplit("/", 1)[-1], path, need.url or "",
                              sha256_of(target), target.stat().st_size))  # fmt: skip


def _git(mirror: Path, need: Need, result: BuildResult) -> None:
    path = f"git/{need.name}.git"
    target = mirror / path
    commit = need.commit or ""
    if target.is_dir() and has_commit(target, commit):
        entry = result.manifest.entries.get(path)
        if entry is not None and entry.commit == commit:
            return
    elif target.is_dir():
        _log(f"fetching {need.url} into {path}")
        _run(["git", "--git-dir", str(target), "fetch", "--prune", "origin"], need)
        result.count("git", 0)
    else:
        _log(f"cloning {need.url} into {path}")
        partial = target.with_name(target.name + ".part")
        shutil.rmtree(partial, ignore_errors=True)
        _run(["git", "clone", "--quiet", "--mirror", need.url or "", str(partial)], need)
        if not has_commit(partial, commit):
            shutil.rmtree(partial, ignore_errors=True)
            raise MirrorError(f"{need.url} has no commit {commit} (pinned): not kept")
        partial.rename(target)
        result.count("git", 0)
    if not has_commit(target, commit):
        raise MirrorError(f"{need.url} has no commit {commit} (pinned)")
    _run(["git", "--git-dir", str(target), "update-server-info"], need)  # dumb HTTP
    result.manifest.add(Entry("git", need.name, path, need.url or "", commit=commit))


def _apt(mirror: Path, plan: AptPlan, result: BuildResult, progress: bool) -> None:
    """The closure of ``plan.packages`` into DIR/apt/pool; the signed index only once every
    .deb of it is there (an index naming a missing file would fail the hosts' installs)."""
    upstream = plan.upstream
    try:
        packages, notes = apt_repo.read_indexes(mirror, upstream, plan.refresh, _log)
        for note in notes:
            _log(f"WARNING {note}")
        installed = None
        if plan.installed is not None:
            try:
                status = plan.installed.read_text(errors="replace")
            except OSError as exc:
                raise MirrorError(f"--apt-installed {plan.installed}: {exc.strerror}") from None
            installed = Index(installed_packages(status))
            _log(f"apt: {len(installed.candidates)} packages the hosts have ({plan.installed}) "
                 "are not mirrored")  # fmt: skip
        chosen = Index(packages).closure(plan.packages, installed)
        _log(f"apt: {len(chosen)} packages in the closure of {', '.join(plan.packages)}")
        problems = apt_repo.fetch_debs(mirror, chosen, result.manifest, result.count,
                                       progress, _log)  # fmt: skip
        result.manifest.save(mirror)
        if problems:
            result.problems += problems
            result.problems.append("apt: the repository index is not written (or kept as it "
                                   "was) until every .deb above is fetched")  # fmt: skip
            return
        suite = upstream.mirror_suite
        if apt_repo.write_repository(mirror, suite, upstream.arch, chosen, result.manifest):
            _log(f"apt: signed {mirror / 'apt/dists' / suite / 'InRelease'}")
        result.manifest.save(mirror)
        result.apt = apt_repo.stack_apt(plan.base_url, suite, mirror)
    except (AptError, FetchError, MirrorError) as exc:
        result.problems += [f"apt: {line}" for line in str(exc).splitlines()]


def _run(command: list[str], need: Need) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise MirrorError(f"{' '.join(command[:3])} … failed: {proc.stderr.strip()[-500:]}")


def _write_index(mirror: Path, manifest: Manifest) -> None:
    """PEP 503 pages under ``simple/`` for the wheels the manifest holds (sha256 fragments)."""
    projects: dict[str, list[Entry]] = {}
    for entry in manifest.entries.values():
        if entry.kind == "wheel":
            projects.setdefault(canonicalize_name(entry.name.split("==")[0]), []).append(entry)
    root = mirror / "simple"
    if not projects:
        return
    root.mkdir(exist_ok=True)
    links = []
    for project in sorted(projects):
        files = sorted(projects[project], key=lambda e: e.path)
        anchors = "".join(
            f'<a href="{html.escape(Path(e.path).name)}#sha256={e.sha256}">'
            f"{html.escape(Path(e.path).name)}</a><br>\n"
            for e in files
        )
        (root / project).mkdir(exist_ok=True)
        (root / project / "index.html").write_text(
            f"<!DOCTYPE html>\n<html><body>\n{anchors}</body></html>\n"
        )
        links.append(f'<a href="{project}/">{project}</a><br>\n')
    (root / "index.html").write_text(
        "<!DOCTYPE html>\n<html><body>\n" + "".join(links) + "</body></html>\n"
    )


def stack_block(base_url: str, apt: dict | None = None, conda: bool = False) -> dict:
    """The ``stack["mirror"]`` settings that point a fleet at this mirror served at base_url
    (``apt``: the signed apt repository's, from the build; ``conda``: the mirror holds the
    conda lock's files, under ``conda/``)."""
    base = base_url.rstrip("/")
    block: dict = {
        "artifacts_url": f"{base}/artifacts",
        "pip_index_url": f"{base}/simple",
        "git_base_url": f"{base}/git",
    }
    if conda:
        block["conda_channel"] = f"{base}/conda"
    if apt is not None:
        block["apt"] = apt
    return block
