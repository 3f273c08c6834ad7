"""The lab from nothing: base rootfs + mirror (doubles, wheelhouse, git remotes) with no caches.

    python benchmarks/bench_lab_from_nothing.py

Rebuilds the base (mmdebstrap, needs the Debian archive and no lab up) and builds a complete
mirror into a temporary directory with pip's cache off and an empty download cache, then
4 hosts up on the cached base. Prints seconds; the issue's targets: base + mirror <= 3 min on
2 cores, 4 hosts up <= 5 s. Leaves the lab down and the real mirror untouched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from p40lab import apex_remote, base, hosts, mirror, plan, verl_remote, wheelhouse  # noqa: E402
from p40lab import state as st  # noqa: E402
from p40lab.artifacts import pins as lab_pins  # noqa: E402
from p40lab.util import require_root  # noqa: E402


def main() -> int:
    require_root()
    if any(st.pid_alive(h.get("supervisor_pid")) for h in st.load().get("hosts", [])):
        raise SystemExit("a lab is up: run `python -m p40lab down` first")
    os.environ["PIP_NO_CACHE_DIR"] = "1"
    t0 = time.monotonic()
    base.build(force=True)
    t_base = time.monotonic() - t0
    with tempfile.TemporaryDirectory(prefix="p40lab-mirror-") as tmp:
        root, downloads = Path(tmp) / "mirror", Path(tmp) / "downloads"
        t1 = time.monotonic()
        mirror.build(root, kernel_release=os.uname().release, base_url=st.MIRROR_URL,
                     unpack_bytes=lab_pins.CUDA_UNPACK_BYTES_REAL)  # fmt: skip
        t_doubles = time.monotonic() - t1
        t2 = time.monotonic()
        wheels = wheelhouse.build_wheelhouse(root, base_url=st.MIRROR_URL)
        t_wheels = time.monotonic() - t2
        t3 = time.monotonic()
        verl_remote.build_verl_remote(root / "git" / "verl.git", downloads)
        apex_remote.build_apex_remote(root / "git" / "apex.git")
        t_git = time.monotonic() - t3
        size = subprocess.run(["du", "-sb", str(root)], capture_output=True, text=True).stdout
    total = t_base + t_doubles + t_wheels + t_git
    print(f"base rootfs (mmdebstrap, bookworm): {t_base:.1f} s")
    print(f"mirror doubles (driver, CUDA, cuDNN, Miniconda, apt): {t_doubles:.1f} s")
    print(f"wheelhouse ({wheels.get('files')} wheels, {wheels['bytes'] / 2**20:.0f} MiB, "
          f"no pip cache): {t_wheels:.1f} s")  # fmt: skip
    print(f"git remotes (verl 0.5.0 sdist from PyPI, apex stand-in): {t_git:.1f} s")
    print(f"mirror size: {int(size.split()[0]) / 2**20:.0f} MiB")
    print(f"lab from nothing (base + mirror): {total:.1f} s (target <= 180 s)")
    specs = plan.plan(None, "4xP40,8xP40,1xP100,2xH200")
    t4 = time.monotonic()
    hosts.up(specs, mirror=False)
    t_up = time.monotonic() - t4
    left = {k: v for k, v in hosts.down().items() if v}
    print(f"4 hosts up on the cached base: {t_up:.2f} s (target <= 5 s); leftovers after down: "
          f"{left or 'none'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
