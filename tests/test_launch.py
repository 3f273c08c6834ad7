"""p40fleet.launch (overrides per profile, sizing rule, refusals), the rendered launch script
(bash -n, refusal with exit 2, exec with the overrides and "$@"), and its writer
(``operations.training.write_launch_script``)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import subprocess

import pytest
from pyinfra.facts.files import Directory, File
from pyinfra.facts.server import TmpDir, Users

from p40fleet import launch
from p40fleet import verl_patches as vp
from p40fleet.facts.home import UserFile, UserFileState
from p40fleet.launch import LaunchError, plan_launch, profile_overrides, size_for
from p40fleet.operations.training import SCRIPT_NAME, write_launch_script
from p40fleet.privdrop import STAGE_DIR
from p40fleet.spec import SpecError, load_spec
from tests.opharness import at, run_op

P40, P100_16, P4, V100_16, V100_32, T4 = 0x1B38, 0x15F8, 0x1BB3, 0x1DB4, 0x1DB5, 0x1EB8
A100_40, A100_80, RTX3090, H100, K80, H200, M40 = (
    0x20B0, 0x20B2, 0x2204, 0x2330, 0x102D, 0x2335, 0x17FD,
)  # fmt: skip
SPEC = load_spec("lab1", {})
HOME = "/home/verl"
SCRIPT = f"{HOME}/launch-ppo.sh"
PY = "/home/verl/miniconda3/envs/verl-p40/bin/python"

FP32_SDPA = [
    "actor_rollout_ref.rollout.dtype=float32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    "+actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32",
    "+actor_rollout_ref.ref.fsdp_config.model_dtype=fp32",
    "+critic.model.fsdp_config.mixed_precision.param_dtype=fp32",
    "+actor_rollout_ref.model.override_config._attn_implementation=sdpa",
    "actor_rollout_ref.model.use_remove_padding=False",
]


# ------------------------------------------------------------------ overrides per profile


def test_pascal_overrides_hf_rollout_fp32_sdpa_no_compile():
    assert profile_overrides("pascal") == [
        "actor_rollout_ref.rollout.name=hf",
        *FP32_SDPA,
        "actor_rollout_ref.actor.use_torch_compile=False",
    ]


def test_volta_turing_overrides_vllm_in_fp32_and_sdpa():
    assert profile_overrides("volta-turing") == ["actor_rollout_ref.rollout.name=vllm", *FP32_SDPA]


def test_ampere_plus_adds_nothing_to_verls_defaults():
    assert profile_overrides("ampere-plus") == []


@pytest.mark.parametrize("profile", ["maxwell", "refused", "", "Pascal"])
def test_unknown_profile_is_refused(profile):
    with pytest.raises(LaunchError, match="unknown GPU profile"):
        profile_overrides(profile)
    with pytest.raises(LaunchError, match="unknown GPU profile"):
        size_for(profile, 4, 24)


def test_no_made_up_environment_variables():
    plan = plan_launch(SPEC, [P40] * 4)
    assert dict(plan.env) == {"PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "1"}
    assert not any("TRITON" in o for o in plan.overrides)


# ------------------------------------------------------------------ sizing rule


@pytest.mark.parametrize(
    ("gpu", "micro", "vllm"),
    [
        (P4, 1, None),  # 8 GiB fp32
        (P100_16, 2, None),  # 16 GiB fp32
        (P40, 4, None),  # 24 GiB fp32
        (V100_16, 2, 0.60),  # 16 GiB fp32
        (T4, 2, 0.60),
        (V100_32, 4, 0.35),  # 32 GiB fp32; 12/32 = 0.375 -> 0.35
        (RTX3090, 8, 0.50),  # 24 GiB bf16 = 48 effective
        (A100_40, 16, 0.30),  # 40 GiB bf16 = 80 effective
        (A100_80, 16, 0.30),
        (H100, 16, 0.30),
    ],
)
def test_sizing_rule_per_gpu(gpu, micro, vllm):
    for n in (1, 2, 4, 8):
        plan = plan_launch(SPEC, [gpu] * n)
        s = plan.sizing
        assert s.micro_batch_per_gpu == micro
        assert s.log_prob_micro_batch_per_gpu == 2 * micro
        assert s.ppo_mini_batch_size == 2 * micro * n
        assert s.train_batch_size == 8 * micro * n
        assert s.gpu_memory_utilization == vllm
        assert (s.hf_generate_micro_batch == 4 * micro) == (plan.profile == "pascal")
        assert f"trainer.n_gpus_per_node={n}" in plan.overrides


def test_sizing_p40x4_and_a100x8_values():
    p40 = plan_launch(SPEC, [P40] * 4).overrides
    for o in (
        "data.train_batch_size=128",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "+actor_rollout_ref.rollout.micro_batch_size=16",
    ):
        assert o in p40
    assert not any("gpu_memory_utilization" in o for o in p40)  # the HF rollout ignores it
    a100 = plan_launch(SPEC, [A100_80] * 8).overrides
    assert "data.train_batch_size=1024" in a100  # = verl's default at this size
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=256" in a100
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.30" in a100
    assert not any("micro_batch_size=" in o and o.startswith("+") for o in a100)


def test_ecc_memory_from_nvidia_smi_stays_in_the_same_bucket():
    # P40 with ECC on reports 22919 MiB; V100 16GB 16160 MiB
    ecc = plan_launch(SPEC, [P40] * 4, smi_memory_mib=[22919] * 4).sizing
    assert ecc.memory_gib == pytest.approx(22919 / 1024)
    assert ecc.micro_batch_per_gpu == plan_launch(SPEC, [P40] * 4).sizing.micro_batch_per_gpu
    v100 = plan_launch(SPEC, [V100_16] * 2, smi_memory_mib=[16160, 16160]).sizing
    assert v100.micro_batch_per_gpu == 2


def test_smallest_gpu_sizes_a_mixed_host():
    s = plan_launch(SPEC, [V100_32, V100_16]).sizing
    assert s.memory_gib == 16 and s.micro_batch_per_gpu == 2
    # an incomplete nvidia-smi answer falls back to the catalog
    assert plan_launch(SPEC, [P40, P40], smi_memory_mib=[22919, None]).sizing.memory_gib == 24


def test_pascal_with_ampere_on_one_host_takes_the_lowest_profile():
    plan = plan_launch(SPEC, [P40, A100_80])
    assert plan.profile == "pascal"
    assert "actor_rollout_ref.rollout.name=hf" in plan.overrides


def test_vllm_memory_utilization_clamped_and_rounded_down():
    assert launch.vllm_memory_utilization(8) == 0.60
    assert launch.vllm_memory_utilization(24) == 0.50
    assert launch.vllm_memory_utilization(32) == 0.35
    assert launch.vllm_memory_utilization(141) == 0.30


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("gpus", "why"),
    [
        ([K80], "compute capability 3.7"),
        ([H200], "does not support"),
        ([0x9999], "unknown NVIDIA device"),
        ([], "no NVIDIA GPU found"),
    ],
)
def test_refused_hosts_get_no_plan(gpus, why):
    with pytest.raises(LaunchError, match=why):
        plan_launch(SPEC, gpus)


def test_unknown_memory_is_refused_unless_nvidia_smi_says():
    spec = load_spec("lab1", {"policy": {"allow_maxwell": True}})
    with pytest.raises(LaunchError, match="memory size of Tesla M40 unknown"):
        plan_launch(spec, [M40])
    assert plan_launch(spec, [M40], smi_memory_mib=[24478]).sizing.micro_batch_per_gpu == 4


@pytest.mark.parametrize(
    "training",
    [
        {"model": {"name": "Qwen 0.5B"}},
        {"data": {"name": "gsm,8k"}},
        {"data": {"val_file": "a b.parquet"}},
    ],
)
def test_names_that_cannot_be_hydra_values_are_refused(training):
    # The spec refuses them first (file names are [A-Za-z0-9._+-]); plan_launch checks again.
    with pytest.raises(SpecError, match="expected a file name of letters"):
        load_spec("lab1", {"training": training})
    spec = load_spec("lab1", {})  # and plan_launch refuses them too (a spec built unvalidated)
    model = spec.training.model.model_copy(update={"name": "Qwen 0.5B"})
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"model": model})})
    with pytest.raises(LaunchError, match="expected a path of letters"):
        plan_launch(spec, [P40])


def test_model_data_and_lengths_come_from_spec_training():
    spec = load_spec(
        "lab1",
        {
            "training": {
                "model": {"name": "Qwen2.5-1.5B-Instruct"},
                "data": {"name": "m", "train_file": "t.parquet", "val_file": "v.pq"},
                "max_prompt_length": 96,
                "max_response_length": 64,
            }
        },
    )
    plan = plan_launch(spec, [P40])
    assert plan.model_path == "/home/verl/models/Qwen2.5-1.5B-Instruct"
    assert "critic.model.path=/home/verl/models/Qwen2.5-1.5B-Instruct" in plan.overrides
    assert "data.train_files=/home/verl/data/m/t.parquet" in plan.overrides
    assert "data.val_files=/home/verl/data/m/v.pq" in plan.overrides
    assert "data.max_prompt_length=96" in plan.overrides
    assert "data.max_response_length=64" in plan.overrides
    assert plan.argv()[:3] == [PY, "-m", "verl.trainer.main_ppo"]
    default = plan_launch(SPEC, [P40])
    assert default.train_file == "/home/verl/data/gsm8k/train.parquet"
    assert default.val_file == "/home/verl/data/gsm8k/test.parquet"
    assert "data.max_prompt_length=512" in default.overrides  # verl's default, now explicit


# ------------------------------------------------------------------ validation batch, nodes


def test_hf_rollout_gets_a_validation_batch_of_one_chunk_per_gpu():
    p40 = plan_launch(SPEC, [P40] * 4).sizing
    assert (p40.hf_generate_micro_batch, p40.val_batch_size) == (16, 64)
    assert "data.val_batch_size=64" in plan_launch(SPEC, [P40] * 4).overrides
    # vLLM takes the whole validation set, as verl intends
    assert plan_launch(SPEC, [A100_80] * 8).sizing.val_batch_size is None
    assert not any("val_batch_size" in o for o in plan_launch(SPEC, [T4]).overrides)


def test_multi_node_plan_sizes_for_the_world():
    shape = launch.cluster_shape({"a": [P40] * 4, "b": [P40] * 4, "c": [P40] * 4})
    plan = plan_launch(SPEC, [P40] * 4, cluster=shape)
    s = plan.sizing
    assert (s.nnodes, s.gpus_per_node, s.world_size) == (3, 4, 12)
    assert (s.train_batch_size, s.ppo_mini_batch_size, s.val_batch_size) == (384, 96, 192)
    assert "trainer.nnodes=3" in plan.overrides
    assert "trainer.n_gpus_per_node=4" in plan.overrides
    assert plan.sizing.describe().startswith("3 node(s) x 4 GPU(s) x 24 GiB (pascal)")


def test_cluster_takes_the_lowest_profile_and_smallest_memory():
    shape = launch.cluster_shape({"a": [A100_80], "b": [P100_16]})
    plan = plan_launch(SPEC, [A100_80], cluster=shape)
    assert plan.profile == "pascal" and plan.sizing.memory_gib == 16
    assert "actor_rollout_ref.rollout.name=hf" in plan.overrides


def test_cluster_refusals_name_the_node_and_the_numbers():
    # a CPU-only member (a head, say) runs no GPU worker: it is not a training node
    assert launch.cluster_shape({"head": [], "a": [P40] * 2}).node_gpus == (("a", 2),)
    assert launch.cluster_shape({"head": [], "a": [P40] * 2}).left_out == (("head", "no GPU"),)
    with pytest.raises(LaunchError, match="no GPU in the Ray cluster \\(a, b\\)"):
        launch.cluster_shape({"a": [], "b": []})
    shape = launch.cluster_shape({"a": [P40] * 4, "b": [P40] * 4})
    with pytest.raises(
        LaunchError, match="this host has 2 GPU\\(s\\), the cluster plan gives every node 4"
    ):
        plan_launch(SPEC, [P40] * 2, cluster=shape)


# ------------------------------------------------------------------ the cluster plan

DEMO = {"lab1": [P40] * 4, "lab2": [P40] * 8, "lab3": [P100_16]}


@pytest.mark.parametrize(
    ("counts", "shape"),
    [
        ({"lab1": 4, "lab2": 8, "lab3": 1}, (("lab2",), 8)),  # the demo fleet: 8, not 3 x 1
        ({"a": 8, "b": 8, "c": 4, "d": 2}, (("a", "b"), 8)),  # 16, not 4 x 2
        ({"a": 4, "b": 4, "c": 4}, (("a", "b", "c"), 4)),
        ({"a": 1, "b": 1, "c": 1}, (("a", "b", "c"), 1)),
        ({"a": 2, "b": 2, "c": 4}, (("a", "b", "c"), 2)),  # 6 beats 4
        ({"a": 3, "b": 6}, (("b",), 6)),  # 2 x 3 = 1 x 6: the fewer nodes
        ({"a": 2, "b": 2, "c": 2, "d": 3, "e": 3, "f": 6}, (("a", "b", "c", "d", "e", "f"), 2)),
        ({"a": 1, "b": 2, "c": 4, "d": 8}, (("d",), 8)),  # 4, 6, 8, 8: 2 x 4 = 1 x 8
    ],
)
def test_cluster_trains_on_the_most_gpus(counts, shape):
    got = launch.cluster_shape({n: [P40] * c for n, c in counts.items()})
    best = max(k * sum(c >= k for c in counts.values()) for k in counts.values())
    members, per_node = shape
    assert (got.members, got.gpus_per_node) == (members, per_node)
    assert got.training_gpus == got.nnodes * got.gpus_per_node == best
    assert {n for n, _ in got.left_out} == set(counts) - set(members)


def test_demo_fleet_trains_on_8_gpus_and_names_who_is_left_out():
    shape = launch.cluster_shape(DEMO, name="headed by lab1 (10.0.0.1:6379)")
    assert (shape.nnodes, shape.gpus_per_node, shape.training_gpus, shape.idle_gpus) == (1, 8, 8, 0)
    assert shape.left_out == (
        ("lab1", "4 GPU(s), fewer than the 8 every node runs"),
        ("lab3", "1 GPU(s), fewer than the 8 every node runs"),
    )
    member = plan_launch(SPEC, [P40] * 8, cluster=shape, host="lab2")
    assert "trainer.nnodes=1" in member.overrides
    assert "trainer.n_gpus_per_node=8" in member.overrides
    assert "RAY_ADDRESS" not in dict(member.env)
    alone = plan_launch(SPEC, [P40] * 4, cluster=shape, host="lab1")
    assert "trainer.n_gpus_per_node=4" in alone.overrides and "trainer.nnodes=1" in alone.overrides
    assert dict(alone.env)["RAY_ADDRESS"] == "local"  # never the cluster's Ray
    p100 = plan_launch(SPEC, [P100_16], cluster=shape, host="lab3")
    assert p100.sizing.memory_gib == 16 and "trainer.n_gpus_per_node=1" in p100.overrides
    for plan, this in ((member, "lab2"), (alone, "lab1"), (p100, "lab3")):
        text = render(plan)
        head = "\n".join(line for line in text.splitlines() if line.startswith("#"))
        assert (
            "# Ray cluster headed by lab1 (10.0.0.1:6379): 1 node(s) x 8 GPU(s) = 8 training "
            "GPU(s)" in head
        )
        assert "# In it: lab2 (8 GPU(s))." in head
        assert (
            "# Not in it: lab1: 4 GPU(s), fewer than the 8 every node runs; lab3: 1 GPU(s)" in head
        )
        assert f"# This host ({this})" in head
    assert "is not in it (4 GPU(s), fewer than the 8" in render(alone)
    assert 'export RAY_ADDRESS="${P40FLEET_RAY_ADDRESS:-local}"' in render(alone)
    line = next(ln for ln in render(alone).splitlines() if ln.startswith("export RAY_ADDRESS="))
    for given, seen in (({}, "local"), ({"P40FLEET_RAY_ADDRESS": "auto"}, "auto")):
        proc = subprocess.run(["sh", "-c", f'{line}; echo "$RAY_ADDRESS"'], env=given,
                              capture_output=True, text=True)  # fmt: skip
        assert proc.stdout.strip() == seen  # the smoke step's own Ray, else a private one
    assert "is a training node" in render(member) and "RAY_ADDRESS=local\n" not in render(member)


def test_members_and_left_out_hosts_are_listed_as_the_lab_names_them():
    shape = launch.cluster_shape({f"lab{i}": [P40] * (1 if i == 3 else 2) for i in (10, 2, 3)})
    assert shape.members == ("lab2", "lab10") and shape.left_out[0][0] == "lab3"


def test_refused_and_cpu_only_members_are_left_out_with_their_reason():
    shape = launch.cluster_shape(
        {"head": [], "a": [P40] * 2, "b": [P40] * 2, "k": [K80]}, refused={"k": "Kepler"}
    )
    assert shape.members == ("a", "b")
    assert shape.left_out == (("head", "no GPU"), ("k", "refused (Kepler)"))


def test_memory_of_the_cluster_is_the_training_nodes_not_the_left_out():
    # the P100 (16 GiB) trains alone; the two P40 nodes are sized with 24 GiB
    shape = launch.cluster_shape({"a": [P40] * 2, "b": [P40] * 2, "c": [P100_16]})
    assert shape.members == ("a", "b") and shape.memory_gib == 24
    assert plan_launch(SPEC, [P40] * 2, cluster=shape, host="a").sizing.memory_gib == 24


# ------------------------------------------------------------------ per verl ref


def test_seed_ref_refuses_pascal_and_drops_overrides_it_lacks():
    seed = load_spec(
        "lab1",
        {"verl": {"ref": vp.SEED_COMMIT, "commit": vp.SEED_COMMIT, "version": "0.5.0.dev0"}},
    )
    with pytest.raises(LaunchError, match="62549582.*no rollout backend"):
        plan_launch(seed, [P40])
    volta = plan_launch(seed, [V100_16])
    assert not any("model_dtype" in o for o in volta.overrides)
    assert any("model_dtype" in o for o in plan_launch(SPEC, [V100_16]).overrides)
    assert volta.verl_ref == vp.SEED_COMMIT


def test_unknown_ref_is_refused_and_aliases_resolve():
    with pytest.raises(LaunchError, match="no patch rule set"):
        launch.ref_overrides("v9.9.9", "pascal")
    assert launch.ref_overrides("v0.5.0-lab1", "pascal").ref == "v0.5.0"
    assert launch.ref_overrides(vp.V050_COMMIT, "pascal").absent == ()


# ------------------------------------------------------------------ the script


USERS = {"verl": {"uid": 2001, "home": HOME}}
FRESH = {
    Users: USERS,
    at(Directory, path=HOME): {"mode": 750},
    File: None,
    Directory: None,
    UserFile: UserFileState(),
    TmpDir: "/tmp",
}


def staged_upload(r) -> tuple[str, str]:
    """The one upload of the launch script: (root's stage path, its text)."""
    [(dest, data)] = [(d, v) for d, v in r.uploads.items() if d.endswith("-" + SCRIPT_NAME)]
    return dest, data.decode() if isinstance(data, bytes) else data


def render(plan) -> str:
    r = run_op(write_launch_script, plan=plan, user="verl", home=HOME, facts=FRESH)
    return staged_upload(r)[1]


def test_operation_stages_the_script_outside_the_home_and_the_user_writes_it():
    """N1: root uploads into its own 0700 stage dir; the user copies it in (mode 755, a
    rename over whatever is at the path: a planted symlink is replaced, never followed)."""
    r = run_op(
        write_launch_script,
        plan=plan_launch(SPEC, [P40] * 4),
        user="verl",
        home=HOME,
        facts=FRESH,
    )
    staged, _ = staged_upload(r)
    assert staged.startswith(STAGE_DIR + "/") and not staged.startswith(HOME)
    assert r.commands[0] == f"install -d -m 700 {STAGE_DIR}"
    assert r.commands[1] == f"upload {staged}"
    copy = r.commands[2]
    assert copy.startswith("su -s /bin/sh verl -c ") and SCRIPT in copy
    assert "chmod 755" in copy and f'mv -fT "$t" {SCRIPT}' in copy
    assert copy.endswith(f"< {staged} ; rc=$?; rm -f {staged} ; exit $rc")
    assert not any(c.startswith(("chown", "chmod", "cp ")) for c in r.commands)


def test_operation_identical_script_is_no_change():
    plan = plan_launch(SPEC, [P40] * 4)
    text = render(plan)
    same = UserFileState("file", 755, "verl", hashlib.sha1(text.encode()).hexdigest())
    facts = {**FRESH, at(UserFile, path=SCRIPT, user="verl"): same}
    r = run_op(write_launch_script, plan=plan, user="verl", home=HOME, facts=facts)
    assert r.commands == [] and r.noops
    # another GPU count is another script
    other = plan_launch(SPEC, [P40] * 8)
    r = run_op(write_launch_script, plan=other, user="verl", home=HOME, facts=facts)
    assert r.commands[1].startswith(f"upload {STAGE_DIR}/")
    # the same text at another mode, or owned by someone else, is written again
    for wrong in (
        UserFileState("file", 644, "verl", same.sha1),
        UserFileState("file", 755, "root", same.sha1),
    ):
        facts = {**FRESH, at(UserFile, path=SCRIPT, user="verl"): wrong}
        assert run_op(write_launch_script, plan=plan, user="verl", home=HOME, facts=facts).changed


def test_a_symlink_at_the_script_is_replaced_by_the_user_and_a_directory_refuses_the_host():
    plan = plan_launch(SPEC, [P40] * 4)
    link = {**FRESH, at(UserFile, path=SCRIPT, user="verl"): UserFileState("link")}
    r = run_op(write_launch_script, plan=plan, user="verl", home=HOME, facts=link)
    assert any(c.startswith("su -s /bin/sh verl -c") for c in r.commands) and not r.failures
    folder = {**FRESH, at(UserFile, path=SCRIPT, user="verl"): UserFileState("dir")}
    r = run_op(write_launch_script, plan=plan, user="verl", home=HOME, facts=folder)
    assert r.commands == ["function _fail"]
    assert (
        SCRIPT in r.failures[0]
        and "is a directory" in r.failures[0]
        and "move it away" in r.failures[0]
    )


def test_operation_refuses_without_the_training_user_or_home():
    plan = plan_launch(SPEC, [P40])
    r = run_op(write_launch_script, plan=plan, user="verl", home=HOME, facts={Users: {}})
    assert r.commands == ["function _fail"] and "run deploy/python.py" in r.failures[0]
    facts = {Users: USERS, at(Directory, path=HOME): None}
    r = run_op(write_launch_script, plan=plan, user="verl", home=HOME, facts=facts)
    assert "home directory /home/verl" in r.failures[0]


@pytest.mark.parametrize("gpus", [[P40] * 4, [A100_80] * 8, [T4]])
def test_rendered_script_passes_bash_n(gpus, tmp_path):
    plan = plan_launch(SPEC, gpus)
    text = render(plan)
    script = tmp_path / "launch-ppo.sh"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert text.startswith("#!/usr/bin/env bash\n")
    assert 'exec "$PYTHON" -m verl.trainer.main_ppo \\\n' in text
    for override in plan.overrides:
        assert f"    {shlex.quote(override)} \\\n" in text
    assert text.endswith('    "$@"\n')
    assert "TRITON" not in text
    assert plan.sizing.describe() in text


FAKE_PYTHON = """#!/bin/sh
printf '%s\\n' "$PWD" "$@" > "$ARGS_OUT"
"""


def local_plan(tmp_path, gpus=(P40, P40, P40, P40)):
    """The host's plan with python, model, data and workdir moved into tmp_path."""
    plan = plan_launch(SPEC, list(gpus))
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    work = tmp_path / "home"
    work.mkdir()
    return dataclasses.replace(
        plan,
        python=str(python),
        workdir=str(work),
        model_path=str(tmp_path / "models" / "Qwen2.5-0.5B-Instruct"),
        train_file=str(tmp_path / "data" / "gsm8k" / "train.parquet"),
        val_file=str(tmp_path / "data" / "gsm8k" / "test.parquet"),
    )


def run_script(plan, tmp_path, *args):
    script = tmp_path / "launch-ppo.sh"
    script.write_text(render(plan))
    env = {"PATH": os.environ["PATH"], "ARGS_OUT": str(tmp_path / "args.txt")}
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=30
    )


