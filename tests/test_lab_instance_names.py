"""Lab instances by name, without a lab: the default keeps today's names, and no two instances
share a path, bridge, subnet, netns, veth or mirror, nor match each other's name patterns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_PROBE = """
import json, sys
from p40lab import httpd, mirror, net, state as st
others = sys.argv[1:]
print(json.dumps({
    "lab_dir": str(st.LAB_DIR), "state": str(st.state_path()), "bridge": st.BRIDGE,
    "subnet": st.SUBNET, "netns": net.netns_name("lab1"), "veth": net.veth_name("lab200"),
    "mirror_dir": str(mirror.MIRROR_DIR), "mirror_bind": httpd.BIND,
    "mirror_pid": str(httpd.PID_FILE), "mirror_url": st.MIRROR_URL, "ssh_key": str(st.SSH_KEY),
    "matches": [n for n in others if net._OUR_NETNS.fullmatch(n) or net._OUR_VETH.fullmatch(n)],
}))
"""


def probe(instance: str, *names: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("P40LAB_")}
    if instance:
        env["P40LAB_INSTANCE"] = instance
    proc = subprocess.run([sys.executable, "-c", _PROBE, *names], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_default_instance_keeps_the_documented_names():
    assert probe("") == {
        "lab_dir": "/var/lib/p40lab", "state": "/var/lib/p40lab/state.json",
        "bridge": "labbr0", "subnet": "10.231.0.0/24", "netns": "p40lab-lab1",
        "veth": "p4vlab200", "mirror_dir": "/var/cache/p40lab/mirror",
        "mirror_bind": "10.231.0.1", "mirror_pid": "/var/lib/p40lab/mirror.pid",
        "mirror_url": "http://10.231.0.1:8111", "ssh_key": "/var/lib/p40lab/id_ed25519",
        "matches": [],
    }  # fmt: skip


def test_instances_share_nothing_and_ignore_each_other():
    ours = {
        "": ("p40lab-lab1", "p4vlab1"),
        "test": ("p40lab-test-lab1", "p4test-lab1"),
        "v1": ("p40lab-v1-lab1", "p4v1-lab1"),
        "abcdef": ("p40lab-abcdef-lab1", "p4abcdef-lab1"),
    }
    everyone = [n for pair in ours.values() for n in pair]
    seen = {}
    for instance, own in ours.items():
        got = probe(instance, *everyone)
        assert got["matches"] == list(own), (instance, got["matches"])  # its own names only
        assert len(got["veth"]) <= 15, got["veth"]  # lab200 still fits an interface name
        seen[instance] = got
    for key in ("lab_dir", "bridge", "subnet", "netns", "mirror_dir", "mirror_bind", "ssh_key"):
        values = [got[key] for got in seen.values()]
        assert len(set(values)) == len(values), (key, values)


def test_a_bad_instance_name_is_refused_with_the_rule():
    env = {**os.environ, "P40LAB_INSTANCE": "Lab-1"}
    proc = subprocess.run([sys.executable, "-m", "p40lab", "status"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode != 0
    assert "P40LAB_INSTANCE='Lab-1': use 1-6 lowercase letters or digits" in proc.stderr
