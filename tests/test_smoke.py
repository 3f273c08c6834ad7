"""verify --smoke: the overrides (one function for CPU and GPU), the script that runs them as the
training user, its output read into PASS / FAIL / SKIP (fixtures from real runs), the lab-only
CPU rule set on the real verl 0.5.0 sdist, and the CLI switch."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from p40fleet import verl_patches as vp
from p40fleet.cli import verify as verify_cli
from p40fleet.facts.smoke import (
    RAY_PORT,
    ClusterSmokeTargets,
    SmokeTargets,
    render_cluster_smoke,
    render_job,
    render_smoke,
)
from p40fleet.launch import plan_launch
from p40fleet.spec import load_spec
from p40fleet.verification import smoke, smoke_script
from p40fleet.verification.check import FAIL, PASS, SKIP, Check
from p40fleet.verification.smoke_script import render_cluster_job
from tests.verl_checks import verl_failures
from tests.verl_sdist import extract_verl

FIXTURES = Path(__file__).parent / "fixtures" / "smoke"
SPEC = load_spec("lab1", {})
P40 = 0x1B38
TARGETS = SmokeTargets(
    user="verl",
    python="/home/verl/miniconda3/envs/verl-p40/bin/python",
    launch_script="/home/verl/launch-ppo.sh",
    verl_checkout="/home/verl/verl",
    verl_ref="v0.5.0",
    gpus=4,
    timeout_s=600,
)


def fixture(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


# --- the overrides ------------------------------------------------------------------------


def keyed(overrides: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in overrides)


def test_cpu_overrides_one_step_one_worker_on_cpu_nothing_saved():
    o = keyed(smoke.smoke_overrides(simulated=True, gpus=8))
    assert o["trainer.device"] == "cpu"
    assert (o["trainer.nnodes"], o["trainer.n_gpus_per_node"]) == ("1", "1")
    assert o["trainer.total_training_steps"] == "1"
    assert (o["trainer.val_before_train"], o["trainer.test_freq"], o["trainer.save_freq"]) == (
        "False", "-1", "-1",
    )  # fmt: skip
    assert o["hydra.run.dir"] == f"{smoke.SCRATCH}/hydra"
    assert o["trainer.default_local_dir"].startswith(smoke.SCRATCH)
    assert (o["data.max_prompt_length"], o["data.max_response_length"]) == ("64", "16")


def test_gpu_overrides_use_the_hosts_workers_and_never_cpu():
    o = keyed(smoke.smoke_overrides(simulated=False, gpus=4))
    assert "trainer.device" not in o
    assert o["trainer.n_gpus_per_node"] == "4" and o["trainer.nnodes"] == "1"
    assert o["data.train_batch_size"] == o["actor_rollout_ref.actor.ppo_mini_batch_size"] == "4"


def test_gpus_per_node_comes_from_the_launch_plan():
    plan = plan_launch(SPEC, [P40] * 8)
    assert smoke.gpus_per_node(plan.overrides) == 8
    assert smoke.gpus_per_node([]) == 1


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory) -> str:
    tree = extract_verl(tmp_path_factory.mktemp("verl") / "verl-0.5.0")
    return str(tree / "verl" / "trainer" / "config")


def composed(config_dir: str, overrides: list[str]):
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=list(overrides))
    OmegaConf.resolve(cfg)
    return cfg


@pytest.mark.parametrize(
    "gpus,simulated", [(1, True), (4, True), (1, False), (4, False), (8, False)]
)
def test_launch_plan_plus_smoke_composes_and_passes_verls_checks(config_dir, gpus, simulated):
    plan = plan_launch(SPEC, [P40] * gpus)
    extra = smoke.smoke_overrides(simulated=simulated, gpus=gpus, scratch="/tmp/s")
    cfg = composed(config_dir, [*plan.overrides, *extra])  # the script's, then the smoke's
    assert verl_failures(cfg, val_rows=1) == []
    workers = 1 if simulated else gpus
    assert cfg.trainer.n_gpus_per_node == workers and cfg.trainer.nnodes == 1
    assert cfg.data.train_batch_size == workers  # one sample per worker: the smallest
    assert cfg.trainer.total_training_steps == 1 and cfg.trainer.save_freq == -1
    assert cfg.trainer.device == ("cpu" if simulated else "cuda")


def test_a_smaller_batch_than_the_workers_fails_verls_checks(config_dir):
    plan = plan_launch(SPEC, [P40] * 4)
    extra = smoke.smoke_overrides(simulated=False, gpus=4, scratch="/tmp/s")
    extra = [o.replace("=4", "=2") if "batch_size=" in o else o for o in extra]
    assert verl_failures(composed(config_dir, [*plan.overrides, *extra]), val_rows=1)


def test_shell_word_expands_only_the_scratch_dir():
    assert smoke.shell_word(f"hydra.run.dir={smoke.SCRATCH}/hydra") == 'hydra.run.dir="$S"/hydra'
    assert smoke.shell_word("a=b c") == "'a=b c'"
    out = subprocess.run(
        ["sh", "-c", f'S="/tmp/x y"; printf "%s\\n" {smoke.shell_word("k=" + smoke.SCRATCH)}'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout == "k=/tmp/x y\n"


# --- the script ---------------------------------------------------------------------------


def test_the_script_runs_exactly_the_overrides_of_smoke_overrides():
    job = render_job(TARGETS)
    cpu = " ".join(smoke.shell_word(o) for o in smoke.smoke_overrides(simulated=True, gpus=1))
    gpu = " ".join(smoke.shell_word(o) for o in smoke.smoke_overrides(simulated=False, gpus=4))
    assert f"set -- {cpu}\n" in job and f"set -- {gpu}\n" in job
    assert f"--port={RAY_PORT}" in job and "--num-gpus=1" in job and '{"cpu": 1}' in job
    # the lab-only rules and the one applier travel with it; PYTHONPATH names the copy only
    assert vp.lab_cpu_ruleset_json("v0.5.0").rstrip("\n") in job
    assert vp.APPLIER_PATH.read_text().rstrip("\n") in job
    assert 'export PYTHONPATH="$S/verl"' in job and 'cp -a "$CO/verl" "$S/verl/verl"' in job
    for name in ("HF_DATASETS_CACHE", "HF_HOME", "XDG_CACHE_HOME", "RAY_TMPDIR", "TMPDIR"):
        assert f'{name}="$S' in job, name
    assert subprocess.run(["sh", "-n", "-c", job]).returncode == 0


def test_the_script_renders_without_pyinfra():
    """A GPU harness runs the same script text by hand: rendering it needs no pyinfra."""
    code = (
        "import sys; sys.modules['pyinfra'] = None\n"
        "from p40fleet.verification.smoke_script import SmokeTargets, render_job\n"
        "print(len(render_job(SmokeTargets('verl', '/p', '/l', '/c', 'v0.5.0', 1, 600))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and int(out.stdout) > 10_000, out.stderr


def test_all_of_it_runs_as_the_training_user():
    full = render_smoke(TARGETS)
    run_lines = [ln for ln in full.splitlines() if "sh -c" in ln]
    assert len(run_lines) == 1 and re.search(r"p40fleet_ask \d+ verl sh -c", run_lines[0])
    assert subprocess.run(["sh", "-n", "-c", full]).returncode == 0
    with pytest.raises(ValueError, match="never runs as root"):
        render_smoke(TARGETS._replace(user=""))


def test_only_a_host_the_inventory_marks_simulated_gets_the_cpu_step():
    """N14: the lab's marker is looked at only on a host the inventory marks simulated; on any
    other host the step is a GPU step, whatever is on its disk."""
    real = render_smoke(TARGETS._replace(simulated=False))
    assert "p40lab-sim" not in real and "p40fleet_sim=no\n" in real
    lab = render_smoke(TARGETS._replace(simulated=True))
    assert "[ -d /etc/p40lab-sim ]" in lab
    assert TARGETS.simulated is False  # the default: not simulated


def test_script_against_a_fake_launch_script_cleans_its_scratch_dir(tmp_path):
    """The GPU path of the job, run here against a stand-in script: the overrides arrive as
    arguments, the scratch dir is gone afterwards, the exit status and the log are read."""
    launch = tmp_path / "launch-ppo.sh"
    launch.write_text(
        "#!/bin/sh\n"
        'echo "args: $*"\n'
        'echo "hf: $HF_DATASETS_CACHE"\n'
        'echo "(TaskRunner pid=7) step:1 - training/global_step:1 - timing_s/step:0.5"\n'
        "exit 0\n"
    )
    launch.chmod(0o755)
    job = render_job(TARGETS._replace(launch_script=str(launch), python="/bin/true"))
    out = subprocess.run(["sh", "-c", job, "sh", "no"], capture_output=True, text=True)
    run = smoke.parse_smoke(out.stdout.splitlines())
    assert run.complete and run.values["rc"] == "0" and run.values["left"] == ""
    args = next(line for line in run.log if line.startswith("args: "))
    assert "trainer.total_training_steps=1" in args and "hydra.run.dir=/tmp/p40fleet-smoke." in args
    scratch = args.split("hydra.run.dir=", 1)[1].split("/hydra")[0]
    assert not Path(scratch).exists()
    assert run.metrics[1]["training/global_step"] == 1.0
    check = smoke.smoke_check(run, model="m", overrides=smoke.smoke_overrides(simulated=False,
                                                                               gpus=4))  # fmt: skip
    assert check.status == PASS and "GPU: 1 PPO step in 0.50 s" in check.detail


def test_the_cpu_step_stops_only_its_own_ray_never_ray_stop(tmp_path):
    """A simulated cluster member runs the fleet's raylet as the same user: the CPU step's
    clean-up stops the processes naming its own temp dir ($S/ray) and nothing else (`ray stop`
    would stop the member's raylet, and on the head the cluster's GCS: seen on the lab)."""
    job = render_job(TARGETS)
    assert '"$RAY" stop' not in job and "ray stop --force" not in job
    functions = job.split("own_ray() {", 1)[1].split("finish() {", 1)[0]
    scratch = tmp_path / "p40fleet-smoke.abc"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    own = subprocess.Popen([*sleeper, f"--session_dir={scratch}/ray/session_1"])
    fleet = subprocess.Popen([*sleeper, "--session_dir=/tmp/ray/session_2", f"{scratch}/rayx"])
    try:
        out = subprocess.run(["sh", "-c", f'S={scratch}\nown_ray() {{{functions}\n'
                              'own_ray; stop_own_ray; echo "left: $(own_ray)"'],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert out.stdout.splitlines() == [str(own.pid), "left: "], out
        assert own.wait(timeout=20) is not None
        assert fleet.poll() is None  # another Ray's process lives on
    finally:
        for proc in (own, fleet):
            proc.kill()
            proc.wait()


# --- the output: PASS / FAIL / SKIP ---------------------------------------------------------

CPU = smoke.smoke_overrides(simulated=True, gpus=1)


def test_pass_from_a_real_lab_run():
    run = smoke.parse_smoke(fixture("lab-cpu-pass.out"))
    check = smoke.smoke_check(run, model="tiny-qwen2", overrides=CPU)
    assert check.status == PASS, check
    assert check.detail.startswith("CPU (simulated host): 1 PPO step in ")
    assert "(timing_s/step)" in check.detail and "model tiny-qwen2, lengths 64+16" in check.detail
    assert run.metrics[1]["training/global_step"] == 1.0


def test_fail_from_a_real_lab_run_with_a_broken_launch_script():
    run = smoke.parse_smoke(fixture("lab-cpu-broken-launch.out"))
    check = smoke.smoke_check(run, model="tiny-qwen2", overrides=CPU)
    assert check.status == FAIL, check
    assert check.detail.startswith("CPU (simulated host): launch script exit 1, no training/")
    error = "error: NotImplementedError: Rollout name: no_such_rollout is not supported"
    assert error in check.detail
    # the last lines end with the exception, not with the Ray workers' noise after it
    assert check.detail.endswith(
        "NotImplementedError: Rollout name: no_such_rollout is not supported"
    )
    assert "^^^" not in check.detail
    assert "launch-ppo.sh" in check.remedy and "deploy/training.py" in check.remedy


def test_exit_0_without_the_step_line_is_a_fail():
    lines = [ln for ln in fixture("lab-cpu-pass.out") if "global_step" not in ln]
    check = smoke.smoke_check(smoke.parse_smoke(lines), model="m", overrides=CPU)
    assert check.status == FAIL and "no training/global_step:1" in check.detail


def test_the_step_line_with_a_nonzero_exit_is_a_fail():
    lines = [("rc=1" if ln == "rc=0" else ln) for ln in fixture("lab-cpu-pass.out")]
    check = smoke.smoke_check(smoke.parse_smoke(lines), model="m", overrides=CPU)
    assert check.status == FAIL and "launch script exit 1" in check.detail


def test_a_timeout_says_so_and_how_to_raise_the_bound():
    out = ["@@p40fleet-smoke 1", "sim=yes", "rc=124", "timed_out=yes", "@@log loading", "@@end"]
    check = smoke.smoke_check(smoke.parse_smoke(out), model="m", overrides=CPU, timeout_s=60)
    assert check.status == FAIL and "stopped after 60 s" in check.detail
    assert "--smoke-timeout" in check.remedy


def test_a_launch_script_refusal_is_its_own_fix():
    out = [
        "@@p40fleet-smoke 1", "sim=no", "rc=2", "timed_out=no",
        "@@log launch-ppo: model directory /home/verl/models/x is missing: save the model there",
        "@@end",
    ]  # fmt: skip
    check = smoke.smoke_check(smoke.parse_smoke(out), model="m", overrides=CPU)
    assert check.status == FAIL and check.detail.startswith("GPU: launch script exit 2")
    assert check.remedy.startswith("model directory /home/verl/models/x is missing")


def test_the_scripts_error_lines_name_the_exception_beyond_the_log_tail():
    """The script greps the log's exception lines (@@error): an exception followed by more
    noise than the tail keeps is still named."""
    out = ["@@p40fleet-smoke 1", "sim=yes", "rc=1", "timed_out=no",
           "@@error ValueError: Total available GPUs 0 is less than total desired GPUs 1",
           *[f"@@log (raylet) noise {i}" for i in range(30)], "@@end"]  # fmt: skip
    check = smoke.smoke_check(smoke.parse_smoke(out), model="m", overrides=CPU)
    assert check.status == FAIL
    assert "error: ValueError: Total available GPUs 0 is less than" in check.detail
    assert "noise 29" in check.detail and "noise 14" not in check.detail  # LOG_LINES: 15


def test_no_output_is_a_fail():
    check = smoke.smoke_check(smoke.parse_smoke([]), model="m", overrides=CPU)
    assert check.status == FAIL and "no answer" in check.detail


def test_gpu_peak_memory_is_reported_from_a_real_gpu_log():
    """verl's own console line from the H200 run under a 24 GiB cap (docs/measurements)."""
    log = Path(__file__).parents[1] / "docs" / "measurements" / "ppo-1xP40.log"
    steps = smoke.parse_metrics(log.read_text().splitlines())
    first = steps[1]
    out = ["@@p40fleet-smoke 1", "sim=no", "rc=0", "run_s=150"]
    out += [f"@@step {line}" for line in log.read_text().splitlines() if " step:1 " in line]
    check = smoke.smoke_check(smoke.parse_smoke([*out, "@@end"]), model="q", overrides=CPU)
    assert check.status == PASS
    assert f"peak {first['perf/max_memory_allocated_gb']:.2f} GiB allocated per GPU" in check.detail
    assert f"{first['timing_s/step']:.2f} s (timing_s/step)" in check.detail


