"""operations/ray.py: facts in, commands out (tests/opharness.py)."""

from __future__ import annotations

import hashlib
import json

import pytest
from pyinfra.api import State
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.facts.server import TmpDir
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from p40fleet.facts.gpu import PciGpus
from p40fleet.facts.ray import HasSystemd
from p40fleet.operations import ray
from p40fleet.ray import TOKEN_FILE, UNIT_NAME, UNIT_PATH, cluster_token, plan_ray
from p40fleet.spec import load_spec
from tests.opharness import run_op

SPEC = load_spec("lab1", {})
PLAN = plan_ray(load_spec("lab2", {}), "lab2", "lab1", "10.231.0.11")
RAY = PLAN.argv[0]
UNIT_FILE = {"mode": 644, "user": "root", "group": "root"}
TOKEN = {"mode": 600, "user": "root", "group": "root"}


@pytest.fixture(autouse=True)
def controller_cache(tmp_path, monkeypatch):
    """The controller's cache (the cluster's token) in a temp dir."""
    monkeypatch.setenv("P40FLEET_CACHE", str(tmp_path / "controller"))


def token_sha1() -> str:
    token = cluster_token(PLAN.cluster)
    return hashlib.sha1(f"RAY_AUTH_TOKEN={token}\n".encode()).hexdigest()


def rendered() -> str:
    fresh = run_op(ray.ray_member, plan=PLAN, facts=facts(unit=None, token=None))
    return fresh.uploads[UNIT_PATH]


def facts(unit=UNIT_FILE, sha1=None, running=True, enabled=True, systemd=True, cli=True,
          token=TOKEN, token_sha1=None):  # fmt: skip
    """A host's answers; ``token``/``token_sha1``: TOKEN_FILE's (the sum: this cluster's)."""

    def file(path):
        if path == RAY:
            return {"mode": 755} if cli else None
        return token if path == TOKEN_FILE else unit

    def sha1sum(path):
        if path == TOKEN_FILE:
            return globals()["token_sha1"]() if token_sha1 is None else token_sha1
        return sha1

    return {
        HasSystemd: systemd,
        File: file,
        Directory: lambda path: None if path in (UNIT_PATH, TOKEN_FILE) else {"mode": 755},
        Sha1File: sha1sum,
        TmpDir: "/tmp",
        SystemdStatus: {UNIT_NAME: running},
        SystemdEnabled: {UNIT_NAME: enabled},
    }


def test_fresh_host_gets_unit_reload_start_enable():
    result = run_op(ray.ray_member, plan=PLAN, facts=facts(unit=None, running=False,
                                                           enabled=False, token=None))  # fmt: skip
    assert result.commands[-3:] == [
        "systemctl daemon-reload",
        f"systemctl start {UNIT_NAME}",
        f"systemctl enable {UNIT_NAME}",
    ]
    text = result.uploads[UNIT_PATH]
    assert f"ExecStart={RAY} start --address=10.231.0.11:6379 --disable-usage-stats --block" in text
    assert "User=verl" in text and "Restart=always" in text and "WantedBy=multi-user.target" in text


def test_running_member_of_this_cluster_is_left_alone():
    sha1 = hashlib.sha1(rendered().encode()).hexdigest()
    result = run_op(ray.ray_member, plan=PLAN, facts=facts(sha1=sha1))
    assert result.commands == [] and not result.changed
    assert any("is running" in n for n in result.noops)


def test_other_cluster_unit_is_rewritten_and_the_member_restarted():
    result = run_op(ray.ray_member, plan=PLAN, facts=facts(sha1="0" * 40))
    assert f"upload {UNIT_PATH}" in result.commands
    assert result.commands[-2:] == ["systemctl daemon-reload", f"systemctl restart {UNIT_NAME}"]
    assert not any(c.endswith(f"start {UNIT_NAME}") and "restart" not in c
                   for c in result.commands)  # fmt: skip


