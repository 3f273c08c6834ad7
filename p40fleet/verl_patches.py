"""verl capability patch rules, as data, per supported verl ref and GPU capability profile.

A rule is literal text: ``old`` must occur exactly ``count`` times in ``file`` (relative to the
checkout) and becomes ``new``. The applier (``files/verl_patches.py``, standard library only, run
on the host) checks every rule before writing any file and records what it applied; this module
loads it for in-process use (:func:`plan`, :func:`apply`) so there is one implementation.

Profiles (docs/stack-facts.md §3): ``pascal`` (cc 6.x) gets the rules below, and so does
``volta-turing`` (7.x): verl 0.5.0 hard-codes bf16 autocast in the actor/critic forward and loads
the critic with flash_attention_2 where no config reaches, and neither bf16 nor flash-attn 2 runs
below cc 8.0; ``ampere-plus`` (>= 8.0) runs verl untouched. ``maxwell`` (5.x, only with an
explicit override) is treated like ``pascal``.

One rule is a correctness fix, not a capability one: ``hf-rollout-generate-positions`` drops the
``position_ids`` argument of the HF rollout's ``generate()`` call (verl PR #1637; with it
transformers 4.53.3 feeds every generated token the last prompt position). It sits in the
``pascal`` set (the HF rollout is the P40 rollout, the lab's too) and so in ``volta-turing``'s
(vLLM by default there; the same rule when ``rollout.name=hf`` is chosen). ``ampere-plus``
stays untouched: its rollout is vLLM, which computes its own positions.

Left alone on purpose: the model merger (it calls tensor dtype methods such as ``.bfloat16()``),
Megatron code and ``verl/utils/torch_dtypes.py``. Dtype sites that config already reaches
(``fsdp_config.mixed_precision.param_dtype``, ``fsdp_config.model_dtype``) are not patched.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from p40fleet.paths import FILES
from p40fleet.profile import PROFILES


def _applier_path() -> Path:
    """``files/verl_patches.py``: the installed package's, else the checkout's (p40fleet.paths)."""
    return FILES / "verl_patches.py"


#: The applier: the only owner of the patch record's name and format.
APPLIER_PATH = _applier_path()


def load_applier() -> ModuleType:
    """Import files/verl_patches.py (the one applier implementation) as a module."""
    name = "p40fleet_verl_patch_applier"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, APPLIER_PATH)
    if spec is None or spec.loader is None:  # pragma: no cover
        raise ImportError(f"cannot load {APPLIER_PATH}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


#: The applier's record in the checkout (its name is the applier's: it owns the format).
RECORD_NAME: str = load_applier().RECORD_NAME

PATCHED_PROFILES = ("pascal",)


class VerlPatchError(ValueError):
    """Unknown ref/profile, or a ref that cannot be supported for a profile."""


@dataclass(frozen=True)
class Rule:
    id: str
    file: str
    old: str
    new: str
    count: int
    why: str


@dataclass(frozen=True)
class RuleSet:
    ref: str
    profile: str
    rules: tuple[Rule, ...]
    supported: bool = True
    reason: str = ""

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "format": 1,
            "ref": self.ref,
            "profile": self.profile,
            "supported": self.supported,
            "reason": self.reason,
            "rules": [asdict(r) for r in self.rules],
        }


# --- verl v0.5.0 (tag, commit 8fdc4d3f202f41461f4de9f42a637228e342668b) -------------------

_FA_WHY = (
    "with CUDA available this module imports flash_attn.bert_padding at load time, but the pinned "
    "P40 environment has no flash-attn (its kernels need sm_80+), so the import would fail; the "
    "imported helpers are only used when use_remove_padding=True, which Pascal config turns off"
)


def _forward_autocast_fp32(role: str, file: str) -> Rule:
    """The actor's and the critic's forward pass: their hard-coded bf16 autocast, made fp32."""
    return Rule(
        id=f"{role}-autocast-fp32",
        file=file,
        old="with torch.autocast(device_type=self.device_name, dtype=torch.bfloat16):",
        new="with torch.autocast(device_type=self.device_name, dtype=torch.float32):",
        count=1,
        why=f"The {role} forward pass runs under a hard-coded bf16 autocast that no config "
        "reaches; Pascal has no bf16 math, so autocast targets fp32.",
    )


def _flash_attn_import_guard(role: str, file: str) -> Rule:
    """The actor's and the critic's module-level flash-attn import, made optional."""
    return Rule(
        id=f"{role}-flash-attn-import",
        file=file,
        old=(
            "if is_cuda_available:\n"
            "    from flash_attn.bert_padding import index_first_axis, pad_input, rearrange,"
            " unpad_input\n"
            "elif is_npu_available:\n"
        ),
        new=(
            "if is_cuda_available:\n"
            "    try:\n"
            "        from flash_attn.bert_padding import index_first_axis, pad_input, rearrange,"
            " unpad_input\n"
            "    except ImportError:  # p40fleet pascal: no flash-attn; use_remove_padding=False\n"
            "        index_first_axis = pad_input = rearrange = unpad_input = None\n"
            "elif is_npu_available:\n"
        ),
        count=1,
        why=f"The {role} " + _FA_WHY + ".",
    )


_V050_PASCAL: tuple[Rule, ...] = (
    _forward_autocast_fp32("actor", "verl/workers/actor/dp_actor.py"),
    _flash_attn_import_guard("actor", "verl/workers/actor/dp_actor.py"),
    _forward_autocast_fp32("critic", "verl/workers/critic/dp_critic.py"),
    _flash_attn_import_guard("critic", "verl/workers/critic/dp_critic.py"),
    Rule(
        id="hf-rollout-autocast-fp32",
        file="verl/workers/rollout/hf_rollout.py",
        old="torch.autocast(device_type=get_device_name(), dtype=torch.bfloat16):",
        new="torch.autocast(device_type=get_device_name(), dtype=torch.float32):",
        count=1,
        why="The HF rollout, the only rollout a P40 can run, generates under a hard-coded bf16 "
        "autocast that rollout.dtype does not reach; Pascal has no bf16 math.",
    ),
    Rule(
        id="hf-rollout-generate-positions",
        file="verl/workers/rollout/hf_rollout.py",
        old="                position_ids=position_ids,\n",
        new="                # p40fleet: generate() derives position_ids from the mask\n",
        count=1,
        why="verl PR #1637 passes the prompt's position_ids to generate(), and transformers "
        "4.53.3 never advances given ones: every generated token gets the last prompt position "
        "(RoPE frozen). Without them generate() derives left-padding-aware positions from the "
        "growing attention mask, equal to verl's own on the real tokens.",
    ),
    Rule(
        id="fsdp-actor-attn-sdpa",
        file="verl/workers/fsdp_workers.py",
        old=(
            "local_path, trust_remote_code=trust_remote_code,"
            ' attn_implementation="flash_attention_2"\n'
        ),
        new='local_path, trust_remote_code=trust_remote_code, attn_implementation="sdpa"\n',
        count=1,
        why="The actor/ref model config is loaded with flash_attention_2, which needs flash-attn "
        "and sm_80+; sdpa's memory-efficient kernel runs on sm_61.",
    ),
    Rule(
        id="fsdp-critic-attn-sdpa",
        file="verl/workers/fsdp_workers.py",
        old=(
            "critic_model_config = AutoConfig.from_pretrained(\n"
            "            local_path,\n"
            '            attn_implementation="flash_attention_2",\n'
        ),
        new=(
            "critic_model_config = AutoConfig.from_pretrained(\n"
            "            local_path,\n"
            '            attn_implementation="sdpa",\n'
        ),
        count=1,
        why="The critic model config is loaded with flash_attention_2, which needs flash-attn and "
        "sm_80+; sdpa's memory-efficient kernel runs on sm_61.",
    ),
    Rule(
        id="fsdp-reward-model-load-fp32-sdpa",
        file="verl/workers/fsdp_workers.py",
        old=(
            "                torch_dtype=torch.bfloat16,\n"
            '                attn_implementation="flash_attention_2",\n'
        ),
        new=(
            "                torch_dtype=torch.float32,\n"
            '                attn_implementation="sdpa",\n'
        ),
        count=1,
        why="The reward model is loaded in bf16 with flash_attention_2 regardless of config; a "
        "P40 needs fp32 weights and sdpa attention.",
    ),
    Rule(
        id="fsdp-reward-model-cast-fp32",
        file="verl/workers/fsdp_workers.py",
        old="            reward_module.to(torch.bfloat16)\n",
        new="            reward_module.to(torch.float32)\n",
        count=1,
        why="After loading, the reward model is cast to bf16 unconditionally; on Pascal it stays "
        "fp32.",
    ),
    Rule(
        id="fsdp-reward-model-autocast-fp32",
        file="verl/workers/fsdp_workers.py",
        old="torch.no_grad(), torch.autocast(device_type=device_name, dtype=torch.bfloat16):",
        new="torch.no_grad(), torch.autocast(device_type=device_name, dtype=torch.float32):",
        count=1,
        why="The reward model forward pass runs under a hard-coded bf16 autocast that no config "
        "reaches; Pascal has no bf16 math.",
    ),
    Rule(
        id="fsdp-reward-model-flash-attn-import",
        file="verl/workers/fsdp_workers.py",
        old=(
            "        if is_cuda_available:\n"
            "            from flash_attn.bert_padding import index_first_axis, pad_input,"
            " rearrange, unpad_input\n"
            "        elif is_npu_available:\n"
        ),
        new=(
            "        if is_cuda_available:\n"
            "            try:\n"
            "                from flash_attn.bert_padding import index_first_axis, pad_input,"
            " rearrange, unpad_input\n"
            "            except ImportError:  # p40fleet pascal: no flash-attn\n"
            "                index_first_axis = pad_input = rearrange = unpad_input = None\n"
            "        elif is_npu_available:\n"
        ),
        count=1,
        why="The reward model forward imports flash_attn.bert_padding on every CUDA call; the P40 "
        "environment has no flash-attn and the helpers are only used with use_remove_padding.",
    ),
    Rule(
        id="model-valuehead-tokencls-attn-sdpa",
        file="verl/utils/model.py",
        old=(
            "            config=model_config,\n"
            '            attn_implementation="flash_attention_2",\n'
            "            trust_remote_code=trust_remote_code,\n"
            "        )\n"
            "        return model\n"
        ),
        new=(
            "            config=model_config,\n"
            '            attn_implementation="sdpa",\n'
            "            trust_remote_code=trust_remote_code,\n"
            "        )\n"
            "        return model\n"
        ),
        count=1,
        why="The value-head (token classification) model is loaded with flash_attention_2, which "
        "needs flash-attn and sm_80+; sdpa runs on sm_61.",
    ),
    Rule(
        id="model-valuehead-causallm-attn-sdpa",
        file="verl/utils/model.py",
        old=(
            "        config=model_config,\n"
            '        attn_implementation="flash_attention_2",\n'
            "        trust_remote_code=trust_remote_code,\n"
            "    )\n"
            "    model = AutoModelForCausalLMWithValueHead"
        ),
        new=(
            "        config=model_config,\n"
            '        attn_implementation="sdpa",\n'
            "        trust_remote_code=trust_remote_code,\n"
            "    )\n"
            "    model = AutoModelForCausalLMWithValueHead"
        ),
        count=1,
        why="The trl value-head fallback loads its causal LM with flash_attention_2, which needs "
        "flash-attn and sm_80+; sdpa runs on sm_61.",
    ),
)

V050_COMMIT = "8fdc4d3f202f41461f4de9f42a637228e342668b"
SEED_COMMIT = "62549582a71881fe861b09f8375e3aea80ac6754"

_SEED_REASON = (
    "verl removed its HF rollout on 2025-08-18 and vLLM needs compute capability >= 7.0, so at "
    "62549582 (2025-09-08) a Pascal GPU has no rollout backend; use v0.5.0"
)

# ref -> profile -> RuleSet
RULE_SETS: dict[str, dict[str, RuleSet]] = {
    "v0.5.0": {
        "pascal": RuleSet("v0.5.0", "pascal", _V050_PASCAL),
        "volta-turing": RuleSet("v0.5.0", "volta-turing", _V050_PASCAL),
        "ampere-plus": RuleSet("v0.5.0", "ampere-plus", ()),
    },
    SEED_COMMIT: {
        "pascal": RuleSet(SEED_COMMIT, "pascal", (), supported=False, reason=_SEED_REASON),
        "volta-turing": RuleSet(SEED_COMMIT, "volta-turing", ()),
        "ampere-plus": RuleSet(SEED_COMMIT, "ampere-plus", ()),
    },
}

# Other names for a supported tree: the upstream commit of a tag, and the simulated lab's tags
# whose verl/ tree equals that release (p40lab.verl_remote: v0.5.0-lab1 only changes README.md).
REF_ALIASES: dict[str, str] = {
    V050_COMMIT: "v0.5.0",
    "v0.5.0-lab1": "v0.5.0",
}


def known_refs() -> list[str]:
    return sorted(RULE_SETS) + sorted(REF_ALIASES)


def rule_set(ref: str, profile: str) -> RuleSet:
    """The rule set for a verl ref (tag, commit or alias) and profile.

    Raises VerlPatchError for an unknown ref/profile, or when the pair is unsupported (with the
    reason). The returned set carries the ref exactly as asked for (that is what gets recorded).
    """
    if profile == "maxwell":
        profile = "pascal"
    if profile not in PROFILES:
        raise VerlPatchError(f"unknown GPU profile {profile!r}: expected one of {PROFILES}")
    base = REF_ALIASES.get(ref, ref)
    if base not in RULE_SETS:
        raise VerlPatchError(
            f"verl ref {ref!r} has no patch rule set: supported refs are {known_refs()}"
        )
    rs = RULE_SETS[base][profile]
    if not rs.supported:
        raise VerlPatchError(f"verl ref {ref} is unsupported for profile {profile}: {rs.reason}")
    return RuleSet(ref, profile, rs.rules, rs.supported, rs.reason)


@functools.cache
def ruleset_json(ref: str, profile: str) -> str:
    """The JSON the host-side applier takes (``--rules``)."""
    return json.dumps(rule_set(ref, profile).to_json_dict(), indent=2, sort_keys=True) + "\n"


def plan(checkout: str | Path, ref: str, profile: str) -> dict[str, Any]:
    """What applying would do (nothing written); raises the applier's PatchError."""
    return load_applier().plan(str(checkout), rule_set(ref, profile).to_json_dict())


