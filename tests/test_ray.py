"""The Ray cluster as data: spec, head choice, ray start lines, ray status parsing, checks."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p40fleet.facts.ray import HasSystemd, RayStatus
from p40fleet.ray import (
    RAY_START_NO_CLIENT,
    TOKEN_FILE,
    UNIT_PATH,
    RayError,
    RayProbe,
    choose_head,
    cluster_token,
    load_members,
    parse_probe,
    parse_status,
    plan_ray,
    save_members,
    systemd_path,
    systemd_quote,
    token_file_text,
)
from p40fleet.spec import SpecError, load_spec
from p40fleet.verification.check import FAIL, PASS, SKIP
from p40fleet.verification.checks.ray import left_out_checks, ray_checks

#: The tests' own user: the facts' privilege drop runs without runuser then.
ME = getpass.getuser()

FIXTURES = Path(__file__).parent / "fixtures" / "ray"  # real Ray 2.48.0 output
TWO_NODES = (FIXTURES / "status-v-2.48.0-2nodes-6gpu.txt").read_text().splitlines()
ONE_DEAD = (FIXTURES / "status-v-2.48.0-1dead.txt").read_text().splitlines()
NO_GCS = (FIXTURES / "status-2.48.0-no-gcs.txt").read_text().splitlines()
#: Ray 2.52.1 on the lab after lab3 rebooted: ray status lists lab3's old node as active
#: (ray#63566); the GCS node table (GCS_NODES_PY's output) has it dead.
GHOST_STATUS = (FIXTURES / "status-v-2.52.1-dead-listed-active.txt").read_text().splitlines()
GHOST_GCS = (FIXTURES / "gcs-nodes-2.52.1-1dead.txt").read_text().splitlines()
GHOST = "4716e409a5d56014842359ba24b5de8c8951fdd2819f28470a181204"
REJOINED = "65a1d39e6bd6a8be8a87bbfd07027cb653674313fdd743be38d12a33"
HEAD_ID = "dba85ff5b25350855d5f6c65dd47e864c36c57a7c9f1a0fca94170f0"
WORKER_ID = "0302df07d04c8401454fe5894d0b83568c85181c553fdae5f5644349"
RAY = "/home/verl/miniconda3/envs/verl-p40/bin/ray"
PYTHON = "/home/verl/miniconda3/envs/verl-p40/bin/python"


# -- spec -----------------------------------------------------------------------------------


def test_spec_defaults_and_errors_name_host_and_field():
    ray = load_spec("lab1", {}).ray
    assert (ray.head, ray.port, ray.dashboard, ray.temp_dir) == (None, 6379, False, "/tmp/ray")
    with pytest.raises(SpecError) as exc:
        load_spec("lab2", {"ray": {"port": 80}}, {"ray": {"node_ip": "lab2"}})
    text = str(exc.value)
    assert "host lab2: stack.ray.port = 80: expected a number at least 1024" in text
    assert "stack.ray.node_ip = 'lab2': expected an IP address" in text
    assert "value set in stack_host" in text
    with pytest.raises(SpecError, match="unknown key 'surprise'"):
        load_spec("lab1", {"ray": {"surprise": 1}})
    with pytest.raises(SpecError, match="dashboard_port = 6379: expected a port other"):
        load_spec("lab1", {"ray": {"dashboard": True, "dashboard_port": 6379}})


# -- head and plans -------------------------------------------------------------------------


def test_head_from_spec_or_the_ray_head_group():
    spec = load_spec("lab1", {})
    assert choose_head(spec, ["lab1"], ["lab1", "lab2"]) == "lab1"
    named = load_spec("lab1", {"ray": {"head": "lab2"}})
    assert choose_head(named, ["lab1"], ["lab1", "lab2"]) == "lab2"
    with pytest.raises(RayError, match="group ray_head is missing") as exc:
        choose_head(spec, [], ["lab1"])
    assert "stack.ray.head" in exc.value.fix
    with pytest.raises(RayError, match=r"has 2 hosts \(lab1, lab2\)"):
        choose_head(spec, ["lab1", "lab2"], ["lab1", "lab2"])
    with pytest.raises(RayError, match="'lab9' is not a host of this inventory"):
        choose_head(load_spec("lab1", {"ray": {"head": "lab9"}}), [], ["lab1"])


def test_head_and_worker_start_lines():
    spec = load_spec("lab1", {"ray": {"port": 6380}}, {"ray": {"node_ip": "10.231.0.11"}})
    head = plan_ray(spec, "lab1", "lab1", "10.231.0.11")
    assert head.role == "head" and head.address == "10.231.0.11:6380"
    assert head.argv[:3] == (PYTHON, "-c", RAY_START_NO_CLIENT) and head.cli == RAY
    assert " ".join(head.argv[3:]) == (
        "start --head --port=6380 --node-ip-address=10.231.0.11 "
        "--include-dashboard=false --temp-dir=/tmp/ray --disable-usage-stats --block"
    )
    assert head.exec_start().startswith(f'{PYTHON} -c "import sys; ')
    worker = plan_ray(load_spec("lab2", {}), "lab2", "lab1", "10.231.0.11")
    assert worker.role == "worker"
    assert worker.argv == (
        RAY, "start", "--address=10.231.0.11:6379", "--disable-usage-stats", "--block"
    )  # fmt: skip
    dash = plan_ray(load_spec("lab1", {"ray": {"dashboard": True}}), "lab1", "lab1", "h")
    assert "--include-dashboard=true" in dash.argv and "--dashboard-port=8265" in dash.argv


def test_the_head_binds_the_ray_client_server_only_when_asked():
    """Ray 2.52's ``ray start --head`` binds the client server (10001, its address)
    whenever grpcio imports: off by default, through the launcher; on with the spec's port."""
    off = plan_ray(load_spec("lab1", {}), "lab1", "lab1", "h")
    assert off.argv[:2] == (PYTHON, "-c") and "--ray-client-server-port" not in " ".join(off.argv)
    on = plan_ray(load_spec("lab1", {"ray": {"client_server": True}}), "lab1", "lab1", "h")
    assert on.argv[:2] == (RAY, "start") and "--ray-client-server-port=10001" in on.argv
    port = load_spec("lab1", {"ray": {"client_server": True, "client_server_port": 10005}})
    assert "--ray-client-server-port=10005" in plan_ray(port, "lab1", "lab1", "h").argv
    with pytest.raises(SpecError, match="client_server_port"):
        load_spec("lab1", {"ray": {"client_server": True, "client_server_port": 6379}})


