"""The CUDA check: the toolkit's nvcc release."""

from __future__ import annotations

import re

from p40fleet.verification.check import FAIL, PASS, Check, force_reinstall, no_answer
from p40fleet.verification.checks._common import SYSTEM, first_line
from p40fleet.verification.probe import CheckContext


def nvcc(ctx: CheckContext) -> Check:
    name = "nvcc"
    release = ctx.spec.cuda_release
    section = ctx.answers.section("nvcc")
    remedy = (
        force_reinstall("cuda", SYSTEM) + f" (stack.paths.cuda_dir must be the {release} toolkit)"
    )
    if section is None:
        return no_answer(name, "nvcc --version", remedy)
    missing = section.get("missing")
    if missing:
        return Check(
            name,
            FAIL,
            f"no nvcc at {missing}",
            f"{SYSTEM} (installs CUDA {ctx.spec.cuda.version})",
        )
    found = None
    for line in section.raw:
        if match := re.search(r"release (\d+\.\d+), V(\d+(?:\.\d+)*)", line):
            found = match
            break
    if found is None:
        why = first_line(section) or f"exit {section.rc}"
        return Check(name, FAIL, f"nvcc --version says no release ({why})", remedy)
    text = f"release {found.group(1)}, V{found.group(2)}"
    if found.group(1) == release:
        return Check(name, PASS, text)
    return Check(name, FAIL, f"nvcc: {text}, expected release {release}", remedy)
