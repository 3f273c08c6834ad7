"""``python -m p40fleet.deploy``: an inventory pyinfra would run silently wrong is refused (2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from p40fleet.cli import deploy as deploy_cli

REPO = Path(__file__).resolve().parent.parent


def inventory(tmp_path: Path, text: str) -> str:
    path = tmp_path / "inventory.py"
    path.write_text(text)
    return str(path)


def refused(capsys, *argv: str) -> str:
    assert deploy_cli.main(list(argv)) == 2
    return capsys.readouterr().err


def test_missing_inventory_file_is_2(tmp_path, capsys):
    err = refused(capsys, str(tmp_path / "lab_typo.py"), "deploy/full.py")
    assert "lab_typo.py does not exist" in err


def test_empty_inventory_is_2(tmp_path, capsys):
    err = refused(capsys, inventory(tmp_path, "hosts = []\n"), "deploy/full.py")
    assert "has 0 hosts" in err


def test_repeated_address_is_2(tmp_path, capsys):
    text = (
        'hosts = [("p40-01", {"ssh_hostname": "192.0.2.11"}),\n'
        '         ("p40-01-again", {"ssh_hostname": "192.0.2.11"}), "p40-02"]\n'
    )
    err = refused(capsys, inventory(tmp_path, text), "deploy/full.py", "-y")
    assert "hosts p40-01, p40-01-again share the address 192.0.2.11 port 22" in err
    assert "fix: list each machine once" in err


def test_one_nat_address_on_different_ports_is_fine(tmp_path):
    """N10: hosts behind one NAT/bastion address, each on its own ssh_port, are two machines."""
    text = (
        'hosts = [("p40-01", {"ssh_hostname": "192.0.2.1", "ssh_port": 2201}),\n'
        '         ("p40-02", {"ssh_hostname": "192.0.2.1", "ssh_port": 2202})]\n'
    )
    assert deploy_cli.check_inventory(inventory(tmp_path, text)) == 2


@pytest.mark.parametrize(
    ("first", "second", "shown"),
    [
        ("2001:db8::1", "2001:DB8:0:0::1", "2001:db8::1"),  # two spellings of one IPv6 address
        ("node.lab.", "Node.Lab", "node.lab"),  # a trailing-dot FQDN, another case
        ("192.0.2.11", "[192.0.2.11]", "192.0.2.11"),
    ],
)
def test_two_spellings_of_one_address_are_2(tmp_path, capsys, first, second, shown):
    """N10: the same machine under two spellings of its address is refused."""
    text = (
        f'hosts = [("a", {{"ssh_hostname": {first!r}}}), ("b", {{"ssh_hostname": {second!r}}})]\n'
    )
    err = refused(capsys, inventory(tmp_path, text), "deploy/full.py")
    assert f"hosts a, b share the address {shown} port 22" in err


def test_the_default_port_is_22(tmp_path, capsys):
    text = (
        'hosts = [("a", {"ssh_hostname": "192.0.2.5"}),\n'
        '         ("b", {"ssh_hostname": "192.0.2.5", "ssh_port": 22})]\n'
    )
    err = refused(capsys, inventory(tmp_path, text), "deploy/full.py")
    assert "hosts a, b share the address 192.0.2.5 port 22" in err


def test_repeated_names_are_2(tmp_path, capsys):
    text = 'hosts = ["p40-02", ("p40-02", {"ssh_port": 2222})]\n'
    err = refused(capsys, inventory(tmp_path, text), "deploy/full.py")
    assert "host p40-02 is listed 2 times in group hosts" in err
    text = 'a = [("p40-02", {"x": 1})]\nb = [("p40-02", {"x": 2})]\n'
    err = refused(capsys, inventory(tmp_path, text), "deploy/full.py")
    assert "host p40-02 is given host data in 2 places (a, b)" in err


def test_a_host_in_two_groups_without_conflict_is_fine(tmp_path):
    path = inventory(tmp_path, 'sim = ["@local"]\nray_head = ["@local"]\n')
    assert deploy_cli.check_inventory(path) == 1


def test_usage_errors_are_2(tmp_path, capsys):
    path = inventory(tmp_path, 'hosts = ["@local"]\n')
    assert "no deploy file" in refused(capsys, path, "--limit", "x")
    assert "do not exist" in refused(capsys, path, "deploy/nope.py")
    assert "failed to load" in refused(capsys, inventory(tmp_path, "raise SystemError('x')\n"),
                                       "deploy/full.py")  # fmt: skip


def test_split_args():
    argv = ["inv.py", "deploy/a.py", "deploy/b.py", "-y", "--limit", "x"]
    assert deploy_cli.split_args(argv) == (
        "inv.py", ["deploy/a.py", "deploy/b.py"], ["-y", "--limit", "x"]
    )  # fmt: skip
    with pytest.raises(deploy_cli.InventoryError):
        deploy_cli.split_args(["-y"])


def test_a_good_inventory_runs_pyinfra(tmp_path):
    """End to end: the module runs pyinfra with the deploys and the arguments given."""
    path = inventory(tmp_path, 'hosts = ["@local"]\n')
    proc = subprocess.run(
        [sys.executable, "-m", "p40fleet.deploy", path, "deploy/facts.py", "--dry"],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "inventory" in out and "1 host(s)" in out and "[@local]" in out, out
