"""The lab's firewall fault (``python -m p40lab block/unblock``), without a lab: the nft command
lines it builds, its errors, and (root with nft) the scripts applied in a throwaway netns."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from p40lab import cli, firewall, net
from p40lab.state import LabError

NS = net.netns_name("lab1")


def test_block_script_drops_the_ports_in_the_labs_own_table():
    assert firewall.block_script([29500, 6379]) == (
        "add table inet p40lab\n"
        "add chain inet p40lab input { type filter hook input priority 0; policy accept; }\n"
        "add rule inet p40lab input tcp dport { 29500, 6379 } drop\n"
    )


def test_block_script_from_one_source_only():
    rule = firewall.block_script([29500], "10.231.0.12").splitlines()[-1]
    assert rule == "add rule inet p40lab input ip saddr 10.231.0.12 tcp dport { 29500 } drop"


def test_unblock_deletes_the_table_and_is_a_no_op_without_one():
    assert firewall.unblock_script() == "add table inet p40lab\ndelete table inet p40lab\n"


def test_nft_runs_in_the_hosts_netns_from_the_controller():
    assert firewall.nft_argv("lab1") == ["ip", "netns", "exec", NS, "nft", "-f", "-"]
    assert firewall.list_argv("lab2")[:4] == ["ip", "netns", "exec", net.netns_name("lab2")]


@pytest.mark.parametrize("text", ["", "0", "65536", "22,x", "80-90", "-1"])
def test_bad_ports_are_refused_naming_them(text):
    with pytest.raises(LabError, match="port"):
        firewall.parse_ports(text)


def test_ports_parse_in_order_without_duplicates():
    assert firewall.parse_ports("29500, 6379,29500") == [29500, 6379]


def test_missing_nft_names_the_package_and_make_target(monkeypatch):
    monkeypatch.setattr(firewall.shutil, "which", lambda name: None)
    with pytest.raises(LabError) as err:
        firewall.block("lab1", [29500])
    assert "apt-get install nftables" in str(err.value) and "make lab-setup" in str(err.value)
    firewall.clear("lab1")  # down: no nft, no table, no error


def test_a_host_without_a_netns_is_refused(monkeypatch):
    monkeypatch.setattr(firewall.shutil, "which", lambda name: "/usr/sbin/nft")
    monkeypatch.setattr(firewall, "our_netns", lambda: [])
    with pytest.raises(LabError, match=f"no netns {NS}"):
        firewall.unblock("lab1")


def test_block_and_unblock_send_their_scripts_to_nft(monkeypatch):
    calls = []
    monkeypatch.setattr(firewall.shutil, "which", lambda name: "/usr/sbin/nft")
    monkeypatch.setattr(firewall, "our_netns", lambda: [NS])
    monkeypatch.setattr(firewall, "run", lambda argv, **kw: calls.append((argv, kw)))
    firewall.block("lab1", [29500], "10.231.0.12")
    firewall.unblock("lab1")
    firewall.clear("lab1")
    argv = firewall.nft_argv("lab1")
    assert calls[0] == (argv, {"input": firewall.block_script([29500], "10.231.0.12")})
    assert calls[1] == (argv, {"input": firewall.unblock_script()})
    assert calls[2] == (argv, {"input": firewall.unblock_script(), "check": False, "quiet": True})


def test_cli_parses_block_and_unblock():
    args = cli.parser().parse_args(["block", "lab1", "--tcp", "29500,6379", "--from", "lab2"])
    assert (args.fn, args.host, args.tcp, args.source) == (cli.cmd_block, "lab1", "29500,6379",
                                                           "lab2")  # fmt: skip
    args = cli.parser().parse_args(["unblock", "lab1"])
    assert (args.fn, args.host) == (cli.cmd_unblock, "lab1")


def test_down_clears_each_hosts_block_before_its_netns_goes(monkeypatch):
    from p40lab import hosts

    order = []
    monkeypatch.setattr(hosts.st, "load", lambda: {"hosts": [{"name": "lab1", "ip": "x"}]})
    monkeypatch.setattr(hosts.st, "update", lambda fn: None)
    monkeypatch.setattr(hosts, "stop_host", lambda h: None)
    monkeypatch.setattr(hosts, "umount_disk", lambda name: None)
    monkeypatch.setattr(hosts, "our_mounts", lambda: [])
    monkeypatch.setattr(hosts, "leftovers", lambda: {}, raising=False)
    monkeypatch.setattr(hosts.net, "our_netns", lambda: [])
    monkeypatch.setattr(hosts.net, "our_veths", lambda: [])
    monkeypatch.setattr(hosts.net, "bridge_down", lambda: None)
    monkeypatch.setattr(hosts.firewall, "clear", lambda name: order.append(("clear", name)))
    monkeypatch.setattr(hosts.net, "host_down", lambda name: order.append(("netns", name)))
    hosts.down(mirror=False)
    assert order == [("clear", "lab1"), ("netns", "lab1")]


needs_nft = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("unshare"),
    reason="needs root, nft and unshare",
)


@needs_nft
def test_the_scripts_apply_in_a_netns_and_unblock_leaves_nothing():
    """nft itself takes the scripts: block twice (rules add up), list, unblock twice."""
    block = firewall.block_script([29500], "10.231.0.12") + firewall.block_script([6379])
    unblock = firewall.unblock_script()
    shell = (
        f"nft -f - <<'EOF'\n{block}EOF\nnft list table inet p40lab\necho @@unblocked\n"
        f"nft -f - <<'EOF'\n{unblock}EOF\nnft -f - <<'EOF'\n{unblock}EOF\nnft list tables\n"
    )
    proc = subprocess.run(["unshare", "--net", "sh", "-ec", shell], text=True,
                          capture_output=True, timeout=30)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ip saddr 10.231.0.12 tcp dport 29500 drop" in proc.stdout
    assert "tcp dport 6379 drop" in proc.stdout
    assert "hook input priority filter; policy accept;" in proc.stdout
    assert proc.stdout.split("@@unblocked")[1].strip() == ""  # unblock left no table