def test_skip_names_the_missing_model_or_data_and_other_failures():
    ok = [Check("model files", PASS, "ok"), Check("data files", PASS, "ok")]
    assert smoke.smoke_skip(ok) is None
    no_model = [Check("model files", FAIL, "/home/verl/models/x is missing", "stage it"), ok[1]]
    skipped = smoke.smoke_skip(no_model)
    assert skipped.status == SKIP and "no staged model (/home/verl/models/x" in skipped.detail
    other = [*ok, Check("torch version", FAIL, "2.1", "fix")]
    assert "fails torch version" in smoke.smoke_skip(other).detail


# --- the lab-only CPU rule set --------------------------------------------------------------


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory) -> Path:
    """~/verl as a host has it: the sdist with the pascal rules applied and recorded."""
    tree = extract_verl(tmp_path_factory.mktemp("lab-cpu") / "verl")
    vp.apply(tree, "v0.5.0", "pascal")
    return tree


def test_lab_cpu_rules_apply_to_a_package_copy_and_keep_the_pascal_rules(patched_tree, tmp_path):
    scratch = tmp_path / "verl"
    shutil.copytree(patched_tree / "verl", scratch / "verl")  # what the script copies
    applier = vp.load_applier()
    result = applier.apply(str(scratch), json.loads(vp.lab_cpu_ruleset_json("v0.5.0")))
    assert [a for _, a in result["actions"]] == ["apply"] * len(
        vp.LAB_CPU_RULE_SETS["v0.5.0"].rules
    )
    workers = (scratch / "verl/workers/fsdp_workers.py").read_text()
    assert 'backend="gloo" if get_device_name() == "cpu"' in workers
    assert workers.count('sync_module_states=device_name != "cpu"') == 3
    assert 'attn_implementation="sdpa"' in workers  # pascal's rules are still there
    # the host's tree is untouched and its record still says pascal
    record = json.loads((patched_tree / vp.RECORD_NAME).read_text())
    assert record["profile"] == "pascal"
    assert 'gloo" if' not in (patched_tree / "verl/workers/fsdp_workers.py").read_text()
    subprocess.run(["python3", "-m", "py_compile", str(scratch / "verl/utils/device.py")],
                   check=True)  # fmt: skip


