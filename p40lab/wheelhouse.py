"""The lab's Python mirror: a wheelhouse plus a PEP 503 simple index, built on the controller.

Layout under ``dest`` (served by the mirror at ``<base>/``)::

    dest/wheels/<file>.whl                   find-links directory (flat)
    dest/simple/index.html                   project list
    dest/simple/<normalized-name>/index.html one page per project, relative links
                                             ``../../wheels/<file>#sha256=<hex>``
    dest/.wheelhouse.json                    stamp: hash of the requirement list + the result

Hosts are Debian bookworm (glibc 2.36) with CPython 3.11, so wheels are fetched with
``pip download --only-binary :all: --platform ... --python-version 3.11 --implementation cp
--abi cp311``. Projects that ship only an sdist cannot be fetched that way; when the controller
itself is CPython 3.11 the fallback is ``pip wheel --prefer-binary``, which builds those into
wheels here so the hosts never need a build backend from the network.

The lab's torch is the CPU build the lab hosts (``/opt/wheels``, ``2.13.0+cpu``): the real
cu118 index uses absolute links that a naive proxy breaks, and the simulated hosts have no CUDA
anyway. Re-running with the same requirement list is a no-op (see the stamp).

Hashes: the hosts install ``files/torch-requirements-lab.txt`` and ``files/verl-requirements-
lab.txt`` with ``pip install --require-hashes``, so the mirror must serve files with exactly
those sums. Hashed lines are fetched in pip's hash-checking mode (a PyPI file with another sum
stops the build), and afterwards every hashed line must match a served file. A project that
ships only an sdist (antlr4-python3-runtime 4.9.3) is built into a wheel here for unhashed use,
but a locally built wheel has no stable sum (timestamps, build tools), so the lock lists the
sdist's published sum instead and the mirror serves that sdist too: the host checks it and
builds it with the env's hashed setuptools (``--no-build-isolation``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import html
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from p40lab.state import MIRROR_URL, LabError
from p40lab.util import log, sha256_file

REPO_ROOT = Path(__file__).resolve().parent.parent
VERL_REQUIREMENTS = REPO_ROOT / "files" / "verl-requirements-lab.txt"
TORCH_LOCK = REPO_ROOT / "files" / "torch-requirements-lab.txt"
TORCH_WHEELS = Path(os.environ.get("P40LAB_TORCH_WHEELS", "/opt/wheels"))
TORCH_VERSION = "2.13.0+cpu"
TORCH_REQUIREMENT = f"torch=={TORCH_VERSION}"

# torch and its closure (setuptools included) and ninja (the Apex build's) come hash-locked from
# TORCH_LOCK; wheel and pip are served for hand-run builds on a host without network (no deploy
# step installs them).
BASE_REQUIREMENTS = ["wheel", "pip"]

PYTHON_VERSION = "3.11"
ABI = "cp311"
# bookworm has glibc 2.36: every manylinux tag up to 2_36 runs there. pip does not expand a
# perennial manylinux tag to the older ones by itself, so list them all.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
MAX_BYTES = 1_500 * 1024 * 1024  # budget for the mirror's Python side
STAMP = ".wheelhouse.json"
STAMP_VERSION = 2  # 2: hashed lines are checked against the served files, sdists served
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def normalize(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def default_requirements() -> list[str]:
    """The lab's torch lock, ``files/verl-requirements-lab.txt`` and the base tools."""
    reqs: list[str] = []
    for path in (TORCH_LOCK, VERL_REQUIREMENTS):
        if path.exists():
            reqs += read_requirements(path)
    return reqs + BASE_REQUIREMENTS


def line_hashes(line: str) -> list[str]:
    """The ``--hash=sha256:`` sums of a requirement line."""
    return _HASH.findall(line)


def read_requirements(path: Path) -> list[str]:
    """Requirement lines of a requirements file (comments, blanks and option lines dropped).

    ``-r other.txt`` includes are followed relative to the file.
    """
    out: list[str] = []
    for raw in Path(path).read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            out += read_requirements(Path(path).parent / line.split(None, 1)[1].strip())
            continue
        if line.startswith("-"):  # --index-url, --no-deps, -e ... : not ours to mirror
            continue
        out.append(line)
    return out