def test_stopped_or_disabled_member_is_started_or_enabled_only():
    sha1 = hashlib.sha1(rendered().encode()).hexdigest()
    stopped = run_op(ray.ray_member, plan=PLAN, facts=facts(sha1=sha1, running=False))
    assert stopped.commands == [f"systemctl start {UNIT_NAME}"]
    disabled = run_op(ray.ray_member, plan=PLAN, facts=facts(sha1=sha1, enabled=False))
    assert disabled.commands == [f"systemctl enable {UNIT_NAME}"]


def test_a_fresh_member_gets_the_clusters_token_root_0600_and_token_auth():
    """The token file (root:root 0600, made so before the upload writes into it) and a unit
    that runs Ray with RAY_AUTH_MODE=token and has systemd read that file."""
    result = run_op(ray.ray_member, plan=PLAN, facts=facts(unit=None, running=False,
                                                           enabled=False, token=None))  # fmt: skip
    token = cluster_token(PLAN.cluster)
    assert result.uploads[TOKEN_FILE] == f"RAY_AUTH_TOKEN={token}\n"
    first = result.commands.index(f"upload {TOKEN_FILE}")
    assert result.commands[first - 1] == (
        "install -d -m 700 -o root -g root /etc/p40fleet && ( umask 077 && touch "
        f"{TOKEN_FILE} ) && chmod 600 {TOKEN_FILE}"
    )
    assert f"chmod 600 {TOKEN_FILE}" in result.commands[first + 1 :]
    assert f"chown root:root {TOKEN_FILE}" in result.commands[first + 1 :]
    assert first < result.commands.index(f"upload {UNIT_PATH}")  # the token before its unit
    unit = result.uploads[UNIT_PATH]
    assert "Environment=RAY_AUTH_MODE=token\n" in unit
    assert f"EnvironmentFile={TOKEN_FILE}\n" in unit  # no "-": no token, no start
    # the secret travels only as the upload's content: never a command, log or no-op line
    said = [*result.commands, *result.logs, *result.noops, *result.failures]
    assert not [line for line in said if token in line]
    assert token not in unit


def test_a_converged_member_sends_nothing_and_a_new_token_restarts_it():
    sha1 = hashlib.sha1(rendered().encode()).hexdigest()
    same = run_op(ray.ray_member, plan=PLAN, facts=facts(sha1=sha1))
    assert same.commands == [] and not same.changed
    other = run_op(ray.ray_member, plan=PLAN, facts=facts(sha1=sha1, token_sha1="0" * 40))
    assert f"upload {TOKEN_FILE}" in other.commands and f"upload {UNIT_PATH}" not in other.commands
    assert other.commands[-1] == f"systemctl restart {UNIT_NAME}"
    loose = run_op(ray.ray_member, plan=PLAN, facts=facts(sha1=sha1, token={**TOKEN, "mode": 644}))
    assert loose.commands[-1] == f"chmod 600 {TOKEN_FILE}"  # made 0600 again, no restart


def test_a_bad_token_on_the_controller_refuses_the_host(tmp_path):
    path = ray.cluster_token.__globals__["token_path"](PLAN.cluster)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("short\n")
    result = run_op(ray.ray_member, plan=PLAN, facts=facts())
    assert result.commands == ["function _fail"]
    assert "not 64 hex digits" in result.failures[0] and f"remove {path}" in result.failures[0]


def test_refusals_change_nothing():
    no_systemd = run_op(ray.ray_member, plan=PLAN, facts=facts(systemd=False))
    assert no_systemd.commands == ["function _fail"]
    assert "/run/systemd/system is missing" in no_systemd.failures[0]
    assert "host lab1: ray cluster:" in no_systemd.failures[0]
    no_cli = run_op(ray.ray_member, plan=PLAN, facts=facts(cli=False))
    assert no_cli.commands == ["function _fail"]
    assert f"{RAY} is missing" in no_cli.failures[0] and "deploy/python.py" in no_cli.failures[0]