def test_the_launcher_leaves_the_client_server_out(tmp_path):
    """The launcher's code against a stand-in of ``ray.scripts.scripts`` with Ray 2.52's rule
    (``has_ray_client = get_ray_client_dependency_error() is None``, then port 10001)."""
    pkg = tmp_path / "ray" / "scripts"
    pkg.mkdir(parents=True)
    (tmp_path / "ray" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "scripts.py").write_text(
        "import sys\n"
        "def get_ray_client_dependency_error():\n    return None  # grpcio imports\n"
        "def main():\n"
        "    port = 10001 if get_ray_client_dependency_error() is None else None\n"
        "    print(sys.argv[0], sys.argv[1:], 'client_server_port', port)\n    return 0\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", RAY_START_NO_CLIENT, "start", "--head"],
                         env=env, capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.split() == ["ray", "['start',", "'--head']", "client_server_port", "None"]


def test_the_cluster_token_is_made_once_0600_and_kept(tmp_path):
    path = tmp_path / "cache" / "ray-auth" / "lab1@10.0.0.1_6379.token"
    token = cluster_token("lab1@10.0.0.1:6379", path)
    assert len(token) == 64 and int(token, 16) >= 0
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert cluster_token("lab1@10.0.0.1:6379", path) == token  # a second run: the same
    assert cluster_token("x", tmp_path / "other.token") != token  # another cluster: its own
    assert token_file_text(token) == f"RAY_AUTH_TOKEN={token}\n"
    path.write_text("not a token\n")
    with pytest.raises(RayError, match="not 64 hex digits") as bad:
        cluster_token("lab1@10.0.0.1:6379", path)
    assert f"remove {path}" in bad.value.fix
    with pytest.raises(ValueError):
        token_file_text("abc")


