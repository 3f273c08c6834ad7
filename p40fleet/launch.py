"""The PPO launch for one host: GPU facts + stack spec -> Hydra overrides and environment.

Pure: no pyinfra, no I/O. ``operations/launch.py`` renders the result into
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
needs no tensor parallelism in vLLM either), ``trainer.n_gpus_per_node`` = the host's GPU count,
``trainer.nnodes=1``, ``trainer.logger=[console]`` (verl's default adds wandb, which needs an
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

Sizing rule
-----------
``memory`` = the smallest per-GPU memory on the host in GiB: nvidia-smi's ``memory.total`` when
given, else the catalog's nominal ``memory_gib``. ``effective = memory`` for the fp32 profiles
(pascal, volta-turing) and ``2 x memory`` for ampere-plus (bf16 halves the bytes per value).
``n`` = the host's GPU count.

================  ======  =======  =======  =======  =====
effective GiB     < 10    10-18    18-36    36-72    >= 72
micro (per GPU)   1       2        4        8        16
================  ======  =======  =======  =======  =====

(the bounds sit between nominal sizes, so ECC's few percent never move a GPU: P40 24 GiB fp32
-> 4, V100/T4 16 GiB fp32 -> 2, RTX 3090 24 GiB bf16 -> 8, A100 40/80 GiB bf16 -> 16)

* ``actor.ppo_micro_batch_size_per_gpu`` = ``critic.ppo_micro_batch_size_per_gpu`` = micro
* ``rollout.log_prob_micro_batch_size_per_gpu`` = ``ref.log_prob_micro_batch_size_per_gpu``
  = 2 x micro (forward only: no gradients, no optimizer state)
* ``actor.ppo_mini_batch_size`` = 2 x micro x n (two gradient-accumulation micro-batches per GPU
  per update; the critic follows the actor's value)
* ``data.train_batch_size`` = 4 x ppo_mini_batch_size = 8 x micro x n (four updates per step)
* HF rollout (pascal): ``+rollout.micro_batch_size`` = 4 x micro (half a GPU's share of the step)
* vLLM (volta-turing, ampere-plus): ``rollout.gpu_memory_utilization`` = 12 GiB / memory,
  clamped to [0.30, 0.60] and rounded down to 0.05 (vLLM's weights + KV cache get about 12 GiB;
  the rest stays for the FSDP actor and critic on the same GPU). The HF rollout does not read it.

This satisfies verl's checks for any n: ``train_batch_size`` divisible by n, mini <= train, the
per-GPU mini-batch (2 x micro, times ``rollout.n``) divisible by micro. The rule is sized for a
small model (the default Qwen2.5-0.5B-Instruct, 0.5-1.5B) at verl's 512 + 512 tokens; a bigger
model or longer sequences want smaller micro-batches: pass them as arguments.
"""

from __future__ import annotations

import math
import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from p40fleet.gpu_catalog import lookup
from p40fleet.profile import (
    AMPERE_PLUS_PROFILE,
    PASCAL_PROFILE,
    PROFILES,
    VOLTA_TURING_PROFILE,
    summarize_host,
)
from p40fleet.spec import StackSpec

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_TRAIN_FILE",
    "DEFAULT_VAL_FILE",
    "ENTRY_POINT",
    "LaunchError",
    "LaunchPlan",
    "Sizing",
    "effective_memory_gib",
    "gpu_memory_gib",
    "micro_batch_per_gpu",
    "plan_launch",
    "profile_overrides",
    "size_for",
    "vllm_memory_utilization",
]

ENTRY_POINT = "verl.trainer.main_ppo"
#: Directory name under spec.env.model_dir (a Hugging Face model saved there).
DEFAULT_MODEL = "Qwen2.5-0.5B-Instruct"
#: Files under spec.env.data_dir: what verl's examples/data_preprocess/gsm8k.py writes.
DEFAULT_TRAIN_FILE = "gsm8k/train.parquet"
DEFAULT_VAL_FILE = "gsm8k/test.parquet"

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
_SAFE_RELATIVE = re.compile(r"[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*")

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