class _Member:
    """An inventory host as ray_cluster.membership reads it: a name, host data, its PCI fact."""

    def __init__(self, name: str, devices: list[int]):
        from p40fleet.facts.gpu import PciGpu
        from p40fleet.gpu_catalog import lookup

        self.name = name
        self.data = {}
        self.asked: list[type] = []
        self._gpus = [
            PciGpu(f"0000:0{i}:00.0", 0x10DE, d, 0x030200, 0x10DE, 0x11D9, lookup(d))
            for i, d in enumerate(devices, 1)
        ]

    probe = None  # what facts.ray.RayStatus answers here (verify)

    def get_fact(self, cls, **kwargs):
        from p40fleet.facts.gpu import PciGpus
        from p40fleet.facts.ray import RayStatus

        if cls is RayStatus and self.probe is not None:
            return self.probe
        assert cls is PciGpus, cls
        self.asked.append(cls)
        return self._gpus


P40, P100, H200 = 0x1B38, 0x15F8, 0x2335
DEMO = {"lab1": [P40] * 4, "lab2": [P40] * 8, "lab3": [P100], "lab4": [H200] * 2}


class _Inventory:
    """pyinfra's inventory as ray_cluster reads it: hosts, the active ones (this run's
    ``--limit``, connected), groups, and a state (one membership per state)."""

    def __init__(self, members: list[_Member], active: list[str], head: str = "lab1"):
        self.members = members
        self.active = active
        self.head = head
        self.state = State()

    def __iter__(self):
        return iter(self.members)

    def get_active_hosts(self):
        return [m for m in self.members if m.name in self.active]

    def get_host(self, name):
        return next(m for m in self.members if m.name == name)

    def get_group(self, name):
        assert name == "ray_head"
        return [self.get_host(self.head)]


@pytest.fixture
def fleet(monkeypatch, tmp_path):
    """``fleet(counts, active=None)`` -> (ray_cluster module, members by name); the controller
    cache in tmp_path (its ray-members.json is the last full run's record)."""
    from p40fleet.operations.run import ray_cluster

    monkeypatch.setenv("P40FLEET_CACHE", str(tmp_path))

    def make(counts=DEMO, active=None):
        members = [_Member(n, devices) for n, devices in counts.items()]
        for i, m in enumerate(members, 1):
            m.data = {"ssh_hostname": f"10.0.0.{i}"}
        fake = _Inventory(members, list(counts) if active is None else active)
        monkeypatch.setattr(ray_cluster, "inventory", fake)
        return ray_cluster, {m.name: m for m in members}

    return make


def test_a_member_its_own_spec_refuses_is_not_in_the_cluster_before_its_preflight_ran(fleet):
    """The demo's 2xH200 host (R525 refuses it) prepared after a P100 host: it must not size the
    P100's launch plan, whether or not its own preflight has refused it yet (CI, 2026-12-01)."""
    ray_cluster, members = fleet({"lab1": [P40] * 4, "lab3": [P100], "lab4": [H200] * 2})
    shape = ray_cluster.membership(SPEC).shape
    assert dict(shape.node_gpus) == {"lab1": 4}
    assert H200 not in shape.gpus
    assert members["lab4"].asked  # decided from its own facts, not from the order hosts ran in
    why = shape.why_left_out("lab4")
    assert why.startswith("refused (GPUs 2× H200") and "R525" in why


def test_full_run_plans_the_demo_fleet_on_8_gpus_and_records_every_member(fleet, tmp_path):
    ray_cluster, _ = fleet()
    members = ray_cluster.membership(SPEC)
    assert (members.head, members.address) == ("lab1", "10.0.0.1:6379")
    assert (members.shape.members, members.shape.gpus_per_node) == (("lab2",), 8)
    assert members.shape.name == "headed by lab1 (10.0.0.1:6379)"
    assert [n for n, _ in members.shape.left_out] == ["lab1", "lab3", "lab4"]
    assert members.runs_member("lab1") and members.runs_member("lab2")  # the head, the node
    assert not members.runs_member("lab3") and not members.runs_member("lab4")
    record = json.loads((tmp_path / "ray-members.json").read_text())
    nodes = record["clusters"]["lab1@10.0.0.1:6379"]["nodes"]
    assert nodes["lab2"] == {"gpus": [P40] * 8} and nodes["lab3"] == {"gpus": [P100]}
    assert "H200" in nodes["lab4"]["refused"]
    assert any("recorded" in note for note in members.notes)
    # the same run asks once; a second full run with the same facts leaves the file alone
    mtime = (tmp_path / "ray-members.json").stat().st_mtime_ns
    again, _ = fleet()
    assert again.membership(SPEC).notes == ()
    assert (tmp_path / "ray-members.json").stat().st_mtime_ns == mtime


