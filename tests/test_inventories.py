"""The inventories' connection settings: a non-root admin always goes through sudo, host keys are
checked strictly, a sudo password comes from the environment only (issue 13, security S9/S18)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State, StringCommand
from pyinfra.connectors.util import CommandOutput, make_unix_command
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory

from p40fleet.operations.run import verify as run_verify
from p40fleet.spec import load_spec
from p40fleet.training import TrainingTarget

REPO = Path(__file__).resolve().parents[1]
SECRET = "P40-not-in-any-file"


def _hosts(path: Path) -> dict:
    with ctx_state.use(State()):
        return {h.name: h for h in make_inventory(str(path), cwd=str(REPO))}


def _root_or_sudo(hosts: dict) -> None:
    for host in hosts.values():
        user = host.data.get("ssh_user")
        assert user == "root" or host.data.get("_sudo") is True, (host.name, user)
        assert host.data.get("ssh_strict_host_key_checking") == "yes", host.name


def test_lab_inventory_admin_goes_through_sudo(monkeypatch):
    monkeypatch.delenv("P40FLEET_SUDO_PASSWORD", raising=False)
    hosts = _hosts(REPO / "inventories" / "lab.py")
    assert set(hosts) == {"p40-01", "p40-02", "p40-03"}
    _root_or_sudo(hosts)
    for host in hosts.values():
        assert host.data.get("ssh_user") == "admin"  # the example: sudo, not root logins
        assert not host.data.get("_sudo_password")  # a NOPASSWD rule by default


def test_lab_inventory_sudo_password_from_the_environment_only(monkeypatch):
    monkeypatch.setenv("P40FLEET_SUDO_PASSWORD", SECRET)
    hosts = _hosts(REPO / "inventories" / "lab.py")
    assert {h.data.get("_sudo_password") for h in hosts.values()} == {SECRET}
    text = (REPO / "inventories" / "lab.py").read_text()
    assert "NOPASSWD" in text and "PYINFRA_SUDO_PASSWORD" in text  # the rule and the exposure


def _sim_hosts(tmp_path: Path, monkeypatch, **env: str) -> dict:
    state = {
        "up": True,
        "ssh_key": str(tmp_path / "id_ed25519"),
        "known_hosts": str(tmp_path / "known_hosts"),
        "hosts": [
            {
                "name": f"lab{i}",
                "ip": f"10.0.0.{10 + i}",
                "layout": "4xP40",
                "os": "ubuntu20.04",
                "supervisor_pid": os.getpid(),
            }
            for i in (1, 2)
        ],
    }
    (tmp_path / "state.json").write_text(json.dumps(state))
    monkeypatch.setenv("P40LAB_STATE", str(tmp_path / "state.json"))
    for name in ("P40LAB_SSH_USER", "P40LAB_SUDO_PASSWORD", "P40LAB_HOST_DATA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return _hosts(REPO / "inventories" / "sim.py")


def test_sim_inventory_root_by_default(tmp_path, monkeypatch):
    hosts = _sim_hosts(tmp_path, monkeypatch)
    _root_or_sudo(hosts)
    assert {(h.data.get("ssh_user"), h.data.get("_sudo")) for h in hosts.values()} == {
        ("root", None)
    }


@pytest.mark.parametrize("password", [None, SECRET])
def test_sim_inventory_connects_as_the_lab_admin_with_sudo(tmp_path, monkeypatch, password):
    env = {"P40LAB_SSH_USER": "admin-pw" if password else "admin"}
    if password:
        env["P40LAB_SUDO_PASSWORD"] = password
    hosts = _sim_hosts(tmp_path, monkeypatch, **env)
    _root_or_sudo(hosts)
    for host in hosts.values():
        assert host.data.get("ssh_user") == env["P40LAB_SSH_USER"]
        assert host.data.get("_sudo") is True
        assert (host.data.get("_sudo_password") or None) == password


def test_pyinfra_sends_the_sudo_password_in_the_remote_command_line():
    """S18, pyinfra 3.10's design: masked in logs, in clear in the command sent to the host
    (README "When it fails" and inventories/lab.py say so; a NOPASSWD rule avoids it)."""
    command = make_unix_command(
        StringCommand("id"), _sudo=True, _sudo_password=SECRET, _sudo_askpass_path="/tmp/ask"
    )
    assert f"PYINFRA_SUDO_PASSWORD={SECRET}" in command.get_raw_value()
    assert SECRET not in str(command)


def test_verify_probe_after_the_run_uses_the_hosts_sudo(monkeypatch):
    """deploy/full.py's closing probe runs like the facts: through sudo for a sudo host (it ran
    as the bare SSH user before, where a non-root admin cannot read root's files)."""
    inventory = Inventory((["h1"], {"ssh_user": "admin", "_sudo": True, "_sudo_password": "pw"}))
    State(inventory, Config())
    target = inventory.get_host("h1")
    seen: dict = {}

    def run_shell_command(command, **kwargs):
        seen.update(kwargs)
        return False, CommandOutput([])

    plan = TrainingTarget("/m", "/d/train.parquet", "/d/test.parquet")
    monkeypatch.setattr(target, "get_fact", lambda fact, **kw: [])
    monkeypatch.setattr(target, "run_shell_command", run_shell_command)
    monkeypatch.setattr(run_verify.training, "training_target", lambda spec, t: plan)
    run_verify._probe_now(target, load_spec("h1", {}))
    assert seen.get("_sudo") is True and seen.get("_sudo_password") == "pw"


def test_only_the_sim_inventory_marks_hosts_simulated(tmp_path, monkeypatch):
    """N14: "simulated" is the inventory's word (host data p40lab_sim), never the host's disk:
    the lab's hosts have it from inventories/sim.py, a real inventory's hosts never do, so a
    lab marker left on a real host cannot turn its GPU checks into SKIPs."""
    from p40fleet.verification.check import simulated_in_inventory

    real = _hosts(REPO / "inventories" / "lab.py")
    assert real and not any(simulated_in_inventory(h.data) for h in real.values())
    lab = _sim_hosts(tmp_path, monkeypatch)
    assert lab and all(simulated_in_inventory(h.data) for h in lab.values())
