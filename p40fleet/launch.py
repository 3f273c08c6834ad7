"""The PPO launch for one host: GPU facts + stack spec -> Hydra overrides and environment.

Pure: no pyinfra, no I/O. ``operations/training.py`` renders the result into
``files/launch-ppo.sh.j2``; ``deploy/training.py`` feeds it the host's facts.

What the script runs
--------------------
``<conda_prefix>/envs/<name>/bin/python -m verl.trainer.main_ppo <overrides> "$@"`` (verl's PPO
entry point; Hydra CLI overrides win over verl's YAML, and a later override wins over an earlier
one, so arguments given to the script replace the ones below — use the plain ``key=value`` form
to replace a ``+key`` one, a second ``+`` on the same key is refused by Hydra).

Overrides per profile (``p40fleet.profile``: lowest compute capability of the host)
-----------------------------------------------------------------------------------
All profiles: data files, model path (actor and critic), batch sizes (rule below),
``actor_rollout_ref.rollout.tensor_model_parallel_size=1`` (verl's YAML says 2; the HF rollout
needs it to divide the GPU count, which 2 does not on a 1-GPU host, and a model that fits one GPU
needs no tensor parallelism in vLLM either), ``trainer.nnodes`` / ``trainer.n_gpus_per_node``
from the cluster shape, ``trainer.logger=[console]`` (verl's default adds wandb, which needs an
account and network access).

``pascal`` (cc 6.x; also Maxwell when ``policy.allow_maxwell``):
  ``rollout.name=hf`` (vLLM ships no sm_6x code; the HF rollout exists at verl v0.5.0),
  ``rollout.dtype=float32``, fp32 FSDP ``param_dtype`` for actor, ref and critic
  (``+...fsdp_config.mixed_precision.param_dtype=fp32``), ``+...ref.fsdp_config.model_dtype=fp32``
  (verl loads the reference model in bf16 unless told), attention ``sdpa`` through
  ``+actor_rollout_ref.model.override_config._attn_implementation=sdpa``,
  ``model.use_remove_padding=False`` (the unpadded path is flash-attn's), ``actor.use_torch_compile
  =False`` (Inductor refuses cc < 7.0; the ref follows the actor's value),
  ``+actor_rollout_ref.rollout.micro_batch_size`` (the HF rollout's generation chunk).
  The bf16 ``autocast`` sites no config reaches are the verl patch rules' job
  (``p40fleet.verl_patches``), not this module's.
``volta-turing`` (cc 7.x): the same fp32 + sdpa overrides, but ``rollout.name=vllm`` with
  ``rollout.dtype=float32``: vLLM runs on cc >= 7.0 and refuses bfloat16 below cc 8.0; of the two
  dtypes it accepts there (float16, float32) float32 is chosen because it is the precision the
  actor computes in here (the rollout's log-probs and the weights synced into vLLM stay fp32).
  float16 is faster on V100/T4 tensor cores: pass ``actor_rollout_ref.rollout.dtype=float16`` to
  the script to take it. ``use_torch_compile`` stays verl's default (True).
  Not reached by any override (verl v0.5.0 source): the critic builds its ``override_config``
  but never applies it, and loads with ``attn_implementation="flash_attention_2"``; the actor's
  and critic's forward passes run under a hard-coded bf16 ``autocast``. The verl patch rules
  change those sites for ``pascal`` only (``p40fleet.verl_patches.PATCHED_PROFILES``).
``ampere-plus`` (cc >= 8.0): verl's defaults already are vLLM, bf16 and flash_attention_2; only
  ``rollout.gpu_memory_utilization`` is added.

Per verl ref (``VERL_REFS``)
----------------------------
``v0.5.0`` (8fdc4d3f..., and the lab's alias ``v0.5.0-lab1``): every override above, composed
with that release's own Hydra config in ``tests/test_launch_hydra.py``. ``62549582...`` (the
blog's pin): no HF rollout there (removed 2025-08-18), so ``pascal`` is refused for it
(``verl_patches``: vLLM needs cc >= 7.0; a preflight refusal, ``p40fleet.preflight``), and the
ref's ``model_dtype`` override is not emitted. Any other ref is refused: its keys are unknown.

Sizing rule
-----------
``memory`` = the smallest per-GPU memory (GiB) of the host (nvidia-smi's ``memory.total`` when
given, else the catalog's nominal ``memory_gib``) and of the cluster's nodes (catalog);
``effective = memory`` for the fp32 profiles (pascal, volta-turing) and ``2 x memory`` for
ampere-plus (bf16 halves the bytes per value). ``W`` = world size = ``trainer.nnodes x
trainer.n_gpus_per_node`` (:class:`ClusterShape`; one host: 1 x its GPU count).

================  ======  =======  =======  =======  =====
effective GiB     < 10    10-18    18-36    36-72    >= 72
micro (per GPU)   1       2        4        8        16
================  ======  =======  =======  =======  =====

* ``actor.ppo_micro_batch_size_per_gpu`` = ``critic.ppo_micro_batch_size_per_gpu`` = micro
* ``rollout.log_prob_micro_batch_size_per_gpu`` = ``ref.log_prob_micro_batch_size_per_gpu``
  = 2 x micro (forward only: no gradients, no optimizer state)
* ``actor.ppo_mini_batch_size`` = 2 x micro x W (two micro-batches per GPU per update; the
  critic follows the actor's value); ``data.train_batch_size`` = 4 x mini = 8 x micro x W
* HF rollout (pascal): ``+rollout.micro_batch_size`` = 4 x micro (the generation chunk) and
  ``data.val_batch_size`` = W x chunk: each GPU generates every validation batch in ONE chunk,
  the short last one too (it is padded to W and is at most one chunk per GPU), so the HF
  rollout's equal-chunk assertion holds for any validation set size. vLLM profiles leave it
  unset (verl sends the whole set, which vLLM schedules itself).
* vLLM: ``rollout.gpu_memory_utilization`` = 12 GiB / memory, clamped to [0.30, 0.60], down to
  0.05. ``data.max_prompt_length`` / ``max_response_length`` from ``stack.training``.

This passes verl's checks for any W (``tests/test_launch_grid.py`` ports them): train batch
divisible by W, per-GPU mini-batch 2 x micro a multiple of micro, per-GPU train share 8 x micro
= 2 generation chunks.

Memory (when the model's config.json is known, ``p40fleet.memory``): the estimated peak per GPU
must stay within ``FIT_FRACTION`` (0.75) of the GPU memory. If the table's micro does not fit,
micro is halved down to 1 first (nothing moves to the CPU, no extra host RAM or PCIe traffic;
the batches shrink with it), then verl's FSDP ``optimizer_offload`` is added for actor and
critic, then ``param_offload`` too (each again from the table's micro down; on the HF rollout
the critic's only: verl v0.5.0's ``hf_rollout.py:109`` gathers the actor's params for generation
without loading offloaded ones back, which fails on a GPU, measured on an H200). The ref's
``param_offload`` is never set: verl already wraps the ref in FSDP ``CPUOffload``
(fsdp_workers.py:366-368) and its manual offload would copy it to the GPU and back. Nothing
fits: :class:`LaunchError` "needs ~X GiB per GPU, has Y". Model unknown (``model_config`` None,
not staged yet): the table alone, and the sizing says "model unknown".

Multi-node (:func:`cluster_shape`): verl gives every node the same GPU count ``k``, so the plan
takes the ``k`` and the nodes (every node with >= ``k`` GPUs) that train on the most GPUs,
``max over k of k x #{nodes with >= k GPUs}``; ties go to fewer nodes, then to more memory per
GPU. 4+8+1 GPUs: 1 node x 8; 8+8+4+2: 2 nodes x 8. GPUs above ``k`` on a training node stay
idle (the sizing says how many). A member without a GPU (a CPU-only head) is not a training
node: Ray places no worker there. A host left out of the cluster gets a plan for its own GPUs
alone, with ``RAY_ADDRESS=local`` (a private Ray: it never joins the cluster's), and every
script's header names the cluster, who is in it, and who is not and why.
"""

