"""The lab's verl git remote: the real verl 0.5.0 source (PyPI sdist) as a bare, dumb-HTTP repo.

GitHub is out of reach in the lab, so the mirror serves ``/git/verl.git`` built here:

* commit 1: the sdist tree (minus the sdist's generated ``PKG-INFO``, ``*.egg-info/`` and the
  ``[egg_info]``-only ``setup.cfg``), tagged ``v0.5.0``;
* commit 2: a one-line README.md change, tagged ``v0.5.0-lab1`` (for the "verl ref bump" flow;
  its ``verl/`` tree is identical, so the v0.5.0 patch rules apply to it).

Author, committer, dates and messages are fixed, so the commit ids are stable across runs and
machines. They are NOT upstream's ids: upstream ``v0.5.0`` is 8fdc4d3f202f4146…, a commit with
upstream's whole history and files the sdist leaves out; this repo has one root commit holding
what the sdist ships.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERL_VERSION = "0.5.0"
REF = "v0.5.0"
BUMP_REF = "v0.5.0-lab1"
# What build_verl_remote produces (checked by the tests; not upstream's 8fdc4d3f…).
EXPECTED_COMMIT = "09f9dd5145005de13962f6f25784f1ab0096e765"
EXPECTED_BUMP_COMMIT = "7acbdb8b6c398db32a067b5a30365409591aedc8"

_DATE = "2025-07-23T00:00:00+00:00"  # the v0.5.0 release day
_IDENT = {
    "GIT_AUTHOR_NAME": "p40lab",
    "GIT_AUTHOR_EMAIL": "p40lab@lab.invalid",
    "GIT_AUTHOR_DATE": _DATE,
    "GIT_COMMITTER_NAME": "p40lab",
    "GIT_COMMITTER_EMAIL": "p40lab@lab.invalid",
    "GIT_COMMITTER_DATE": _DATE,
}
_SDIST_GENERATED = ("PKG-INFO", "setup.cfg", "verl.egg-info")


class VerlRemoteError(RuntimeError):
    pass


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(_IDENT)
    # no user/system config: a global excludesFile or autocrlf would change the tree
    env["GIT_CONFIG_GLOBAL"] = os.devnull
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["LC_ALL"] = "C"
    return env


def _git(*args: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(
        ["git", "-c", "core.autocrlf=false", "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        env=_git_env(),
        text=True,
        capture_output=True,
    )
    if proc.returncode != 0:
        raise VerlRemoteError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def fetch_verl_sdist(cache_dir: Path, version: str = VERL_VERSION) -> Path:
    """``verl-<version>.tar.gz`` from PyPI via ``pip download`` (kept in ``cache_dir``)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tarball = cache_dir / f"verl-{version}.tar.gz"
    if not tarball.exists():
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--disable-pip-version-check",
                "-d",
                str(cache_dir),
                f"verl=={version}",
            ],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        if proc.returncode != 0 or not tarball.exists():
            raise VerlRemoteError(f"pip download verl=={version} failed: {proc.stdout[-2000:]}")
    return tarball


def extract_sdist(tarball: Path, dest: Path, version: str = VERL_VERSION) -> Path:
    """Extract the sdist's top directory ``verl-<version>/`` as ``dest`` (must not exist)."""
    dest = Path(dest)
    if dest.exists():
        raise VerlRemoteError(f"{dest} already exists")
    top = f"verl-{version}"
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest.parent))
    try:
        with tarfile.open(tarball) as tf:
            members = [m for m in tf.getmembers() if m.isfile() or m.isdir()]
            for m in members:
                parts = Path(m.name).parts
                if not parts or parts[0] != top or ".." in parts or m.name.startswith("/"):
                    raise VerlRemoteError(f"unexpected path in {tarball}: {m.name}")
            if sys.version_info >= (3, 12):
                tf.extractall(tmp, members=members, filter="data")
            else:
                tf.extractall(tmp, members=members)  # names checked above
        shutil.move(str(tmp / top), str(dest))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _tag_commit(repo: Path, tag: str) -> str | None:
    try:
        return _git("rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}", cwd=repo)
    except VerlRemoteError:
        return None


def _build_work_repo(tarball: Path, work: Path) -> tuple[str, str]:
    tree = extract_sdist(tarball, work / "verl")
    for name in _SDIST_GENERATED:
        path = tree / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            if name == "setup.cfg" and path.read_text().strip().splitlines()[0] != "[egg_info]":
                continue  # a real setup.cfg: keep it
            path.unlink()
    _git("init", "-q", cwd=tree)
    _git("add", "-A", cwd=tree)
    _git("commit", "-q", "-m", f"verl {VERL_VERSION} (PyPI sdist)", cwd=tree)
    _git("tag", "-a", REF, "-m", f"verl {VERL_VERSION} from the PyPI sdist", cwd=tree)
    with open(tree / "README.md", "a", encoding="utf-8") as fh:
        fh.write("\n<!-- p40lab: v0.5.0-lab1, a ref-bump test tag; verl/ is unchanged -->\n")
    _git("commit", "-q", "-am", "p40lab: README marker for ref-bump tests", cwd=tree)
    _git("tag", "-a", BUMP_REF, "-m", "p40lab ref-bump test tag", cwd=tree)
    return _tag_commit(tree, REF) or "", _tag_commit(tree, BUMP_REF) or ""


def build_verl_remote(dest_git_dir: Path, cache_dir: Path) -> dict:
    """Create (or confirm) the bare repo ``dest_git_dir`` (e.g. ``MIRROR/git/verl.git``).

    Returns ``{'remote': str(dest_git_dir), 'ref': 'v0.5.0', 'commit': <id>, 'version':
    '0.5.0', 'bump_ref': 'v0.5.0-lab1', 'bump_commit': <id>}``. An existing repo whose tags
    already point at the same commits is left as it is; anything else there is replaced.
    """
    dest = Path(dest_git_dir)
    tarball = fetch_verl_sdist(Path(cache_dir))
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="verl-remote-", dir=dest.parent) as tmp:
        work = Path(tmp)
        commit, bump_commit = _build_work_repo(tarball, work)
        if not (commit and bump_commit):
            raise VerlRemoteError("tags missing after building the verl repo")
        if not (
            dest.exists()
            and _tag_commit(dest, REF) == commit
            and _tag_commit(dest, BUMP_REF) == bump_commit
        ):
            staged = work / "verl.git"
            _git("clone", "-q", "--bare", "--no-local", str(work / "verl"), str(staged))
            _git("update-server-info", cwd=staged)
            if dest.exists():
                shutil.rmtree(dest)
            shutil.move(str(staged), str(dest))
        else:
            _git("update-server-info", cwd=dest)
    return {
        "remote": str(dest),
        "ref": REF,
        "commit": commit,
        "version": VERL_VERSION,
        "bump_ref": BUMP_REF,
        "bump_commit": bump_commit,
    }
