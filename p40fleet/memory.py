"""Per-GPU memory of one verl v0.5.0 PPO step: the model's shape -> GiB, phase by phase.

Pure arithmetic over a model's ``config.json`` (no torch). ``p40fleet.launch`` uses it to pick
micro-batches and verl's FSDP offload for a host, or to refuse the host with the numbers.

What is counted (bytes per GPU, ``W`` = world size, FSDP shards weights, grads and Adam by W)
---------------------------------------------------------------------------------------------
* Actor and critic: weights 4 B/param (verl keeps the trainable models' master weights in fp32
  on every profile, fsdp_workers.py:246-248 and :1010), gradients 4 B/param while that model
  updates, Adam 8 B/param (exp_avg + exp_avg_sq), and the optimizer step's one param-sized
  temporary (torch's foreach AdamW). The critic is the same body with a 1-output value head
  instead of the LM head.
* Reference policy: weights 4 B/param on the fp32 profiles (the launch plan sets its
  ``model_dtype=fp32``), 2 B/param (bf16) on ampere-plus (verl's default for a non-actor model).
* Logits: a log-prob micro-batch ``micro x sequence x vocab x 4`` bytes (actor's old log-probs
  and the ref's); a training micro-batch's logits plus one checkpointed hidden state per layer
  (verl enables gradient checkpointing by default).
* Rollout: the HF rollout generates a chunk at a time with the whole actor gathered
  (``summon_full_params``; verl also wraps the HF-rollout actor as ONE FSDP unit,
  fsdp_workers.py:355-357, so every actor forward gathers the whole model): KV cache and the
  last-token logits of the chunk. vLLM takes its ``gpu_memory_utilization`` share while awake.
* Offload (verl's ``fsdp_config.param_offload`` / ``optimizer_offload``): an offloaded model's
  weights / Adam state are on the GPU only during that model's own phase.

The peak is the largest phase (generate, actor log-prob, ref log-prob, critic values, critic
update, actor update). Calibration (issue 16, an H200, 1xP40 overrides, Qwen2.5-0.5B shape,
micro 4, log-prob micro 8, train batch 32): measured 16.7 GiB allocated at prompt/response
96/64 and 18.0 GiB at 512/512; this model says 16.6 and 17.5 (``tests/test_memory.py``).
verl wraps the ref with FSDP ``CPUOffload`` (fsdp_workers.py:366-368) and yet the measured
peaks sit ~4 B/param above weights+grads+Adam of actor and critic: counting the ref's weights on
the GPU accounts for that (without them the model is ~12 % low at both lengths).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "FIT_FRACTION",
    "GIB",
    "MemoryEstimate",
    "ModelShape",
    "ModelShapeError",
    "Workload",
    "estimate",
]

GIB = 2**30
#: Share of a GPU's memory the estimate may use. Measured on an H200 with PyTorch's allocator
#: capped (docs/measurements/ppo-*.json, two PPO steps each): the 1xP40 plan, estimated 22.2 GiB,
#: peaked at 20.4 GiB allocated / 24.0 reserved under a 24 GiB cap (0.92 of it estimated); the
#: P100 fallback, estimated 12.9, peaked at 13.0 / 15.9 under 16 GiB (0.81). Both trained. The
#: CUDA context lies outside that cap: a real GPU reports it in nvidia-smi's memory.total.
FIT_FRACTION = 0.93
_CONFIG_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


class ModelShapeError(ValueError):
    """config.json lacks a number the estimate needs."""


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer's config.json that size its memory."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    head_dim: int
    #: q/k/v projections carry a bias (Qwen2 does; Llama's ``attention_bias`` says)
    qkv_bias: bool

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> ModelShape:
        missing = [k for k in _CONFIG_KEYS if not isinstance(config.get(k), int)]
        if missing:
            raise ModelShapeError(
                f"config.json has no integer {', '.join(missing)}: cannot size the model"
            )
        values = {k: int(config[k]) for k in _CONFIG_KEYS}  # type: ignore[call-overload]
        head_dim = config.get("head_dim")
        if not isinstance(head_dim, int):
            head_dim = values["hidden_size"] // values["num_attention_heads"]
        bias = config.get("attention_bias")
        if not isinstance(bias, bool):
            bias = str(config.get("model_type", "")).startswith("qwen2")
        return cls(
            **values,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            head_dim=head_dim,
            qkv_bias=bias,
        )

    def _body(self) -> int:
        """Embedding, decoder layers and the final norm (what actor and critic share)."""
        h, q, kv = self.hidden_size, self.num_attention_heads, self.num_key_value_heads
        q_dim, kv_dim = q * self.head_dim, kv * self.head_dim
        attention = h * q_dim + 2 * h * kv_dim + q_dim * h
        if self.qkv_bias:
            attention += q_dim + 2 * kv_dim
        layer = attention + 3 * h * self.intermediate_size + 2 * h
        return self.vocab_size * h + self.num_hidden_layers * layer + h

    def params(self) -> int:
        """The causal LM (actor, ref): body plus an LM head unless tied to the embedding."""
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self._body() + head

    def critic_params(self) -> int:
        """The critic: the same body and a value head (hidden -> 1, with bias)."""
        return self._body() + self.hidden_size + 1

    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim


@dataclass(frozen=True)
class Workload:
    """What one PPO step asks of each GPU."""

    world_size: int
    sequence: int  # max_prompt_length + max_response_length
    micro: int  # actor/critic ppo_micro_batch_size_per_gpu
    log_prob_micro: int
    hf_chunk: int | None = None  # HF rollout generation chunk (None: vLLM)
    vllm_gib: float = 0.0  # vLLM's share while awake (vLLM profiles)
    ref_bytes: int = 4  # 4 fp32 profiles, 2 ampere-plus
    param_offload: bool = False
    optimizer_offload: bool = False


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU, per phase; ``peak`` is the largest."""

    phases: tuple[tuple[str, int], ...]
    params: int
    critic_params: int

    @property
    def peak(self) -> int:
        return max(b for _, b in self.phases)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: p[1])[0]

    def peak_gib(self) -> float:
        return self.peak / GIB


