"""The conda env's check: its python version."""

from __future__ import annotations

from p40fleet.verification.check import FAIL, PASS, Check, force_reinstall, no_answer
from p40fleet.verification.checks._common import PYTHON, py_failure, python_missing
from p40fleet.verification.probe import CheckContext


def python_version(ctx: CheckContext) -> Check:
    name = "python version"
    pinned = ctx.spec.python_version
    remedy = force_reinstall("env", PYTHON)
    section = ctx.answers.section("python")
    if section is None:
        return no_answer(name, "the env's python", remedy)
    if missing := python_missing(section, primary=True):
        return Check(name, FAIL, missing, PYTHON)
    answer = section.answer
    if answer is None:
        return Check(name, FAIL, py_failure(section, "the env's python"), remedy)
    found = answer.get("version")
    if found == pinned:
        return Check(name, PASS, f"python {found} ({answer.get('executable')})")
    return Check(name, FAIL, f"env python is {found}, expected {pinned}", remedy)