def test_systemd_quoting():
    assert systemd_quote("--address=10.0.0.1:6379") == "--address=10.0.0.1:6379"
    assert systemd_quote("/opt/my env/ray") == '"/opt/my env/ray"'
    assert systemd_quote('a"b\\c') == '"a\\"b\\\\c"'
    assert systemd_quote("100%") == '"100%%"' and systemd_quote("$HOME") == '"$$HOME"'
    with pytest.raises(ValueError):
        systemd_quote("a\nb")


# -- ray status -----------------------------------------------------------------------------


def test_status_of_two_nodes():
    status = parse_status(TWO_NODES)
    assert status is not None and status.active == (HEAD_ID, WORKER_ID)
    assert status.totals["GPU"] == 6.0 and status.totals["CPU"] == 3.0
    assert status.per_node[HEAD_ID]["GPU"] == 2.0 and status.per_node[WORKER_ID]["GPU"] == 4.0


def test_status_after_a_node_died_and_without_a_gcs():
    status = parse_status(ONE_DEAD)
    assert status is not None and status.active == (HEAD_ID,) and status.pending == 0
    assert parse_status(NO_GCS) is None


def probe(status_lines, node_id=HEAD_ID, rc=0, sim=False, active="active", enabled="enabled",
          gcs=None, gcs_rc=0):  # fmt: skip
    lines = ["unit=yes", f"active={active}", f"enabled={enabled}",
             f"sim={'yes' if sim else 'no'}", f"node_id={node_id}", "@@ray-status",
             *status_lines, f"@@rc={rc}"]  # fmt: skip
    if gcs is not None:
        lines += ["@@gcs-nodes", *gcs, f"@@gcs-rc={gcs_rc}"]
    return parse_probe(lines)


def test_a_dead_node_ray_status_still_lists_is_not_counted():
    """Ray 2.52.1's ``ray status`` keeps a rebooted member's old node under Active (4 of 3):
    the GCS node table decides, and the check passes with 3/3 saying what it left out."""
    assert parse_status(GHOST_STATUS).active[-1] == GHOST  # what ray status says
    answers = probe(GHOST_STATUS, node_id=REJOINED, gcs=GHOST_GCS)
    assert answers.membership == "gcs" and answers.dead == (GHOST,)
    assert len(answers.status.active) == 3 and GHOST not in answers.status.active
    checks = ray_checks(answers, address="h:6379", nodes=3, pci_gpus=0)
    assert checks[1].status == PASS, checks[1]
    assert "3/3 nodes active" in checks[1].detail and "1 dead node(s)" in checks[1].detail
    # without the GCS's table: ray status's count, and the check says where it came from
    blind = probe(GHOST_STATUS, node_id=REJOINED, gcs=["ModuleNotFoundError: ray._raylet"],
                  gcs_rc=1)  # fmt: skip
    assert blind.membership == "ray status" and len(blind.status.active) == 4
    check = ray_checks(blind, address="h:6379", nodes=3, pci_gpus=0)[1]
    assert check.status == FAIL and "4/3 nodes" in check.detail
    assert "GCS node table was not read: ModuleNotFoundError" in check.detail
    # a GCS that answers with a node ray status does not list yet: alive counts
    table = [f"@@gcs-node {HEAD_ID} alive 10.0.0.1", f"@@gcs-node {WORKER_ID} alive 10.0.0.2",
             f"@@gcs-node {'e' * 56} alive 10.0.0.3"]  # fmt: skip
    late = probe(TWO_NODES, gcs=table)
    assert late.status.active == (HEAD_ID, WORKER_ID, "e" * 56)


def test_probe_answers():
    answers = probe(TWO_NODES)
    assert answers.unit and answers.active == "active" and answers.node_id == HEAD_ID
    assert answers.status is not None and answers.status_rc == 0
    failed = probe(NO_GCS, rc=1)
    assert failed.status is None and "Timed out" in failed.status_tail[-1]


# -- checks ---------------------------------------------------------------------------------


def statuses(checks):
    return {c.name: c.status for c in checks}