from __future__ import annotations

import math
import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from p40fleet import memory, verl_patches
from p40fleet.gpu_catalog import lookup
from p40fleet.memory import FIT_FRACTION, GIB, ModelShape, ModelShapeError, Workload
from p40fleet.profile import (
    AMPERE_PLUS_PROFILE,
    PASCAL_PROFILE,
    PROFILES,
    VOLTA_TURING_PROFILE,
)
from p40fleet.spec import StackSpec

__all__ = [
    "ENTRY_POINT",
    "VERL_REFS",
    "ClusterShape",
    "LaunchError",
    "LaunchPlan",
    "Sizing",
    "VerlRefOverrides",
    "cluster_shape",
    "effective_memory_gib",
    "gpu_memory_gib",
    "micro_batch_per_gpu",
    "plan_launch",
    "profile_overrides",
    "ref_overrides",
    "size_for",
    "vllm_memory_utilization",
]

ENTRY_POINT = "verl.trainer.main_ppo"

#: Real variables only: Python's unbuffered output (logs appear as they happen under Ray) and
#: Hydra's full traceback on a configuration error.
ENV: tuple[tuple[str, str], ...] = (("PYTHONUNBUFFERED", "1"), ("HYDRA_FULL_ERROR", "1"))

# (upper bound of effective GiB, micro-batch per GPU); the last bucket is open.
_MICRO_BUCKETS: tuple[tuple[float, int], ...] = ((10, 1), (18, 2), (36, 4), (72, 8))
_MICRO_MAX = 16
_VLLM_GIB = 12.0
_VLLM_MIN, _VLLM_MAX = 0.30, 0.60

