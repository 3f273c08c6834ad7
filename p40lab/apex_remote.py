"""The lab's ``apex`` git remote: a bare repo holding the Apex stand-in, tagged ``25.09``.

The real pin is NVIDIA/apex tag ``25.09``; the lab serves a repository with the same tag name
over dumb HTTP (``<mirror>/git/apex.git``), so deploys clone and check out the tag the same way.
The commit is reproducible: the stand-in tree is committed with a fixed author, committer and
date, so the same tree always gives the same commit id. Re-running is a no-op when the tag
already points at that commit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from p40lab.state import LabError

STANDIN_DIR = Path(__file__).resolve().parent / "apex_standin"
TAG = "25.09"
BRANCH = "master"
FIXED_DATE = "2025-08-04T00:00:00+00:00"  # the day the real 25.09 tag's commit was made
IDENTITY = {
    "GIT_AUTHOR_NAME": "p40lab",
    "GIT_AUTHOR_EMAIL": "p40lab@lab.invalid",
    "GIT_AUTHOR_DATE": FIXED_DATE,
    "GIT_COMMITTER_NAME": "p40lab",
    "GIT_COMMITTER_EMAIL": "p40lab@lab.invalid",
    "GIT_COMMITTER_DATE": FIXED_DATE,
}
# build leftovers that must never be committed
_SKIP_DIRS = {"__pycache__", "build", "dist", ".eggs"}
_SKIP_SUFFIXES = (".pyc", ".so", ".o")


def _git(*args: str, cwd: Path | None = None) -> str:
    env = dict(os.environ, **IDENTITY)
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["HOME"] = env.get("HOME", "/root")
    env.pop("GIT_DIR", None)
    cmd = ["git", "-c", "init.defaultBranch=" + BRANCH, "-c", "commit.gpgsign=false"]
    cmd += ["-c", "tag.gpgsign=false", "-c", "core.autocrlf=false", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True)
    if proc.returncode != 0:
        raise LabError(f"`git {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def standin_files(src: Path = STANDIN_DIR) -> list[Path]:
    """The stand-in's source files (relative paths), without build leftovers."""
    out = []
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(part in _SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_file() and not path.name.endswith(_SKIP_SUFFIXES):
            out.append(rel)
    return out


def build_apex_remote(
    dest_git_dir: Path, *, url: str | None = None, src: Path = STANDIN_DIR
) -> dict[str, Any]:
    """Create/refresh the bare repo ``dest_git_dir`` (e.g. ``<mirror>/git/apex.git``).

    Returns ``{'remote': url or the bare repo's path, 'ref': '25.09', 'commit': <sha>,
    'changed': bool}``.
    """
    dest = Path(dest_git_dir)
    if not (src / "setup.py").exists():
        raise LabError(f"apex stand-in source missing: {src}/setup.py")
    with tempfile.TemporaryDirectory(prefix="p40lab-apex-") as tmp:
        work = Path(tmp) / "apex"
        work.mkdir()
        for rel in standin_files(src):
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, work / rel)
            os.chmod(work / rel, 0o644)
        _git("init", "-q", cwd=work)
        _git("add", "-A", cwd=work)
        _git("commit", "-q", "-m", f"Apex stand-in for the p40fleet lab ({TAG})", cwd=work)
        commit = _git("rev-parse", "HEAD", cwd=work)

        if not (dest / "HEAD").exists():
            dest.mkdir(parents=True, exist_ok=True)
            _git("init", "-q", "--bare", str(dest))
        try:
            current = _git("rev-parse", "-q", "--verify", f"refs/tags/{TAG}^{{commit}}", cwd=dest)
        except LabError:
            current = ""
        changed = current != commit
        if changed:
            _git("push", "-q", "--force", str(dest), f"HEAD:refs/heads/{BRANCH}", cwd=work)
            _git("push", "-q", "--force", str(dest), f"HEAD:refs/tags/{TAG}", cwd=work)
            _git("symbolic-ref", "HEAD", f"refs/heads/{BRANCH}", cwd=dest)
        # dumb HTTP clients read info/refs and objects/info/packs
        _git("update-server-info", cwd=dest)
    for path in dest.rglob("*"):  # served by the mirror: world-readable
        path.chmod(0o755 if path.is_dir() else 0o644)
    return {"remote": url or str(dest), "ref": TAG, "commit": commit, "changed": changed}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(description="build the lab's apex git remote")
    ap.add_argument("dest", type=Path)
    ap.add_argument("--url", default=None)
    args = ap.parse_args(argv)
    try:
        print(json.dumps(build_apex_remote(args.dest, url=args.url), indent=2))
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
