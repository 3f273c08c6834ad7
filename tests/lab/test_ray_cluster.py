"""The Ray cluster on the simulated lab: 3 hosts form one cluster, a re-run changes nothing, a
rebooted worker rejoins (systemd, here the lab's systemctl double, starts it at boot).

One fresh lab of three provisionable hosts (lab1 1xP40 = the head: the sim inventory's
``ray_head`` group, lab2 1xP40, lab3 1xP100), converged with ``deploy/full.py``, then
``deploy/ray.py``. The measured times are printed (``pytest -s``). The cluster plan
(``operations.run.ray_cluster.membership``): 1+1+1 GPUs train as 3 nodes x 1; a run limited to
lab1 plans the same cluster from the full run's record, and a full run after it changes nothing.
``verify --collective`` measures gloo over the lab bridge between the 3 training nodes (PASS at
the default floor), and FAILs naming lab2 when a firewall (``p40lab block``) drops lab2's
TCP to the head's rendezvous port. ``verify --limit
lab1 --smoke`` runs the head's own step and one PPO step over the cluster's plan (3 x 1, CPU,
gloo) on the fleet's Ray cluster, which stays up.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p40fleet.facts.ray import RayStatus
from p40fleet.ray import TOKEN_FILE, parse_status, token_path
from p40fleet.spec.pins import RayCluster
from p40lab import runs
from p40lab.state import host_ip

pytestmark = pytest.mark.lab

GPUS = "1xP40,1xP40,1xP100"
HOSTS = ("lab1", "lab2", "lab3")
RAY = "/home/verl/miniconda3/envs/verl-p40/bin/ray"
ADDRESS = f"{host_ip(1)}:6379"  # lab1 of the test instance
UNIT = "p40fleet-ray.service"
ENV: dict[str, str] = {}


#: The cluster's token as root hands it to a client (RAY_AUTH_MODE=token: Ray's token auth).
WITH_TOKEN = f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(sed -n 's/^RAY_AUTH_TOKEN=//p' {TOKEN_FILE}) "


def active_nodes(lab) -> tuple[str, ...]:
    """The node ids the head's probe counts as active, as verify counts them (facts/ray.py: the
    GCS's alive nodes; Ray 2.52's ``ray status`` alone keeps dead ones listed, ray#63566)."""
    fact = RayStatus()
    command = fact.command(ray=RAY, address=ADDRESS, temp_dir="/tmp/ray", user="verl")
    probe = fact.process(lab.ssh("lab1", command, timeout=120).stdout.splitlines())
    assert probe.membership in ("gcs", ""), probe  # the GCS's table was read (or no status)
    return probe.status.active if probe.status else ()


def node_id(lab, name: str) -> str:
    """This host's raylet node id, read as the verify check reads it (facts/ray.py)."""
    fact = RayStatus()
    command = fact.command(ray=RAY, address=ADDRESS, temp_dir="/tmp/ray", user="verl")
    out = lab.ssh(name, command, timeout=90)
    return fact.process(out.stdout.splitlines()).node_id


