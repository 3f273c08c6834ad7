"""The runbook's "After a kernel update" (docs/runbook.md), end to end on one lab host.

A fresh host (no dkms, no compiler: p40lab.base) converges with ``deploy/system.py`` only
because the deploy installs dkms and the build tools from the mirror. Then the kernel update an
unattended upgrade brings: ``apt-get install linux-image-<second release>`` (the mirror's
second kernel, without its headers) and a reboot into it. ``python -m p40fleet.verify`` then
names the missing module for the running kernel, and ``deploy/system.py --limit HOST`` brings
it back: headers for the running kernel, whose install lets DKMS rebuild the driver for it,
then the reboot that loads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p40lab import apt, runs
from p40lab.artifacts import pins as lab_pins

pytestmark = pytest.mark.lab

HOST = "lab1"
PIN = lab_pins.DRIVER_VERSION
AS_ADMIN = {"P40LAB_SSH_USER": "admin"}  # inventories/sim.py: ssh_user admin, _sudo
BUILD = ("dkms", "build-essential", "pkg-config", "libglvnd-dev")


def sh(lab, command: str) -> str:
    r = lab.ssh(HOST, command)
    assert r.returncode == 0, f"{command!r} -> rc={r.returncode}\n{r.stdout}{r.stderr}"
    return r.stdout


def system(tmp_path: Path) -> runs.RunResult:
    env = dict(AS_ADMIN, P40FLEET_CACHE=str(tmp_path / "controller-cache"))
    return runs.run("deploy/system.py", "--limit", HOST, env=env)


def verify_checks(tmp_path: Path, name: str) -> tuple[int, dict[str, dict]]:
    report = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "p40fleet.verify", runs.SIM_INVENTORY, "--limit", HOST,
         "--json", str(report)],
        cwd=runs.REPO, capture_output=True, text=True, timeout=900, env=dict(os.environ),
    )  # fmt: skip
    entry = json.loads(report.read_text())["hosts"][HOST]
    return proc.returncode, {c["name"]: c for c in entry["checks"]}


def installed(lab, *packages: str) -> set[str]:
    query = "dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n' " + " ".join(packages)
    out = lab.ssh(HOST, query)
    return {line.split()[0] for line in out.stdout.splitlines() if line.split()[1:2] == ["ii"]}


@pytest.fixture(autouse=True)
def _lab1_reinstalled_afterwards(lab):
    """The session's lab is shared: lab1 leaves this module with its first kernel and a fresh
    system disk again (the later modules expect a fresh host, headers for ``uname -r``)."""
    yield
    lab.reinstall(HOST)


def test_fresh_host_converges_then_a_kernel_update_is_named_by_verify_and_repaired(lab, tmp_path):
    lab.reinstall(HOST)
    first_kernel = sh(lab, "uname -r").strip()
    second = apt.second_kernel(first_kernel)
    assert installed(lab, *BUILD) == set()  # the image has none of them
    for tool in ("dkms", "cc", "make"):
        assert lab.ssh(HOST, f"command -v {tool}").returncode != 0, tool

    t0 = time.monotonic()
    first = system(tmp_path)
    assert first.returncode == 0 and not first.errors[HOST], first.output[-5000:]
    converge_s = time.monotonic() - t0
    assert installed(lab, *BUILD) == set(BUILD)  # the deploy installed them, from the mirror
    assert f"nvidia/{PIN}, {first_kernel}, x86_64: installed" in sh(lab, "dkms status")
    code, checks = verify_checks(tmp_path, "converged")
    assert checks["dkms"]["status"] == "PASS", checks["dkms"]
    assert checks["dkms"]["detail"] == f"nvidia/{PIN}, {first_kernel}, x86_64: installed"

    # the kernel update: image without headers (dkms's hook cannot build), then a reboot
    out = lab.ssh(HOST, f"apt-get install -y -q linux-image-{second} 2>&1").stdout
    assert "please install the linux-headers-" + second in out, out
    lab.reboot(HOST)
    assert sh(lab, "uname -r").strip() == second
    assert lab.ssh(HOST, "nvidia-smi").returncode != 0  # no nvidia.ko for this kernel
    code, checks = verify_checks(tmp_path, "after-update")
    assert code != 0
    dkms = checks["dkms"]
    assert dkms["status"] == "FAIL", dkms
    assert f"no nvidia/{PIN} installed for the running kernel {second}" in dkms["detail"], dkms
    assert f"linux-headers-{second}" in dkms["remedy"], dkms

    t0 = time.monotonic()
    repair = system(tmp_path)
    assert repair.returncode == 0 and not repair.errors[HOST], repair.output[-5000:]
    repair_s = time.monotonic() - t0
    assert f"linux-headers-{second}" in installed(lab, f"linux-headers-{second}")
    assert sh(lab, "uname -r").strip() == second  # rebooted into the same kernel
    status = sh(lab, "dkms status")
    assert f"nvidia/{PIN}, {second}, x86_64: installed" in status, status
    assert PIN in sh(lab, "nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    code, checks = verify_checks(tmp_path, "repaired")
    assert checks["dkms"]["status"] == "PASS", checks["dkms"]
    assert checks["dkms"]["detail"] == f"nvidia/{PIN}, {second}, x86_64: installed"
    print(f"fresh host deploy/system.py: {converge_s:.1f} s; repair after the kernel update: "
          f"{repair_s:.1f} s")  # fmt: skip
