"""p40fleet.memory against issue 16's measurements, and the plan's fit / offload / refusal.

Measured (issue 16: an H200, uncapped, verl v0.5.0 with the project's 1xP40 overrides and
patch rules, Qwen2.5-0.5B shape, micro 4, log-prob micro 8, train batch 32): allocated
16.7 GiB at prompt/response 96/64 and 18.0 GiB at 512/512 (one step). Measured again with the
project's own rendered scripts, two steps each, allocator capped (docs/measurements/ppo-*.json,
benchmarks/gpu_ppo): 1xP40 20.4 GiB (step 2; Adam state exists from then on), 2xP40 16.7 GiB
per GPU, 1xP100 plan 13.0 GiB. The config.json values are Qwen2.5-0.5B-Instruct's
(tests/fixtures/models/).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from p40fleet.launch import LaunchError, plan_launch
from p40fleet.memory import ModelShape, ModelShapeError, Workload, estimate
from p40fleet.spec import load_spec

QWEN = json.loads(
    (
        Path(__file__).parent / "fixtures" / "models" / "Qwen2.5-0.5B-Instruct.config.json"
    ).read_text()
)
P40, P100, P4 = 0x1B38, 0x15F8, 0x1BB3
MEASURED = {(96, 64): 16.7, (512, 512): 20.4}
MEASUREMENTS = Path(__file__).resolve().parents[1] / "docs" / "measurements"


def spec(prompt=512, response=512):
    return load_spec(
        "lab1", {"training": {"max_prompt_length": prompt, "max_response_length": response}}
    )


def test_parameter_count_from_config_json():
    shape = ModelShape.from_config(QWEN)
    assert shape.params() == 494_032_768  # Qwen2.5-0.5B: 494 M (tied embedding, qkv bias)
    assert shape.critic_params() == shape.params() + 896 + 1  # value head instead of LM head
    untied = ModelShape.from_config({**QWEN, "tie_word_embeddings": False})
    assert untied.params() == shape.params() + 151936 * 896
    assert untied.critic_params() == shape.critic_params()


@pytest.mark.parametrize(("lengths", "measured"), MEASURED.items())
def test_estimate_agrees_with_the_measurements_within_25_percent(lengths, measured):
    shape = ModelShape.from_config(QWEN)
    work = Workload(world_size=1, sequence=sum(lengths), micro=4, log_prob_micro=8, hf_chunk=16)
    est = estimate(shape, work).peak_gib()
    assert abs(est - measured) / measured <= 0.25, (est, measured)
    # and the plan for a 1xP40 host is exactly that workload
    plan = plan_launch(spec(*lengths), [P40], model_config=QWEN)
    s = plan.sizing
    assert (s.micro_batch_per_gpu, s.log_prob_micro_batch_per_gpu, s.train_batch_size) == (4, 8, 32)
    assert s.estimate_gib == pytest.approx(est)
    assert not s.param_offload and not s.optimizer_offload


def test_estimate_values_recorded():
    """The numbers docs/training.md, the README and the report quote."""
    plan = plan_launch(spec(96, 64), [P40], model_config=QWEN)
    assert round(plan.sizing.estimate_gib, 1) == 16.6
    plan = plan_launch(spec(), [P40], model_config=QWEN)
    assert round(plan.sizing.estimate_gib, 1) == 22.2
    assert "estimated peak 22.2 GiB/GPU (actor log-prob), limit 22.3" in plan.sizing.describe()


@pytest.mark.parametrize(
    ("run", "gpus"), [("ppo-1xP40", [P40]), ("ppo-2xP40", [P40, P40]), ("ppo-1xP100", [P100])]
)
def test_plan_estimate_within_25_percent_of_the_capped_gpu_runs(run, gpus):
    """The device runs of benchmarks/gpu_ppo (the plan's own script, two PPO steps)."""
    measured = json.loads((MEASUREMENTS / f"{run}.json").read_text())
    assert measured["ok"] and measured["steps_done"] == 2
    peak = max(g["max_allocated_gib"] for g in measured["peak_per_gpu"])
    est = plan_launch(spec(), gpus, model_config=QWEN).sizing.estimate_gib
    assert abs(est - peak) / peak <= 0.25, (run, est, peak)


def test_fsdp_shards_the_static_part_over_the_world():
    one = plan_launch(spec(), [P40], model_config=QWEN).sizing.estimate_gib
    four = plan_launch(spec(), [P40] * 4, model_config=QWEN).sizing.estimate_gib
    assert four < one / 1.5


def test_p40_with_ecc_lowers_the_micro_batch_before_offloading():
    # 22919 MiB (ECC on): 22.2 GiB at micro 4 is over 0.93 x 22.4 = 20.8
    s = plan_launch(spec(), [P40], smi_memory_mib=[22919], model_config=QWEN).sizing
    assert s.micro_batch_per_gpu == 2 and not s.param_offload and not s.optimizer_offload


def test_p100_16gb_is_planned_with_fsdp_offload():
    plan = plan_launch(spec(), [P100], model_config=QWEN)
    s = plan.sizing
    assert s.optimizer_offload and not s.param_offload and s.micro_batch_per_gpu == 2
    assert s.estimate_gib <= 0.93 * 16
    for o in (
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
        "critic.model.fsdp_config.optimizer_offload=True",
    ):
        assert o in plan.overrides


def test_hf_rollout_never_offloads_the_actors_params():
    """verl v0.5.0's HF rollout gathers the actor for generation without loading offloaded
    params back: "Expects tensor to be on the compute device cuda:0, was on cpu"
    (docs/measurements, an H200 run of the earlier P100 plan). Only the critic's go."""
    p100 = plan_launch(spec(), [P100], model_config=QWEN).sizing
    hf = dataclasses.replace(p100, param_offload=True)
    assert "critic.model.fsdp_config.param_offload=True" in hf.overrides()
    assert not any("actor.fsdp_config.param_offload" in o for o in hf.overrides())
    assert "critic param" in hf.describe()
    # and the estimate keeps the actor's weights on the GPU there
    shape = ModelShape.from_config(QWEN)
    work = Workload(world_size=1, sequence=1024, micro=1, log_prob_micro=2, hf_chunk=4)
    on = estimate(shape, dataclasses.replace(work, param_offload=True, optimizer_offload=True))
    vllm = dataclasses.replace(work, hf_chunk=None, param_offload=True, optimizer_offload=True)
    assert dict(on.phases)["critic values"] > dict(estimate(shape, vllm).phases)["critic values"]
    # verl already puts the ref on the CPU (FSDP CPUOffload): its manual offload is not set
    assert not any(
        o.startswith("actor_rollout_ref.ref.fsdp_config.param_offload") for o in hf.overrides()
    )
    # at 96/64 too: the weights, grads and Adam state alone exceed 12 GiB
    assert plan_launch(spec(96, 64), [P100], model_config=QWEN).sizing.optimizer_offload


def test_a_host_where_nothing_fits_is_refused_with_the_numbers():
    with pytest.raises(LaunchError, match=r"needs ~13\.9 GiB per GPU, has 8\.0"):  # README
        plan_launch(spec(), [P4], model_config=QWEN)
    big = {
        **QWEN,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    }  # fmt: skip  (a Qwen2.5-7B shape)
    with pytest.raises(LaunchError, match=r"model of 7616M parameters .* has 24\.0"):
        plan_launch(spec(), [P40] * 4, model_config=big)


def test_model_unknown_is_said_and_sized_by_the_table():
    s = plan_launch(spec(), [P40]).sizing
    assert s.estimate_gib is None and s.micro_batch_per_gpu == 4
    assert "model unknown (config.json not read): memory not estimated" in s.describe()


def test_config_without_the_numbers_is_refused():
    with pytest.raises(ModelShapeError, match="no integer vocab_size"):
        ModelShape.from_config({k: v for k, v in QWEN.items() if k != "vocab_size"})
    with pytest.raises(LaunchError, match="model Qwen2.5-0.5B-Instruct: config.json has no"):
        plan_launch(spec(), [P40], model_config={"hidden_size": 896})
