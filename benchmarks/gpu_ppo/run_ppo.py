"""verl PPO steps on a real GPU with the launch script p40fleet renders, memory capped to a P40's.

Run by hand on the device machine (never by CI; pytest does not collect this folder)::

    python3 benchmarks/gpu_ppo/run_ppo.py --plan 1xP40 [--plan 1xP100] \\
        --stage /tmp/p40stage --carry build/gpu_ppo/carry2 --out "$OUT" [--steps 2]

and locally, to see what would run (the project's venv, no GPU)::

    .venv/bin/python benchmarks/gpu_ppo/run_ppo.py --plan 2xP40 --render-only \\
        --carry build/gpu_ppo/carry2

What one ``--plan`` does on the device
--------------------------------------
1. Environment (once per machine): joins ray's wheel from its two carried parts (sha256 from
   the manifest), ``pip install --no-deps --no-index --target STAGE/site`` of every carried
   wheel, and applies the project's own verl patch rules (``p40fleet.verl_patches``, i.e.
   ``files/verl_patches.py``) for the plan's profile to the installed verl. pydantic (which
   ``p40fleet.spec`` needs, and the device lacks) goes to ``STAGE/plan-site``, for this process
   only, so the trainer sees exactly the carried verl set plus the device's own packages.
2. Plan: ``p40fleet.launch.plan_launch`` for fake PCI facts (``PLANS``: 10de:1b38 Tesla P40 or
   10de:15f8 Tesla P100 16GB, memory from the catalog) and the default ``StackSpec`` (lengths
   from ``spec.training``), called with whichever of its keyword arguments exist
   (``plan_kwargs``); the script is ``files/launch-ppo.sh.j2`` rendered with jinja2 exactly as
   pyinfra's ``files.template`` does (StrictUndefined, keep_trailing_newline) from
   ``plan.template_vars()``.
3. Files where the plan points: a random-weight model of Qwen2.5-0.5B-Instruct's shape (built
   on the GPU with the carried transformers, bf16 like the real checkpoint), the carried
   tokenizer and GSM8K-format parquet pair, and a ``python`` at the plan's conda path that
   execs the device's python3.
4. ``bash launch-ppo.sh trainer.total_training_steps=N`` (the only added override: the plan's
   run is open-ended) with ``hook/`` and the site first on ``PYTHONPATH``: ``sitecustomize``
   caps every GPU process at the plan's memory and records peaks and the models' dtypes and
   attention (hook/sitecustomize.py).
5. ``OUT/ppo-<plan>.log`` (the trainer's output) and ``OUT/ppo-<plan>.json`` (steps, step time,
   peak memory per GPU against the cap and the plan's estimate when it has one, read-backs,
   checks). Copy both to docs/measurements/.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Mode:
    """A host shape to plan for, and the memory cap that stands in for its GPUs."""

    device_id: int
    gpus: int
    cap_gib: float
    kind: str  # the device tool's kind that runs it
    #: Hydra overrides added after the plan's (the P100 floor: what the plan's last fallback
    #: would run, to check its refusal against a real allocator capped at 16 GiB)
    forced: tuple[str, ...] = ()


PLANS: dict[str, Mode] = {
    "1xP40": Mode(0x1B38, 1, 24.0, "nvidia-h200"),
    "1xP100": Mode(0x15F8, 1, 16.0, "nvidia-h200"),
    "2xP40": Mode(0x1B38, 2, 24.0, "nvidia-h200-x2"),
    # The 1xP40 script forced to the plan's last fallback for a P100 (micro 1, log-prob micro 2,
    # HF chunk 4, critic param + actor/critic optimizer offload), run under a P100's 16 GiB.
    "1xP100-floor": Mode(
        0x1B38,
        1,
        16.0,
        "nvidia-h200",
        forced=(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "critic.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.micro_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "data.train_batch_size=8",
            "data.val_batch_size=4",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
            "critic.model.fsdp_config.optimizer_offload=True",
            "critic.model.fsdp_config.param_offload=True",
        ),
    ),
}

#: The packages only this process needs (p40fleet.spec), kept off the trainer's path.
PLAN_ONLY = ("pydantic", "pydantic_core", "annotated_types", "typing_inspection")

# multicast off on the device's NVLink hosts (device KINDS.md), offline everything.
RUN_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "PYTHONUNBUFFERED": "1",
}


def repo_root() -> Path:
    """The checkout holding p40fleet/: the working directory, else two folders up."""
    for candidate in (Path.cwd(), HERE.parents[1]):
        if (candidate / "p40fleet" / "launch.py").is_file():
            return candidate
    raise SystemExit("run_ppo: no p40fleet/ in the working directory: run from the repo root")


# --- plan and script (runs locally too) ---------------------------------------------------


def load_spec(prompt_length: int | None = None, response_length: int | None = None):
    """The default StackSpec; the lengths, when given, go to ``stack.training``."""
    from p40fleet.spec import load_spec as _load

    training = {}
    if prompt_length is not None:
        training["max_prompt_length"] = prompt_length
    if response_length is not None:
        training["max_response_length"] = response_length
    return _load("gpu-ppo", {"training": training} if training else {})


def _model_config_arg(annotation: str, config: Mapping[str, Any], config_path: Path) -> Any:
    """plan_launch's ``model_config`` in the form its annotation names."""
    text = str(annotation)
    try:
        import p40fleet.memory as memory
    except ImportError:
        memory = None
    if memory is not None:
        for name, cls in vars(memory).items():
            if isinstance(cls, type) and name in text:
                for maker in ("from_config", "from_dict", "from_mapping", "from_json", "load"):
                    make = getattr(cls, maker, None)
                    if make is None:
                        continue
                    for arg in (dict(config), config_path):
                        try:
                            return make(arg)
                        except (TypeError, ValueError, AttributeError, OSError):
                            continue
    if ("Path" in text or "str" in text) and "Mapping" not in text and "dict" not in text:
        return str(config_path)
    return dict(config)