def test_checks_pass_on_a_full_cluster_and_fail_on_a_missing_node():
    ok = ray_checks(probe(TWO_NODES), address="h:6379", nodes=2, pci_gpus=2)
    assert statuses(ok) == {"ray service": PASS, "ray cluster": PASS, "ray GPUs": PASS}
    assert "2/2 nodes active at h:6379" in ok[1].detail
    short = ray_checks(probe(ONE_DEAD), address="h:6379", nodes=2, pci_gpus=2)
    assert short[1].status == FAIL and "1/2 nodes" in short[1].detail and short[1].remedy
    gone = ray_checks(probe(ONE_DEAD, node_id=WORKER_ID), address="h:6379", nodes=1, pci_gpus=4)
    assert gone[1].status == FAIL and "is not active" in gone[1].detail
    assert gone[2].status == SKIP


def test_gpu_check_compares_with_pci_and_skips_simulated_hosts():
    wrong = ray_checks(probe(TWO_NODES, node_id=WORKER_ID), address="h:1", nodes=2, pci_gpus=8)
    assert wrong[2].status == FAIL and "offers 4 GPUs" in wrong[2].detail
    sim = ray_checks(probe(TWO_NODES, sim=True), address="h:1", nodes=2, pci_gpus=4,
                     simulated=True)  # fmt: skip
    assert sim[2].status == SKIP and "simulated host" in sim[2].detail
    # N14: the lab's marker on a host its inventory does not mark simulated: checked for real
    real = ray_checks(probe(TWO_NODES, sim=True), address="h:1", nodes=2, pci_gpus=4)
    assert real[2].status != SKIP and "simulated host" not in real[2].detail


def test_a_head_that_does_not_train_must_offer_no_gpu():
    # the head's unit runs --num-gpus=0: Ray offering its 2 GPUs is a FAIL (an old unit)
    head = ray_checks(probe(TWO_NODES), address="h:1", nodes=2, pci_gpus=2, ray_gpus=0)
    assert head[2].status == FAIL
    assert "offers 2 GPUs on this node, expected 0 planned" in head[2].detail


def test_a_left_out_host_skips_and_fails_when_it_still_runs_a_member():
    (skip,) = left_out_checks(RayProbe(), "1 GPU(s), fewer than the 8 every node runs")
    assert skip.status == SKIP and "not in the Ray cluster: 1 GPU(s), fewer" in skip.detail
    (fail,) = left_out_checks(probe(TWO_NODES), "1 GPU(s), fewer than the 8 every node runs")
    assert fail.status == FAIL and "left out of the Ray cluster (1 GPU(s)" in fail.detail
    assert "deploy/ray.py" in fail.remedy


def test_plan_ray_num_gpus():
    spec = load_spec("lab1", {})
    assert "--num-gpus=0" in plan_ray(spec, "lab1", "lab1", "10.0.0.1", num_gpus=0).argv
    assert not any("num-gpus" in a for a in plan_ray(spec, "lab1", "lab1", "10.0.0.1").argv)


def test_members_record_round_trip_and_unreadable_files(tmp_path):
    path = tmp_path / "ray-members.json"
    assert load_members("h@a:1", path) is None
    assert save_members("h@a:1", {"a": [0x1B38] * 2}, {"b": "no"}, path) is True
    assert save_members("h@a:1", {"a": [0x1B38] * 2}, {"b": "no"}, path) is False  # unchanged
    assert save_members("g@b:1", {"x": [0x15F8]}, {}, path) is True  # another cluster beside it
    got = load_members("h@a:1", path)
    assert (got.gpus, got.refused) == ({"a": (0x1B38, 0x1B38)}, {"b": "no"}) and got.learnt
    assert load_members("g@b:1", path).gpus == {"x": (0x15F8,)}
    path.write_text("{not json")
    assert load_members("h@a:1", path) is None
    assert save_members("h@a:1", {"a": [1]}, {}, path) is True  # rewritten whole


def test_service_down_and_head_unreachable_fail_with_remedies():
    checks = ray_checks(probe(NO_GCS, rc=1, active="activating", enabled="disabled"),
                        address="h:6379", nodes=2, pci_gpus=2)  # fmt: skip
    assert statuses(checks)["ray service"] == FAIL and "is-active: activating" in checks[0].detail
    assert checks[1].status == FAIL and "rc=1" in checks[1].detail and "h:6379" in checks[1].remedy