_FP32_PROFILES = (PASCAL_PROFILE, VOLTA_TURING_PROFILE)
_VLLM_PROFILES = (VOLTA_TURING_PROFILE, AMPERE_PLUS_PROFILE)

# Hydra parses these characters in an unquoted value as plain text; anything else is refused
# rather than quoted (a path that needs quoting is a path to rename).
_SAFE_PATH = re.compile(r"[A-Za-z0-9._/+-]+")

# fp32 everywhere + sdpa: what config reaches on GPUs without bf16 (stack facts §5).
_FP32_SDPA: tuple[str, ...] = (
    "actor_rollout_ref.rollout.dtype=float32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    "+actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32",
    "+actor_rollout_ref.ref.fsdp_config.model_dtype=fp32",
    "+critic.model.fsdp_config.mixed_precision.param_dtype=fp32",
    # leading underscore: the plain attn_implementation key is ignored by verl v0.5.0
    "+actor_rollout_ref.model.override_config._attn_implementation=sdpa",
    "actor_rollout_ref.model.use_remove_padding=False",
)

_PROFILE_OVERRIDES: dict[str, tuple[str, ...]] = {
    PASCAL_PROFILE: (
        "actor_rollout_ref.rollout.name=hf",
        *_FP32_SDPA,
        "actor_rollout_ref.actor.use_torch_compile=False",
    ),
    VOLTA_TURING_PROFILE: ("actor_rollout_ref.rollout.name=vllm", *_FP32_SDPA),
    AMPERE_PLUS_PROFILE: (),
}

_OFFLOAD_PARAM = (
    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "critic.model.fsdp_config.param_offload=True",
)
_OFFLOAD_OPTIMIZER = (
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
    "critic.model.fsdp_config.optimizer_offload=True",
)


class LaunchError(ValueError):
    """No launch script for this host: the message says why and what to change."""


# ------------------------------------------------------------------------------ verl refs


@dataclass(frozen=True)
class VerlRefOverrides:
    """Which of this module's overrides a verl ref has; ``absent`` keys are never emitted."""

    ref: str
    commit: str
    absent: tuple[str, ...]
    source: str


#: The verl refs the project accepts (aliases: ``verl_patches.REF_ALIASES``). A profile the
#: ref cannot serve is refused by ``verl_patches.rule_set`` (preflight: ``verl_refusal``).
VERL_REFS: dict[str, VerlRefOverrides] = {
    "v0.5.0": VerlRefOverrides(
        "v0.5.0",
        verl_patches.V050_COMMIT,
        absent=(),
        source="every override composed with the PyPI sdist's Hydra config "
        "(tests/test_launch_hydra.py)",
    ),
    verl_patches.SEED_COMMIT: VerlRefOverrides(
        verl_patches.SEED_COMMIT,
        verl_patches.SEED_COMMIT,
        # The HF rollout was removed on 2025-08-18 (its generation chunk goes with it); the
        # ref's model_dtype override does not compose there (issue 16). No copy of that tree
        # is reachable here (PyPI and the lab carry v0.5.0 only), so this row is not composed.
        absent=(
            "actor_rollout_ref.rollout.micro_batch_size",
            "actor_rollout_ref.ref.fsdp_config.model_dtype",
        ),
        source="issue 16 and stack facts §2 (not composed: no copy of the tree)",
    ),
}


def ref_overrides(ref: str, profile: str) -> VerlRefOverrides:
    """The table row of ``ref`` (tag, commit or alias); refuses an unknown ref or a profile
    the ref cannot serve (the reason from ``verl_patches``)."""
    try:
        verl_patches.rule_set(ref, profile)
    except verl_patches.VerlPatchError as exc:
        raise LaunchError(str(exc)) from None
    base = verl_patches.REF_ALIASES.get(ref, ref)
    if base not in VERL_REFS:
        raise LaunchError(
            f"verl ref {ref!r}: no launch overrides known for it (accepted: "
            f"{', '.join(sorted(VERL_REFS))} and aliases {', '.join(verl_patches.REF_ALIASES)})"
        )
    return VERL_REFS[base]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+")