def test_limit_never_reshapes_members_outside_the_run_come_from_the_record(fleet):
    ray_cluster, _ = fleet()
    full = ray_cluster.membership(SPEC).shape
    limited, members = fleet(active=["lab1"])  # pyinfra ... --limit lab1
    got = limited.membership(SPEC)
    assert got.shape == full  # the same cluster, the same header text
    assert not members["lab2"].asked and not members["lab3"].asked  # not in this run
    assert members["lab1"].asked
    assert got.notes and got.notes[0].startswith("lab2, lab3, lab4 not in this run: sized from")
    # lab1's own script: the plan a full run writes (it trains alone on 4 GPUs)
    from p40fleet.launch import plan_launch

    gpus = members["lab1"].get_fact(PciGpus)
    assert plan_launch(SPEC, gpus, cluster=got.shape, host="lab1") == plan_launch(
        SPEC, gpus, cluster=full, host="lab1"
    )


def test_an_unreachable_member_is_sized_from_the_record(fleet):
    ray_cluster, _ = fleet()
    full = ray_cluster.membership(SPEC).shape
    # lab2 (the one training node) did not connect: still the cluster, never lab1 x 4 + ...
    unreachable, _ = fleet(active=["lab1", "lab3", "lab4"])
    got = unreachable.membership(SPEC)
    assert got.shape == full and got.shape.members == ("lab2",)
    assert got.notes[0].startswith("lab2 not in this run")


def test_without_a_record_a_partial_run_plans_no_cluster(fleet, tmp_path):
    ray_cluster, members = fleet(active=["lab1", "lab3"])
    got = ray_cluster.membership(SPEC)
    assert got.shape is None
    assert "members lab2, lab4 are not in this run (--limit) or unreachable" in got.problem
    assert str(tmp_path / "ray-members.json") in got.problem and "without --limit" in got.problem
    assert not (tmp_path / "ray-members.json").exists()  # a partial run records nothing
    (check,) = ray_cluster.verify_checks(SPEC)  # verify follows the same membership
    assert (check.name, check.status) == ("ray", "FAIL") and "lab2, lab4" in check.detail
    assert "without --limit" in check.remedy


def test_a_record_of_another_cluster_is_not_used(fleet, tmp_path):
    ray_cluster, _ = fleet()
    ray_cluster.membership(SPEC)
    other = load_spec("lab1", {"ray": {"port": 6380}})  # another GCS: another cluster
    limited, _ = fleet(active=["lab1"])
    assert limited.membership(other).shape is None


def test_the_head_that_does_not_train_offers_ray_no_gpu(fleet, monkeypatch):
    ray_cluster, members = fleet()
    got = ray_cluster.membership(SPEC)
    monkeypatch.setattr(ray_cluster, "host", members["lab1"])
    head = ray_cluster.plan_for_host(SPEC, got)
    assert head.role == "head" and "--num-gpus=0" in head.argv
    monkeypatch.setattr(ray_cluster, "host", members["lab2"])
    worker = ray_cluster.plan_for_host(SPEC, got)
    assert worker.role == "worker" and not any(a.startswith("--num-gpus") for a in worker.argv)
    # 4+4: the head trains, Ray offers its GPUs
    ray_cluster, members = fleet({"lab1": [P40] * 4, "lab2": [P40] * 4})
    monkeypatch.setattr(ray_cluster, "host", members["lab1"])
    plan = ray_cluster.plan_for_host(SPEC, ray_cluster.membership(SPEC))
    assert not any(a.startswith("--num-gpus") for a in plan.argv)
    assert ray_cluster.expected_nodes(SPEC, ray_cluster.membership(SPEC)) == 2