def plan_kwargs(
    plan_launch: Callable, config: Mapping[str, Any], config_path: Path, extra: Mapping
) -> dict[str, Any]:
    """Keyword arguments for ``plan_launch`` as deploy/training.py would pass them: the model's
    config.json when the function takes one; ``extra`` (``--plan-kwargs``) on top. A required
    parameter this harness does not know is refused by name."""
    params = inspect.signature(plan_launch).parameters
    kwargs: dict[str, Any] = {}
    if "model_config" in params:
        kwargs["model_config"] = _model_config_arg(
            params["model_config"].annotation, config, config_path
        )
    kwargs.update(extra)
    known = {"spec", "gpus", *kwargs}
    missing = [
        name
        for name, p in params.items()
        if p.default is inspect.Parameter.empty
        and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        and name not in known
    ]
    if missing:
        raise SystemExit(
            f"run_ppo: plan_launch needs {', '.join(missing)} which the harness does not know: "
            "pass it with --plan-kwargs '{\"NAME\": VALUE}' or teach plan_kwargs()"
        )
    return kwargs


def make_plan(mode: Mode, spec, config_path: Path, extra: Mapping | None = None):
    """``plan_launch`` for ``mode``'s fake PCI facts (memory from the catalog)."""
    from p40fleet.launch import plan_launch

    config = json.loads(config_path.read_text())
    kwargs = plan_kwargs(plan_launch, config, config_path, extra or {})
    return plan_launch(spec, [mode.device_id] * mode.gpus, **kwargs)


def render(plan, repo: Path) -> str:
    """files/launch-ppo.sh.j2 as pyinfra's files.template renders it."""
    from jinja2 import Environment, StrictUndefined

    template = (repo / "files" / "launch-ppo.sh.j2").read_text()
    env = Environment(undefined=StrictUndefined, keep_trailing_newline=True)
    return env.from_string(template).render(**plan.template_vars())


def _jsonable(value: Any, depth: int = 0) -> Any:
    if depth > 6:
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    elif hasattr(value, "model_dump"):
        value = value.model_dump()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v, depth + 1) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


#: Keys, in order of preference, that carry the plan's per-GPU memory estimate in GiB.
ESTIMATE_KEYS = (
    "per_gpu_gib",
    "total_gib",
    "needs_gib",
    "estimate_gib",
    "peak_gib",
    "gib",
)


