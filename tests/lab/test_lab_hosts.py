"""The simulated lab itself: reachability, fake hardware, boot semantics, reinstall, teardown.

Run as root: ``python -m pytest tests/lab/test_lab_hosts.py -x -q``. Hosts: lab1 4xP40,
lab2 8xP40, lab3 1xP100, lab4 2xH200 (see conftest.py). The teardown test runs last and brings
the default lab back up for whatever runs after it.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import paramiko
import pytest

from p40lab import fakehw, plan, procs
from p40lab import state as lab_state

pytestmark = pytest.mark.lab

EXPECTED = {
    "lab1": ["10de:1b38"] * 4,
    "lab2": ["10de:1b38"] * 8,
    "lab3": ["10de:15f8"],
    "lab4": ["10de:2335"] * 2,
}
REPO = Path(__file__).resolve().parents[2]


def uptime(lab, host: str) -> float:
    return float(lab.ssh(host, "cat /proc/uptime", check=True).stdout.split()[0])


def modules(lab, host: str) -> set[str]:
    out = lab.ssh(host, "ls /sys/module", check=True).stdout
    return set(out.split())


def wait_uptime_over(lab, host: str, seconds: float) -> float:
    up = uptime(lab, host)
    if up < seconds:
        time.sleep(seconds - up + 0.1)
        up = uptime(lab, host)
    return up


# --------------------------------------------------------------------------- planning (no lab)


def test_plan_layouts_and_options():
    specs = plan.plan(None, "4xP40,0,2x1eb8,1xH200", "lab2,3", ["lab4=debian12"])
    assert [s.name for s in specs] == ["lab1", "lab2", "lab3", "lab4"]
    assert [len(s.gpus) for s in specs] == [4, 0, 2, 1]
    assert specs[2].gpus[0].pci_id == "10de:1eb8" and specs[2].gpus[0].name == "T4"
    assert [s.headers for s in specs] == [True, False, False, True]
    assert [s.os for s in specs] == ["ubuntu20.04"] * 3 + ["debian12"]
    assert [len(s.gpus) for s in plan.plan(3, "2xP40")] == [2, 2, 2]
    assert fakehw.parse_layout("2x10de:abcd")[0].pci_id == "10de:abcd"
    for bad in (dict(n=3, gpus="1xP40,2xP40"), dict(gpus="4xQ99"), dict(gpus="P40", os_opts=["x"])):
        with pytest.raises(lab_state.LabError):
            plan.plan(**bad)


# --------------------------------------------------------------------------- reachability


def test_pyinfra_reaches_all_hosts_strictly(lab):
    proc = lab.pyinfra("inventories/sim.py", "exec", "--", "hostname")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    succeeded = set(re.findall(r"\[(lab\d+)\]\s+Success", out))
    assert succeeded == set(EXPECTED), out  # a wrong inventory would run 0 hosts and exit 0
    for name in EXPECTED:
        assert re.search(rf"\[{name}\]\s+{name}\b", out), out
    assert re.search(r"server\.shell \(hostname\)\s+4\s+4\s", out), out


def test_pyinfra_refuses_unknown_host_key(lab, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    proc = lab.pyinfra(
        "inventories/sim.py",
        "exec",
        "--limit",
        "lab1",
        "--data",
        f"ssh_known_hosts_file={empty}",
        "--",
        "hostname",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "[lab1] Success" not in out


def test_paramiko_strict_host_key_checking(lab):
    st = lab.state
    h = lab.host("lab3")
    client = paramiko.SSHClient()
    client.load_host_keys(st["known_hosts"])
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        h["ip"],
        username="root",
        key_filename=st["ssh_key"],
        allow_agent=False,
        look_for_keys=False,
        timeout=10,
    )
    try:
        _, stdout, _ = client.exec_command("hostname")
        assert stdout.read().decode().strip() == "lab3"
    finally:
        client.close()
    stranger = paramiko.SSHClient()
    stranger.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException):
        stranger.connect(
            h["ip"],
            username="root",
            key_filename=st["ssh_key"],
            allow_agent=False,
            look_for_keys=False,
            timeout=10,
        )
    stranger.close()


def test_inventory_refuses_when_lab_state_says_down(lab, tmp_path):
    fake_state = tmp_path / "state.json"
    fake_state.write_text('{"up": false, "hosts": []}')
    proc = lab.pyinfra(
        "inventories/sim.py", "exec", "--", "hostname", env={"P40LAB_STATE": str(fake_state)}
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"the simulated lab is not up: run `{lab_state.cli('up')}`" in out


def test_inventory_host_data_merges_group_stack_and_lab_overrides(lab, tmp_path):
    data = lab.state
    data["stack"] = {"policy": {"allow_reboot": True}, "python_version": "3.11.9"}
    state_copy = tmp_path / "state.json"
    state_copy.write_text(json.dumps(data))
    proc = lab.pyinfra("inventories/sim.py", "debug-inventory",
                       env={"P40LAB_STATE": str(state_copy)})  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    group = runpy.run_path(str(REPO / "inventories/group_data/all.py")).get("stack", {})
    decoder = json.JSONDecoder()
    seen = {}
    for m in re.finditer(r"^\[(lab\d+)\][^\n]*\n(?:--> Groups:[^\n]*\n)?--> Data:\n", out, re.M):
        seen[m[1]], _ = decoder.raw_decode(out, m.end())
    assert sorted(seen) == sorted(EXPECTED), out
    for name, hd in seen.items():
        assert hd["ssh_user"] == "root" and hd["ssh_key"] == data["ssh_key"]
        assert hd["ssh_known_hosts_file"] == data["known_hosts"]
        assert hd["ssh_strict_host_key_checking"] == "yes"
        assert hd["ssh_allow_agent"] is False and hd["ssh_look_for_keys"] is False
        assert hd["ssh_hostname"] == lab.host(name)["ip"]
        assert hd["p40lab_sim"] is True  # N14: "simulated" comes from here, not the disk
        assert hd["stack"]["policy"]["allow_reboot"] is True
        assert hd["stack"]["python_version"] == "3.11.9"
        for key, value in group.get("policy", {}).items():
            if key != "allow_reboot":
                assert hd["stack"]["policy"][key] == value, key


def test_cli_status_ssh_and_refuses_second_up(lab):
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "p40lab", *a],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    status = run("status")
    assert status.returncode == 0, status.stderr
    for name in EXPECTED:
        assert name in status.stdout
    assert status.stdout.count(" up ") >= 4, status.stdout
    ssh = run("ssh", "lab2", "cat", "/etc/hostname")
    assert (ssh.returncode, ssh.stdout.strip()) == (0, "lab2"), ssh.stderr
    again = run("up", "--no-mirror")
    assert again.returncode == 1
    assert "already up" in again.stderr
    kh = run("known-hosts")
    assert kh.returncode == 0 and kh.stdout.count("ssh-ed25519") == 4


# --------------------------------------------------------------------------- fake hardware


def test_sysfs_pci_tree_has_the_right_ids(lab):
    script = textwrap.dedent(r"""
        for d in /sys/bus/pci/devices/*; do
            printf '%s %s %s %s %s %s %s\n' "${d##*/}" "$(cat $d/vendor)" "$(cat $d/device)" \
                "$(cat $d/class)" "$(cat $d/subsystem_vendor)" "$(cat $d/subsystem_device)" \
                "$(stat -L -c %s $d/config)"
        done
    """)
    for name, want in EXPECTED.items():
        rows = [line.split() for line in lab.ssh(name, script, check=True).stdout.splitlines()]
        gpus = [r for r in rows if r[3].startswith("0x03")]
        got = [f"{r[1][2:]}:{r[2][2:]}" for r in gpus]
        assert got == want, (name, rows)
        assert all(r[6] == "256" for r in rows), rows
        assert [r[0] for r in gpus] == [fakehw.gpu_bdf(i) for i in range(len(want))]
        if name in ("lab1", "lab2"):  # P40: class 3D controller, subsystem 10de:11d9
            assert {(r[3], r[4], r[5]) for r in gpus} == {("0x030200", "0x10de", "0x11d9")}
        assert lab.state["hosts"][int(name[3:]) - 1]["gpus"] == want
    # the controller's real PCI bus is hidden
    assert lab.ssh("lab1", "ls -A /proc/bus/pci", check=True).stdout.strip() == ""
    # realpath of the bus symlink is the devices tree, like the kernel's
    real = lab.ssh("lab1", "readlink -f /sys/bus/pci/devices/0000:04:00.0", check=True).stdout
    assert real.strip() == "/sys/devices/pci0000:00/0000:04:00.0"


def test_fresh_host_has_nouveau_headers_and_fake_focal(lab):
    for name in EXPECTED:
        assert modules(lab, name) == {"nouveau"}, name
        drv = lab.ssh(name, "readlink -f /sys/bus/pci/devices/0000:04:00.0/driver").stdout
        assert drv.strip() == "/sys/bus/pci/drivers/nouveau"
    release = os.uname().release
    out = lab.ssh(
        "lab1",
        "uname -r; test -d /lib/modules/$(uname -r)/build && echo headers; "
        ". /etc/os-release; echo $ID $VERSION_ID $VERSION_CODENAME; "
        "cat /etc/lsb-release | grep CODENAME; python3 -c 'import sys; "
        "print(sys.version_info >= (3, 10))'",
        check=True,
    ).stdout.split()
    assert out[:5] == [release, "headers", "ubuntu", "20.04", "focal"], out
    assert "DISTRIB_CODENAME=focal" in out and out[-1] == "True"


# --------------------------------------------------------------------------- boot semantics


def test_reboot_gives_fresh_uptime_and_keeps_files(lab):
    lab.ssh(
        "lab1",
        "echo kept > /root/marker; echo gone > /run/volatile; mkdir -p /tmp/d; "
        "echo gone > /tmp/d/f; mkdir -p /home/x && echo h > /home/x/f",
        check=True,
    )
    before = wait_uptime_over(lab, "lab1", 2.5)
    boot_before = int(lab.ssh("lab1", "cat /run/p40lab-sim/boot", check=True).stdout)
    took = lab.reboot("lab1")
    assert took < 10
    after = uptime(lab, "lab1")
    assert after < before, (before, after)
    out = lab.ssh(
        "lab1",
        "cat /root/marker /home/x/f; test -e /run/volatile || echo fresh-run; "
        "test -e /tmp/d || echo empty-tmp; stat -c %a /tmp; "
        "cat /run/p40lab-sim/boot; ps -o pid= -p 1",
        check=True,
    ).stdout.split()
    expected = ["kept", "h", "fresh-run", "empty-tmp", "1777", str(boot_before + 1), "1"]
    assert out == expected, out
    lab.ssh("lab1", "rm -rf /root/marker /home/x", check=True)


def test_reboot_from_inside_and_pyinfra_server_reboot(lab, tmp_path):
    before = wait_uptime_over(lab, "lab4", 2.5)
    lab.ssh("lab4", "reboot")  # the shim ends PID 1; the ssh session may drop
    deadline = time.monotonic() + 20
    while True:
        proc = lab.ssh("lab4", "cat /proc/uptime")
        if proc.returncode == 0 and float(proc.stdout.split()[0]) < before:
            break
        assert time.monotonic() < deadline, "lab4 did not come back after `reboot`"
        time.sleep(0.2)
    deploy = tmp_path / "reboot.py"
    deploy.write_text(
        "from pyinfra.operations import server\n"
        "server.reboot(name='reboot lab4', delay=1, interval=0.5, reboot_timeout=30)\n"
    )
    wait_uptime_over(lab, "lab4", 2.5)
    proc = lab.pyinfra("inventories/sim.py", str(deploy), "--limit", "lab4", timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[lab4] Success" in out, out
    assert uptime(lab, "lab4") < 30


def test_poweroff_stays_off_until_power_button(lab):
    lab.ssh("lab4", "echo on-disk > /root/survives; poweroff")
    deadline = time.monotonic() + 10
    while procs.host_is_up(lab.host("lab4")):
        assert time.monotonic() < deadline, "lab4 did not power off"
        time.sleep(0.1)
    time.sleep(0.5)
    assert not procs.host_is_up(lab.host("lab4"))  # stays off: no reboot by the supervisor
    lab.reboot("lab4")  # the power button
    out = lab.ssh("lab4", "cat /root/survives; rm /root/survives", check=True).stdout
    assert out.strip() == "on-disk"


def test_blacklist_alone_keeps_nouveau_initramfs_update_removes_it(lab):
    host = "lab2"
    # initramfs updated BEFORE the blacklist: does not count
    lab.ssh(
        host,
        "mkdir -p /var/lib/p40lab-sim && touch /var/lib/p40lab-sim/initramfs-updated "
        "&& sleep 0.05 && printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' "
        "> /etc/modprobe.d/blacklist-nouveau.conf",
        check=True,
    )
    lab.reboot(host)
    assert modules(lab, host) == {"nouveau"}
    # a commented-out blacklist + a fresh initramfs: still loaded
    lab.ssh(
        host,
        "echo '# blacklist nouveau' > /etc/modprobe.d/blacklist-nouveau.conf && "
        "sleep 0.05 && touch /var/lib/p40lab-sim/initramfs-updated",
        check=True,
    )
    lab.reboot(host)
    assert modules(lab, host) == {"nouveau"}
    # blacklist, then update-initramfs (the doubles' tool), then reboot: nouveau gone, unbound
    lab.ssh(
        host,
        "echo 'blacklist nouveau' > /etc/modprobe.d/blacklist-nouveau.conf && "
        "sleep 0.05 && update-initramfs -u",
        check=True,
    )
    assert modules(lab, host) == {"nouveau"}  # nothing changes before the reboot
    lab.reboot(host)
    assert modules(lab, host) == set()
    assert lab.ssh(host, "test -e /sys/bus/pci/devices/0000:04:00.0/driver").returncode != 0
    # the driver double installed nvidia.ko for the running kernel: loaded after a reboot
    lab.ssh(
        host,
        "d=/lib/modules/$(uname -r)/updates/dkms; mkdir -p $d && touch $d/nvidia.ko && "
        "echo 525.147.05 > /var/lib/p40lab-sim/nvidia-module-version",
        check=True,
    )
    assert lab.ssh(host, "test -e /run/p40lab-sim/nvidia-loaded").returncode != 0
    lab.reboot(host)
    out = lab.ssh(
        host,
        "ls /sys/module; cat /sys/module/nvidia/version "
        "/run/p40lab-sim/nvidia-loaded; "
        "readlink -f /sys/bus/pci/devices/0000:0b:00.0/driver",
        check=True,
    )
    assert out.stdout.split() == [
        "nvidia",
        "525.147.05",
        "525.147.05",
        "/sys/bus/pci/drivers/nvidia",
    ]
    # back to a fresh host for whoever comes next
    lab.reinstall(host)
    assert modules(lab, host) == {"nouveau"}


def test_boot_d_hooks_run_at_boot(lab):
    lab.ssh(
        "lab3",
        "mkdir -p /etc/p40lab-sim/boot.d && printf '#!/bin/sh\\n"
        'echo "$P40LAB_HOST $P40LAB_BOOT" > /run/hooked\\n\' '
        "> /etc/p40lab-sim/boot.d/50-test && chmod +x /etc/p40lab-sim/boot.d/50-test "
        "&& printf '#!/bin/sh\\nexit 3\\n' > /etc/p40lab-sim/boot.d/10-fails && "
        "chmod +x /etc/p40lab-sim/boot.d/10-fails",
        check=True,
    )
    lab.reboot("lab3")
    host, boot = lab.ssh("lab3", "cat /run/hooked", check=True).stdout.split()
    assert host == "lab3" and int(boot) >= 2
    lab.ssh("lab3", "rm -f /etc/p40lab-sim/boot.d/50-test /etc/p40lab-sim/boot.d/10-fails")


def test_reinstall_drops_system_changes_keeps_home_and_makes_a_new_host_key(lab):
    host = "lab3"
    lab.ssh(
        host,
        "echo x > /etc/p40-marker && mkdir -p /usr/local/cuda-11.8 /home/verl && "
        "echo y > /usr/local/cuda-11.8/version.json && echo z > /home/verl/keep && "
        "echo 'blacklist nouveau' > /etc/modprobe.d/bl.conf && "
        "mkdir -p /var/lib/p40lab-sim && touch /var/lib/p40lab-sim/initramfs-updated",
        check=True,
    )
    lab.reboot(host)
    assert modules(lab, host) == set()
    pub = lab.root(host) / "etc/ssh/ssh_host_ed25519_key.pub"
    key_before, fp_before = pub.read_text(), lab.host_key_fingerprint(host)
    lab.reinstall(host, keep_host_key=False)  # what a real reinstall does
    assert pub.read_text() != key_before
    fp = lab.host_key_fingerprint(host)
    assert fp != fp_before and fp.startswith("SHA256:")
    # strict checking against the lab's (the inventory's) known_hosts refuses the new key ...
    refused = lab.ssh(host, "true")
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
    # ... the wrong fingerprint changes nothing, the console's one re-keys it
    assert lab.rekey(host, "--expect", fp_before).returncode == 2
    assert lab.ssh(host, "true").returncode == 255
    rekeyed = lab.rekey(host, "--expect", fp)
    assert rekeyed.returncode == 0, rekeyed.stdout + rekeyed.stderr
    assert f"new: ssh-ed25519 {fp}" in rekeyed.stdout and fp_before in rekeyed.stdout
    out = lab.ssh(
        host,
        "ls /etc/p40-marker /usr/local/cuda-11.8 /etc/modprobe.d/bl.conf 2>&1; "
        "cat /home/verl/keep; cat /run/p40lab-sim/boot",
        check=False,
    ).stdout
    assert out.count("No such file or directory") == 3, out
    assert out.split()[-2:] == ["z", "1"], out
    assert modules(lab, host) == {"nouveau"}
    # --keep-host-key: an admin who restores /etc/ssh from a backup; known_hosts stays valid
    key_now = pub.read_text()
    lab.reinstall(host, keep_host_key=True)
    assert pub.read_text() == key_now and lab.host_key_fingerprint(host) == fp
    lab.ssh(host, "rm -rf /home/verl", check=True)


# --------------------------------------------------------------------------- teardown (last)


def _in_our_hosts(pid: str) -> bool:
    """A live process chrooted in one of this instance's hosts (sshd, anything it started)."""
    try:
        root = os.readlink(f"/proc/{pid}/root")
    except OSError:
        return False
    return root.startswith(f"{lab_state.HOSTS_DIR}/")