def test_expected_nodes_are_the_head_and_the_training_nodes(fleet):
    ray_cluster, _ = fleet()
    assert ray_cluster.expected_nodes(SPEC, ray_cluster.membership(SPEC)) == 2  # lab1 + lab2
    ray_cluster, _ = fleet({"lab1": [P40] * 8, "lab2": [P40] * 8, "lab3": [P40] * 4})
    assert ray_cluster.expected_nodes(SPEC, ray_cluster.membership(SPEC)) == 2


def test_a_left_out_host_runs_no_member():
    absent = run_op(ray.ray_left_out, why="1 GPU(s)", facts={File: None})
    assert absent.commands == [] and "left out of the cluster (1 GPU(s))" in absent.noops[0]
    only_token = {File: lambda path: TOKEN if path == TOKEN_FILE else None}
    token_only = run_op(ray.ray_left_out, why="1 GPU(s)", facts=only_token)
    assert token_only.commands == [f"rm -f {TOKEN_FILE}"]  # no stale token stays
    present = run_op(
        ray.ray_left_out,
        why="1 GPU(s)",
        facts={
            File: UNIT_FILE,
            SystemdStatus: {UNIT_NAME: True},
            SystemdEnabled: {UNIT_NAME: True},
        },
    )
    assert present.commands == [
        f"systemctl stop {UNIT_NAME}",
        f"systemctl disable {UNIT_NAME}",
        f"rm -f {UNIT_PATH}",
        "systemctl daemon-reload",
        f"rm -f {TOKEN_FILE}",
    ]


def test_verify_follows_the_membership(fleet, monkeypatch):
    from p40fleet.ray import RayProbe

    ray_cluster, members = fleet()
    lab3 = members["lab3"]
    monkeypatch.setattr(ray_cluster, "host", lab3)
    lab3.probe = RayProbe()  # no unit: the plan leaves it out, nothing to run
    (skip,) = ray_cluster.verify_checks(SPEC)
    assert skip.status == "SKIP" and "1 GPU(s), fewer than the 8 every node runs" in skip.detail
    lab3.probe = RayProbe(unit=True, active="active", enabled="enabled")  # an old plan's unit
    (fail,) = ray_cluster.verify_checks(SPEC)
    assert fail.status == "FAIL" and "left out of the Ray cluster" in fail.detail
    lab2 = members["lab2"]  # the training node: the member checks, 2 nodes expected
    monkeypatch.setattr(ray_cluster, "host", lab2)
    lab2.probe = RayProbe(unit=True, active="active", enabled="enabled")
    checks = ray_cluster.verify_checks(SPEC)
    assert [c.name for c in checks] == ["ray service", "ray cluster", "ray GPUs"]


def test_an_ipv6_head_is_dialled_in_brackets(fleet):
    ray_cluster, members = fleet({"lab1": [P40] * 4, "lab2": [P40] * 4})
    members["lab1"].data = {"ssh_hostname": "2001:db8::11"}
    assert ray_cluster.membership(SPEC).address == "[2001:db8::11]:6379"