def test_not_deployed_is_one_skip():
    checks = ray_checks(RayProbe(), address="h:6379", nodes=2, pci_gpus=2)
    assert [(c.name, c.status) for c in checks] == [("ray", SKIP)]
    assert "deploy/ray.py" in checks[0].detail


# -- the facts' shell, run here against a stand-in ray CLI ----------------------------------


def test_ray_status_fact_command(tmp_path):
    temp = tmp_path / "ray"
    log = temp / "session_latest" / "logs"
    log.mkdir(parents=True)
    (log / "raylet.out").write_text((FIXTURES / "raylet.out-2.48.0-head.txt").read_text())
    cli = tmp_path / "ray-cli"
    cli.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\n"
                   f"echo \"$RAY_AUTH_MODE $RAY_AUTH_TOKEN\" > {tmp_path}/auth\n"
                   f"cat {FIXTURES}/status-v-2.48.0-2nodes-6gpu.txt\n")  # fmt: skip
    cli.chmod(0o755)
    py = tmp_path / "python"  # the env's python beside its ray CLI reads the GCS node table
    py.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$3\" \"$RAY_AUTH_TOKEN\" > {tmp_path}/gcs-args\n"
                  f"echo '@@gcs-node {HEAD_ID} alive 10.231.0.11'\n"
                  f"echo '@@gcs-node {WORKER_ID} dead 10.231.0.12'\n")  # fmt: skip
    py.chmod(0o755)
    unit = tmp_path / "unit"
    unit.touch()
    token = tmp_path / "ray-auth.env"
    token.write_text(token_file_text("ab" * 32))
    fact = RayStatus()
    command = fact.command(user=ME, ray=str(cli), address="10.231.0.11:6379", temp_dir=str(temp))
    assert f"p40fleet_tk={TOKEN_FILE}" in command  # root's own file, for the user's stdin
    command = command.replace(UNIT_PATH, str(unit)).replace(TOKEN_FILE, str(token))
    assert "ab" * 32 not in command  # the token is the file's, never the command line's
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    answers = fact.process(out.stdout.splitlines())
    assert (tmp_path / "args").read_text().split() == ["status", "--address",
                                                       "10.231.0.11:6379", "-v"]  # fmt: skip
    # ray status gets Ray's token auth from root's file, on stdin (RAY_AUTH_MODE=token)
    assert (tmp_path / "auth").read_text() == f"token {'ab' * 32}\n"
    assert (tmp_path / "gcs-args").read_text() == f"10.231.0.11:6379\n{'ab' * 32}\n"
    assert answers.membership == "gcs" and answers.status.active == (HEAD_ID,)
    assert answers.dead == (WORKER_ID,)
    token.unlink()  # no token file: the status runs (and a token-auth cluster refuses it)
    subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert (tmp_path / "auth").read_text() == "token \n"
    token.write_text(token_file_text("ab" * 32))
    assert answers.node_id == HEAD_ID and answers.status_rc == 0
    missing = fact.command(user=ME, ray=str(tmp_path / "none"), address="h:1", temp_dir=str(temp))
    out = subprocess.run(["sh", "-c", missing.replace(UNIT_PATH, str(unit))],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert fact.process(out.stdout.splitlines()).status_rc == 127
    unit.unlink()
    (tmp_path / "args").unlink()
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert not (answers := fact.process(out.stdout.splitlines())).unit
    assert answers.status is None and not (tmp_path / "args").exists()  # ray never asked


def test_ray_status_names_the_node_of_the_newest_raylet_log(tmp_path):
    """A worker that rejoins its head (reboot, crash) logs to raylet.1.out in the same session."""
    log = tmp_path / "ray" / "session_latest" / "logs"
    log.mkdir(parents=True)
    (log / "raylet.out").write_text((FIXTURES / "raylet.out-2.48.0-head.txt").read_text())
    rejoined = "f" * 56
    (log / "raylet.1.out").write_text(
        "[2026-11-30 11:50:02,001 I 23 23] (raylet) main.cc:501: Setting node ID "
        f"node_id={rejoined}\n"
    )
    os.utime(log / "raylet.out", (1, 1))
    fact = RayStatus()
    command = fact.command(
        user=ME, ray="/nowhere/ray", address="h:6379", temp_dir=str(tmp_path / "ray")
    )
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert fact.process(out.stdout.splitlines()).node_id == rejoined


def test_has_systemd_fact():
    assert HasSystemd().process(["yes"]) is True
    assert HasSystemd().process(["no"]) is False


# -- S2: Ray has no authentication: the dashboard on loopback, members on their own address -----


def test_dashboard_listens_on_loopback_unless_the_spec_opens_it():
    head = plan_ray(load_spec("lab1", {"ray": {"dashboard": True}}), "lab1", "lab1", "10.0.0.1")
    assert "--dashboard-host=127.0.0.1" in head.argv
    assert not [a for a in head.argv if "0.0.0.0" in a]
    opened = {"ray": {"dashboard": True, "dashboard_host": "10.0.0.1"}}
    head = plan_ray(load_spec("lab1", opened), "lab1", "lab1", "10.0.0.1")
    assert "--dashboard-host=10.0.0.1" in head.argv
    with pytest.raises(SpecError, match="dashboard_host = 'everywhere': expected an IP"):
        load_spec("lab1", {"ray": {"dashboard_host": "everywhere"}})


def test_members_pass_their_cluster_address():
    spec = load_spec("lab2", {})
    worker = plan_ray(spec, "lab2", "lab1", "10.0.0.1", node_ip="10.0.0.2")
    assert "--node-ip-address=10.0.0.2" in worker.argv
    pinned = load_spec("lab2", {}, {"ray": {"node_ip": "10.9.0.2"}})
    worker = plan_ray(pinned, "lab2", "lab1", "10.0.0.1", node_ip="10.0.0.2")
    assert "--node-ip-address=10.9.0.2" in worker.argv  # stack.ray.node_ip wins


def test_unit_quotes_home_and_path_for_systemd():
    plan = plan_ray(load_spec("lab1", {}), "lab1", "lab1", "10.0.0.1")
    values = plan.template_vars()
    assert values["work_dir"] == "/home/verl"
    assert values["env_home"] == "HOME=/home/verl"
    with pytest.raises(ValueError, match="systemd path"):
        systemd_path("/home/x y")
    assert systemd_quote("HOME=/home/a b") == '"HOME=/home/a b"'


def test_the_docs_say_how_ray_authenticates_and_what_it_does_not_cover():
    """docs/training.md (README links it for the Ray cluster and its token)."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "training.md").read_text()
    section = text[text.index("**Many boxes: the Ray cluster.**") :]
    section = section[: section.index("\n## ")] if "\n## " in section else section
    assert "**Ray's token authentication (review S2).**" in section
    for words in ("RAY_AUTH_MODE=token", "/etc/p40fleet/ray-auth.env", "root:root 0600",
                  "ray-auth/<cluster>.token", "client_server", "no TLS", "private network",
                  "firewall", "127.0.0.1", "--node-ip-address"):  # fmt: skip
        assert words in section, words
    assert "Ray has no authentication" not in text


@pytest.mark.parametrize("head_address", ["2001:db8::1", "[2001:db8::1]"])
def test_an_ipv6_head_address_is_bracketed_in_the_members_address(head_address):
    """Security N13: ``--address=2001:db8::1:6379`` is ambiguous; Ray's form is [v6]:port."""
    spec = load_spec("lab2", {"ray": {"head_address": head_address}})
    worker = plan_ray(spec, "lab2", "lab1", spec.ray.head_address)
    assert "--address=[2001:db8::1]:6379" in worker.argv and worker.address == "[2001:db8::1]:6379"
    # an inventory's bare ssh_hostname too; v4 and names stay as they are
    assert plan_ray(spec, "lab2", "lab1", "fe80::1").address == "[fe80::1]:6379"
    assert plan_ray(spec, "lab2", "lab1", "10.0.0.1").address == "10.0.0.1:6379"
    assert plan_ray(spec, "lab2", "lab1", "node1.lab").address == "node1.lab:6379"