def plan_estimate(plan) -> dict[str, Any]:
    """The plan's memory estimate when it exposes one: every field of the plan or its sizing
    whose name mentions 'estimate' or whose value's type mentions Estimate/Memory, and the
    first number among ``ESTIMATE_KEYS`` (``per_gpu_gib``: None when none is found)."""
    found: dict[str, Any] = {}
    for owner_name, owner in (("plan", plan), ("sizing", getattr(plan, "sizing", None))):
        if owner is None:
            continue
        names = (
            [f.name for f in dataclasses.fields(owner)]
            if dataclasses.is_dataclass(owner)
            else list(vars(owner))
        )
        names += [n for n, v in inspect.getmembers(type(owner)) if isinstance(v, property)]
        for name in names:
            value = getattr(owner, name, None)
            kind = type(value).__name__.lower()
            if "estimate" in name.lower() or "estimate" in kind or "memory" in kind:
                found[f"{owner_name}.{name}"] = _jsonable(value)
    return {"fields": found, "per_gpu_gib": _first_estimate(list(found.values()))}


def _first_estimate(values: list[Any]) -> float | None:
    """A bare number, else the first ``ESTIMATE_KEYS`` number, breadth first."""
    queue = list(values)
    while queue:
        value = queue.pop(0)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, Mapping):
            for key in ESTIMATE_KEYS:
                number = value.get(key)
                if isinstance(number, int | float) and not isinstance(number, bool):
                    return float(number)
            queue += [v for v in value.values() if isinstance(v, Mapping)]
    return None


def describe_plan(name: str, mode: Mode, plan, script: str) -> dict[str, Any]:
    """What the JSON records about the plan."""
    return {
        "plan": name,
        "fake_pci": f"10de:{mode.device_id:04x}",
        "gpu_count": mode.gpus,
        "cap_gib": mode.cap_gib,
        "profile": plan.profile,
        "sizing": plan.sizing.describe(),
        "overrides": list(plan.overrides),
        "estimate": plan_estimate(plan),
        "launch_script": script,
    }


# --- the trainer's log ----------------------------------------------------------------------


def parse_steps(log: str) -> dict[int, dict[str, float]]:
    """verl's console logger lines (``step:N - key:value - ...``) -> {N: {key: value}}: verify's
    own reader (``p40fleet.verification.smoke.parse_metrics``), so both read a step alike."""
    from p40fleet.verification.smoke import parse_metrics

    return parse_metrics(log.splitlines())


def summarize(
    describe: Mapping[str, Any],
    log: str,
    meas_dir: Path,
    steps_requested: int,
    rc: int | None,
    timed_out: bool,
) -> dict[str, Any]:
    """The run's JSON: steps, times, peak memory per GPU against the cap and the estimate,
    read-backs, and the checks the issue asks for."""
    steps = parse_steps(log)
    train = {n: m for n, m in sorted(steps.items()) if "timing_s/step" in m}
    cap = float(describe["cap_gib"])
    gpus = []
    for path in sorted(meas_dir.glob("mem-*.json")):
        data = json.loads(path.read_text())
        for dev in data["devices"]:
            if dev["max_reserved_gib"] <= 0:
                continue
            gpus.append(
                {
                    "pid": data["pid"],
                    "cuda_visible_devices": data["cuda_visible_devices"],
                    "device": dev["name"],
                    "cap_fraction": dev["cap_fraction"],
                    "cap_errors": data["cap_errors"],
                    "max_allocated_gib": round(dev["max_allocated_gib"], 3),
                    "max_reserved_gib": round(dev["max_reserved_gib"], 3),
                    "device_used_max_gib": round(dev["device_used_max_gib"], 3),
                }
            )
    readbacks = [json.loads(p.read_text()) for p in sorted(meas_dir.glob("readback-*.json"))]
    modules = [m for r in readbacks for m in r["modules"].values()]
    estimate = describe["estimate"]["per_gpu_gib"]
    peak_alloc = max((g["max_allocated_gib"] for g in gpus), default=None)
    versus = None
    if estimate and peak_alloc:
        versus = {
            "estimate_gib": estimate,
            "measured_max_allocated_gib": peak_alloc,
            "estimate_over_measured": round(estimate / peak_alloc, 3),
            "within_25_percent": abs(estimate / peak_alloc - 1) <= 0.25,
        }
    last = train[max(train)] if train else {}
    checks = {
        "steps_done": len(train) >= steps_requested,
        "actor_updated": any("actor/pg_loss" in m for m in train.values()),
        "critic_updated": any("critic/vf_loss" in m for m in train.values()),
        "rollout_hf": any(r.get("rollout_class") == "HFRollout" for r in readbacks),
        "fp32_params": bool(modules)
        and all(m["param_dtypes"] == ["torch.float32"] for m in modules),
        "sdpa": bool(modules) and all(m["attn_implementation"] == "sdpa" for m in modules),
        "capped_every_gpu": len(gpus) >= describe["gpu_count"]
        and all(g["cap_fraction"] and not g["cap_errors"] for g in gpus),
        "under_cap": bool(gpus) and all(g["max_reserved_gib"] <= cap for g in gpus),
    }
    return {
        **{k: v for k, v in describe.items() if k != "launch_script"},
        "steps_requested": steps_requested,
        "steps_done": len(train),
        "step_time_s": [m["timing_s/step"] for m in train.values()],
        "verl_step_metrics": {
            k: last.get(k)
            for k in (
                "perf/max_memory_allocated_gb",
                "perf/max_memory_reserved_gb",
                "timing_s/gen",
                "timing_s/update_actor",
                "timing_s/update_critic",
                "response_length/mean",
                "prompt_length/mean",
            )
        },
        "validation": {k: v for k, v in steps.get(0, {}).items() if k.startswith("val")},
        "peak_per_gpu": gpus,
        "estimate_vs_measured": versus,
        "readback": readbacks,
        "rc": rc,
        "timed_out": timed_out,
        "checks": checks,
        "ok": all(checks.values()) and rc == 0,
        "launch_script": describe["launch_script"],
    }


