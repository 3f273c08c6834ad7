"""p40fleet.runtime's smaller adaptations: the connector arguments, the inventory as pyinfra's
CLI reads it, pyinfra's template loader (sshguard, ssh_poll, deploy_frames: their own tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS

from p40fleet.runtime import connector_args, inventory, templates
from tests.opharness import make_host

REPO = Path(__file__).resolve().parents[1]


def test_connector_arguments_keep_only_pyinfras_connector_keys():
    given = {"_sudo": True, "_su_user": "u", "_env": {"A": "1"}, "_serial": True, "_if": []}
    assert connector_arguments_of(given) == {"_sudo": True, "_su_user": "u", "_env": {"A": "1"}}
    assert connector_args.connector_arguments(None) == {}
    assert connector_args.connector_arguments({}) == {}


def connector_arguments_of(given):
    found = connector_args.connector_arguments(given)
    assert set(found) <= set(CONNECTOR_ARGUMENT_KEYS)
    return found


def test_a_hosts_connector_arguments_come_from_its_data_outside_any_operation():
    """The verify probe runs after the last operation: ``_sudo`` from the inventory must reach
    its command, or it would run unprivileged."""
    _, host = make_host({"_sudo": True, "_sudo_user": "ops", "ssh_port": 2222})
    found = connector_args.host_connector_arguments(host)
    assert found["_sudo"] is True and found["_sudo_user"] == "ops"
    assert "ssh_port" not in found and set(found) <= set(CONNECTOR_ARGUMENT_KEYS)
    _, plain = make_host({})
    assert connector_args.host_connector_arguments(plain)["_sudo"] is False


def test_the_inventory_is_read_with_its_group_data_from_the_given_directory(tmp_path):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text("stack = {'from': 'group_data'}\n")
    (tmp_path / "group_data" / "gpus.py").write_text("gpu_layout = '4xP40'\n")
    source = tmp_path / "fleet.py"
    source.write_text("gpus = [('p40-01', {'ssh_port': 2201}), 'p40-02']\n")
    before = os.getcwd()
    hosts = {h.name: h for h in inventory.load_inventory(str(source), tmp_path)}
    assert os.getcwd() == before  # the working directory is given back
    assert set(hosts) == {"p40-01", "p40-02"}
    assert hosts["p40-01"].data.get("ssh_port") == 2201
    assert hosts["p40-02"].data.get("stack") == {"from": "group_data"}
    assert hosts["p40-02"].data.get("gpu_layout") == "4xP40"


def test_a_list_of_host_names_is_an_inventory_as_on_pyinfras_command_line():
    found = inventory.load_inventory("p40-08.example,p40-09.example", REPO)
    assert sorted(h.name for h in found) == ["p40-08.example", "p40-09.example"]


def test_an_inventory_that_fails_raises_pyinfras_error_and_gives_the_directory_back(tmp_path):
    source = tmp_path / "broken.py"
    source.write_text("raise RuntimeError('no lab state')\n")
    before = os.getcwd()
    with pytest.raises(Exception) as raised:  # pyinfra's own (UnexpectedExternalError)
        inventory.load_inventory(str(source), tmp_path)
    assert repr(raised.value.exception) == "RuntimeError('no lab state')"
    assert os.getcwd() == before


def test_templates_render_as_files_template_does(tmp_path):
    """pyinfra's loader: StrictUndefined (a missing name fails) and the trailing newline kept."""
    src = tmp_path / "t.j2"
    src.write_text("user={{ name }}\n")
    assert templates.get_template(str(src)).render({"name": "p40"}) == "user=p40\n"
    with pytest.raises(Exception, match="undefined"):
        templates.get_template(str(src)).render({})