def test_the_collective_runs_on_the_head_over_the_training_nodes(fleet, monkeypatch):
    """verify --collective: the head asks one all-reduce over the plan's training nodes (their
    Ray addresses, rank order = the plan's), the rendezvous on the head's address and the
    pinned port; another member adds nothing; a run without the head says where it runs."""
    from p40fleet.facts.collective import CollectiveRunFact
    from p40fleet.verification import collective

    two = {"lab1": [P40] * 2, "lab2": [P40] * 2, "lab3": [P100]}  # 2 nodes x 2 P40 train
    ray_cluster, members = fleet(two)
    head = members["lab1"]
    asked = []

    def get_fact(cls, **kwargs):
        if cls is CollectiveRunFact:
            asked.append(kwargs["targets"])
            return collective.parse_collective(
                ["@@p40fleet-collective 1", "sim=yes", "backend=gloo", "@@member lab1 10.0.0.1",
                 "@@member lab2 10.0.0.2", "@@missing lab2 10.0.0.2 not an alive node", "@@end"]
            )  # fmt: skip
        return _Member.get_fact(head, cls, **kwargs)

    monkeypatch.setattr(head, "get_fact", get_fact)
    monkeypatch.setattr(ray_cluster, "host", head)
    checks = ray_cluster.collective_checks(SPEC)
    (targets,) = asked
    assert targets.members == (("lab1", "10.0.0.1"), ("lab2", "10.0.0.2"))  # lab3 left out
    assert (targets.address, targets.store_host, targets.port) == ("10.0.0.1:6379", "10.0.0.1",
                                                                    29500)  # fmt: skip
    assert targets.user == SPEC.user.name and targets.python.endswith("/bin/python")
    assert [(c.name, c.status) for c in checks] == [
        ("collective lab1", "SKIP"), ("collective lab2", "FAIL"), ("collective", "FAIL")
    ]  # fmt: skip
    assert checks[-1].status == "FAIL" and "lab2 (10.0.0.2) cannot join" in checks[-1].detail
    monkeypatch.setattr(ray_cluster, "host", members["lab2"])
    assert ray_cluster.collective_checks(SPEC) == []
    limited, members = fleet(two, active=["lab2"])  # lab1 out of this run: sized from the record
    monkeypatch.setattr(limited, "host", members["lab2"])
    (skip,) = limited.collective_checks(SPEC)
    assert skip.status == "SKIP" and "runs on the Ray head lab1" in skip.detail


def test_the_head_runs_one_step_over_the_clusters_plan(fleet, monkeypatch):
    """verify --smoke on a cluster of 2+ training nodes: the head (only) asks one cluster step
    (the plan's members and addresses, its GPUs per node, the cluster's GCS address), after its
    own checks passed; a head whose own step or Ray check failed SKIPs it; another member and a
    fleet that trains on one node add nothing."""
    from p40fleet.facts.smoke import ClusterSmokeStep
    from p40fleet.verification import smoke
    from p40fleet.verification.check import PASS, SIM_DATA, Check

    three = {"lab1": [P40], "lab2": [P40], "lab3": [P100]}  # 3 nodes x 1 GPU train
    ray_cluster, members = fleet(three)
    head = members["lab1"]
    for m in members.values():
        m.data[SIM_DATA] = True
    asked = []
    answer = [
        "@@p40fleet-smoke 1",
        "sim=yes",
        "cluster=yes",
        "scratch_rc=0",
        "patch_rc=0",
        "@@node lab1 10.0.0.1",
        "@@node lab2 10.0.0.2",
        "@@node lab3 10.0.0.3",
        "cluster_rc=0",
        "rc=0",
        "timed_out=no",
        "run_s=61",
        "@@step (TaskRunner pid=7) step:1 - training/global_step:1 - timing_s/step:1.2",
        "@@worker 10.0.0.2",
        "@@worker 10.0.0.3",
        "@@worker local",
        "left=",
        "@@end",
    ]

    def get_fact(cls, **kwargs):
        if cls is ClusterSmokeStep:
            asked.append(kwargs["targets"])
            return smoke.parse_smoke(answer)
        return _Member.get_fact(head, cls, **kwargs)

    monkeypatch.setattr(head, "get_fact", get_fact)
    monkeypatch.setattr(ray_cluster, "host", head)
    own = [Check("ray cluster", PASS, "3/3 nodes active"), Check(smoke.CHECK, PASS, "CPU: 1 step")]
    (row,) = ray_cluster.cluster_smoke_checks(SPEC, own)
    (targets,) = asked
    assert targets.members == (("lab1", "10.0.0.1"), ("lab2", "10.0.0.2"), ("lab3", "10.0.0.3"))
    assert (targets.address, targets.head_host, targets.gpus_per_node) == (
        "10.0.0.1:6379",
        "10.0.0.1",
        1,
    )
    assert targets.simulated and targets.user == SPEC.user.name
    assert targets.launch_script == f"{SPEC.user.home}/launch-ppo.sh"
    assert (row.name, row.status) == ("smoke step (cluster)", "PASS"), row
    assert row.detail.startswith(
        "CPU (simulated host): 1 PPO step over 3 node(s) x 1 GPU(s) (lab1, lab2, lab3) in 1.20 s"
    )
    assert row.detail.endswith("run 61 s; workers on 3 node(s) (lab1, lab2, lab3)")
    # the head's own step failed: SKIP, nothing asked
    failed = [own[0], Check(smoke.CHECK, "FAIL", "launch script exit 1")]
    (skip,) = ray_cluster.cluster_smoke_checks(SPEC, failed)
    assert skip.status == "SKIP" and "own `smoke step` did not pass" in skip.detail
    down = [Check("ray cluster", "FAIL", "2/3 nodes active"), own[1]]
    (skip,) = ray_cluster.cluster_smoke_checks(SPEC, down)
    assert skip.detail == "not run: the head lab1 fails ray cluster"
    assert len(asked) == 1
    for name in ("lab2", "lab3"):  # the members add nothing
        monkeypatch.setattr(ray_cluster, "host", members[name])
        assert ray_cluster.cluster_smoke_checks(SPEC, own) == []
    ray_cluster, members = fleet()  # the demo fleet trains on one node (lab2 x 8): no row
    monkeypatch.setattr(ray_cluster, "host", members["lab1"])
    assert ray_cluster.cluster_smoke_checks(SPEC, own) == []