def test_the_cpu_shim_answers_verls_cuda_only_calls(patched_tree, tmp_path):
    scratch = tmp_path / "verl"
    shutil.copytree(patched_tree / "verl", scratch / "verl")
    vp.load_applier().apply(str(scratch), json.loads(vp.lab_cpu_ruleset_json("v0.5.0")))
    text = (scratch / "verl/utils/device.py").read_text()
    fake_cpu = types.SimpleNamespace(current_device=lambda: "cpu", is_available=lambda: True)
    fake_torch = types.SimpleNamespace(
        cpu=fake_cpu, manual_seed=lambda s: ("seed", s), get_rng_state=lambda: "rng"
    )
    module = types.ModuleType("device_under_test")
    module.__dict__["torch"] = fake_torch
    start = text.index("class _CpuDeviceShim")
    exec(
        compile(text[start : text.index("\n\n\ndef ", start)], "device.py", "exec"), module.__dict__
    )
    shim = module._CPU_DEVICE_SHIM
    assert shim.memory_allocated() == 0 and shim.max_memory_reserved() == 0
    assert shim.mem_get_info() == (0, 0) and shim.empty_cache() is None
    assert shim.get_device_name() == "cpu" and shim.current_device() == "cpu"
    assert shim.manual_seed(3) == ("seed", 3)
    with pytest.raises(AttributeError, match="lab-cpu shim"):
        shim.Stream  # noqa: B018
    use = 'if device_name == "cpu":  # p40fleet lab-cpu\n        return _CPU_DEVICE_SHIM'
    assert use in text