# ------------------------------------------------------------------------------ sizing


def profile_overrides(profile: str) -> list[str]:
    """The precision / attention / rollout overrides of ``profile`` (no sizing, no paths)."""
    try:
        return list(_PROFILE_OVERRIDES[profile])
    except KeyError:
        raise LaunchError(
            f"unknown GPU profile {profile!r}: expected one of {', '.join(PROFILES)}"
        ) from None


def effective_memory_gib(profile: str, memory_gib: float) -> float:
    """Memory in fp32 terms: the GiB for fp32 profiles, twice that for bf16 (ampere-plus)."""
    profile_overrides(profile)  # refuses an unknown profile
    return memory_gib if profile in _FP32_PROFILES else 2 * memory_gib


def micro_batch_per_gpu(profile: str, memory_gib: float) -> int:
    """Training micro-batch per GPU from the bucket table (module docstring)."""
    effective = effective_memory_gib(profile, memory_gib)
    for bound, micro in _MICRO_BUCKETS:
        if effective < bound:
            return micro
    return _MICRO_MAX


def vllm_memory_utilization(memory_gib: float) -> float:
    """vLLM's share of one GPU: 12 GiB / memory, clamped to [0.30, 0.60], down to 0.05."""
    fraction = min(_VLLM_MAX, max(_VLLM_MIN, _VLLM_GIB / memory_gib))
    return math.floor(fraction * 20 + 1e-9) / 20