# --- the device ------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def keep_carry(stage: Path, carry: Path) -> Path:
    """The carried folder, kept in the stage for later calls on the same machine (the device
    removes carried paths before the next call): ``carry`` when carried, else the stage's copy."""
    kept = stage / "carry2"
    if (carry / "manifest.json").is_file():
        shutil.copytree(carry, kept, dirs_exist_ok=True)
        return carry
    if (kept / "manifest.json").is_file():
        return kept
    raise SystemExit(
        f"run_ppo: no {carry}/manifest.json and no copy in {stage}: run prepare.sh and carry "
        f"{carry} (benchmarks/gpu_ppo/README.md)"
    )


def stage_env(stage: Path, carry: Path) -> tuple[Path, Path]:
    """STAGE/site (the trainer's packages, verl unpatched yet) and STAGE/plan-site; once."""
    manifest = json.loads((carry / "manifest.json").read_text())
    site, plan_site = stage / "site", stage / "plan-site"
    marker = stage / "installed.json"
    if marker.is_file() and json.loads(marker.read_text()) == manifest:
        return site, plan_site
    wheels = stage / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    joined = wheels / manifest["split"]["wheel"]
    with joined.open("wb") as out:
        for part in manifest["split"]["parts"]:
            src = stage / part if (stage / part).is_file() else carry / part
            if not src.is_file():
                raise SystemExit(
                    f"run_ppo: {part} is neither in {stage} nor in {carry}: carry "
                    "build/gpu_ppo/carry1 in a first call and copy it to the stage (README.md)"
                )
            with src.open("rb") as fh:
                shutil.copyfileobj(fh, out)
    if _sha256(joined) != manifest["split"]["sha256"]:
        raise SystemExit(f"run_ppo: joined {joined.name} does not match its sha256: re-carry")
    all_wheels = [joined, *sorted((carry / "wheels").glob("*.whl"))]
    plan_only = [w for w in all_wheels if w.name.split("-")[0].lower() in PLAN_ONLY]
    trainer = [w for w in all_wheels if w not in plan_only]
    for target, group in ((site, trainer), (plan_site, plan_only)):
        shutil.rmtree(target, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        pip += ["--no-compile", "--no-cache-dir", "--target", str(target), *map(str, group)]
        subprocess.run(pip, check=True)
    marker.write_text(json.dumps(manifest))
    return site, plan_site


def patch_verl(site: Path, ref: str, profile: str) -> dict[str, Any]:
    """The project's verl rules for ``profile`` applied to the installed verl (idempotent)."""
    from p40fleet import verl_patches

    result = verl_patches.apply(site, ref, profile)
    record = json.loads((site / verl_patches.RECORD_NAME).read_text())
    return {
        "ref": ref,
        "profile": profile,
        "rules": record.get("rule_ids"),
        "actions": [f"{rule} {action}" for rule, action in result["actions"]],
        "notes": result["notes"],
    }


def build_model(model_dir: Path, assets: Path, site: Path, log) -> dict[str, Any]:
    """Random weights of the carried config on the GPU, saved like the real checkpoint."""
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        model_dir.mkdir(parents=True, exist_ok=True)
        code = (
            "import json, sys, torch\n"
            "from transformers import AutoConfig, AutoModelForCausalLM\n"
            "src, dst = sys.argv[1:3]\n"
            "config = AutoConfig.from_pretrained(src)\n"
            "torch.manual_seed(0)\n"
            "with torch.device('cuda'):\n"
            "    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)\n"
            "model.save_pretrained(dst, safe_serialization=True)\n"
            "n = sum(p.numel() for p in model.parameters())\n"
            "print(json.dumps({'parameters': n, 'class': type(model).__name__}))\n"
        )
        env = {**os.environ, "PYTHONPATH": str(site), **RUN_ENV}
        subprocess.run(
            [sys.executable, "-c", code, str(assets / "model"), str(model_dir)],
            check=True,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    for name in (
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ):
        shutil.copy2(assets / "model" / name, model_dir / name)
    return {"path": str(model_dir), "bytes": weights.stat().st_size}


def lay_out(plan, assets: Path, site: Path, log) -> dict[str, Any]:
    """The model, the data and the python where the plan's script looks for them."""
    python = Path(plan.python)
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    for src, dst in (("train.parquet", plan.train_file), ("test.parquet", plan.val_file)):
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(assets / "data" / src, dst)
    Path(plan.workdir).mkdir(parents=True, exist_ok=True)
    return build_model(Path(plan.model_path), assets, site, log)


def gpu_facts() -> list[dict[str, Any]]:
    """nvidia-smi's GPUs (name, memory), without initialising CUDA here."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    return [{"name": r[0], "memory": r[1], "driver": r[2]} for r in rows]


def run_launch(script: Path, args: list[str], env: dict, log_path: Path, timeout_s: int):
    """bash SCRIPT ARGS, output to the log; its whole process group is ended at the timeout."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            ["bash", str(script), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return proc.returncode, True


def run_one(name: str, args, repo: Path, stage: Path, carry: Path) -> dict[str, Any]:
    mode = PLANS[name]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / f"ppo-{name}.log"
    log_path.write_bytes(b"")
    t0 = time.monotonic()
    carry = keep_carry(stage, carry)
    site, plan_site = stage_env(stage, carry)
    for path in (plan_site, repo):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    spec = load_spec(args.prompt_length, args.response_length)
    assets = carry / "assets"
    plan = make_plan(mode, spec, assets / "model" / "config.json", json.loads(args.plan_kwargs))
    script_text = render(plan, repo)
    describe = describe_plan(name, mode, plan, script_text)
    patches = patch_verl(site, spec.verl.ref, plan.profile)
    with log_path.open("ab") as log:
        model = lay_out(plan, assets, site, log)
    script = Path(plan.workdir) / "launch-ppo.sh"
    script.write_text(script_text)
    script.chmod(0o755)
    meas = stage / f"meas-{name}"
    shutil.rmtree(meas, ignore_errors=True)
    meas.mkdir(parents=True)
    env = {**os.environ, **RUN_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE / "hook"), str(site)])
    env.update(P40_CAP_GIB=str(mode.cap_gib), P40_MEAS_DIR=str(meas))
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(mode.gpus))
    extra = [f"trainer.total_training_steps={args.steps}", *mode.forced, *args.override]
    setup_s = time.monotonic() - t0
    if args.smoke:
        return run_smoke(
            name, mode, plan, spec, describe, script, env, log_path, meas, args, setup_s
        )
    rc, timed_out = run_launch(script, extra, env, log_path, args.timeout_s)
    if timed_out:  # a killed trainer can leave Ray's daemons behind for the next plan
        subprocess.run(
            [sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"],
            env={**env, "PYTHONPATH": str(site)},
            capture_output=True,
        )
    log = log_path.read_text(errors="replace")
    summary = summarize(describe, log, meas, args.steps, rc, timed_out)
    summary.update(
        extra_overrides=extra,
        setup_s=round(setup_s, 1),
        run_s=round(time.monotonic() - t0 - setup_s, 1),
        gpus=gpu_facts(),
        model=model,
        verl_patches=patches,
        python=sys.version.split()[0],
    )
    (out / f"ppo-{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def run_smoke(name, mode, plan, spec, describe, script, env, log_path, meas, args, setup_s):
    """verify --smoke's own code path on this GPU: the job ``facts.smoke.SmokeStep`` runs on a
    host (``files/verify-smoke.sh.j2`` rendered by ``smoke_script.render_job``, with the
    overrides of ``smoke.smoke_overrides``), its output read by ``smoke.parse_smoke`` and judged
    by ``smoke.smoke_check``. Here it runs as root (a host runs it as the training user)."""
    from p40fleet.verification import smoke
    from p40fleet.verification.smoke_script import SmokeTargets, render_job

    targets = SmokeTargets(
        "verl", sys.executable, str(script), "/unused", spec.verl.ref, mode.gpus, args.timeout_s
    )
    job = Path(args.stage) / f"smoke-{name}.sh"
    job.write_text(render_job(targets))
    t0 = time.monotonic()
    with log_path.open("ab") as log:
        proc = subprocess.run(["sh", str(job), "no"], stdout=subprocess.PIPE, stderr=log, env=env)
    output = proc.stdout.decode(errors="replace")
    with log_path.open("a") as log:
        log.write(output)
    run = smoke.parse_smoke(output.splitlines())
    overrides = smoke.smoke_overrides(simulated=False, gpus=mode.gpus)
    check = smoke.smoke_check(
        run, model=Path(plan.model_path).name, overrides=overrides, timeout_s=args.timeout_s
    )
    summary = summarize(
        describe, output, meas, 1, run.int_value("rc"), run.values.get("timed_out") == "yes"
    )
    summary.update(
        smoke_check=check.to_dict(),
        smoke_overrides=overrides,
        smoke_job_sha256=hashlib.sha256(job.read_bytes()).hexdigest(),
        setup_s=round(setup_s, 1),
        run_s=round(time.monotonic() - t0, 1),
        gpus=gpu_facts(),
        python=sys.version.split()[0],
    )
    summary["ok"] = summary["ok"] and check.status == "PASS"
    out = Path(args.out)
    (out / f"smoke-{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plan", action="append", choices=sorted(PLANS), required=True)
    parser.add_argument("--stage", type=Path, default=Path("/tmp/p40stage"))
    parser.add_argument("--carry", type=Path, default=Path("build/gpu_ppo/carry2"))
    parser.add_argument("--out", default=os.environ.get("OUT") or "docs/measurements")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--timeout-s", type=int, default=420, help="per plan")
    parser.add_argument("--prompt-length", type=int, help="stack.training.max_prompt_length")
    parser.add_argument("--response-length", type=int, help="stack.training.max_response_length")
    parser.add_argument("--plan-kwargs", default="{}", help="JSON: extra plan_launch kwargs")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override")
    parser.add_argument("--render-only", action="store_true", help="print the script and exit")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="verify --smoke's job (one step) instead of the plan's run",
    )
    args = parser.parse_args(argv)
    repo = repo_root()
    if args.render_only:
        sys.path.insert(0, str(repo))
        spec = load_spec(args.prompt_length, args.response_length)
        config = args.carry / "assets" / "model" / "config.json"
        for name in args.plan:
            plan = make_plan(PLANS[name], spec, config, json.loads(args.plan_kwargs))
            print(f"# --- {name}: {json.dumps(plan_estimate(plan))}")
            print(render(plan, repo))
        return 0
    ok = True
    for name in args.plan:
        try:
            summary = run_one(name, args, repo, args.stage, args.carry)
        except Exception as exc:
            if type(exc).__name__ != "LaunchError":
                raise
            # the plan refused the host: a result, recorded with the plan's own words
            summary = {"plan": name, "refused": str(exc), "ok": False}
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"ppo-{name}.json").write_text(json.dumps(summary, indent=1))
            print(json.dumps(summary, indent=1))
            ok = False
            continue
        brief = {k: summary[k] for k in ("plan", "steps_done", "step_time_s", "peak_per_gpu")}
        print(json.dumps({**brief, "checks": summary["checks"], "ok": summary["ok"]}, indent=1))
        ok = ok and summary["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
