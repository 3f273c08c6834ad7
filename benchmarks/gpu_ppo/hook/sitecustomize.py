"""GPU PPO harness hook: a P40's memory cap and read-backs in every Python process (Ray too).

Python imports ``sitecustomize`` at start-up from the first ``sys.path`` entry that has one;
run_ppo.py puts this folder first on ``PYTHONPATH`` for the launch script, so the trainer, Ray's
workers and anything they spawn load it. Inert unless ``P40_CAP_GIB`` is set.

* When a process initialises CUDA (never earlier: processes without a GPU stay untouched), every
  visible device gets ``torch.cuda.set_per_process_memory_fraction(cap / total)``, and a daemon
  thread writes the process's peak allocated/reserved memory to ``$P40_MEAS_DIR/mem-<pid>.json``
  once a second.
* After verl's FSDP workers finish ``init_model``, the models they built are read back (the
  attention implementation in the model config, parameter dtypes, FSDP mixed precision, the
  rollout class) into ``$P40_MEAS_DIR/readback-<pid>-<role>.json`` and one ``p40-readback:`` line.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time

_CAP_GIB = os.environ.get("P40_CAP_GIB")
_DIR = os.environ.get("P40_MEAS_DIR") or "/tmp"
_GIB = 1024**3


def _write(name: str, data: dict) -> None:
    path = os.path.join(_DIR, name)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, default=str)
    os.replace(tmp, path)


def _memory_state(torch, caps: dict) -> dict:
    devices = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        devices.append(
            {
                "index": i,
                "name": torch.cuda.get_device_name(i),
                "total_gib": total / _GIB,
                "cap_fraction": caps.get(i),
                "max_allocated_gib": torch.cuda.max_memory_allocated(i) / _GIB,
                "max_reserved_gib": torch.cuda.max_memory_reserved(i) / _GIB,
                "allocated_gib": torch.cuda.memory_allocated(i) / _GIB,
                "device_used_gib": (total - free) / _GIB,
            }
        )
    return devices


def _poll(torch, caps: dict, errors: list) -> None:
    pid = os.getpid()
    used_max: dict[int, float] = {}
    while True:
        try:
            devices = _memory_state(torch, caps)
            for d in devices:
                used_max[d["index"]] = max(used_max.get(d["index"], 0.0), d["device_used_gib"])
                d["device_used_max_gib"] = used_max[d["index"]]
            _write(
                f"mem-{pid}.json",
                {
                    "pid": pid,
                    "argv0": sys.argv[0] if sys.argv else "",
                    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "cap_gib": float(_CAP_GIB),
                    "cap_errors": errors,
                    "time": time.time(),
                    "devices": devices,
                },
            )
        except Exception as exc:  # a poll must never take the worker down
            print(f"p40-hook: memory poll failed: {exc!r}", file=sys.stderr)
        time.sleep(1.0)


def _on_cuda_init() -> None:
    import torch

    caps: dict = {}
    errors: list = []
    cap = float(_CAP_GIB) * _GIB
    for i in range(torch.cuda.device_count()):
        try:
            total = torch.cuda.get_device_properties(i).total_memory
            fraction = min(1.0, cap / total)
            torch.cuda.set_per_process_memory_fraction(fraction, i)
            caps[i] = fraction
        except Exception as exc:  # recorded: the summary refuses an uncapped run
            errors.append(f"device {i}: {exc!r}")
    print(f"p40-hook: pid {os.getpid()} memory cap {_CAP_GIB} GiB, fractions {caps}", flush=True)
    threading.Thread(target=_poll, args=(torch, caps, errors), daemon=True).start()


def _torch_loaded(torch) -> None:
    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if lazy_call is not None:
        lazy_call(_on_cuda_init)  # runs inside CUDA's lazy init, or now if already initialised
        return
    original = torch.cuda._lazy_init  # older/newer torch without _lazy_call

    def lazy_init():
        was = torch.cuda.is_initialized()
        original()
        if not was and torch.cuda.is_initialized():
            _on_cuda_init()

    torch.cuda._lazy_init = lazy_init


def _module_view(module) -> dict:
    inner = getattr(module, "_fsdp_wrapped_module", None) or getattr(module, "module", module)
    config = getattr(inner, "config", None)
    mixed = getattr(module, "mixed_precision", None)
    return {
        "wrapper": type(module).__name__,
        "model_class": type(inner).__name__,
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "config_torch_dtype": str(getattr(config, "torch_dtype", None)),
        "param_dtypes": sorted({str(p.dtype) for p in module.parameters()}),
        "param_count": sum(p.numel() for p in module.parameters()),
        "mixed_precision": None
        if mixed is None
        else {k: str(getattr(mixed, k, None)) for k in ("param_dtype", "reduce_dtype")},
    }


_count = iter(range(1 << 30))


def _readback(worker, role: str) -> None:
    # one process holds several workers (actor+rollout, ref, critic): one file each
    role = str(getattr(worker, "role", role))
    out = {"pid": os.getpid(), "role": role, "worker": type(worker).__name__, "modules": {}}
    for attr in ("actor_module_fsdp", "ref_module_fsdp", "critic_module", "reward_module"):
        module = getattr(worker, attr, None)
        if module is not None and hasattr(module, "parameters"):
            out["modules"][attr] = _module_view(module)
    rollout = getattr(worker, "rollout", None)
    if rollout is not None:
        out["rollout_class"] = type(rollout).__name__
    _write(f"readback-{os.getpid()}-{next(_count)}-{role}.json", out)
    print("p40-readback: " + json.dumps(out, default=str), flush=True)


def _wrap_init_model(cls, role: str) -> None:
    original = cls.init_model

    @functools.wraps(original)  # keeps verl's @register attributes (dispatch mode)
    def init_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        try:
            _readback(self, role)
        except Exception as exc:
            print(f"p40-hook: read-back failed: {exc!r}", file=sys.stderr, flush=True)
        return result

    cls.init_model = init_model


def _verl_workers_loaded(module) -> None:
    for name, role in (("ActorRolloutRefWorker", "actor_rollout_ref"), ("CriticWorker", "critic")):
        cls = getattr(module, name, None)
        if cls is not None:
            _wrap_init_model(cls, role)


class _AfterImport:
    """A meta-path finder that runs a hook once a named module has executed."""

    def __init__(self, hooks: dict):
        self.hooks = hooks

    def find_spec(self, name, path, target=None):
        if name not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        hook = self.hooks.pop(name)
        loader = spec.loader
        exec_module = loader.exec_module

        def run(module):
            exec_module(module)
            try:
                hook(module)
            except Exception as exc:
                print(f"p40-hook: hook for {name} failed: {exc!r}", file=sys.stderr, flush=True)

        loader.exec_module = run
        return spec


if _CAP_GIB:
    sys.meta_path.insert(
        0,
        _AfterImport({"torch": _torch_loaded, "verl.workers.fsdp_workers": _verl_workers_loaded}),
    )
