"""verl v0.5.0's own batch-size assertions, ported to run over a composed Hydra config.

Each check cites where verl asserts it (file:line in the verl 0.5.0 sdist from PyPI,
``tests/verl_sdist.py``). :func:`verl_failures` returns verl's complaints (empty: verl starts
and validates). Only what verl checks before or during a PPO step is here; the values that
reach the workers are the composed ones (Hydra overrides applied, interpolations resolved).
"""

from __future__ import annotations

import math

#: The GSM8K test split that verl's examples/data_preprocess/gsm8k.py writes.
GSM8K_TEST_ROWS = 1319


def hf_chunk_failure(what: str, rows: int, chunk: int | None) -> str | None:
    """hf_rollout.py:47-49 splits a rank's batch into ``max(rows // micro_batch_size, 1)``
    chunks (``config.get("micro_batch_size", batch_size)``) and protocol.py:698-701 asserts
    the split is equal (auto padding is off by default, protocol.py:671-672)."""
    chunks = max(rows // (chunk or rows), 1)
    if rows % chunks:
        return f"{what}: only support equal chunk. Got size of DataProto {rows} and chunk {chunks}"
    return None


def validation_batches(rows: int, val_batch_size: int | None) -> list[int]:
    """ray_trainer.py:593-603: batch ``data.val_batch_size`` (None: the whole set),
    ``drop_last=False`` (a short last batch)."""
    size = val_batch_size or rows
    full, rest = divmod(rows, size)
    return [size] * min(full, 1) + ([rest] if rest else [])


def verl_failures(cfg, val_rows: int = GSM8K_TEST_ROWS) -> list[str]:
    """What verl 0.5.0 would assert about ``cfg`` (composed ppo_trainer config)."""
    out: list[str] = []
    arr, critic, data = cfg.actor_rollout_ref, cfg.critic, cfg.data
    actor, ref, rollout = arr.actor, arr.ref, arr.rollout
    world = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    n = rollout.n
    train = data.train_batch_size

    # ray_trainer.py:394 n_gpus; :411 minimal_bsz = n_gpus (FSDP); :414-418
    if train * n % world:
        out.append(
            f"ray_trainer.py:415 real_train_batch_size ({train * n}) must be divisible by "
            f"minimal possible batch size ({world})"
        )
    # ray_trainer.py:448-456 check_mutually_exclusive (actor, ref, rollout, critic)
    for name, mbs, per_gpu in (
        ("actor_rollout_ref.actor", actor.ppo_micro_batch_size,
         actor.ppo_micro_batch_size_per_gpu),
        ("actor_rollout_ref.ref", ref.log_prob_micro_batch_size,
         ref.log_prob_micro_batch_size_per_gpu),
        ("actor_rollout_ref.rollout", rollout.log_prob_micro_batch_size,
         rollout.log_prob_micro_batch_size_per_gpu),
        ("critic", critic.ppo_micro_batch_size, critic.ppo_micro_batch_size_per_gpu),
    ):  # fmt: skip
        if (mbs is None) == (per_gpu is None):
            out.append(f"ray_trainer.py:448-456 [{name}] set exactly one micro-batch size")
    # ray_trainer.py:500 and :522
    for name, section in (("actor", actor), ("critic", critic)):
        if train < section.ppo_mini_batch_size:
            out.append(f"ray_trainer.py:500/522 train_batch_size < {name}.ppo_mini_batch_size")
    # fsdp_workers.py:175-195 (actor) and :954-973 (critic): the per-GPU mini-batch
    for name, section, rollout_n in (("actor", actor, n), ("critic", critic, critic.rollout_n)):
        sp = section.ulysses_sequence_parallel_size
        mini = section.ppo_mini_batch_size * rollout_n // (world // sp)
        micro = section.ppo_micro_batch_size_per_gpu
        if mini <= 0:
            out.append(f"fsdp_workers.py:177 {name} ppo_mini_batch_size {mini} after normalization")
        elif micro is not None and (mini % micro or mini // micro <= 0):
            out.append(
                f"fsdp_workers.py:189/967 {name}: normalized ppo_mini_batch_size {mini} should "
                f"be divisible by ppo_micro_batch_size_per_gpu {micro}"
            )
    # log-prob micro-batches (fsdp_workers.py:774 and :818 -> dp_actor.py:325 split)
    for name, micro in (
        ("rollout", rollout.log_prob_micro_batch_size_per_gpu),
        ("ref", ref.log_prob_micro_batch_size_per_gpu),
        ("critic forward", critic.forward_micro_batch_size_per_gpu),
    ):
        if micro is not None and micro <= 0:
            out.append(f"dp_actor.py:325 {name} log-prob micro-batch {micro}")
    # fsdp_workers.py:463-467 rollout world size divisible by infer_tp
    if world % rollout.tensor_model_parallel_size:
        out.append(
            f"fsdp_workers.py:465 rollout world_size: {world} is not divisible by infer_tp: "
            f"{rollout.tensor_model_parallel_size}"
        )
    # DP_COMPUTE_PROTO (decorator.py:341-351 -> :111 chunk; protocol.py:698-701): the step's
    # batch (train x n, ray_trainer.py:1163) goes to the W ranks in equal parts
    if train * n % world:
        out.append(f"protocol.py:699 dispatch: {train * n} rows do not split over {world} ranks")
    if rollout.name == "hf":
        chunk = rollout.get("micro_batch_size")
        if not train * n % world and (f := hf_chunk_failure("train", train * n // world, chunk)):
            out.append("hf_rollout.py:47-49 " + f)
        # validation: ray_trainer.py:697 repeat val_kwargs.n, :739-744 pad to W, then chunk
        for rows in validation_batches(val_rows, data.get("val_batch_size")):
            rows *= rollout.val_kwargs.n
            per_rank = math.ceil(rows / world)
            if f := hf_chunk_failure(f"validation ({rows} rows)", per_rank, chunk):
                out.append("hf_rollout.py:47-49 " + f)
    return out