def test_lab_cpu_rules_are_separate_from_every_host_rule_set():
    cpu_ids = {r.id for r in vp.LAB_CPU_RULE_SETS["v0.5.0"].rules}
    for ref, profiles in vp.RULE_SETS.items():
        for rs in profiles.values():
            assert not cpu_ids & {r.id for r in rs.rules}, (ref, rs.profile)
    assert vp.lab_cpu_rule_set("v0.5.0-lab1").profile == vp.LAB_CPU_PROFILE
    with pytest.raises(vp.VerlPatchError, match="no lab-cpu rule set"):
        vp.lab_cpu_rule_set(vp.SEED_COMMIT)


# --- the switch: host data and the CLI ----------------------------------------------------


def test_host_data_switch_and_bound():
    assert smoke.requested("yes") and smoke.requested(True) and smoke.requested("1")
    assert not smoke.requested(None) and not smoke.requested("no") and not smoke.requested("")
    assert smoke.timeout_from_data(None) == smoke.DEFAULT_TIMEOUT_S == 600
    assert smoke.timeout_from_data("900") == 900 and smoke.timeout_from_data(45) == 45
    for bad in ("10", "ten", "-5", "1.5"):
        with pytest.raises(ValueError, match="verify_smoke_timeout="):
            smoke.timeout_from_data(bad)


