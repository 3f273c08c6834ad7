"""Lab instances: the test lab runs beside the user's lab and beside a third one, touching neither.

The session lab is instance ``test`` (tests/conftest.py). The user's lab is the default instance
(``make demo`` leaves it up); the session also fails at teardown if it changed (conftest.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from p40lab import hosts, net
from p40lab import state as st

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
SIDE = "side"  # a third instance, brought up and down by one test


def p40lab(instance: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m p40lab ARGS`` for ``instance`` ("" = the default lab)."""
    env = {k: v for k, v in os.environ.items() if k not in ("P40LAB_INSTANCE", "P40LAB_STATE")}
    if instance:
        env["P40LAB_INSTANCE"] = instance
    return subprocess.run(
        [sys.executable, "-m", "p40lab", *args], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_the_test_lab_is_an_instance_of_its_own(lab):
    assert st.INSTANCE, "tests/conftest.py did not select a lab instance"
    assert st.LAB_DIR != Path("/var/lib/p40lab") and st.BRIDGE != "labbr0"
    assert st.SUBNET != "10.231.0.0/24" and st.MIRROR_DIR.name == f"mirror-{st.INSTANCE}"
    data = lab.state
    assert data["instance"] == st.INSTANCE and data["bridge"] == st.BRIDGE
    for h in data["hosts"]:
        assert h["netns"] == f"p40lab-{st.INSTANCE}-{h['name']}", h
        assert h["ip"].startswith(f"{st.NET}.") and h["root"].startswith(f"{st.LAB_DIR}/"), h
    assert data["mirror_url"] == f"http://{st.NET}.1:8111"


def test_the_default_lab_is_unchanged_and_blind_to_ours(lab):
    """While the test lab runs, the default instance (the user's lab, up or not) is as it was
    before the session, and its own bookkeeping (leftovers, down) sees nothing of ours."""
    default = lab.instance_snapshot("")
    if lab.user_lab_before is not None:
        assert default == lab.user_lab_before
    ours = set(net.our_netns()) | set(net.our_veths()) | {st.BRIDGE}
    assert len(net.our_netns()) == len(lab.hosts) and net.link_exists(st.BRIDGE)
    seen = set(default["netns"]) | set(default["links"]) | set(default["mounts"])
    assert not seen & ours, seen & ours
    assert st.SUBNET not in default["routes"]
    left = p40lab("", "leftovers")
    assert st.INSTANCE not in left.stdout and str(st.LAB_DIR) not in left.stdout, left.stdout


def test_two_instances_side_by_side(lab):
    ours_before = hosts.snapshot()
    up = p40lab(SIDE, "up", "--gpus", "0,1xP40", "--no-mirror")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        side = lab.instance_snapshot(SIDE)
        assert side["netns"] == [f"p40lab-{SIDE}-lab1", f"p40lab-{SIDE}-lab2"], side
        assert f"labbr-{SIDE}" in side["links"] and side["routes"], side
        said = p40lab(SIDE, "ssh", "lab2", "hostname; ip -4 -o addr show eth0")
        assert said.returncode == 0, said.stderr
        name, addr = said.stdout.splitlines()
        side_net = side["routes"][0].rsplit(".", 1)[0]  # 10.231.N.0/24 -> 10.231.N
        assert name == "lab2" and f" {side_net}.12/24 " in addr and side_net != st.NET, said.stdout
        # our lab, same host names, is another set of machines and still answers
        assert hosts.snapshot() == ours_before
        count = "grep -l 0x10de /sys/bus/pci/devices/*/vendor | wc -l"  # NVIDIA devices
        assert p40lab(SIDE, "ssh", "lab2", count).stdout.strip() == "1"
        gpus = lab.ssh("lab2", count, check=True).stdout.strip()
        assert gpus == str(len(lab.host("lab2")["gpus"])) != "1", gpus
    finally:
        down = p40lab(SIDE, "down", "--wipe")
    assert down.returncode == 0, down.stdout + down.stderr
    assert p40lab(SIDE, "leftovers").returncode == 0
    shutil.rmtree(f"/var/lib/p40lab-{SIDE}", ignore_errors=True)
    assert hosts.snapshot() == ours_before  # its down left ours alone
    assert lab.ssh("lab1", "hostname", check=True).stdout.strip() == "lab1"
