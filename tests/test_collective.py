"""verify --collective: the bus-bandwidth math (nccl-tests' all_reduce_perf), the script's
output read into per-node and group checks (fixtures from real runs of the rendered script, gloo
on this machine), the verdicts (floor, a member that cannot join, no answer), the script's
rendering and privilege drop, the pin and the CLI switch."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from p40fleet.cli import verify as verify_cli
from p40fleet.facts.collective import CollectiveRunFact, render_collective
from p40fleet.privdrop import AS_USER_FN
from p40fleet.ray import TOKEN_FILE
from p40fleet.spec import SpecError, load_spec
from p40fleet.verification import collective as coll
from p40fleet.verification.check import FAIL, PASS, SKIP
from p40fleet.verification.collective_script import CollectiveTargets, config, render_job

FIXTURES = Path(__file__).parent / "fixtures" / "collective"
SPEC = load_spec("lab1", {})
FLOOR = SPEC.ray.collective_min_busbw_gbs
MIB = 1 << 20
TARGETS = CollectiveTargets(
    user="verl",
    python="/home/verl/miniconda3/envs/verl-p40/bin/python",
    address="10.231.0.11:6379",
    store_host="10.231.0.11",
    port=29500,
    members=(("lab1", "10.231.0.11"), ("lab2", "10.231.0.12")),
    timeout_s=180,
)


def fixture(name: str) -> coll.CollectiveRun:
    return coll.parse_collective((FIXTURES / name).read_text().splitlines())


def checks_of(run: coll.CollectiveRun, floor: float = FLOOR, timeout_s: int = 180) -> dict:
    out = coll.collective_checks(run, head="lab1", floor_gbs=floor, timeout_s=timeout_s)
    assert out[-1].name == coll.CHECK, "the group's check comes last"
    return {c.name: c for c in out}


def synthetic(world: int, seconds: dict[int, float], *, sim: bool = True) -> list[str]:
    """Output of a run where every rank took ``seconds[size]`` (the slowest rank: +10%)."""
    lines = ["@@p40fleet-collective 1", f"sim={'yes' if sim else 'no'}", "backend=gloo"]
    names = [f"lab{i + 1}" for i in range(world)]
    lines += [f"@@member {n} 10.0.0.{i + 1}" for i, n in enumerate(names)]
    for i, n in enumerate(names):
        lines.append(f"@@rank {n} {i} 10.0.0.{i + 1}")
        slow = 1.1 if i == world - 1 else 1.0
        lines += [f"@@time {n} {b} {t * slow:.9f}" for b, t in seconds.items()]
    return [*lines, "rc=0", "timed_out=no", "run_s=20", "@@end"]


# --- the math -----------------------------------------------------------------------------


def test_busbw_is_algbw_times_2_n_minus_1_over_n():
    # nccl-tests' doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for all-reduce
    assert coll.algbw_gbs(10**9, 0.01) == pytest.approx(100.0)
    assert coll.busbw_gbs(10**9, 0.01, 8) == pytest.approx(175.0)
    assert coll.busbw_gbs(10**9, 0.01, 2) == pytest.approx(100.0)  # n=2: busbw = algbw
    assert coll.busbw_gbs(10**9, 0.01, 4) == pytest.approx(150.0)
    assert coll.busbw_gbs(10**9, 0.01, 1) == 0.0  # one rank moves nothing over a link
    assert coll.busbw_gbs(10**9, 0.0, 4) == 0.0


def test_the_default_floor_passes_1gbe_and_fails_100mbit():
    """A ring all-reduce moves 2(n-1)/n of the buffer per rank: on a link of L bytes/s the time
    is S*2(n-1)/n/L, so busbw = L. 1 GbE carries ~117 MB/s of payload, 100 Mbit ~11.7."""
    for link, want in ((117e6, PASS), (11.7e6, FAIL)):
        for world in (2, 3):
            t = {b: b * 2 * (world - 1) / world / link for b in coll.SIZES}
            run = coll.parse_collective(synthetic(world, t))
            # the synthetic slowest rank is 10% slower: busbw = L / 1.1
            assert checks_of(run)[coll.CHECK].status == want, (link, world)
    assert FLOOR == 0.05


# --- real runs of the rendered script (gloo, this machine) --------------------------------


def test_three_ranks_report_per_node_and_for_the_group():
    run = fixture("cluster-3ranks.out")
    assert [m for m, _ in run.members] == ["lab1", "lab2", "lab3"]
    assert run.values["backend"] == "gloo" and run.complete
    assert all(len(r.times) == len(coll.SIZES) for r in run.ranks.values())
    checks = checks_of(run)
    for name in ("lab1", "lab2", "lab3"):
        check = checks[f"collective {name}"]
        assert check.status == PASS and "GB/s @ 64 MiB" in check.detail
        assert "latency" in check.detail and "@ 8 B" in check.detail
    group = checks[coll.CHECK]
    assert group.status == PASS, group
    # the group's busbw at 64 MiB uses the slowest rank's time (lab3's 0.138314766 s)
    want = coll.busbw_gbs(64 * MIB, 0.138314766, 3)
    assert f"{want:.3f} GB/s @ 64 MiB" in group.detail
    assert f"(algbw {coll.algbw_gbs(64 * MIB, 0.138314766):.3f})" in group.detail
    assert "gloo (simulated host), 3 node(s) (lab1, lab2, lab3)" in group.detail
    assert "latency 1706 us @ 8 B" in group.detail


def test_under_the_floor_fails_naming_the_slowest_node():
    group = checks_of(fixture("cluster-3ranks.out"), floor=100.0)[coll.CHECK]
    assert group.status == FAIL
    assert "under the floor 100 GB/s (stack.ray.collective_min_busbw_gbs)" in group.detail
    assert "slowest: lab3" in group.detail and "lab3" in group.remedy


def test_a_member_that_is_not_in_ray_fails_naming_it():
    checks = checks_of(fixture("missing-member.out"))
    member = checks["collective lab2"]
    assert member.status == FAIL
    assert "10.9.9.9: not an alive node of the Ray cluster at 192.0.2.2:26999" in member.detail
    assert "systemctl status p40fleet-ray` on lab2" in member.remedy
    assert checks["collective lab1"].status == SKIP  # no rank runs without the whole group
    assert "the group lacks lab2" in checks["collective lab1"].detail
    group = checks[coll.CHECK]
    assert group.status == FAIL and "lab2 (10.9.9.9) cannot join" in group.detail


def test_a_blocked_rendezvous_port_fails_naming_the_port():
    checks = checks_of(fixture("rendezvous-blocked.out"))
    for name in ("lab1", "lab2"):
        check = checks[f"collective {name}"]
        assert check.status == FAIL
        assert "cannot reach the rendezvous 192.0.2.77:29533" in check.detail
        assert "open the port" in check.remedy and "collective_port" in check.remedy
    assert checks[coll.CHECK].status == FAIL


def test_the_member_that_cannot_connect_is_named_before_those_that_waited_for_it():
    out = [
        "@@p40fleet-collective 1", "sim=yes", "backend=gloo",
        "@@member lab1 10.0.0.1", "@@member lab2 10.0.0.2",
        "@@rank lab1 0 10.0.0.1", "@@fail lab1 DistStoreError: wait timeout after 60000ms",
        "@@rank lab2 1 10.0.0.2",
        "@@fail lab2 cannot reach the rendezvous 10.0.0.1:29500 from 10.0.0.2 within 60 s: "
        "timed out",
        "rc=0", "timed_out=no", "@@end",
    ]  # fmt: skip
    checks = checks_of(coll.parse_collective(out))
    group = checks[coll.CHECK]
    assert group.status == FAIL
    assert group.detail.index("lab2 (10.0.0.2): cannot reach") < group.detail.index("lab1")
    # the one that only waited is told so, not sent after its own ephemeral ports
    waited = checks["collective lab1"]
    assert waited.status == FAIL
    assert waited.remedy.startswith("lab1 waited for lab2, which cannot reach the rendezvous")
    assert "ephemeral" not in waited.remedy
    assert "open the port from lab2" in checks["collective lab2"].remedy


def test_a_rank_without_an_answer_fails_within_the_bound():
    out = [
        "@@p40fleet-collective 1", "sim=no", "backend=nccl",
        "@@member gpu1 10.0.0.1", "@@member gpu2 10.0.0.2",
        "@@fail gpu2 no answer within 180 s (a rank that waits for the group; or no free GPU)",
        "@@rank gpu1 0 10.0.0.1", "@@fail gpu1 DistBackendError: NCCL timeout",
        "rc=0", "timed_out=no", "@@end",
    ]  # fmt: skip
    checks = checks_of(coll.parse_collective(out))
    assert checks["collective gpu2"].status == FAIL
    assert "no answer within 180 s" in checks["collective gpu2"].detail
    assert checks[coll.CHECK].status == FAIL and checks[coll.CHECK].detail.startswith("nccl,")


def test_a_script_killed_at_its_bound_fails_with_the_bound_to_raise():
    out = ["@@p40fleet-collective 1", "sim=yes", "backend=gloo", "@@member lab1 10.0.0.1",
           "@@member lab2 10.0.0.2", "rc=124", "timed_out=yes", "@@end"]  # fmt: skip
    checks = checks_of(coll.parse_collective(out), timeout_s=60)
    assert checks["collective lab1"].status == FAIL
    assert "no answer within 60 s" in checks["collective lab1"].detail
    assert "--collective-timeout" in checks["collective lab1"].remedy


def test_no_output_and_a_driver_error_fail():
    (check,) = coll.collective_checks(coll.parse_collective([]), head="lab1", floor_gbs=FLOOR)
    assert check.status == FAIL and "no answer" in check.detail
    out = ["@@p40fleet-collective 1", "sim=yes", "backend=gloo", "@@member lab1 10.0.0.1",
           "@@error the head cannot hold the rendezvous on port 29500 (port in use? bind "
           "failed): DistNetworkError: address already in use", "@@end"]  # fmt: skip
    (check,) = coll.collective_checks(coll.parse_collective(out), head="lab1", floor_gbs=FLOOR)
    assert check.status == FAIL and "port 29500" in check.detail
    assert "stack.ray.collective_port" in check.remedy


def test_one_node_is_measured_but_has_no_link_to_judge():
    run = fixture("local-2ranks.out")  # two ranks on one machine: a real group of 2
    assert checks_of(run)[coll.CHECK].status == PASS
    one = coll.parse_collective(synthetic(1, {8: 1e-4, MIB: 1e-3, 16 * MIB: 1e-2, 64 * MIB: 4e-2}))
    group = checks_of(one)[coll.CHECK]
    assert group.status == SKIP and "one training node" in group.detail


# --- the script ---------------------------------------------------------------------------


def test_the_config_carries_the_members_the_sizes_and_a_bounded_join():
    cfg = config(TARGETS)
    assert cfg["members"] == [["lab1", "10.231.0.11"], ["lab2", "10.231.0.12"]]
    assert cfg["sizes"] == list(coll.SIZES) and len(cfg["iterations"]) == len(coll.SIZES)
    assert cfg["join_s"] == 60 and cfg["limit_s"] == 180
    assert coll.join_timeout_s(30) == 10
    with pytest.raises(ValueError, match="expected a name and an address"):
        config(TARGETS._replace(members=(("lab 1", "x"),)))
    job = render_job(TARGETS)
    assert json.dumps(cfg, sort_keys=True) in job and "{{" not in job


def test_the_rendered_script_answers_without_the_env(tmp_path):
    """Run for real with a python that is not there: it still answers, never hangs."""
    job = render_job(TARGETS._replace(python=str(tmp_path / "no-python"), timeout_s=30))
    proc = subprocess.run(["sh", "-c", job, "sh", "yes"], capture_output=True, text=True,
                          timeout=30)  # fmt: skip
    run = coll.parse_collective(proc.stdout.splitlines())
    assert run.started and run.complete and run.values["backend"] == "gloo"
    (check,) = coll.collective_checks(run, head="lab1", floor_gbs=FLOOR)
    assert check.status == FAIL and "no-python is missing" in check.detail


def test_the_collective_runs_as_the_training_user():
    command = CollectiveRunFact().command(targets=TARGETS)
    text = command.replace(AS_USER_FN, "")
    first = text.find("p40fleet_ask ")
    assert first >= 0 and "/home/verl" not in text[:first]
    assert text[first:].split()[2] == "verl"  # bounded, as the training user
    # the cluster's token: root's file on the user's stdin, never on the command line
    assert f"p40fleet_tk={TOKEN_FILE}" in text and '<"$p40fleet_tk"' in text
    with pytest.raises(ValueError, match="never runs as root"):
        render_collective(TARGETS._replace(user=""))


# --- the pin and the CLI ------------------------------------------------------------------


def test_the_pin_is_validated():
    assert SPEC.ray.collective_port == 29500
    with pytest.raises(SpecError, match="collective_port"):
        load_spec("lab1", {"ray": {"collective_port": 6379}})
    with pytest.raises(SpecError, match="collective_min_busbw_gbs"):
        load_spec("lab1", {"ray": {"collective_min_busbw_gbs": 0}})
    assert (
        load_spec("lab1", {"ray": {"collective_min_busbw_gbs": 2.5}}).ray.collective_min_busbw_gbs
        == 2.5
    )


def test_the_cli_switch_sets_host_data():
    command = verify_cli.pyinfra_command("@local", collective=True, collective_timeout=90)
    assert "verify_collective=yes" in command and "verify_collective_timeout=90" in command
    assert "verify_collective=yes" not in verify_cli.pyinfra_command("@local")


def test_collective_timeout_needs_collective_and_sane_seconds(capsys):
    assert verify_cli.main(["@local", "--collective-timeout", "100"]) == 2
    assert "--collective-timeout needs --collective" in capsys.readouterr().err
    assert verify_cli.main(["@local", "--collective", "--collective-timeout", "5"]) == 2
    assert "expected seconds >= 30" in capsys.readouterr().err
    with pytest.raises(ValueError, match="verify_collective_timeout"):
        coll.timeout_from_data("10")
    assert coll.timeout_from_data(None) == coll.DEFAULT_TIMEOUT_S


def test_the_cli_prints_the_collective_rows_of_the_head(capsys):
    fleet = {"hosts": {"lab1": {"checks": [
        {"name": "collective lab2", "status": "FAIL", "detail": "10.0.0.2: not an alive node",
         "remedy": "see lab2"},
        {"name": "collective", "status": "FAIL", "detail": "gloo: lab2 cannot join", "remedy": ""},
        {"name": "ray cluster", "status": "PASS", "detail": "3/3 nodes", "remedy": ""},
    ]}}}  # fmt: skip
    verify_cli._print_collective(fleet)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "collective lab2 [lab1]: FAIL 10.0.0.2: not an alive node (fix: see lab2)"
    assert out[1:] == ["collective [lab1]: FAIL gloo: lab2 cannot join"]
    verify_cli._print_collective({"hosts": {}})
    assert "no host reported it" in capsys.readouterr().out