def test_smoke_switch_becomes_host_data():
    command = verify_cli.pyinfra_command("@local", smoke=True, smoke_timeout=900)
    assert command[-4:] == ["--data", "verify_smoke=yes", "--data", "verify_smoke_timeout=900"]
    assert "verify_smoke=yes" not in verify_cli.pyinfra_command("@local")


def test_smoke_timeout_needs_smoke_and_sane_seconds(capsys):
    assert verify_cli.main(["@local", "--smoke-timeout", "100"]) == 2
    assert "--smoke-timeout needs --smoke" in capsys.readouterr().err
    assert verify_cli.main(["@local", "--smoke", "--smoke-timeout", "5"]) == 2
    assert "expected seconds >= 30" in capsys.readouterr().err


def test_the_cpu_step_names_its_ray_to_a_left_out_hosts_launch_script():
    """A host the cluster plan leaves out has RAY_ADDRESS=local in its launch script, which
    yields to P40FLEET_RAY_ADDRESS: the simulated step exports it, so verl joins the step's Ray
    (fake GPU, ``cpu`` resource), not a private one without them."""
    from p40fleet.verification.smoke_script import SmokeTargets, render_job

    job = render_job(SmokeTargets("verl", "/py", "/home/verl/launch-ppo.sh", "/v", "v0.5.0", 1, 60))
    cpu_branch = job.split('if [ "$SIM" = yes ]; then', 1)[1].split("\nelse\n", 1)[0]
    assert "export RAY_ADDRESS=auto P40FLEET_RAY_ADDRESS=auto" in cpu_branch


# --- the cluster's step (issue 25, section 4): one step over the cluster's plan ------------

CLUSTER = ClusterSmokeTargets(
    user="verl",
    python="/home/verl/miniconda3/envs/verl-p40/bin/python",
    launch_script="/home/verl/launch-ppo.sh",
    verl_checkout="/home/verl/verl",
    verl_ref="v0.5.0",
    address="10.0.0.1:6379",
    head_host="10.0.0.1",
    members=(("lab1", "10.0.0.1"), ("lab2", "10.0.0.2"), ("lab3", "10.0.0.3")),
    gpus_per_node=1,
    timeout_s=600,
    simulated=True,
)


def test_cluster_overrides_are_the_plans_nodes_and_gpus_one_sample_per_worker():
    o = keyed(smoke.cluster_overrides(simulated=True, nnodes=3, gpus_per_node=1))
    assert (o["trainer.nnodes"], o["trainer.n_gpus_per_node"], o["trainer.device"]) == (
        "3",
        "1",
        "cpu",
    )
    assert o["data.train_batch_size"] == o["actor_rollout_ref.actor.ppo_mini_batch_size"] == "3"
    g = keyed(smoke.cluster_overrides(simulated=False, nnodes=2, gpus_per_node=4))
    assert (g["trainer.nnodes"], g["trainer.n_gpus_per_node"], g["data.train_batch_size"]) == (
        "2",
        "4",
        "8",
    )
    assert "trainer.device" not in g
    # the single-host step is unchanged: one node
    assert keyed(smoke.smoke_overrides(simulated=False, gpus=4))["trainer.nnodes"] == "1"


@pytest.mark.parametrize("nnodes,per_node,simulated", [(2, 1, True), (3, 1, True), (2, 4, False)])
def test_launch_plan_plus_cluster_overrides_pass_verls_checks(
    config_dir, nnodes, per_node, simulated
):
    plan = plan_launch(SPEC, [P40] * per_node)
    extra = smoke.cluster_overrides(
        simulated=simulated, nnodes=nnodes, gpus_per_node=per_node, scratch="/tmp/s"
    )
    cfg = composed(config_dir, [*plan.overrides, *extra])
    assert verl_failures(cfg, val_rows=1) == []
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (nnodes, per_node)
    assert cfg.data.train_batch_size == nnodes * per_node


