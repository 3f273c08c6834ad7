"""The torch checks: its version, CUDA and the capability it sees."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from p40fleet.verification.check import (
    FAIL,
    PASS,
    SIMULATED,
    SKIP,
    Check,
    force_reinstall,
)
from p40fleet.verification.checks._common import PYTHON, is_cuda_build, package_answer
from p40fleet.verification.probe import CheckContext


def _cc(cap: tuple[int, int] | list[int] | None) -> str:
    return "?" if not cap else f"{cap[0]}.{cap[1]}"


def _torch_line(answer: Mapping[str, Any]) -> str:
    """``2.6.0+cu118 True (6, 1)``: version, is_available(), get_device_capability()."""
    text = f"{answer.get('version')} {answer.get('cuda_available')}"
    cap = answer.get("capability")
    if cap:
        text += f" ({cap[0]}, {cap[1]})"
    return text


def _torch_answer(ctx: CheckContext, name: str) -> tuple[dict[str, Any] | None, Check | None]:
    """The torch snippet's answer, or the FAIL saying why there is none."""
    answer, problem = package_answer(ctx, name, "torch")
    if answer is not None and answer.get("error"):
        remedy = force_reinstall("torch", PYTHON)
        return None, Check(name, FAIL, f"import torch failed: {answer['error']}", remedy)
    return answer, problem


def torch_version(ctx: CheckContext) -> Check:
    name = "torch version"
    pinned = ctx.spec.torch.version
    answer, problem = _torch_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    found = answer.get("version")
    if found == pinned:
        return Check(name, PASS, _torch_line(answer))
    return Check(
        name,
        FAIL,
        f"torch {found} in the env, expected {pinned}",
        force_reinstall("torch", PYTHON),
    )


def _gpu_skip(ctx: CheckContext, name: str) -> Check | None:
    """SKIP for checks that need a real GPU behind a CUDA torch."""
    if ctx.sim:
        return Check(name, SKIP, f"{SIMULATED}: no real GPU behind torch.cuda")
    if not is_cuda_build(ctx.spec.torch.version):
        return Check(
            name,
            SKIP,
            f"the torch pin {ctx.spec.torch.version} is a CPU build: no CUDA to check",
        )
    return None


def torch_cuda(ctx: CheckContext) -> Check:
    name = "torch cuda"
    if skip := _gpu_skip(ctx, name):
        return skip
    answer, problem = _torch_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    if answer.get("cuda_available") is True:
        return Check(
            name,
            PASS,
            f"torch.cuda.is_available() True: {answer.get('device_count')} device(s), "
            f"CUDA {answer.get('cuda_version')}",
        )
    return Check(
        name,
        FAIL,
        f"torch.cuda.is_available() is {answer.get('cuda_available')} "
        f"(torch {answer.get('version')}, torch.version.cuda {answer.get('cuda_version')})",
        "nvidia-smi must answer first (driver loaded: see nvidia-smi driver); torch must be the "
        f"{ctx.spec.torch.version} build ({force_reinstall('torch', PYTHON)}); "
        "CUDA_VISIBLE_DEVICES must not hide the GPUs",
    )


def torch_capability(ctx: CheckContext) -> Check:
    name = "torch capability"
    if skip := _gpu_skip(ctx, name):
        return skip
    if ctx.lowest is None:
        return Check(name, SKIP, "no known GPU in the PCI facts to compare with (see gpus)")
    answer, problem = _torch_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    if answer.get("cuda_available") is not True:
        return Check(name, SKIP, "torch.cuda is not available (see torch cuda)")
    caps = [tuple(c) for c in answer.get("capabilities") or [] if len(c) == 2]
    device0 = answer.get("capability")
    if not caps and device0:
        caps = [tuple(device0)]
    if not caps:
        return Check(
            name, FAIL, "torch reported no device capability", force_reinstall("torch", PYTHON)
        )
    lowest_torch = min(caps)
    shown = f"({device0[0]}, {device0[1]})" if device0 else _cc(lowest_torch)
    if lowest_torch == tuple(ctx.lowest):
        return Check(
            name,
            PASS,
            f"torch.cuda.get_device_capability() {shown}; lowest {_cc(lowest_torch)} = "
            f"lowest on the PCI bus {_cc(ctx.lowest)}",
        )
    return Check(
        name,
        FAIL,
        f"torch sees lowest capability {_cc(lowest_torch)} (device 0: {shown}), the PCI facts "
        f"say {_cc(ctx.lowest)}",
        "torch does not see the GPUs the host has: check CUDA_VISIBLE_DEVICES and "
        "`nvidia-smi -L`; a GPU the driver does not bind is missing here",
    )