def test_script_exits_2_when_the_model_dir_is_missing(tmp_path):
    plan = local_plan(tmp_path)
    result = run_script(plan, tmp_path)
    assert result.returncode == 2
    assert f"model directory {plan.model_path} is missing" in result.stderr
    assert not (tmp_path / "args.txt").exists()  # python never ran


def test_script_exits_2_when_a_data_file_is_missing(tmp_path):
    plan = local_plan(tmp_path)
    os.makedirs(plan.model_path)
    result = run_script(plan, tmp_path)
    assert result.returncode == 2
    assert f"training data {plan.train_file} is missing" in result.stderr
    os.makedirs(os.path.dirname(plan.train_file))
    open(plan.train_file, "w").close()
    result = run_script(plan, tmp_path)
    assert result.returncode == 2 and f"validation data {plan.val_file}" in result.stderr


def test_script_exits_2_without_the_envs_python(tmp_path):
    plan = dataclasses.replace(local_plan(tmp_path), python=str(tmp_path / "no" / "python"))
    result = run_script(plan, tmp_path)
    assert result.returncode == 2 and "no python at" in result.stderr


def test_script_execs_main_ppo_with_overrides_then_arguments(tmp_path):
    plan = local_plan(tmp_path)
    os.makedirs(plan.model_path)
    os.makedirs(os.path.dirname(plan.train_file))
    for path in (plan.train_file, plan.val_file):
        open(path, "w").close()
    extra = ["trainer.total_epochs=1", "trainer.experiment_name=a b"]
    result = run_script(plan, tmp_path, *extra)
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "args.txt").read_text().splitlines()
    assert lines == [plan.workdir, "-m", "verl.trainer.main_ppo", *plan.overrides, *extra]