def test_the_cluster_script_runs_the_plans_overrides_against_the_cluster_never_ray_stop():
    job = render_cluster_job(CLUSTER)
    cpu = " ".join(
        smoke.shell_word(o)
        for o in smoke.cluster_overrides(simulated=True, nnodes=3, gpus_per_node=1)
    )
    assert f"set -- {cpu}\n" in job and "trainer.nnodes=3" in job
    assert "export RAY_ADDRESS=10.0.0.1:6379 P40FLEET_RAY_ADDRESS=10.0.0.1:6379" in job
    assert "RAY_AUTH_TOKEN" in job and "IFS= read -r P40FLEET_T" in job  # the token: stdin
    assert '"$RAY" stop' not in job and 'ray_up=""' in job and "ray_up=1" not in job  # never set
    assert "--head" not in job  # no private Ray
    assert vp.lab_cpu_ruleset_json("v0.5.0").rstrip("\n") in job
    assert smoke_script.CLUSTER_DRIVER.read_text().rstrip("\n") in job
    config = json.loads(job.split('> "$S/cluster.json"\n', 1)[1].split("\nP40FLEET", 1)[0])
    assert config["members"] == [list(m) for m in CLUSTER.members]
    assert (config["address"], config["head_host"], config["gpus_per_node"]) == (
        "10.0.0.1:6379",
        "10.0.0.1",
        1,
    )
    assert subprocess.run(["sh", "-n", "-c", job]).returncode == 0
    # the single-host script is not the cluster's: it starts and stops its own Ray
    single = render_job(TARGETS)
    assert "cluster.py" not in single and "ray_up=1" in single and "RAY_AUTH_TOKEN" not in single
    with pytest.raises(ValueError, match="2 or more members"):
        render_cluster_job(CLUSTER._replace(members=CLUSTER.members[:1]))


def test_the_cluster_step_runs_as_the_training_user_with_roots_token_on_stdin():
    from p40fleet.ray import TOKEN_FILE

    full = render_cluster_smoke(CLUSTER)
    assert len(re.findall(r"p40fleet_ask \d+ verl sh -c", full)) == 1
    assert full.endswith(
        'sh "$p40fleet_sim" <"$p40fleet_tk"; else echo \'@@p40fleet-smoke 1\'; '
        "echo 'launch=absent'; echo '@@end'; fi; true"
    )
    assert (
        f"if [ -f {TOKEN_FILE} ] && [ ! -L {TOKEN_FILE} ]; then p40fleet_tk={TOKEN_FILE}; "
        "else p40fleet_tk=/dev/null; fi" in full
    )
    assert subprocess.run(["sh", "-n", "-c", full]).returncode == 0
    assert "p40fleet_sim=no\n" in render_cluster_smoke(CLUSTER._replace(simulated=False))
    with pytest.raises(ValueError, match="never runs as root"):
        render_cluster_smoke(CLUSTER._replace(user=""))


FAKE_RAY = """
import json, os
_LOG = os.environ["FAKE_RAY_LOG"]
def _say(*w):
    open(_LOG, "a").write(" ".join(str(x) for x in w) + "\\n")
def init(**kw):
    _say("init", kw.get("address"), kw.get("_node_ip_address"), os.environ.get("RAY_AUTH_TOKEN"),
         "jobcfg" if "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ else "-")
def nodes():
    return json.loads(os.environ["FAKE_RAY_NODES"])
def shutdown():
    pass
class _Remote:
    def __init__(self, fn):
        self.fn = fn
    def options(self, **kw):
        self.kw = kw
        return self
    def remote(self, *args):
        _say("task", self.kw["scheduling_strategy"].node_id, *args)
        return self.fn(*args)
def remote(fn):
    return _Remote(fn)
def wait(refs, num_returns, timeout):
    return refs, []
def get(ref):
    return ref
"""


def fake_ray(tmp_path: Path, alive: list[tuple[str, float, float]]) -> dict[str, str]:
    """A stand-in ``ray`` package (init, nodes, remote tasks run in place) and its env."""
    pkg = tmp_path / "fake" / "ray"
    (pkg / "util").mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_RAY)
    (pkg / "util" / "__init__.py").write_text("")
    (pkg / "util" / "scheduling_strategies.py").write_text(
        "class NodeAffinitySchedulingStrategy:\n"
        "    def __init__(self, node_id, soft):\n"
        "        self.node_id = node_id\n"
    )
    nodes = [
        {
            "NodeManagerAddress": ip,
            "NodeID": f"id-{ip}",
            "Alive": True,
            "Resources": {"CPU": 2.0, "GPU": gpu, "cpu": cpu},
        }
        for ip, gpu, cpu in alive
    ]
    return {
        "PYTHONPATH": str(tmp_path / "fake"),
        "FAKE_RAY_NODES": json.dumps(nodes),
        "FAKE_RAY_LOG": str(tmp_path / "ray.log"),
        "PATH": "/usr/bin:/bin",
    }