def apply(checkout: str | Path, ref: str, profile: str, check: bool = False) -> dict[str, Any]:
    """Apply in-process (tests, local checkouts). Hosts run files/verl_patches.py instead."""
    return load_applier().apply(str(checkout), rule_set(ref, profile).to_json_dict(), check=check)


# --- LAB-ONLY rule set "lab-cpu": one PPO step on CPU in a simulated host (issue 25) ----------
#
# Never applied to a host's ~/verl: verify --smoke on a simulated host (p40lab) copies the
# checkout's verl package into a scratch directory, applies these rules there with
# files/verl_patches.py and puts that copy first on PYTHONPATH (issue 25, the CPU probe:
# the three edits one v0.5.0 PPO step on CPU needs, FSDP1, no reference policy).

LAB_CPU_PROFILE = "lab-cpu"

_CPU_SHIM = '''logger = logging.getLogger(__name__)  # p40fleet lab-cpu: the CPU shim follows


class _CpuDeviceShim:
    """p40fleet lab-cpu: torch.cpu, plus the torch.cuda-only calls verl makes (memory 0, no-op)."""

    def __getattr__(self, name):
        if name in ("manual_seed", "get_rng_state", "set_rng_state"):
            return getattr(torch, name)
        if name == "mem_get_info":
            return lambda *args, **kwargs: (0, 0)
        if "memory" in name:
            return lambda *args, **kwargs: 0
        if name == "empty_cache":
            return lambda *args, **kwargs: None
        if name == "get_device_name":
            return lambda *args, **kwargs: "cpu"
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        raise AttributeError(f"torch.cpu has no {name!r} (p40fleet lab-cpu shim)")


_CPU_DEVICE_SHIM = _CpuDeviceShim()
'''

