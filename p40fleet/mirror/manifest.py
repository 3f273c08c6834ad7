"""``DIR/manifest.json``: what a mirror holds, and the check of a mirror against it."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from p40fleet.mirror.fetch import sha256_of

MANIFEST = "manifest.json"
FORMAT = 1


@dataclass
class Entry:
    """One file (or, ``kind == "git"``, one bare repository and its pinned commit)."""

    kind: str  # artifact | wheel | git | apt | conda
    # the file name (an artifact's, a conda package's); name==version for a wheel; the repo
    # name for git; package=version for a .deb, the path under apt/ for the repository's own
    # index files (url "": made here)
    name: str
    path: str  # relative to the mirror dir
    url: str  # where it was fetched from
    sha256: str | None = None
    size: int | None = None
    commit: str | None = None


@dataclass
class Manifest:
    entries: dict[str, Entry] = field(default_factory=dict)  # by path

    @classmethod
    def load(cls, mirror: Path) -> Manifest:
        try:
            data = json.loads((mirror / MANIFEST).read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            raise ValueError(f"{mirror / MANIFEST}: unreadable ({exc})") from None
        if data.get("format") != FORMAT:
            raise ValueError(f"{mirror / MANIFEST}: unknown format {data.get('format')!r}")
        return cls({e["path"]: Entry(**e) for e in data["files"]})

    def save(self, mirror: Path) -> None:
        data = {"format": FORMAT, "files": [asdict(self.entries[p]) for p in sorted(self.entries)]}
        fd, tmp = tempfile.mkstemp(prefix=".manifest.", dir=mirror)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, mirror / MANIFEST)

    def add(self, entry: Entry) -> None:
        self.entries[entry.path] = entry

    def summary(self) -> dict[str, tuple[int, int]]:
        """``{kind: (files, bytes)}``."""
        out: dict[str, tuple[int, int]] = {}
        for entry in self.entries.values():
            files, size = out.get(entry.kind, (0, 0))
            out[entry.kind] = (files + 1, size + (entry.size or 0))
        return out


def has_commit(repo: Path, commit: str) -> bool:
    proc = subprocess.run(
        ["git", "--git-dir", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
    )
    return proc.returncode == 0


def verify(mirror: Path, progress: bool = False) -> tuple[list[str], int]:
    """Problems of ``mirror`` against its manifest (each names the file and what is wrong),
    and the number of entries checked. Every file is hashed again."""
    manifest = Manifest.load(mirror)
    if not manifest.entries:
        return [f"{mirror / MANIFEST}: no manifest (or an empty one): build the mirror first"], 0
    problems = []
    for path, entry in sorted(manifest.entries.items()):
        target = mirror / path
        if entry.kind == "git":
            if not target.is_dir():
                problems.append(f"{path}: missing (git mirror of {entry.url})")
            elif not has_commit(target, entry.commit or ""):
                problems.append(f"{path}: has no commit {entry.commit} (pinned)")
            continue
        if not target.is_file():
            problems.append(f"{path}: missing ({entry.kind} {entry.name})")
            continue
        if progress:
            print(f"  checking {path}", flush=True)
        size = target.stat().st_size
        if entry.size is not None and size != entry.size:
            problems.append(f"{path}: {size} bytes, the manifest says {entry.size}")
            continue
        got = sha256_of(target)
        if got != entry.sha256:
            problems.append(f"{path}: sha256 {got}, the manifest (the pin) says {entry.sha256}")
    return problems, len(manifest.entries)