def wait_for(predicate, timeout: float, step: float = 2.0) -> float | None:
    """Seconds until ``predicate()`` holds, None when it did not within ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return time.monotonic() - t0
        time.sleep(step)
    return None


@pytest.fixture(scope="module")
def cluster(lab, tmp_path_factory):
    ENV["P40FLEET_CACHE"] = str(tmp_path_factory.mktemp("controller-cache"))
    lab.down()
    # from test_flows' converged P40 and P100 disks when it ran first (tests/lab/conftest.py)
    lab.up(gpus=GPUS, seed={"lab1": "p40x4", "lab2": "p40x4", "lab3": "p100x1"})
    full = runs.run("deploy/full.py", env=ENV)
    for name in HOSTS:
        assert not full.errors[name], f"{name} did not converge:\n{full.output[-4000:]}"
    t0 = time.monotonic()
    first = runs.run("deploy/ray.py", env=ENV)
    formed = wait_for(lambda: len(active_nodes(lab)) == 3, timeout=300)
    seconds = time.monotonic() - t0
    print(f"\nray: deploy/ray.py {first.seconds:.1f} s, 3 nodes active {seconds:.1f} s after "
          f"it started ({formed and round(formed, 1)} s after it ended)")  # fmt: skip
    yield {"lab": lab, "first": first, "formed": formed}
    lab.release()


def test_three_hosts_form_one_cluster(cluster):
    lab, first = cluster["lab"], cluster["first"]
    assert first.returncode == 0, first.output[-4000:]
    for name in HOSTS:
        assert name in first.connected and not first.errors[name], first.output[-4000:]
        assert first.changed_operations(name), f"{name}: nothing changed on a first run"
        active = lab.ssh(name, f"systemctl is-active {UNIT}; systemctl is-enabled {UNIT}")
        assert active.stdout.split() == ["active", "enabled"], active.stderr
    assert cluster["formed"] is not None, "the cluster never had 3 active nodes"
    ids = active_nodes(lab)
    assert sorted(ids) == sorted(node_id(lab, name) for name in HOSTS)
    assert "--head" in (lab.root("lab1") / f"etc/systemd/system/{UNIT}").read_text()
    worker = (lab.root("lab2") / f"etc/systemd/system/{UNIT}").read_text()
    assert f"--address={ADDRESS}" in worker and "User=verl" in worker


def test_a_client_without_the_clusters_token_is_refused(cluster, monkeypatch):
    """S2: every member runs Ray's token authentication with the controller's token, kept
    root:root 0600 on each member; a client without it (or with another) is refused by the
    head's GCS, the same client with it connects; no Ray Client server listens (not asked)."""
    lab, first = cluster["lab"], cluster["first"]
    monkeypatch.setenv("P40FLEET_CACHE", ENV["P40FLEET_CACHE"])  # the runs' controller cache
    token = token_path(f"lab1@{ADDRESS}").read_text().strip()
    assert len(token) == 64
    assert token not in first.output  # never in the run's output (op names, logs)
    for name in HOSTS:
        read_as_verl = f"runuser -u verl -- cat {TOKEN_FILE} >/dev/null 2>&1; echo rc=$?"
        st = lab.ssh(name, f"stat -c '%U:%G %a' {TOKEN_FILE} /etc/p40fleet; {read_as_verl}")
        assert st.stdout.split() == ["root:root", "600", "root:root", "700", "rc=1"], st.stdout
        assert (lab.root(name) / TOKEN_FILE.lstrip("/")).read_text() == f"RAY_AUTH_TOKEN={token}\n"
    status = f"timeout 60 {RAY} status --address {ADDRESS}; echo rc=$?"
    clients = {
        "none": lab.ssh("lab2", f"runuser -u verl -- sh -c '{status}'", timeout=90),
        "wrong": lab.ssh(
            "lab2", f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN={'0' * 64} {status}", timeout=90
        ),  # fmt: skip
        "token": lab.ssh("lab2", f"{WITH_TOKEN}{status}", timeout=90),
    }
    for kind, out in clients.items():
        print(f"\nray status from lab2, {kind} token: {out.stdout.strip().splitlines()[-3:]}")
    for kind in ("none", "wrong"):
        text = clients[kind].stdout + clients[kind].stderr
        assert "rc=0" not in text and parse_status(text.splitlines()) is None, (kind, text)
        assert "auth" in text.lower(), (kind, text[-2000:])  # refused for its token, not reach
    good = clients["token"].stdout
    assert good.strip().endswith("rc=0"), good[-2000:]
    answer = parse_status(good.splitlines())
    assert answer is not None and len(answer.active) == 3
    # a driver as docs/training.md starts one: root hands the token to the training user's
    # process (never on a command line); ray.init joins the cluster
    driver = (f"import ray\nray.init(address={ADDRESS!r})\n"
              "print('alive', sum(n['Alive'] for n in ray.nodes()))\n")  # fmt: skip
    as_runbook = (f". {TOKEN_FILE}; export RAY_AUTH_TOKEN RAY_AUTH_MODE=token; "
                  "exec runuser -l verl -w RAY_AUTH_MODE,RAY_AUTH_TOKEN -c "
                  f"'timeout 120 {RAY[:-3]}python - 2>&1'")  # fmt: skip
    joined = lab.ssh("lab1", as_runbook, input=driver, timeout=180)
    assert "alive 3" in joined.stdout, joined.stdout[-3000:]
    # the Ray Client server (10001) is not bound anywhere on the head; the GCS (6379) is
    probe = "timeout 5 bash -c 'echo > /dev/tcp/{}/{}' 2>/dev/null; echo rc=$?"
    gcs_ip = ADDRESS.split(":")[0]
    closed = lab.ssh("lab2", probe.format(gcs_ip, 10001)).stdout.strip()
    opened = lab.ssh("lab2", probe.format(gcs_ip, 6379)).stdout.strip()
    assert (closed, opened) == ("rc=1", "rc=0"), (closed, opened)
    unit = (lab.root("lab1") / f"etc/systemd/system/{UNIT}").read_text()
    assert "Environment=RAY_AUTH_MODE=token" in unit and f"EnvironmentFile={TOKEN_FILE}" in unit