class LaunchError(ValueError):
    """No launch script for this host: the message says why and what to change."""


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
    """Batch sizes for one host (see the rule in the module docstring)."""

    profile: str
    gpu_count: int
    memory_gib: float
    micro_batch_per_gpu: int
    log_prob_micro_batch_per_gpu: int
    ppo_mini_batch_size: int
    train_batch_size: int
    #: HF rollout generation chunk (pascal only)
    hf_generate_micro_batch: int | None
    #: vLLM's fraction of GPU memory (vLLM profiles only)
    gpu_memory_utilization: float | None

    def overrides(self) -> list[str]:
        out = [
            f"data.train_batch_size={self.train_batch_size}",
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
        return out

    def describe(self) -> str:
        """One line for the script's header and deploy logs."""
        text = (
            f"{self.gpu_count} GPU(s) x {self.memory_gib:g} GiB ({self.profile}): micro "
            f"{self.micro_batch_per_gpu}/GPU, log-prob micro {self.log_prob_micro_batch_per_gpu}"
            f"/GPU, mini-batch {self.ppo_mini_batch_size}, train batch {self.train_batch_size}"
        )
        if self.hf_generate_micro_batch is not None:
            text += f", HF generate chunk {self.hf_generate_micro_batch}"
        if self.gpu_memory_utilization is not None:
            text += f", vLLM memory {self.gpu_memory_utilization:.2f}"
        return text


def size_for(profile: str, gpu_count: int, memory_gib: float) -> Sizing:
    """Apply the sizing rule; refuses an unknown profile, no GPUs or no memory."""
    if gpu_count < 1:
        raise LaunchError(f"no GPU to train on (GPU count {gpu_count})")
    if not memory_gib or memory_gib <= 0:
        raise LaunchError(f"GPU memory {memory_gib!r} GiB: expected a positive size")
    micro = micro_batch_per_gpu(profile, memory_gib)
    mini = 2 * micro * gpu_count
    return Sizing(
        profile=profile,
        gpu_count=gpu_count,
        memory_gib=memory_gib,
        micro_batch_per_gpu=micro,
        log_prob_micro_batch_per_gpu=2 * micro,
        ppo_mini_batch_size=mini,
        train_batch_size=4 * mini,
        hf_generate_micro_batch=4 * micro if profile == PASCAL_PROFILE else None,
        gpu_memory_utilization=(
            vllm_memory_utilization(memory_gib) if profile in _VLLM_PROFILES else None
        ),
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


def _check_relative(what: str, value: str) -> str:
    if not _SAFE_RELATIVE.fullmatch(value) or ".." in value.split("/"):
        raise LaunchError(
            f"{what} {value!r}: expected a relative path of letters, digits, '.', '_', '+', '-' "
            "and '/' (no '..'): it becomes a Hydra override value"
        )
    return value


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
    env: tuple[tuple[str, str], ...] = ENV

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
            "python": q(self.python),
            "entry_point": q(ENTRY_POINT),
            "workdir": q(self.workdir),
            "model_path": q(self.model_path),
            "train_file": q(self.train_file),
            "val_file": q(self.val_file),
            "overrides": [q(o) for o in self.overrides],
            "env": [(name, q(value)) for name, value in self.env],
        }


def plan_launch(
    spec: StackSpec,
    gpus: Iterable[int | object],
    *,
    smi_memory_mib: Sequence[int | None] = (),
    model_config: Mapping[str, Any] | None = None,
    model_name: str | None = None,
    train_file: str | None = None,
    val_file: str | None = None,
) -> LaunchPlan:
    """The launch plan for a host with ``gpus`` (PCI device ids or ``PciGpu``-like objects).

    ``model_config``: the model's parsed ``config.json`` (None: not staged yet / unknown; the
    sizing does not read it yet). Model and data names default to ``spec.training``'s.

    Raises :class:`LaunchError` when the host is refused (``summarize_host``), its GPU memory
    is unknown, or a name cannot be a Hydra override value.
    """
    gpus = list(gpus)
    summary = summarize_host(
        gpus, branch=spec.driver_branch, allow_maxwell=spec.policy.allow_maxwell
    )
    if not summary.ok or summary.profile is None:
        raise LaunchError(f"GPUs {summary.gpus_str}: {summary.refused}")
    profile = summary.profile
    sizing = size_for(profile, summary.gpu_count, gpu_memory_gib(gpus, smi_memory_mib))

    env = spec.env
    training = spec.training
    if model_name is None:
        model_name = training.model.name
    if train_file is None:
        train_file = posixpath.join(training.data.name, training.data.train_file)
    if val_file is None:
        val_file = posixpath.join(training.data.name, training.data.val_file)
    python = _check_path("python", f"{env.conda_prefix}/envs/{env.name}/bin/python")
    model_path = _check_path(
        "model path", posixpath.join(env.model_dir, _check_relative("model name", model_name))
    )
    train = _check_path(
        "train file", posixpath.join(env.data_dir, _check_relative("train file", train_file))
    )
    val = _check_path(
        "val file", posixpath.join(env.data_dir, _check_relative("val file", val_file))
    )
    overrides = [
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"actor_rollout_ref.model.path={model_path}",
        f"critic.model.path={model_path}",
        *sizing.overrides(),
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        *profile_overrides(profile),
        f"trainer.n_gpus_per_node={summary.gpu_count}",
        "trainer.nnodes=1",
        "trainer.logger=[console]",
    ]
    return LaunchPlan(
        profile=profile,
        sizing=sizing,
        python=python,
        workdir=spec.user.home,
        model_path=model_path,
        train_file=train,
        val_file=val,
        overrides=tuple(overrides),
    )