_V050_LAB_CPU: tuple[Rule, ...] = (
    Rule(
        id="lab-cpu-gloo-backend",
        file="verl/workers/fsdp_workers.py",
        old='backend=f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}",',
        new='backend="gloo" if get_device_name() == "cpu" else '
        'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}",',
        count=1,
        why="On CPU the actor's process-group backend string names cpu twice and "
        "get_nccl_backend() raises; plain gloo is the CPU process group.",
    ),
    Rule(
        id="lab-cpu-device-shim-class",
        file="verl/utils/device.py",
        old="logger = logging.getLogger(__name__)\n",
        new=_CPU_SHIM,
        count=1,
        why="torch.cpu has none of the torch.cuda memory/cache calls verl makes unconditionally "
        "(profiler/performance.py, fsdp_workers.py, hf_rollout.py, flops_counter.py).",
    ),
    Rule(
        id="lab-cpu-device-shim-use",
        file="verl/utils/device.py",
        old=(
            "    device_name = get_device_name()\n"
            "    try:\n"
            "        return getattr(torch, device_name)\n"
        ),
        new=(
            "    device_name = get_device_name()\n"
            '    if device_name == "cpu":  # p40fleet lab-cpu\n'
            "        return _CPU_DEVICE_SHIM\n"
            "    try:\n"
            "        return getattr(torch, device_name)\n"
        ),
        count=1,
        why="get_torch_device() answers the CPU shim on CPU, so one edit covers every call site.",
    ),
    Rule(
        id="lab-cpu-no-sync-module-states",
        file="verl/workers/fsdp_workers.py",
        old="                sync_module_states=True,\n",
        new='                sync_module_states=device_name != "cpu",\n',
        count=3,
        why="FSDP1 refuses sync_module_states with CPU parameters; with one rank there is "
        "nothing to broadcast (actor/ref, critic and reward-model wrappers).",
    ),
)

#: verl ref (as RULE_SETS names it) -> the lab-only CPU rule set.
LAB_CPU_RULE_SETS: dict[str, RuleSet] = {
    "v0.5.0": RuleSet("v0.5.0", LAB_CPU_PROFILE, _V050_LAB_CPU),
}


def lab_cpu_rule_set(ref: str) -> RuleSet:
    """The LAB-ONLY CPU rule set for a verl ref (raises VerlPatchError when it has none)."""
    base = REF_ALIASES.get(ref, ref)
    if base not in LAB_CPU_RULE_SETS:
        raise VerlPatchError(
            f"verl ref {ref!r} has no lab-cpu rule set (a CPU smoke step needs one): known "
            f"{sorted(LAB_CPU_RULE_SETS)}"
        )
    rs = LAB_CPU_RULE_SETS[base]
    return RuleSet(ref, rs.profile, rs.rules)


def lab_cpu_ruleset_json(ref: str) -> str:
    """The JSON files/verl_patches.py takes (``--rules``) for the lab-only CPU rule set."""
    return json.dumps(lab_cpu_rule_set(ref).to_json_dict(), indent=2, sort_keys=True) + "\n"
