"""The lab's mirror: the lab's stand-in for upstream (the installer doubles, the wheelhouse,
the git remotes, the conda channel, the flat apt repository) and the mirror the hosts use, built
from that upstream by ``p40fleet.mirror`` itself, as an admin builds a real lab's (#27).

The mirror dir (``$P40LAB_CACHE/mirror``, default ``/var/cache/p40lab/mirror``) is what
``p40fleet.mirror build`` writes (``manifest.json``, ``artifacts/``, ``simple/``, ``git/``,
``conda/``, a signed dists-style ``apt/``); its ``upstream/`` is the world the build fetches from,
served at ``BASE_URL/upstream/`` to the controller only (:mod:`p40lab.httpd` answers a host 403
there, as the world does not answer an air-gapped host). Upstream's layout (other modules add
``simple/``, ``wheels/``, ``git/``, ``conda/`` beside; this module owns ``artifacts/`` and
``apt/``)::

    artifacts/NVIDIA-Linux-x86_64-525.147.05.run       driver double (makeself-style, sh FILE)
    artifacts/NVIDIA-Linux-x86_64-525.125.06.run       older R525 driver (upgrade tests)
    artifacts/cuda_11.8.0_520.61.05_linux.run          CUDA runfile double (+ driver 520.61.05)
    artifacts/cudnn-linux-x86_64-8.9.7.29_cuda11-archive.tar.xz   real tar.xz, deterministic
    artifacts/Miniconda3-py310_24.11.1-0-Linux-x86_64.sh            installer double (no ToS plugin)
    artifacts/Miniconda3-py310_25.5.1-0-Linux-x86_64.sh             same, conda has `conda tos`
    artifacts/SHA256SUMS                               sha256sum format
    apt/{Packages,Packages.gz,Release,*.deb}           flat repo (p40lab.apt): build-essential,
                                                       pkg-config, libglvnd-dev (Debian's),
                                                       dkms (double), linux-headers-<uname -r>,
                                                       a second kernel + its headers
    .p40lab-doubles.json                               stamp + pins (cache)

Served at ``http://10.231.0.1:8111/`` (document root = mirror dir) by ``python -m p40lab.mirror
serve``, which logs one line per request with the bytes sent to
``/var/lib/p40lab/mirror-access.log``: the build's fetches from ``/upstream/`` (the controller's)
and each host's from the mirror.

Built from :mod:`p40lab.artifacts` (the installer doubles) and :mod:`p40lab.apt` (the apt repo);
served by :mod:`p40lab.httpd`. This module keeps the build stamp, the pins (:func:`make_pins`),
:func:`ensure_mirror`, the fault helpers and the CLI:
``python -m p40lab.mirror build [--force] [--dir D] | serve --dir D [--bind A] [--port P] |
start | stop | bytes | corrupt NAME | restore NAME``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import runpy
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from p40lab import apt, base, doubles, httpd, sim_stack, training_data
from p40lab import state as _lab
from p40lab.artifacts import pins as lab_pins
from p40lab.artifacts.cuda import build_cuda
from p40lab.artifacts.cudnn import build_cudnn
from p40lab.artifacts.driver import build_driver
from p40lab.artifacts.miniconda import build_miniconda
from p40lab.artifacts.pins import (
    CONDA_TOS_VERSION,
    CUDA_FILENAME,
    CUDA_UNPACK_BYTES_REAL,
    CUDA_VERSION,
    CUDNN_FILENAME,
    CUDNN_VERSION,
    DRIVER_VERSION,
    EXTRA_DRIVER_VERSIONS,
    MINICONDA_FILENAME,
    MINICONDA_TOS_FILENAME,
    MINICONDA_TOS_VERSION,
    MINICONDA_VERSION,
    driver_filename,
)
from p40lab.util import sha256_file

BUILD_VERSION = "1"
# This lab instance's (p40lab.state: $P40LAB_INSTANCE), so one instance never serves, stops or
# corrupts another's mirror.
MIRROR_DIR = _lab.MIRROR_DIR
BASE_URL = f"http://{httpd.BIND}:{httpd.PORT}"
UPSTREAM = httpd.UPSTREAM  # upstream's dir inside the mirror dir, and its URL path
UPSTREAM_URL = f"{BASE_URL}/{UPSTREAM}"
STAMP_FILE = ".p40lab-doubles.json"
ORIG_DIR = ".p40lab-orig"  # pristine copies of corrupted artifacts (not under a served path)
# The modules whose code shapes the built bytes: a change in any of them rebuilds the doubles.
_BUILD_SOURCES = (
    Path(__file__),
    Path(apt.__file__),
    *sorted(Path(lab_pins.__file__).parent.glob("*.py")),
)


def log(msg: str) -> None:
    print(f"[p40lab.mirror {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- build + pins


def _artifact(adir: Path, base_url: str, name: str, version: str) -> dict[str, Any]:
    p = adir / name
    return {
        "version": version,
        "filename": name,
        "url": f"{base_url.rstrip('/')}/artifacts/{name}",
        "sha256": sha256_file(p),
        "size": p.stat().st_size,
    }


def _stamp(kernel_release: str, base_url: str, unpack_bytes: int) -> str:
    h = hashlib.sha256()
    h.update(f"{BUILD_VERSION}\n{kernel_release}\n{base_url}\n{unpack_bytes}\n".encode())
    h.update(base.stamp_text().encode())  # the Debian packages' closure is over the base
    h.update(doubles.sources_hash().encode())
    for source in _BUILD_SOURCES:
        h.update(source.read_bytes())
    return h.hexdigest()


def build(
    mirror_dir: Path = MIRROR_DIR,
    *,
    kernel_release: str | None = None,
    base_url: str = BASE_URL,
    unpack_bytes: int | None = None,
    debian: bool = True,
) -> dict[str, Any]:
    """Build artifacts/ and apt/ into ``mirror_dir`` (replacing only those) and return the pins.
    ``debian``: also serve the real Debian build packages (downloaded once over the base image's
    dpkg status; False for a repo without them, e.g. in unit tests)."""
    mirror_dir = Path(mirror_dir)
    kr = kernel_release or os.uname().release
    if unpack_bytes is None:
        unpack_bytes = int(os.environ.get("P40LAB_CUDA_UNPACK_BYTES", CUDA_UNPACK_BYTES_REAL))
    mirror_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".build-", dir=mirror_dir) as tmp:
        tmpd = Path(tmp)
        work = tmpd / "work"
        work.mkdir()
        adir = tmpd / "artifacts"
        adir.mkdir()
        products = {
            driver_filename(DRIVER_VERSION): build_driver(DRIVER_VERSION, kr, work),
            CUDA_FILENAME: build_cuda(kr, work, unpack_bytes),
            CUDNN_FILENAME: build_cudnn(work),
            MINICONDA_FILENAME: build_miniconda(),
            MINICONDA_TOS_FILENAME: build_miniconda(
                MINICONDA_TOS_VERSION, CONDA_TOS_VERSION, tos_plugin=True
            ),
        }
        for v in EXTRA_DRIVER_VERSIONS:
            products[driver_filename(v)] = build_driver(v, kr, work)
        for name, data in products.items():
            (adir / name).write_bytes(data)
            (adir / name).chmod(0o755 if name.endswith((".run", ".sh")) else 0o644)
        sums = "".join(
            f"{hashlib.sha256(products[n]).hexdigest()}  {n}\n" for n in sorted(products)
        )
        (adir / "SHA256SUMS").write_text(sums)
        debs = []
        if debian:
            debs = apt.fetch_debian(
                apt.DEBIAN_PACKAGES,
                _lab.BASE_DIR / "var/lib/dpkg/status",
                _lab.CACHE_DIR / "downloads/debian-apt",
            )
        apt.build_apt(tmpd / "apt", kr, work, debs)
        for sub in ("artifacts", "apt"):
            old = mirror_dir / sub
            if old.exists():
                trash = tmpd / f"old-{sub}"
                old.rename(trash)
            (tmpd / sub).rename(old)
    shutil.rmtree(mirror_dir / ORIG_DIR, ignore_errors=True)
    pins = make_pins(mirror_dir, base_url)
    stamp = {
        "stamp": _stamp(kr, base_url, unpack_bytes),
        "built_at": time.time(),
        "seconds": round(time.monotonic() - t0, 2),
        "kernel_release": kr,
        "pins": pins,
    }
    (mirror_dir / STAMP_FILE).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    log(f"mirror doubles built in {stamp['seconds']} s: {mirror_dir}")
    return pins


def make_pins(mirror_dir: Path, base_url: str = BASE_URL) -> dict[str, Any]:
    """Pins shaped like StackSpec (driver/cuda/cudnn/miniconda = Artifact, mirror = Mirror
    subset) plus ``extra_artifacts`` (alternate driver versions, the Miniconda with the ToS
    plugin; not a StackSpec key)."""
    adir = Path(mirror_dir) / "artifacts"
    return {
        "driver": _artifact(adir, base_url, driver_filename(DRIVER_VERSION), DRIVER_VERSION),
        "cuda": _artifact(adir, base_url, CUDA_FILENAME, CUDA_VERSION),
        "cudnn": _artifact(adir, base_url, CUDNN_FILENAME, CUDNN_VERSION),
        "miniconda": _artifact(adir, base_url, MINICONDA_FILENAME, MINICONDA_VERSION),
        "mirror": {"artifacts_url": f"{base_url.rstrip('/')}/artifacts"},
        "extra_artifacts": {
            f"driver-{v}": _artifact(adir, base_url, driver_filename(v), v)
            for v in EXTRA_DRIVER_VERSIONS
        }
        | {
            f"miniconda-{MINICONDA_TOS_VERSION}": _artifact(
                adir, base_url, MINICONDA_TOS_FILENAME, MINICONDA_TOS_VERSION
            )
        },
    }


STACK_KEYS = ("driver", "cuda", "cudnn", "miniconda", "mirror")


def stack_overrides(pins: dict[str, Any]) -> dict[str, Any]:
    """The StackSpec-shaped subset of the pins (what goes into host data ``stack``)."""
    return {k: pins[k] for k in STACK_KEYS if k in pins}


def _state_get(state: Any, key: str, default: Any = None) -> Any:
    if isinstance(state, dict):
        return state.get(key, default)
    return getattr(state, key, default)


def ensure_mirror(
    state: Any = None,
    mirror_dir: Path | None = None,
    *,
    force: bool = False,
    kernel_release: str | None = None,
    tool: bool = True,
) -> dict[str, Any]:
    """Build upstream (``mirror_dir/upstream``): the doubles unless the cached build is current
    (stamp = hash of the double sources, the builder modules, kernel release, base URL, unpack
    requirement) and intact, then the Python side and the training archives. ``tool``: then
    build the hosts' mirror from it with ``p40fleet.mirror`` (:func:`build_served`; the server
    must answer, :func:`ensure_mirror` starts it). Returns the pins and publishes the lab's
    stack with ``p40lab.state.set_stack_overrides``."""
    mirror_dir = Path(mirror_dir or _state_get(state, "mirror_dir") or MIRROR_DIR)
    base_url = (_state_get(state, "mirror_url") or BASE_URL).rstrip("/")
    upstream_dir, upstream_url = mirror_dir / UPSTREAM, f"{base_url}/{UPSTREAM}"
    _move_old_layout(mirror_dir)
    kr = kernel_release or os.uname().release
    unpack = int(os.environ.get("P40LAB_CUDA_UNPACK_BYTES", CUDA_UNPACK_BYTES_REAL))
    pins = None
    if not force:
        try:
            cached = json.loads((upstream_dir / STAMP_FILE).read_text())
        except (OSError, ValueError):
            cached = {}
        if cached.get("stamp") == _stamp(kr, upstream_url, unpack):
            for name in list((upstream_dir / ORIG_DIR).glob("*")):
                restore_artifact(name.name, upstream_dir)  # a fault test left one corrupted
            try:
                current = make_pins(upstream_dir, upstream_url)
            except OSError:
                current = None
            if current == cached.get("pins"):
                pins = current
                log(f"upstream doubles up to date: {upstream_dir}")
    if pins is None:
        pins = build(upstream_dir, kernel_release=kr, base_url=upstream_url, unpack_bytes=unpack)
    python = sim_stack.build_python_mirror(upstream_dir, upstream_url)
    # the training model and data archives, beside the doubles (same bytes every build)
    training = training_data.build_training_archives(upstream_dir / "artifacts", upstream_url)
    stack = sim_stack.sim_stack(
        pins, python, upstream_url, sim_stack.base_python_version(), unpack_bytes=unpack,
        training=training,
    )  # fmt: skip
    if tool:
        for name in list((mirror_dir / ORIG_DIR).glob("*")):
            restore_artifact(name.name, mirror_dir)  # the build would fetch it again anyway
        if not httpd.answers(base_url):
            httpd.start_server(mirror_dir)
        stack["mirror"] = build_served(mirror_dir, base_url, stack, kr)
    _lab.set_stack_overrides(stack, replace=True)
    return pins


#: What the lab's hosts install from apt beyond the deploy's packages: the kernel update of
#: tests/lab/test_kernel_update.py (an air-gapped fleet takes it from its mirror too).
def _kernel_update_packages(kernel_release: str) -> list[str]:
    return [f"linux-image-{apt.second_kernel(kernel_release)}".lower()]


def build_served(mirror_dir: Path, base_url: str, stack: dict[str, Any], kr: str) -> dict[str, Any]:
    """``p40fleet.mirror``'s build of the hosts' mirror into ``mirror_dir`` from upstream
    (``base_url/upstream``, which must answer): every file the lab's spec needs, each checked
    against its pin, and the apt closure of the deploy's packages for this kernel and of the
    kernel update, signed with the build's key. Returns the ``stack["mirror"]`` block
    (air-gapped) that points the hosts at it."""
    from p40fleet.mirror import apt as apt_repo
    from p40fleet.mirror.build import AptPlan, merge, needs_for, stack_block
    from p40fleet.mirror.build import build as build_mirror
    from p40fleet.spec.load import load_spec

    upstream = f"{base_url}/{UPSTREAM}"
    group = Path(__file__).resolve().parents[1] / "inventories/group_data/all.py"
    spec = load_spec("p40lab", runpy.run_path(str(group)).get("stack") or {}, stack)
    needs = merge(needs_for(spec, f"{upstream}/git", f"{upstream}/conda"))
    kernels = [kr, apt.second_kernel(kr)]
    plan = AptPlan(
        (*apt_repo.deploy_packages(kernels), *_kernel_update_packages(kr)),
        apt_repo.Upstream(url=f"{upstream}/apt", suites=("./",), allow_unverified=True),
        refresh=True,  # upstream's apt is rebuilt with the doubles: read its index each time
        base_url=base_url,
        installed=_lab.BASE_DIR / "var/lib/dpkg/status",  # what every host's image has
    )
    t0 = time.monotonic()
    result = build_mirror(mirror_dir, needs, indexes=[f"{upstream}/simple"], progress=False,
                          apt=plan)  # fmt: skip
    fetched = {kind: n for kind, (n, _) in result.fetched.items()}
    moved = sum(size for _, size in result.fetched.values())
    log(f"mirror built by p40fleet.mirror from {upstream} in {time.monotonic() - t0:.1f} s: "
        f"{len(result.manifest.entries)} files, fetched now {fetched or 0} "
        f"({moved / 1e6:.1f} MB)")  # fmt: skip
    block = stack_block(base_url, result.apt, conda=True)
    return {**block, "pip_find_links": None, "air_gapped": True}


def _move_old_layout(mirror_dir: Path) -> None:
    """A mirror dir from before #27's lab build held upstream's files at its top: move them
    into ``upstream/`` (the wheelhouse is kept, not downloaded again)."""
    if not (mirror_dir / STAMP_FILE).exists() or (mirror_dir / UPSTREAM).exists():
        return
    staging = mirror_dir / f".{UPSTREAM}-moving"
    staging.mkdir(exist_ok=True)
    for entry in list(mirror_dir.iterdir()):
        if entry.name not in (staging.name, ORIG_DIR):
            entry.rename(staging / entry.name)
    staging.rename(mirror_dir / UPSTREAM)
    log(f"moved the old mirror layout of {mirror_dir} into {UPSTREAM}/")


# ---------------------------------------------------------------------------- fault helpers


def corrupt_artifact(name: str, mirror_dir: Path = MIRROR_DIR) -> Path:
    """Flip bytes in the middle of the served copy of artifacts/NAME (pristine copy kept)."""
    mirror_dir = Path(mirror_dir)
    p = mirror_dir / "artifacts" / name
    orig = mirror_dir / ORIG_DIR / name
    orig.parent.mkdir(parents=True, exist_ok=True)
    if not orig.exists():
        shutil.copy2(p, orig)
    data = bytearray(p.read_bytes())
    mid = len(data) // 2
    for i in range(mid, min(mid + 16, len(data))):
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))
    return p


def restore_artifact(name: str, mirror_dir: Path = MIRROR_DIR) -> Path:
    mirror_dir = Path(mirror_dir)
    p = mirror_dir / "artifacts" / name
    orig = mirror_dir / ORIG_DIR / name
    if orig.exists():
        shutil.copy2(orig, p)
        orig.unlink()
    return p


# ---------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m p40lab.mirror")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--dir", type=Path, default=MIRROR_DIR)
    b.add_argument("--force", action="store_true")
    s = sub.add_parser("serve")
    s.add_argument("--dir", type=Path, default=MIRROR_DIR)
    s.add_argument("--bind", default=httpd.BIND)
    s.add_argument("--port", type=int, default=httpd.PORT)
    s.add_argument("--access-log", type=Path, default=httpd.ACCESS_LOG)
    s.add_argument("--rate", type=int, default=0, help="bytes/s per response (0: unthrottled)")
    s.add_argument(
        "--no-ranges", action="store_true", help="ignore Range headers (as python3 -m http.server)"
    )
    st = sub.add_parser("start")
    st.add_argument("--dir", type=Path, default=MIRROR_DIR)
    st.add_argument("--bind", default=httpd.BIND)
    st.add_argument("--port", type=int, default=httpd.PORT)
    sub.add_parser("stop")
    sub.add_parser("bytes")
    for name in ("corrupt", "restore"):
        c = sub.add_parser(name)
        c.add_argument("name")
        c.add_argument("--dir", type=Path, default=MIRROR_DIR)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        print(json.dumps(ensure_mirror(None, a.dir, force=a.force), indent=2))
    elif a.cmd == "serve":
        httpd.serve(a.dir, a.bind, a.port, a.access_log, a.rate, ranges=not a.no_ranges)
    elif a.cmd == "start":
        print(httpd.start_server(a.dir, a.bind, a.port))
    elif a.cmd == "stop":
        print("stopped" if httpd.stop_server() else "not running")
    elif a.cmd == "bytes":
        print(httpd.bytes_served())
    elif a.cmd == "corrupt":
        print(corrupt_artifact(a.name, a.dir))
    elif a.cmd == "restore":
        print(restore_artifact(a.name, a.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
