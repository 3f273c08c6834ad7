"""Every plan the launch code can emit passes verl v0.5.0's own batch checks.

The overrides are composed with verl 0.5.0's Hydra config (PyPI sdist) and run through
``tests/verl_checks.py`` (verl's assertions, each with its file:line). Grid: 1/2/4/8 x P40,
1 x P100 (pascal), 1/4 x V100 16GB (volta-turing), 1/8 x A100 80GB (ampere-plus), each on
1-4 nodes, with the model unknown and with Qwen2.5-0.5B's config.json (which turns on micro
lowering and offload where memory is short), at verl's 512/512 and the measured 96/64.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from p40fleet.launch import plan_launch
from p40fleet.spec import load_spec
from tests.verl_checks import GSM8K_TEST_ROWS, verl_failures
from tests.verl_sdist import extract_verl

P40, P100, V100, A100 = 0x1B38, 0x15F8, 0x1DB4, 0x20B2
QWEN = json.loads(
    (
        Path(__file__).parent / "fixtures" / "models" / "Qwen2.5-0.5B-Instruct.config.json"
    ).read_text()
)
SHAPES = [(P40, 1), (P40, 2), (P40, 4), (P40, 8), (P100, 1), (V100, 1), (V100, 4), (A100, 1),
          (A100, 8)]  # fmt: skip
LENGTHS = [(512, 512), (96, 64)]


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory) -> str:
    tree = extract_verl(tmp_path_factory.mktemp("verl") / "verl-0.5.0")
    return str(tree / "verl" / "trainer" / "config")


@pytest.fixture(scope="module")
def compose_overrides(config_dir):
    """Hydra's compose of ``overrides`` on verl's config, resolved.

    Hydra composes each distinct set of override KEYS once (that is where it refuses a wrong
    key or '+'); the values of a plan with the same keys are then set with Hydra's own
    override parser on a copy of that composition (compose takes ~0.5 s, the grid is large).
    """
    composed: dict[tuple[str, ...], object] = {}
    parser = OverridesParser.create()

    def run(overrides) -> object:
        parsed = parser.parse_overrides(list(overrides))
        keys = tuple(o.input_line.split("=", 1)[0] for o in parsed)
        if keys not in composed:
            with initialize_config_dir(config_dir=config_dir, version_base=None):
                composed[keys] = compose(config_name="ppo_trainer", overrides=list(overrides))
        cfg = copy.deepcopy(composed[keys])
        for override in parsed:
            OmegaConf.update(cfg, override.key_or_group, override.value(), force_add=True)
        OmegaConf.resolve(cfg)
        return cfg

    return run


def plan_for(gpu: int, count: int, nnodes: int, model, lengths=(512, 512)):
    spec = load_spec(
        "lab1",
        {"training": {"max_prompt_length": lengths[0], "max_response_length": lengths[1]}},
    )
    # keyword arguments only where needed: the one-node, model-unknown cases then run
    # unchanged against the launch code before the cluster shape and memory existed (and fail
    # there: the validation batch)
    kwargs: dict[str, object] = {}
    if nnodes > 1:
        from p40fleet.launch import cluster_shape

        kwargs["cluster"] = cluster_shape({f"node{i}": [gpu] * count for i in range(nnodes)})
    if model is not None:
        kwargs["model_config"] = model
    return plan_launch(spec, [gpu] * count, **kwargs)


@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda x: f"{x[0]}+{x[1]}")
@pytest.mark.parametrize("model", [None, QWEN], ids=["model-unknown", "qwen2.5-0.5b"])
@pytest.mark.parametrize("nnodes", [1, 2, 3, 4])
@pytest.mark.parametrize(("gpu", "count"), SHAPES, ids=lambda x: f"{x:#x}" if x > 8 else str(x))
def test_every_plan_passes_verls_checks(gpu, count, nnodes, model, lengths, compose_overrides):
    plan = plan_for(gpu, count, nnodes, model, lengths)
    cfg = compose_overrides(plan.overrides)
    assert cfg.trainer.nnodes == nnodes and cfg.trainer.n_gpus_per_node == count
    assert verl_failures(cfg) == [], plan.sizing.describe()  # GSM8K's 1,319-row test split
    for rows in (GSM8K_TEST_ROWS, 1, 7, 100, 1000, 4096):
        assert verl_failures(cfg, val_rows=rows) == [], (plan.sizing.describe(), rows)
    assert cfg.data.max_prompt_length == lengths[0]
    assert cfg.data.max_response_length == lengths[1]


def test_unequal_nodes_train_on_the_most_gpus(compose_overrides):
    """8+8+4+2 P40s: 2 nodes x 8 (16 GPUs), not 4 nodes x 2 (8); 10+8: 2 x 8, 2 idle."""
    from p40fleet.launch import cluster_shape

    shape = cluster_shape({"a": [P40] * 8, "b": [P40] * 8, "c": [P40] * 4, "d": [P40] * 2})
    plan = plan_launch(load_spec("lab1", {}), [P40] * 8, cluster=shape, model_config=QWEN)
    cfg = compose_overrides(plan.overrides)
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (2, 8)
    assert verl_failures(cfg) == []
    bigger = cluster_shape({"a": [P40] * 10, "b": [P40] * 8, "c": [P40] * 4})
    plan = plan_launch(load_spec("lab1", {}), [P40] * 10, cluster=bigger, model_config=QWEN)
    assert (plan.sizing.nnodes, plan.sizing.gpus_per_node) == (2, 8)
    assert verl_failures(compose_overrides(plan.overrides)) == []
    assert "2 GPU(s) idle on bigger nodes" in plan.sizing.describe()


# ---------------------------------------------------------------- the checks can fail


def test_checks_catch_the_unset_validation_batch(compose_overrides):
    """Issue 16 item 2: the whole 1,319-row split as one batch (verl's default)."""
    plan = plan_for(P40, 4, 1, None)
    cfg = compose_overrides([*plan.overrides, "data.val_batch_size=null"])
    assert verl_failures(cfg) == [
        "hf_rollout.py:47-49 validation (1319 rows): only support equal chunk. "
        "Got size of DataProto 330 and chunk 20"
    ]
    p100 = compose_overrides([*plan_for(P100, 1, 1, None).overrides, "data.val_batch_size=null"])
    assert "DataProto 1319 and chunk 164" in verl_failures(p100)[0]


def test_checks_catch_one_hosts_sizes_on_three_nodes(compose_overrides):
    """Issue 16 item 3: README's old command, a 4x P40 host's sizes with trainer.nnodes=3."""
    plan = plan_for(P40, 4, 1, None)
    cfg = compose_overrides([*plan.overrides, "trainer.nnodes=3"])
    failures = verl_failures(cfg)
    assert failures[0] == (
        "ray_trainer.py:415 real_train_batch_size (128) must be divisible by minimal possible "
        "batch size (12)"
    )
    assert any("normalized ppo_mini_batch_size 2 should be divisible by" in f for f in failures)


def test_readme_multi_node_command_is_what_runs(compose_overrides):
    """docs/training.md's N-box command, word for word: the script's overrides, then its
    arguments (README links it)."""
    from p40fleet.launch import cluster_shape

    doc = (Path(__file__).resolve().parent.parent / "docs" / "training.md").read_text()
    section = doc[doc.index("# Training on the fleet") :]
    # one command block: root hands the cluster's token and RAY_ADDRESS to the training user's
    # ~/launch-ppo.sh (the cluster refuses a driver without the token)
    start = section.index("# as root on the head: the training user's driver gets the cluster")
    block = section[start : section.index("```", start)].replace("\\\n", " ")
    words = block.split()
    assert "RAY_ADDRESS=gpu1:6379;" in words and ". /etc/p40fleet/ray-auth.env;" in block
    assert words[words.index("runuser") : words.index("runuser") + 3] == ["runuser", "-l", "verl"]
    assert "RAY_AUTH_MODE,RAY_AUTH_TOKEN,RAY_ADDRESS" in words
    args = words[words.index("./launch-ppo.sh'") + 1 :]
    shape = cluster_shape({"gpu1": [P40] * 4, "gpu2": [P40] * 4, "gpu3": [P40] * 4})
    plan = plan_launch(load_spec("lab1", {}), [P40] * 4, cluster=shape)
    cfg = compose_overrides([*plan.overrides, *args])
    assert verl_failures(cfg) == []
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (3, 4)
    assert "train batch 384, mini-batch 96, validation batch 192" in " ".join(section.split())
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.actor.ppo_mini_batch_size) == (384, 96)
    assert cfg.data.val_batch_size == 192
