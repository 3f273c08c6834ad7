"""What several components' checks share: the deploys their remedies run, a command's first
line, whether a torch pin is a CUDA build, why the env's python gave no answer."""

from __future__ import annotations

from typing import Any

from packaging.version import InvalidVersion, Version

from p40fleet.verification.check import FAIL, Check, force_reinstall, no_answer
from p40fleet.verification.probe import CheckContext, Section

SYSTEM = "run `pyinfra -y INVENTORY deploy/system.py`"

PYTHON = "run `pyinfra -y INVENTORY deploy/python.py`"


def first_line(section: Section | None, limit: int = 200) -> str:
    if section is None:
        return ""
    for line in section.raw + section.noise:
        if line.strip():
            text = line.strip()
            return text if len(text) <= limit else text[: limit - 3] + "..."
    return ""


def is_cuda_build(torch_version: str) -> bool:
    try:
        local = Version(torch_version).local or ""
    except InvalidVersion:
        return False
    return local.lower().startswith("cu")


def python_missing(section: Section, primary: bool = False) -> str | None:
    """Why there is no answer when the env's interpreter is not there (full text: ``primary``)."""
    missing = section.get("missing")
    if not missing:
        return None
    if primary:
        return f"no python at {missing}: the conda env is missing"
    return "no conda env python (see python version)"


def py_failure(section: Section, what: str) -> str:
    """Why a Python snippet gave no answer: its exit status and the last noise line."""
    noise = section.noise
    tail = f": {noise[-1]}" if noise else ""
    if section.rc == 124:
        return f"{what} timed out{tail}"
    return f"{what} gave no answer (exit {section.rc}){tail}"


def package_answer(
    ctx: CheckContext, name: str, package: str
) -> tuple[dict[str, Any] | None, Check | None]:
    """The ``package`` snippet's answer, or check ``name``'s FAIL saying why there is none."""
    remedy = force_reinstall(package, PYTHON)
    section = ctx.answers.section(package)
    if section is None:
        return None, no_answer(name, f"import {package}", remedy)
    if missing := python_missing(section):
        return None, Check(name, FAIL, missing, PYTHON)
    answer = section.answer
    if answer is None:
        return None, Check(name, FAIL, py_failure(section, f"import {package}"), remedy)
    return answer, None