def verify(report: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "p40fleet.verify", runs.SIM_INVENTORY, "--json", str(report),
         *args],
        cwd=runs.REPO, capture_output=True, text=True, timeout=900, env={**os.environ, **ENV},
    )  # fmt: skip


def test_verify_sees_the_cluster_and_skips_gpus_on_simulated_hosts(cluster, tmp_path):
    """The same run measures the all-reduce over the 3 training nodes (``--collective``): gloo
    over the lab bridge, one row per node and the group's on the head (lab1). Then ``--limit
    lab1 --smoke``: the head's own step and ONE PPO step over the cluster's plan (3 x 1, CPU,
    gloo) on the fleet's Ray cluster, which stays up, with no scratch left anywhere."""
    report = tmp_path / "report.json"
    t0 = time.monotonic()
    proc = verify(report, "--collective")
    print(f"\nray: verify --collective over 3 hosts {time.monotonic() - t0:.1f} s")
    print("\n".join(line for line in proc.stdout.splitlines() if line.startswith("collective")))
    data = json.loads(report.read_text())
    head = {c["name"]: c for c in data["hosts"]["lab1"]["checks"]}
    for name in HOSTS:
        node = head[f"collective {name}"]
        assert node["status"] == "PASS", node
        assert "GB/s @ 64 MiB" in node["detail"] and "latency" in node["detail"]
    group = head["collective"]
    assert group["status"] == "PASS", group
    assert group["detail"].startswith("gloo (simulated host), 3 node(s) (lab1, lab2, lab3)")
    assert ">= floor 0.05 GB/s @ 64 MiB" in group["detail"]
    for name in ("lab2", "lab3"):  # the head reports it; the other members add nothing
        assert not any(c["name"].startswith("collective") for c in data["hosts"][name]["checks"])
    for name in HOSTS:
        checks = {c["name"]: c for c in data["hosts"][name]["checks"]}
        assert checks["ray service"]["status"] == "PASS", checks["ray service"]
        assert checks["ray cluster"]["status"] == "PASS", checks["ray cluster"]
        assert "3/3 nodes active" in checks["ray cluster"]["detail"]
        assert checks["ray GPUs"]["status"] == "SKIP"
        assert "simulated host" in checks["ray GPUs"]["detail"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # --smoke on the head (issue 25, section 4): its own step, then ONE step over the
    # cluster's plan (3 x 1) on the fleet's Ray cluster: CPU, gloo across the lab bridge
    lab, marker = cluster["lab"], "/tmp/p40fleet-test-smoke-marker"
    for name in HOSTS:
        lab.ssh(name, f"touch {marker}")
    smoke_report = tmp_path / "smoke.json"
    t0 = time.monotonic()
    proc = verify(smoke_report, "--limit", "lab1", "--smoke")
    print(f"\nray: verify --limit lab1 --smoke {time.monotonic() - t0:.1f} s")
    print("\n".join(ln for ln in proc.stdout.splitlines() if ln.startswith("smoke step")))
    checks = {c["name"]: c for c in json.loads(smoke_report.read_text())["hosts"]["lab1"]["checks"]}
    assert checks["smoke step"]["status"] == "PASS", checks["smoke step"]
    row = checks["smoke step (cluster)"]
    assert row["status"] == "PASS", row
    assert row["detail"].startswith("CPU (simulated host): 1 PPO step over 3 node(s) x 1 GPU(s) "
                                    "(lab1, lab2, lab3) in ")  # fmt: skip
    used = re.search(r"; workers on (\d) node\(s\) \(([a-z0-9, ]+)\)$", row["detail"])
    assert used is not None and int(used.group(1)) in (2, 3), row["detail"]
    assert set(used.group(2).split(", ")) <= set(HOSTS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # the fleet's Ray is untouched (no `ray stop`), no scratch dir is left on any host, and
    # nothing in the training user's caches or outputs was written
    assert len(active_nodes(lab)) == 3
    for name in HOSTS:
        written = f"find /home/verl/.cache /home/verl/outputs -newer {marker} 2>/dev/null"
        left = lab.ssh(
            name, f"ls -d /tmp/p40fleet-smoke.* 2>/dev/null; runuser -u verl -- {written}"
        )
        assert left.stdout.strip() == "", (name, left.stdout)


def test_rerun_changes_nothing(cluster):
    lab = cluster["lab"]
    before = {name: node_id(lab, name) for name in HOSTS}
    again = runs.run("deploy/ray.py", env=ENV)
    print(f"\nray: re-run {again.seconds:.1f} s, {again.summary()}")
    assert again.returncode == 0, again.output[-4000:]
    for name in HOSTS:
        assert again.changed_operations(name) == [], again.output[-4000:]
        assert not again.errors[name]
    assert {name: node_id(lab, name) for name in HOSTS} == before  # no member restarted
    assert sorted(active_nodes(lab)) == sorted(before.values())


def test_limit_lab1_then_a_full_run_changes_nothing(cluster):
    """``--limit lab1`` writes lab1's script for the cluster a full run plans (lab2 and lab3
    sized from the controller's record of the full run), so the full run after it changes
    nothing (before: nnodes=3 became nnodes=1 and flipped back)."""
    lab = cluster["lab"]
    script = lab.root("lab1") / "home/verl/launch-ppo.sh"
    before = script.read_text()
    assert "trainer.nnodes=3" in before and "trainer.n_gpus_per_node=1" in before
    assert "# In it: lab1 (1 GPU(s)), lab2 (1 GPU(s)), lab3 (1 GPU(s))." in before
    record = json.loads((Path(ENV["P40FLEET_CACHE"]) / "ray-members.json").read_text())
    assert sorted(record["clusters"][f"lab1@{ADDRESS}"]["nodes"]) == list(HOSTS)
    ids = {name: node_id(lab, name) for name in HOSTS}
    t0 = time.monotonic()
    limited = [runs.run(d, "--limit", "lab1", env=ENV) for d in ("deploy/training.py",
                                                                 "deploy/ray.py")]  # fmt: skip
    full = [runs.run(d, env=ENV) for d in ("deploy/training.py", "deploy/ray.py")]
    print(f"\nray: --limit lab1 then a full run (training + ray): {time.monotonic() - t0:.1f} s")
    for result in (*limited, *full):
        assert result.returncode == 0, result.output[-4000:]
        for name in result.connected:
            assert result.changed_operations(name) == [], (name, result.output[-4000:])
    assert limited[0].connected == ["lab1"] and sorted(full[0].connected) == list(HOSTS)
    assert script.read_text() == before
    assert {name: node_id(lab, name) for name in HOSTS} == ids  # no member restarted


def test_rebooted_worker_rejoins(cluster):
    lab = cluster["lab"]
    old = node_id(lab, "lab3")
    t0 = time.monotonic()
    lab.reboot("lab3")
    booted = time.monotonic() - t0

    def rejoined() -> bool:
        new = node_id(lab, "lab3")
        active = active_nodes(lab)
        return bool(new) and new != old and new in active and len(active) == 3

    rejoin = wait_for(rejoined, timeout=300)
    print(f"\nray: lab3 rebooted in {booted:.1f} s, back in the cluster "
          f"{rejoin and round(rejoin + booted, 1)} s after the reboot began")  # fmt: skip
    assert rejoin is not None, f"lab3 did not rejoin: active {active_nodes(lab)}, old {old}"
    assert old not in active_nodes(lab)
    state = lab.ssh("lab3", f"systemctl is-active {UNIT}")
    assert state.stdout.strip() == "active"


def lab_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m p40lab ARGS`` against the test instance (``$P40LAB_INSTANCE``)."""
    return subprocess.run(
        [sys.executable, "-m", "p40lab", *args], cwd=runs.REPO, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip


def test_collective_fails_naming_a_firewalled_member(cluster, tmp_path):
    """A firewall between lab2 and the head (``p40lab block lab1 --tcp 29500 --from lab2``: the
    head drops lab2's TCP to the rendezvous port; Ray's own ports stay open, so lab2 is still
    an alive member and its rank starts): the head's all-reduce FAILs, within its bound, naming
    lab2, the port and the firewall fix. Unblocked, the next check PASSes (the same run limited
    to the head: the members come from the full run's record)."""
    port = RayCluster().collective_port
    lab_cli("block", "lab1", "--tcp", str(port), "--from", "lab2")
    try:
        report = tmp_path / "report.json"
        t0 = time.monotonic()
        proc = verify(report, "--limit", "lab1", "--collective", "--collective-timeout", "60")
        seconds = time.monotonic() - t0
        print(f"\nray: verify --collective with lab2 -> lab1:{port} dropped {seconds:.1f} s")
        print("\n".join(ln for ln in proc.stdout.splitlines() if ln.startswith("collective")))
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
        checks = {c["name"]: c for c in json.loads(report.read_text())["hosts"]["lab1"]["checks"]}
        member = checks["collective lab2"]
        assert member["status"] == "FAIL", member
        assert (
            f"cannot reach the rendezvous {host_ip(1)}:{port} from {host_ip(2)}" in member["detail"]
        ), member
        assert "open the port from lab2 to lab1 (a firewall" in member["remedy"], member
        waited = checks["collective lab3"]  # it only waited for lab2, and is told so
        assert waited["status"] == "FAIL", waited
        assert waited["remedy"].startswith("lab3 waited for lab2"), waited
        group = checks["collective"]
        assert group["status"] == "FAIL", group
        assert f"lab2 ({host_ip(2)}): cannot reach the rendezvous" in group["detail"], group
        assert seconds < 300
    finally:
        lab_cli("unblock", "lab1")
    report = tmp_path / "unblocked.json"
    t0 = time.monotonic()
    proc = verify(report, "--limit", "lab1", "--collective", "--collective-timeout", "60")
    print(f"ray: verify --collective unblocked {time.monotonic() - t0:.1f} s")
    checks = {c["name"]: c for c in json.loads(report.read_text())["hosts"]["lab1"]["checks"]}
    assert checks["collective"]["status"] == "PASS", checks["collective"]
    assert checks["collective lab2"]["status"] == "PASS", checks["collective lab2"]