def _requirements_hash(reqs: list[str]) -> str:
    payload = json.dumps(
        {"v": STAMP_VERSION, "reqs": reqs, "platforms": PLATFORMS, "py": PYTHON_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / ".wheelhouse.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _pip_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return env


def _find_links_args() -> list[str]:
    return ["--find-links", str(TORCH_WHEELS)] if TORCH_WHEELS.is_dir() else []


def _split(req_file: Path) -> tuple[Path, Path]:
    """Hashed and unhashed lines in two files: pip's hash-checking mode takes all or none."""
    lines = [line for line in req_file.read_text().splitlines() if line.strip()]
    hashed, plain = req_file.with_suffix(".hashed.txt"), req_file.with_suffix(".plain.txt")
    hashed.write_text("".join(f"{line}\n" for line in lines if line_hashes(line)))
    plain.write_text("".join(f"{line}\n" for line in lines if not line_hashes(line)))
    return hashed, plain


def _download(wheels: Path, req_file: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "download", "--dest", str(wheels)]
    cmd += ["--only-binary", ":all:", "--python-version", PYTHON_VERSION]
    cmd += ["--implementation", "cp", "--abi", ABI, "--abi", "abi3", "--abi", "none"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    cmd += _find_links_args() + ["-r", str(req_file)]
    log(f"wheelhouse: pip download ({req_file.read_text().count(chr(10))} requirements)")
    return subprocess.run(cmd, env=_pip_env(), text=True, capture_output=True)


def _wheel_fallback(wheels: Path, req_file: Path) -> subprocess.CompletedProcess:
    # --use-pep517: an sdist without pyproject.toml (antlr4-python3-runtime 4.9.3, hydra-core's
    # pin) is otherwise built with the legacy `setup.py bdist_wheel`, which fails with "invalid
    # command 'bdist_wheel'" in a stock venv that has no `wheel`; PEP 517 builds it in an
    # isolated env that gets setuptools and wheel from the index.
    cmd = [sys.executable, "-m", "pip", "wheel", "--prefer-binary", "--use-pep517"]
    cmd += ["--wheel-dir", str(wheels)]
    cmd += _find_links_args() + ["-r", str(req_file)]
    log("wheelhouse: some projects have no cp311 wheel; building them with pip wheel")
    return subprocess.run(cmd, env=_pip_env(), text=True, capture_output=True)


def _fetch(wheels: Path, req_file: Path) -> None:
    """``pip download`` ``req_file``; on a cp311 controller, build what has no wheel."""
    proc = _download(wheels, req_file)
    if proc.returncode == 0:
        return
    no_binary = "No matching distribution" in proc.stderr or (
        "Could not find a version" in proc.stderr
    )
    is_target = sys.version_info[:2] == (3, 11) and sys.platform == "linux"
    if not (no_binary and is_target):
        raise LabError(f"wheelhouse: pip download failed:\n{proc.stderr.strip()[-3000:]}")
    proc = _wheel_fallback(wheels, req_file)
    if proc.returncode != 0:
        raise LabError(f"wheelhouse: pip wheel failed:\n{proc.stderr.strip()[-3000:]}")


def _served(wheels: Path) -> list[Path]:
    """The files the mirror serves: wheels, and the sdists hashed lines name."""
    return sorted([*wheels.glob("*.whl"), *wheels.glob("*.tar.gz")])


def _serve_hashed(dest: Path, reqs: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Index ``dest``; every hashed line must match a served file (fetch its sdist if none does).

    Returns write_index's projects. Raises LabError naming the lines no served file matches.
    """
    projects = write_index(dest)

    def missing() -> list[str]:
        sums = {f["sha256"] for files in projects.values() for f in files}
        return [r for r in reqs if line_hashes(r) and not sums & set(line_hashes(r))]

    lost = missing()
    if lost:
        # The lock names the sdist's published sum (a wheel built here has no stable one).
        sdists = dest / ".requirements.sdist.txt"
        sdists.write_text("".join(f"{r}\n" for r in lost))
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        cmd += ["--dest", str(dest / "wheels"), "-r", str(sdists)]
        log(f"wheelhouse: {len(lost)} locked line(s) match no wheel: fetching their sdists")
        subprocess.run(cmd, env=_pip_env(), text=True, capture_output=True)
        projects = write_index(dest)
        lost = missing()
    if lost:
        raise LabError(
            "wheelhouse: no served file has the sha256 the lock lists for: "
            + "; ".join(r.split(" --", 1)[0] for r in lost)
            + " — regenerate the lock's hashes (see its header) or check what PyPI serves"
        )
    return projects


def _wheel_meta(path: Path) -> tuple[str, str, str | None]:
    """(project name, version, Requires-Python) of a wheel, from its METADATA (sdist: its name)."""
    if path.name.endswith(".tar.gz"):
        name, _, version = path.name.removesuffix(".tar.gz").rpartition("-")
        return name, version, None
    name, version = path.name.split("-")[:2]
    requires_python = None
    try:
        with zipfile.ZipFile(path) as zf:
            meta_name = next(
                n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
            )
            for line in zf.read(meta_name).decode("utf-8", "replace").splitlines():
                if not line:
                    break  # end of the headers
                key, _, value = line.partition(":")
                if key == "Name":
                    name = value.strip()
                elif key == "Version":
                    version = value.strip()
                elif key == "Requires-Python":
                    requires_python = value.strip()
    except (zipfile.BadZipFile, StopIteration, OSError) as exc:
        raise LabError(f"wheelhouse: {path.name} is not a readable wheel: {exc}") from exc
    return name, version, requires_python


def write_index(dest: Path) -> dict[str, list[dict[str, Any]]]:
    """(Re)write dest/simple from dest/wheels; returns {project: [file entries]}."""
    wheels = dest / "wheels"
    simple = dest / "simple"
    projects: dict[str, list[dict[str, Any]]] = {}
    sums_cache_path = dest / ".sha256.json"
    try:
        sums_cache = json.loads(sums_cache_path.read_text())
    except (OSError, json.JSONDecodeError):
        sums_cache = {}
    new_cache: dict[str, Any] = {}
    for whl in _served(wheels):
        st = whl.stat()
        key = f"{whl.name}:{st.st_size}:{int(st.st_mtime)}"
        cached = sums_cache.get(key)
        if cached is None:
            name, version, rp = _wheel_meta(whl)
            cached = {"name": name, "version": version, "requires_python": rp}
            cached["sha256"] = sha256_file(whl)
        new_cache[key] = cached
        entry = dict(cached, filename=whl.name, size=st.st_size)
        projects.setdefault(normalize(cached["name"]), []).append(entry)
    sums_cache_path.write_text(json.dumps(new_cache, indent=1, sort_keys=True))

    simple.mkdir(parents=True, exist_ok=True)
    for stale in simple.iterdir():
        if stale.is_dir() and stale.name not in projects:
            for f in stale.iterdir():
                f.unlink()
            stale.rmdir()
    for project, files in sorted(projects.items()):
        links = []
        for f in files:
            attr = ""
            if f["requires_python"]:
                attr = f' data-requires-python="{html.escape(f["requires_python"], quote=True)}"'
            href = f"../../wheels/{f['filename']}#sha256={f['sha256']}"
            links.append(
                f'    <a href="{html.escape(href)}"{attr}>{html.escape(f["filename"])}</a><br/>'
            )
        page = (
            '<!DOCTYPE html>\n<html>\n  <head><meta name="pypi:repository-version" '
            f'content="1.0"><title>Links for {project}</title></head>\n  <body>\n'
            f"    <h1>Links for {project}</h1>\n" + "\n".join(links) + "\n  </body>\n</html>\n"
        )
        (simple / project).mkdir(exist_ok=True)
        _write_if_changed(simple / project / "index.html", page)
    root = "\n".join(f'    <a href="{p}/">{p}</a><br/>' for p in sorted(projects))
    _write_if_changed(
        simple / "index.html",
        "<!DOCTYPE html>\n<html>\n  <head><title>Simple index</title></head>\n  <body>\n"
        + root
        + "\n  </body>\n</html>\n",
    )
    return projects


def _write_if_changed(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in _served(path))


def build_wheelhouse(
    dest: Path,
    requirements: list[str] | Path | None = None,
    *,
    base_url: str = MIRROR_URL,
    max_bytes: int = MAX_BYTES,
) -> dict[str, Any]:
    """Fill ``dest/wheels`` + ``dest/simple`` for ``requirements`` (default: see module doc).

    Returns ``{'pip_index_url': '<base>/simple', 'pip_find_links': '<base>/wheels',
    'torch': {'version', 'filename', 'sha256', 'requirement'} | None, 'projects': N,
    'files': N, 'bytes': N, 'seconds': float, 'cached': bool, 'requirements': [...],
    'path': str(dest)}``. Raises LabError when pip cannot satisfy the list or the result
    exceeds ``max_bytes``.
    """
    dest = Path(dest)
    if requirements is None:
        reqs = default_requirements()
    elif isinstance(requirements, (str, Path)):
        reqs = read_requirements(Path(requirements))
    else:
        reqs = [r.strip() for r in requirements if r.strip()]
    if not reqs:
        raise LabError("wheelhouse: empty requirement list")
    base = base_url.rstrip("/")
    digest = _requirements_hash(reqs)
    t0 = time.monotonic()

    with _locked(dest):
        stamp_path = dest / STAMP
        try:
            stamp = json.loads(stamp_path.read_text())
        except (OSError, json.JSONDecodeError):
            stamp = {}
        result = stamp.get("result") or {}
        if (
            stamp.get("hash") == digest
            and (dest / "simple" / "index.html").exists()
            and all((dest / "wheels" / f).exists() for f in stamp.get("files", []))
        ):
            result = dict(result, cached=True, seconds=round(time.monotonic() - t0, 3))
            result["pip_index_url"] = f"{base}/simple"
            result["pip_find_links"] = f"{base}/wheels"
            return result

        wheels = dest / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        req_file = dest / ".requirements.txt"
        req_file.write_text("".join(r + "\n" for r in reqs))
        before = {p.name for p in _served(wheels)}
        for part in _split(req_file):
            if part.read_text().strip():
                _fetch(wheels, part)
        for leftover in wheels.iterdir():  # pip download may leave sdists behind: not served
            if not leftover.name.endswith(".whl") and leftover.is_file():
                leftover.unlink()
        projects = _serve_hashed(dest, reqs)
        total = _dir_bytes(wheels)
        if total > max_bytes:
            raise LabError(
                f"wheelhouse: {total / 2**20:.0f} MiB exceeds the budget of "
                f"{max_bytes / 2**20:.0f} MiB (requirements: {', '.join(reqs)})"
            )
        torch_files = sorted(projects.get("torch", []), key=lambda f: f["version"] != TORCH_VERSION)
        torch_info = None
        if torch_files:
            f = torch_files[0]
            torch_info = {
                "version": f["version"],
                "filename": f["filename"],
                "sha256": f["sha256"],
                "requirement": f"torch=={f['version']}",
            }
        files = sorted(p.name for p in _served(wheels))
        result = {
            "pip_index_url": f"{base}/simple",
            "pip_find_links": f"{base}/wheels",
            "torch": torch_info,
            "requirements": reqs,
            "projects": len(projects),
            "files": len(files),
            "new_files": len(set(files) - before),
            "bytes": total,
            "seconds": round(time.monotonic() - t0, 1),
            "cached": False,
            "path": str(dest),
        }
        stamp_path.write_text(
            json.dumps({"hash": digest, "files": files, "result": result}, indent=2) + "\n"
        )
        log(
            f"wheelhouse: {len(files)} wheels, {len(projects)} projects, "
            f"{total / 2**20:.0f} MiB in {result['seconds']}s"
        )
        return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="build the lab's Python wheelhouse")
    ap.add_argument("dest", type=Path)
    ap.add_argument("-r", "--requirements", type=Path, default=None)
    ap.add_argument("--base-url", default=MIRROR_URL)
    args = ap.parse_args(argv)
    try:
        res = build_wheelhouse(args.dest, args.requirements, base_url=args.base_url)
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