def fake_launch(tmp_path: Path) -> Path:
    launch = tmp_path / "launch-ppo.sh"
    launch.write_text(
        "#!/bin/sh\n"
        'echo "args: $*"\n'
        'echo "addr: $RAY_ADDRESS $P40FLEET_RAY_ADDRESS"\n'
        'echo "job: $RAY_JOB_CONFIG_JSON_ENV_VAR"\n'
        'mkdir -p "$HF_HOME"\n'
        'echo "(WorkerDict pid=11) loading"\n'
        'echo "(WorkerDict pid=12, ip=127.0.0.2) loading"\n'
        'echo "(WorkerDict pid=13, ip=127.0.0.3) loading"\n'
        'echo "(WorkerDict pid=14, ip=127.0.0.3) more"\n'
        'echo "(TaskRunner pid=7) step:1 - training/global_step:1 - timing_s/step:0.9"\n'
        "exit 0\n"
    )
    launch.chmod(0o755)
    return launch


LOCAL = (("lab1", "127.0.0.1"), ("lab2", "127.0.0.2"), ("lab3", "127.0.0.3"))


def test_the_cluster_script_against_a_fake_ray_and_launch_script_passes_and_cleans(tmp_path):
    """The cluster job, run here (GPU path) with a stand-in ray package and launch script: the
    helper finds every member alive with its GPUs, the job's runtime env reaches the launch
    script with the cluster's address, the members' scratch path is removed through one task
    per other node, the head's own scratch dir is gone, and the row PASSes with the nodes verl's
    workers logged from."""
    env = fake_ray(tmp_path, [("127.0.0.1", 1, 0), ("127.0.0.2", 1, 0), ("127.0.0.3", 1, 0)])
    targets = CLUSTER._replace(
        launch_script=str(fake_launch(tmp_path)),
        python=sys.executable,
        head_host="127.0.0.1",
        members=LOCAL,
    )
    job = render_cluster_job(targets)
    out = subprocess.run(
        ["sh", "-c", job, "sh", "no"],
        capture_output=True,
        text=True,
        env=env,
        input="RAY_AUTH_TOKEN=abc123\n",
    )
    run = smoke.parse_smoke(out.stdout.splitlines())
    assert run.complete and run.values["rc"] == "0" and run.values["cluster_rc"] == "0", out
    assert run.nodes == LOCAL and run.missing == () and run.left == ()
    assert run.workers == ("127.0.0.2", "127.0.0.3", "local")
    args = next(line for line in run.log if line.startswith("args: "))
    assert "trainer.nnodes=3" in args and "trainer.device" not in args  # the GPU path
    assert (
        next(ln for ln in run.log if ln.startswith("addr: ")) == "addr: 10.0.0.1:6379 10.0.0.1:6379"
    )
    scratch = args.split("hydra.run.dir=", 1)[1].split("/hydra")[0]
    job_cfg = json.loads(next(ln for ln in run.log if ln.startswith("job: "))[5:])
    assert job_cfg["runtime_env"]["env_vars"]["HF_HOME"] == f"{scratch}/hf"
    assert "py_modules" not in job_cfg["runtime_env"]  # GPU hosts: each node's own ~/verl
    assert not Path(scratch).exists()
    calls = (tmp_path / "ray.log").read_text().splitlines()
    assert calls[0] == "init 10.0.0.1:6379 127.0.0.1 abc123 -"  # the token, the head's address
    tasks = [c for c in calls if c.startswith("task ")]
    assert tasks == [f"task id-127.0.0.2 {scratch}", f"task id-127.0.0.3 {scratch}"]
    assert all(c.endswith(" -") for c in calls if c.startswith("init"))  # no job env re-sent
    check = smoke.cluster_check(
        run, head="lab1", members=("lab1", "lab2", "lab3"), gpus_per_node=1, model="m"
    )
    assert check.status == PASS, check
    assert check.detail.startswith(
        "GPU: 1 PPO step over 3 node(s) x 1 GPU(s) (lab1, lab2, lab3) in 0.90 s (timing_s/step)"
    )
    assert check.detail.endswith("; workers on 3 node(s) (lab1, lab2, lab3)")