def _controller_leftovers() -> dict[str, list[str]]:
    """This instance's remains, found with the system tools (not p40lab's own bookkeeping);
    another instance (the user's lab) may be up meanwhile and is not counted."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True)
    ps = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
    routes = subprocess.run(["ip", "route", "show"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    hosts_dir = f"{lab_state.HOSTS_DIR}/"
    veth = f": {lab_state.VETH_PREFIX}{lab_state.HOST_PREFIX}"
    return {
        "netns": [n for n in netns.split() if n.startswith(lab_state.NETNS_PREFIX + "lab")],
        "mounts": [m for m in mounts.stdout.split() if m.startswith(f"{lab_state.LAB_DIR}/")],
        "processes": [
            line
            for line in ps.splitlines()
            if ("p40lab.supervisor" in line and hosts_dir in line or _in_our_hosts(line.split()[0]))
            and " Z" not in line
        ],
        "routes": [r for r in routes.splitlines() if f"{lab_state.NET}." in r],
        "links": [x for x in links.splitlines() if f": {lab_state.BRIDGE}:" in x or veth in x],
    }


def test_zz_down_leaves_nothing_and_up_options(lab):
    """Runs last: down, check, a small lab with --os/--no-headers/raw ids, down, default back."""
    t0 = time.monotonic()
    left = lab.down()
    assert not any(left.values()), left
    assert time.monotonic() - t0 < 10
    assert _controller_leftovers() == {k: [] for k in _controller_leftovers()}
    try:
        lab.up("0,2x1db4", no_headers="lab1", os_opts=["lab1=debian12"])
        out = lab.ssh(
            "lab1",
            ". /etc/os-release; echo $ID $VERSION_ID; "
            "test -e /lib/modules/$(uname -r)/build || echo no-headers; "
            "ls /sys/bus/pci/devices | wc -l",
            check=True,
        ).stdout.split()
        assert out == ["debian", "12", "no-headers", "2"], out
        ids = lab.ssh("lab2", "cat /sys/bus/pci/devices/0000:0[45]:00.0/device").stdout.split()
        assert ids == ["0x1db4", "0x1db4"]
        assert lab.ssh("lab2", "test -d /lib/modules/$(uname -r)/build").returncode == 0
    finally:
        left = lab.down()
    assert not any(left.values()), left
    assert _controller_leftovers() == {k: [] for k in _controller_leftovers()}
    lab.default_wanted = True  # the session's default lab, before the next test that uses it