def test_a_simulated_training_node_offers_ray_fake_gpus_and_cpu(fleet, monkeypatch):
    """verl 0.5.0's CPU step counts GPUs and asks each node for a `cpu` resource: a simulated
    training node's unit offers its PCI GPUs as both; a real host, a simulated head that does
    not train and a host left out get neither."""
    from p40fleet.verification.check import SIM_DATA

    ray_cluster, members = fleet({"lab1": [P40], "lab2": [P40] * 2, "lab3": [P100]})
    for m in members.values():
        m.data[SIM_DATA] = True
    got = ray_cluster.membership(SPEC)
    assert got.shape.members == ("lab1", "lab2", "lab3")
    monkeypatch.setattr(ray_cluster, "host", members["lab2"])
    plan = ray_cluster.plan_for_host(SPEC, got)
    assert "--num-gpus=2" in plan.argv and '--resources={"cpu":2}' in plan.argv
    assert '"--resources={\\"cpu\\":2}"' in plan.exec_start()  # one systemd word
    monkeypatch.setattr(ray_cluster, "host", members["lab1"])
    head = ray_cluster.plan_for_host(SPEC, got)
    assert head.role == "head" and '--resources={"cpu":1}' in head.argv
    assert "--num-gpus=1" in head.argv
    # the demo fleet, simulated: the head (lab1) does not train: no GPU, no `cpu`
    ray_cluster, members = fleet()
    for m in members.values():
        m.data[SIM_DATA] = True
    got = ray_cluster.membership(SPEC)
    monkeypatch.setattr(ray_cluster, "host", members["lab1"])
    head = ray_cluster.plan_for_host(SPEC, got)
    assert "--num-gpus=0" in head.argv and not any("--resources" in a for a in head.argv)
    monkeypatch.setattr(ray_cluster, "host", members["lab2"])
    assert "--num-gpus=8" in ray_cluster.plan_for_host(SPEC, got).argv
    # the same fleet on real hosts: Ray detects the GPUs, no custom resource
    ray_cluster, members = fleet()
    got = ray_cluster.membership(SPEC)
    monkeypatch.setattr(ray_cluster, "host", members["lab2"])
    argv = ray_cluster.plan_for_host(SPEC, got).argv
    assert not any(a.startswith(("--num-gpus", "--resources")) for a in argv)