def test_a_member_without_the_plans_resources_is_a_skip_and_nothing_runs(tmp_path):
    """lab2 offers no `cpu` (a unit from before this plan), lab3 is not in Ray: the helper
    names both, the launch script never runs, the row SKIPs naming them and the fix."""
    env = fake_ray(tmp_path, [("127.0.0.1", 1, 1), ("127.0.0.2", 1, 0)])
    config = tmp_path / "cluster.json"
    config.write_text(
        json.dumps(
            smoke_script.cluster_config(CLUSTER._replace(head_host="127.0.0.1", members=LOCAL))
        )
    )
    out = subprocess.run(
        [
            sys.executable,
            str(smoke_script.CLUSTER_DRIVER),
            "nodes",
            str(config),
            str(tmp_path),
            "yes",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[0] == "@@node lab1 127.0.0.1", out
    assert lines[1].startswith("@@missing lab2 its Ray node offers GPU 1, cpu 0; the plan needs 1")
    assert lines[2].startswith("@@missing lab3 127.0.0.3 is not an alive node of the Ray cluster")
    job_cfg = json.loads((tmp_path / "job.json").read_text())
    assert job_cfg["runtime_env"]["py_modules"] == [f"{tmp_path}/verl/verl"]  # the lab-cpu copy
    run = smoke.parse_smoke(["@@p40fleet-smoke 1", "sim=yes", *lines, "cluster_rc=0", "@@end"])
    check = smoke.cluster_check(
        run, head="lab1", members=("lab1", "lab2", "lab3"), gpus_per_node=1, model="m"
    )
    assert check.status == SKIP, check
    assert check.detail.startswith(
        "not run: the cluster's plan 3 node(s) x 1 GPU(s) (lab1, "
        "lab2, lab3) needs every member in Ray: lab2: its Ray node"
    )
    assert "lab3: 127.0.0.3 is not an alive node" in check.detail
    assert "deploy/ray.py" in check.remedy
    # the whole script stops before the launch script (which would fail the test if run)
    launch = tmp_path / "launch-ppo.sh"
    launch.write_text("#!/bin/sh\necho LAUNCHED\nexit 3\n")
    launch.chmod(0o755)
    targets = CLUSTER._replace(
        launch_script=str(launch), python=sys.executable, head_host="127.0.0.1", members=LOCAL
    )
    full = subprocess.run(
        ["sh", "-c", render_cluster_job(targets), "sh", "no"],
        capture_output=True,
        text=True,
        env=env,
        input="",
    )
    assert "LAUNCHED" not in full.stdout and not re.search(r"^rc=", full.stdout, re.M)
    assert "@@missing lab3" in full.stdout and full.stdout.rstrip().endswith("@@end")


def test_a_cluster_that_cannot_be_asked_is_a_fail_with_the_helpers_error():
    lines = [
        "@@p40fleet-smoke 1",
        "sim=yes",
        "cluster=yes",
        "scratch_rc=0",
        "patch_rc=0",
        "cluster_rc=2",
        "@@log cannot ask the Ray cluster at 10.0.0.1:6379: ConnectionError: auth failed",
        "left=",
        "@@end",
    ]
    check = smoke.cluster_check(
        smoke.parse_smoke(lines), head="lab1", members=("lab1", "lab2"), gpus_per_node=1, model="m"
    )
    assert (
        check.status == FAIL and "could not read the Ray cluster's nodes (exit 2)" in check.detail
    )
    assert "ConnectionError: auth failed" in check.detail and "token" in check.remedy


def test_a_failed_cluster_step_carries_the_trainers_last_lines_and_a_fix():
    lines = [ln for ln in fixture("lab-cpu-broken-launch.out")]
    check = smoke.cluster_check(
        smoke.parse_smoke(lines),
        head="lab1",
        members=("lab1", "lab2"),
        gpus_per_node=1,
        model="tiny-qwen2",
    )
    assert check.name == smoke.CLUSTER_CHECK and check.status == FAIL
    assert check.detail.startswith(
        "2 node(s) x 1 GPU(s) (lab1, lab2): CPU (simulated host): launch script exit 1"
    )
    assert "NotImplementedError: Rollout name: no_such_rollout" in check.detail
    assert "deploy/training.py" in check.remedy
    passed = smoke.cluster_check(
        smoke.parse_smoke(fixture("lab-cpu-pass.out")),
        head="lab1",
        members=("lab1", "lab2"),
        gpus_per_node=1,
        model="m",
    )
    assert passed.status == PASS and "workers' nodes not logged" in passed.detail
    no_step = [ln for ln in fixture("lab-cpu-pass.out") if "global_step" not in ln]
    assert (
        smoke.cluster_check(
            smoke.parse_smoke(no_step),
            head="lab1",
            members=("lab1", "lab2"),
            gpus_per_node=1,
            model="m",
        ).status
        == FAIL
    )
    assert (
        smoke.cluster_check(
            smoke.SmokeRun(), head="lab1", members=("a", "b"), gpus_per_node=1, model="m"
        ).status
        == FAIL
    )


def test_the_cluster_step_is_skipped_when_the_head_cannot_step_alone():
    ok = [Check("ray cluster", PASS, "3/3"), Check(smoke.CHECK, PASS, "CPU: 1 PPO step")]
    assert smoke.cluster_skip(ok, "lab1") is None
    down = smoke.cluster_skip([Check("ray cluster", FAIL, "2/3 nodes active"), ok[1]], "lab1")
    assert down.status == SKIP and down.detail == "not run: the head lab1 fails ray cluster"
    own = smoke.cluster_skip([ok[0], Check(smoke.CHECK, FAIL, "launch script exit 1")], "lab1")
    assert own.status == SKIP and "lab1's own `smoke step` did not pass (FAIL: launch" in own.detail
    assert smoke.cluster_skip(ok[:1], "lab1").status == SKIP  # no own step: not stepped