@dataclass(frozen=True)
class Sizing:
    """Batch sizes, lengths and offload for one launch (rule in the module docstring)."""

    profile: str
    nnodes: int
    gpus_per_node: int
    memory_gib: float
    micro_batch_per_gpu: int
    log_prob_micro_batch_per_gpu: int
    ppo_mini_batch_size: int
    train_batch_size: int
    max_prompt_length: int
    max_response_length: int
    #: HF rollout generation chunk and validation batch (pascal only)
    hf_generate_micro_batch: int | None
    val_batch_size: int | None
    #: vLLM's fraction of GPU memory (vLLM profiles only)
    gpu_memory_utilization: float | None
    param_offload: bool = False
    optimizer_offload: bool = False
    #: estimated peak GiB per GPU and its phase; None: model unknown
    estimate_gib: float | None = None
    estimate_phase: str = ""
    idle_gpus: int = 0

    @property
    def world_size(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def gpu_count(self) -> int:  # the GPUs this launch uses (all nodes)
        return self.world_size

    def overrides(self) -> list[str]:
        out = [
            f"data.max_prompt_length={self.max_prompt_length}",
            f"data.max_response_length={self.max_response_length}",
            f"data.train_batch_size={self.train_batch_size}",
        ]
        if self.val_batch_size is not None:
            out.append(f"data.val_batch_size={self.val_batch_size}")
        out += [
            f"actor_rollout_ref.actor.ppo_mini_batch_size={self.ppo_mini_batch_size}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={self.micro_batch_per_gpu}",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="
            f"{self.log_prob_micro_batch_per_gpu}",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="
            f"{self.log_prob_micro_batch_per_gpu}",
            f"critic.ppo_micro_batch_size_per_gpu={self.micro_batch_per_gpu}",
        ]
        if self.hf_generate_micro_batch is not None:
            out.append(
                f"+actor_rollout_ref.rollout.micro_batch_size={self.hf_generate_micro_batch}"
            )
        if self.gpu_memory_utilization is not None:
            out.append(
                "actor_rollout_ref.rollout.gpu_memory_utilization="
                f"{self.gpu_memory_utilization:.2f}"
            )
        if self.optimizer_offload:
            out += _OFFLOAD_OPTIMIZER
        if self.param_offload:
            # HF rollout: the actor's params stay on the GPU (p40fleet.memory: actor_po)
            out += (
                _OFFLOAD_PARAM[1:] if self.hf_generate_micro_batch is not None else _OFFLOAD_PARAM
            )
        out += [
            f"trainer.nnodes={self.nnodes}",
            f"trainer.n_gpus_per_node={self.gpus_per_node}",
        ]
        return out

    def describe(self) -> str:
        """One line for the script's header and deploy logs."""
        text = (
            f"{self.nnodes} node(s) x {self.gpus_per_node} GPU(s) x {self.memory_gib:g} GiB "
            f"({self.profile}): micro {self.micro_batch_per_gpu}/GPU, log-prob micro "
            f"{self.log_prob_micro_batch_per_gpu}/GPU, mini-batch {self.ppo_mini_batch_size}, "
            f"train batch {self.train_batch_size}, lengths {self.max_prompt_length}"
            f"+{self.max_response_length}"
        )
        if self.hf_generate_micro_batch is not None:
            text += f", HF generate chunk {self.hf_generate_micro_batch}"
        if self.val_batch_size is not None:
            text += f", val batch {self.val_batch_size}"
        if self.gpu_memory_utilization is not None:
            text += f", vLLM memory {self.gpu_memory_utilization:.2f}"
        param = "critic param" if self.hf_generate_micro_batch is not None else "param"
        offload = [n for n, on in ((param, self.param_offload),
                                   ("optimizer", self.optimizer_offload)) if on]  # fmt: skip
        if offload:
            text += f", FSDP {'+'.join(offload)} offload"
        if self.estimate_gib is None:
            text += "; model unknown (config.json not read): memory not estimated"
        else:
            text += (
                f"; estimated peak {self.estimate_gib:.1f} GiB/GPU ({self.estimate_phase}), "
                f"limit {FIT_FRACTION * self.memory_gib:.1f}"
            )
        if self.idle_gpus:
            text += f"; {self.idle_gpus} GPU(s) idle on bigger nodes"
        return text


def size_for(
    profile: str,
    gpus_per_node: int,
    memory_gib: float,
    *,
    nnodes: int = 1,
    shape: ModelShape | None = None,
    max_prompt_length: int = 512,
    max_response_length: int = 512,
    idle_gpus: int = 0,
) -> Sizing:
    """Apply the sizing rule (and the memory fit when ``shape`` is known).

    Raises :class:`LaunchError` for an unknown profile, no GPUs or memory, or a model that
    does not fit even with micro 1 and full offload ("needs ~X GiB per GPU, has Y").
    """
    if gpus_per_node < 1 or nnodes < 1:
        raise LaunchError(f"no GPU to train on ({nnodes} node(s) x {gpus_per_node} GPU(s))")
    if not memory_gib or memory_gib <= 0:
        raise LaunchError(f"GPU memory {memory_gib!r} GiB: expected a positive size")
    bucket = micro_batch_per_gpu(profile, memory_gib)
    world = nnodes * gpus_per_node
    hf = profile == PASCAL_PROFILE
    vllm = vllm_memory_utilization(memory_gib) if profile in _VLLM_PROFILES else None

    def sizing(micro: int, po: bool, oo: bool, est: memory.MemoryEstimate | None) -> Sizing:
        chunk = 4 * micro if hf else None
        return Sizing(
            profile=profile,
            nnodes=nnodes,
            gpus_per_node=gpus_per_node,
            memory_gib=memory_gib,
            micro_batch_per_gpu=micro,
            log_prob_micro_batch_per_gpu=2 * micro,
            ppo_mini_batch_size=2 * micro * world,
            train_batch_size=8 * micro * world,
            max_prompt_length=max_prompt_length,
            max_response_length=max_response_length,
            hf_generate_micro_batch=chunk,
            val_batch_size=world * chunk if chunk is not None else None,
            gpu_memory_utilization=vllm,
            param_offload=po,
            optimizer_offload=oo,
            estimate_gib=est.peak_gib() if est is not None else None,
            estimate_phase=est.peak_phase if est is not None else "",
            idle_gpus=idle_gpus,
        )

    if shape is None:
        return sizing(bucket, False, False, None)

    def work(micro: int, po: bool, oo: bool) -> Workload:
        return Workload(
            world_size=world,
            sequence=max_prompt_length + max_response_length,
            micro=micro,
            log_prob_micro=2 * micro,
            hf_chunk=4 * micro if hf else None,
            vllm_gib=(vllm or 0.0) * memory_gib,
            ref_bytes=4 if profile in _FP32_PROFILES else 2,
            param_offload=po,
            optimizer_offload=oo,
        )

    limit = FIT_FRACTION * memory_gib * GIB
    micros = [bucket >> i for i in range(bucket.bit_length())]  # bucket, bucket/2, ..., 1
    # Smaller micro-batches first (nothing moves to the CPU), then verl's offload.
    for po, oo in ((False, False), (False, True), (True, True)):
        for micro in micros:
            est = memory.estimate(shape, work(micro, po, oo))
            if est.peak <= limit:
                return sizing(micro, po, oo, est)
    least = memory.estimate(shape, work(1, True, True))
    raise LaunchError(
        f"model of {least.params / 1e6:.0f}M parameters at {max_prompt_length}+"
        f"{max_response_length} tokens needs ~{least.peak_gib() / FIT_FRACTION:.1f} GiB per "
        f"GPU, has {memory_gib:.1f} (estimated peak {least.peak_gib():.1f} GiB in "
        f"{least.peak_phase} with micro-batch 1 and FSDP param+optimizer offload, "
        f"limit {FIT_FRACTION:.0%} of the GPU): train a smaller model, shorten "
        "stack.training.max_prompt_length/max_response_length, or use more GPUs per node"
    )


def gpu_memory_gib(
    gpus: Iterable[int | object], smi_memory_mib: Sequence[int | None] = ()
) -> float:
    """Smallest per-GPU memory (GiB): nvidia-smi's MiB when every row has one, else the catalog.

    ``gpus`` are device ids or objects with ``device_id`` / ``pci_id`` (as ``summarize_host``).
    Raises :class:`LaunchError` when neither source knows the size.
    """
    smi = list(smi_memory_mib)
    if smi and all(isinstance(m, int) and m > 0 for m in smi):
        return min(smi) / 1024  # type: ignore[type-var]
    sizes = []
    for gpu in gpus:
        device = gpu if isinstance(gpu, int) else getattr(gpu, "device_id", None)
        if device is None:
            device = getattr(gpu, "pci_id", None)
        model = lookup(device) if isinstance(device, int) else None
        if model is None or model.memory_gib is None:
            name = model.name if model is not None else f"device {device!r}"
            raise LaunchError(
                f"memory size of {name} unknown (the catalog has none and nvidia-smi gave none): "
                "load the driver so nvidia-smi reports memory.total, or add memory_gib to "
                "p40fleet/gpu_catalog.py"
            )
        sizes.append(model.memory_gib)
    if not sizes:
        raise LaunchError("no NVIDIA GPU found")
    return float(min(sizes))


# ------------------------------------------------------------------------------ cluster


@dataclass(frozen=True)
class ClusterShape:
    """The nodes one run trains on and the GPUs each runs; who is left out and why.

    ``node_gpus``: the training nodes with their GPU counts (PCI); every one runs
    ``gpus_per_node`` of them (verl's rule), so ``nnodes x gpus_per_node`` counts only GPUs
    that train. ``left_out``: ``(host, why)`` of the other hosts (they train alone).
    """

    node_gpus: tuple[tuple[str, int], ...]
    gpus: tuple[object, ...] = ()
    memory_gib: float | None = None
    per_node: int | None = None  # None: the smallest node's count
    left_out: tuple[tuple[str, str], ...] = ()
    name: str = ""  # the cluster's name for headers ("headed by gpu1 (10.0.0.1:6379)")

    @property
    def nnodes(self) -> int:
        return len(self.node_gpus)

    @property
    def gpus_per_node(self) -> int:
        """The GPUs that train on every node (verl gives every node the same number)."""
        if self.per_node is not None:
            return self.per_node
        return min(count for _, count in self.node_gpus)

    @property
    def training_gpus(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def idle_gpus(self) -> int:
        """GPUs of training nodes above ``gpus_per_node`` (left-out hosts are not counted)."""
        return sum(count for _, count in self.node_gpus) - self.training_gpus

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.node_gpus)

    def why_left_out(self, host: str) -> str | None:
        """Why ``host`` is not a training node; None when it is one (or unknown here)."""
        return dict(self.left_out).get(host)

    def header(self, host: str | None = None) -> list[str]:
        """Comment lines for a launch script's header: the cluster, who is in it, who is
        not and why, and what ``host``'s script does (one line each, no newlines)."""
        counts = dict(self.node_gpus)
        name = f"Ray cluster {self.name}" if self.name else "Ray cluster"
        lines = [
            f"{name}: {self.nnodes} node(s) x {self.gpus_per_node} GPU(s) = "
            f"{self.training_gpus} training GPU(s) (the most of any per-node count).",
            "In it: " + ", ".join(f"{n} ({counts[n]} GPU(s))" for n in self.members) + ".",
        ]
        if self.left_out:
            lines.append("Not in it: " + "; ".join(f"{n}: {why}" for n, why in self.left_out) + ".")
        if host is not None and host in counts:
            lines.append(
                f"This host ({host}) is a training node: the cluster's run uses "
                f"{self.gpus_per_node} of its {counts[host]} GPU(s)."
            )
        elif host is not None:
            why = self.why_left_out(host) or "not a member"
            lines.append(
                f"This host ({host}) is not in it ({why}): this script trains on its own "
                "GPUs alone, in a private Ray (RAY_ADDRESS=local)."
            )
        return [" ".join(line.split()) for line in lines]


def _catalog_memory(gpus: Sequence[object]) -> float | None:
    try:
        return gpu_memory_gib(gpus)
    except LaunchError:
        return None  # a GPU without a catalog size: each host's nvidia-smi decides


def cluster_shape(
    nodes: Mapping[str, Sequence[int | object]],
    *,
    refused: Mapping[str, str] | None = None,
    name: str = "",
) -> ClusterShape:
    """The training shape of a Ray cluster from each member's PCI GPUs (``{host: gpus}``).

    verl runs the same GPU count ``k`` on every node, so the plan takes, for every ``k`` that
    is some node's GPU count, the nodes with at least ``k`` GPUs, and keeps the candidate with
    the most training GPUs ``k x #{nodes with >= k GPUs}``. Ties go to fewer nodes (a larger
    ``k``: less traffic between hosts), then to more memory per GPU: the catalog's smallest
    per-GPU size over the candidate's nodes (what every node is sized with; unknown counts as
    0). Two candidates with equal GPUs and equal nodes have the same ``k``, hence the same
    nodes, so with this membership the memory key never decides; it is the defined last key.
    A training node with more than ``k`` GPUs runs ``k`` (the rest idle). Members without a
    GPU (a CPU-only head), the ``refused`` hosts (``{host: why}``) and nodes with fewer than
    ``k`` GPUs are left out: each trains alone. ``name`` goes into the script headers.
    """
    refused = dict(refused or {})
    gpu_nodes = {n: list(g) for n, g in nodes.items() if n not in refused and list(g)}
    if not gpu_nodes:
        raise LaunchError(
            f"no GPU in the Ray cluster ({', '.join(sorted({*nodes, *refused})) or 'no member'}): "
            "run deploy/facts.py on its hosts"
        )
    candidates = []
    for k in sorted({len(g) for g in gpu_nodes.values()}):
        members = sorted((n for n, g in gpu_nodes.items() if len(g) >= k), key=_natural)
        mem = _catalog_memory([x for n in members for x in gpu_nodes[n]])
        candidates.append(((k * len(members), -len(members), mem or 0.0), members, k, mem))
    _, members, k, mem = max(candidates, key=lambda c: c[0])  # keys are unique per k
    left = [(n, f"refused ({why})") for n, why in refused.items()]
    for n, g in nodes.items():
        if n in refused or n in members:
            continue
        if not list(g):
            left.append((n, "no GPU"))
        else:
            left.append((n, f"{len(list(g))} GPU(s), fewer than the {k} every node runs"))
    return ClusterShape(
        node_gpus=tuple((n, len(gpu_nodes[n])) for n in members),
        gpus=tuple(x for n in members for x in gpu_nodes[n]),
        memory_gib=mem,
        per_node=k,
        left_out=tuple(sorted(left, key=lambda item: _natural(item[0]))),
        name=name,
    )


def _natural(name: str) -> tuple:
    """lab2 before lab10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


# ------------------------------------------------------------------------------ the plan


def _check_path(what: str, value: str) -> str:
    if not _SAFE_PATH.fullmatch(value):
        raise LaunchError(
            f"{what} {value!r}: expected a path of letters, digits, '.', '_', '+', '-' and '/' "
            "(it becomes a Hydra override value)"
        )
    return value


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the launch script needs for one host."""

    profile: str
    sizing: Sizing
    python: str
    workdir: str
    model_path: str
    train_file: str
    val_file: str
    overrides: tuple[str, ...]
    verl_ref: str = "v0.5.0"
    env: tuple[tuple[str, str], ...] = ENV
    #: header comment lines: the Ray cluster, who is in it, who is not and why
    cluster_lines: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The command the script execs (before the script's own arguments)."""
        return [self.python, "-m", ENTRY_POINT, *self.overrides]

    def template_vars(self) -> dict[str, object]:
        """Keyword arguments for files/launch-ppo.sh.j2: every value used as shell code is
        already shell-quoted (``shlex.quote``); ``profile`` and ``sizing`` go into comments."""
        q = shlex.quote
        return {
            "profile": self.profile,
            "sizing": self.sizing.describe(),
            "nnodes": self.sizing.nnodes,
            "verl_ref": self.verl_ref,
            "python": q(self.python),
            "entry_point": q(ENTRY_POINT),
            "workdir": q(self.workdir),
            "model_path": q(self.model_path),
            "train_file": q(self.train_file),
            "val_file": q(self.val_file),
            "overrides": [q(o) for o in self.overrides],
            "env": [(name, q(value)) for name, value in self.env],
            "cluster": [line.replace("\n", " ") for line in self.cluster_lines],
        }


def plan_launch(
    spec: StackSpec,
    gpus: Iterable[int | object],
    *,
    smi_memory_mib: Sequence[int | None] = (),
    cluster: ClusterShape | None = None,
    model_config: Mapping[str, object] | None = None,
    host: str | None = None,
) -> LaunchPlan:
    """The launch plan for a host with ``gpus`` (PCI device ids or ``PciGpu``-like objects).

    ``cluster``: the Ray cluster the run spans (:func:`cluster_shape`); None: this host alone.
    ``host``: this host's name; one the cluster left out gets a plan for its own GPUs alone
    (a private Ray, ``RAY_ADDRESS=local``), its header saying why.
    ``model_config``: the model's config.json; None: not staged yet (sized by the table only).
    Raises :class:`LaunchError` when the host is refused (``summarize_host``), the verl ref
    cannot serve its profile, the model does not fit, its GPU memory is unknown, or a name
    cannot be a Hydra override value.
    """
    gpus = list(gpus)
    summary = spec.gpu_summary(gpus)
    if not summary.ok or summary.profile is None:
        raise LaunchError(f"GPUs {summary.gpus_str}: {summary.refused}")
    lines: tuple[str, ...] = ()
    env_vars = ENV
    if cluster is not None:
        lines = tuple(cluster.header(host))
        if host is not None and host not in cluster.members:
            cluster = None  # left out: it trains alone, never in the cluster's Ray
            env_vars = (*ENV, ("RAY_ADDRESS", "local"))
    if cluster is None:
        cluster = ClusterShape(node_gpus=(("this host", summary.gpu_count),))
    profile = summary.profile
    if cluster.gpus:  # the cluster's lowest profile decides for every node
        whole = spec.gpu_summary(cluster.gpus)
        if not whole.ok or whole.profile is None:
            raise LaunchError(f"Ray cluster GPUs {whole.gpus_str}: {whole.refused}")
        profile = whole.profile
    if summary.gpu_count < cluster.gpus_per_node:
        raise LaunchError(
            f"this host has {summary.gpu_count} GPU(s), the cluster plan gives every node "
            f"{cluster.gpus_per_node}: run deploy/facts.py and check the inventory"
        )
    ref = ref_overrides(spec.verl.ref, profile)
    mem = gpu_memory_gib(gpus, smi_memory_mib)
    if cluster.memory_gib is not None:
        mem = min(mem, cluster.memory_gib)
    training = spec.training
    shape = None
    if model_config is not None:
        try:
            shape = ModelShape.from_config(model_config)
        except ModelShapeError as exc:
            raise LaunchError(f"model {training.model.name}: {exc}") from None
    sizing = size_for(
        profile,
        cluster.gpus_per_node,
        mem,
        nnodes=cluster.nnodes,
        shape=shape,
        max_prompt_length=training.max_prompt_length,
        max_response_length=training.max_response_length,
        idle_gpus=cluster.idle_gpus,
    )

    env = spec.env
    python = _check_path("python", f"{env.conda_prefix}/envs/{env.name}/bin/python")
    model_path = _check_path("model path", posixpath.join(env.model_dir, training.model.name))
    data_dir = posixpath.join(env.data_dir, training.data.name)
    train = _check_path("train file", posixpath.join(data_dir, training.data.train_file))
    val = _check_path("val file", posixpath.join(data_dir, training.data.val_file))
    overrides = [
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"actor_rollout_ref.model.path={model_path}",
        f"critic.model.path={model_path}",
        *sizing.overrides(),
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        *profile_overrides(profile),
        "trainer.logger=[console]",
    ]
    overrides = [o for o in overrides if _key(o) not in ref.absent]
    return LaunchPlan(
        profile=profile,
        sizing=sizing,
        python=python,
        workdir=spec.user.home,
        model_path=model_path,
        train_file=train,
        val_file=val,
        overrides=tuple(overrides),
        verl_ref=spec.verl.ref,
        env=env_vars,
        cluster_lines=lines,
    )
