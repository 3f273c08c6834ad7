"""The Apex checks: its imports, its CUDA extensions and its build key."""

from __future__ import annotations

from p40fleet.verification.check import (
    FAIL,
    PASS,
    SIMULATED,
    SKIP,
    Check,
    force_reinstall,
    no_answer,
)
from p40fleet.verification.checks._common import PYTHON, is_cuda_build, package_answer
from p40fleet.verification.probe import CheckContext


def apex(ctx: CheckContext) -> Check:
    name = "apex"
    answer, problem = package_answer(ctx, name, "apex")
    if problem is not None:
        return problem
    assert answer is not None
    bad = [f"import {m}: {answer.get(m)}" for m in ("apex", "apex_C") if answer.get(m) != "ok"]
    if not bad:
        return Check(name, PASS, "import apex, apex_C: ok")
    return Check(name, FAIL, "; ".join(bad), force_reinstall("apex", PYTHON))


def _apex_cuda_ext(ctx: CheckContext) -> bool:
    cuda_ext = getattr(ctx.spec.apex, "cuda_ext", None)
    return is_cuda_build(ctx.spec.torch.version) if cuda_ext is None else bool(cuda_ext)


def apex_cuda(ctx: CheckContext) -> Check:
    name = "apex cuda ext"
    if not _apex_cuda_ext(ctx):
        return Check(
            name,
            SKIP,
            f"the torch pin {ctx.spec.torch.version} is a CPU build: Apex is built without "
            "CUDA extensions",
        )
    if ctx.sim:
        return Check(name, SKIP, f"{SIMULATED}: the lab's Apex has no CUDA extensions")
    answer, problem = package_answer(ctx, name, "apex")
    if problem is not None:
        return problem
    assert answer is not None
    modules = ("amp_C", "fused_layer_norm_cuda")
    bad = [f"import {m}: {answer.get(m)}" for m in modules if answer.get(m) != "ok"]
    if not bad:
        return Check(name, PASS, "import amp_C, fused_layer_norm_cuda: ok")
    return Check(
        name,
        FAIL,
        "; ".join(bad),
        f"Apex was built without its CUDA extensions or against another torch: "
        f"{force_reinstall('apex', PYTHON)} (CUDA_HOME = {ctx.spec.paths.cuda_dir})",
    )


def apex_key(ctx: CheckContext) -> Check:
    name = "apex build key"
    if ctx.apex_key is None:
        return Check(name, SKIP, "no expected build key (no known GPU in the PCI facts)")
    section = ctx.answers.section("apex-key")
    remedy = force_reinstall("apex", PYTHON)
    if section is None:
        return no_answer(name, "the Apex build key", remedy)
    missing = section.get("missing")
    if missing:
        return Check(name, FAIL, f"no Apex build key recorded ({missing})", remedy)
    found = section.get("key")
    if found == ctx.apex_key:
        return Check(name, PASS, f"built for {found}")
    return Check(
        name,
        FAIL,
        f"Apex installed is built for {found}, the spec needs {ctx.apex_key}",
        remedy,
    )