def estimate(shape: ModelShape, work: Workload) -> MemoryEstimate:
    """Per-phase bytes on one GPU for ``work`` (module docstring: what is counted)."""
    w = work.world_size
    p, pc = shape.params(), shape.critic_params()
    seq, vocab = work.sequence, shape.vocab_size
    act_layers = shape.num_hidden_layers * shape.hidden_size

    actor_w, actor_adam, actor_grad = 4 * p // w, 8 * p // w, 4 * p // w
    critic_w, critic_adam, critic_grad = 4 * pc // w, 8 * pc // w, 4 * pc // w
    ref_w = work.ref_bytes * p // w
    # HF rollout: the actor (and ref) is one FSDP unit, so a forward gathers all of it
    gather = 4 * p - actor_w if work.hf_chunk is not None else 0

    # verl v0.5.0's HF rollout gathers the actor's FSDP params for generation without loading
    # offloaded ones back (hf_rollout.py:109 -> "Expects tensor to be on the compute device",
    # measured on an H200): there, param offload is the critic's only.
    actor_po = work.param_offload and work.hf_chunk is None

    def resident(active: str) -> int:
        """What stays on the GPU while ``active`` runs (offloaded parts excepted)."""
        total = 0
        if active != "actor":
            total += (0 if actor_po else actor_w) + (0 if work.optimizer_offload else actor_adam)
        if active != "critic":
            total += (0 if work.param_offload else critic_w) + (
                0 if work.optimizer_offload else critic_adam
            )
        if active != "ref":
            total += ref_w
        return total

    lp_logits = work.log_prob_micro * seq * vocab * 4
    # The actor's log-prob pass also computes the entropy (verl v0.5.0 compute_log_prob:
    # calculate_entropy=True; torch_functional.entropy_from_logits keeps softmax(logits) beside
    # the logits): a second logits-sized tensor. Without it the estimate was 28 % under the
    # 2xP40 peak measured on an H200 (docs/measurements/ppo-2xP40.json); the ref skips it.
    entropy = lp_logits
    train_act = work.micro * seq * (vocab + act_layers) * 4
    critic_act = work.micro * seq * act_layers * 4
    actor_idle_adam = 0 if work.optimizer_offload else actor_adam
    if work.hf_chunk is not None:
        kv = work.hf_chunk * (seq * shape.num_hidden_layers * 2 * shape.kv_dim() + vocab) * 4
        generate = resident("actor") + actor_idle_adam + 4 * p + kv
    else:
        # verl's vLLM sharding manager puts an offloaded actor back on the CPU once vLLM has
        # its weights; vLLM's own share covers its weights and KV cache
        on_gpu = 0 if actor_po else actor_w
        generate = resident("actor") + actor_idle_adam + on_gpu + int(work.vllm_gib * GIB)
    phases = (
        ("generate", generate),
        (
            "actor log-prob",
            resident("actor") + actor_idle_adam + actor_w + gather + lp_logits + entropy,
        ),
        ("ref log-prob", resident("ref") + ref_w + gather + lp_logits),
        ("critic values", resident("critic") + critic_w + critic_act),
        (
            "critic update",
            resident("critic") + critic_w + critic_adam + critic_grad + max(critic_w, critic_act),
        ),  # fmt: skip
        (
            "actor update",
            resident("actor")
            + actor_w
            + actor_adam
            + actor_grad
            + max(actor_w, train_act + gather),
        ),  # fmt: skip
    )
    return MemoryEstimate(phases=phases, params=p, critic_params=pc)
