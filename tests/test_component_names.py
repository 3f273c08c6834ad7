"""One component, one file name in every layer (docs/internals.md, Layout): each verify check
module ``p40fleet/verification/checks/<component>.py`` has a ``facts/<component>.py`` or an
``operations/<component>.py`` (what it checks is what those read and do) and its tests in
``tests/test_<component>.py``. ``_common`` is no component: what several share."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ROOT / "p40fleet" / "verification" / "checks"


def _components() -> list[str]:
    return sorted(p.stem for p in CHECKS.glob("*.py") if not p.stem.startswith("_"))


def test_every_check_module_is_named_as_a_facts_or_operations_module():
    components = _components()
    assert components, f"no check module in {CHECKS.relative_to(ROOT)}"
    unnamed = [
        c
        for c in components
        if not (ROOT / "facts" / f"{c}.py").is_file()
        and not (ROOT / "operations" / f"{c}.py").is_file()
    ]
    assert unnamed == [], (
        f"checks/<name>.py with no facts/<name>.py or operations/<name>.py: {unnamed}"
    )


def test_every_check_module_has_its_component_test_file():
    missing = [c for c in _components() if not (ROOT / "tests" / f"test_{c}.py").is_file()]
    assert missing == [], f"checks/<name>.py with no tests/test_<name>.py: {missing}"


def _decorator_name(node: ast.expr) -> str:
    """``operation`` for ``@operation``, ``@operation()`` and ``@api.operation(...)``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _holds_an_operation(path: Path) -> bool:
    return any(
        isinstance(node, ast.FunctionDef)
        and any(_decorator_name(d) == "operation" for d in node.decorator_list)
        for node in ast.walk(ast.parse(path.read_text()))
    )


def _without_operations() -> list[str]:
    return sorted(
        p.stem
        for p in (ROOT / "operations").glob("*.py")
        if p.stem != "__init__" and not _holds_an_operation(p)
    )


def test_every_module_directly_under_operations_holds_an_operation():
    """A module with no ``@operation`` belongs in ``operations/util/`` (helpers) or
    ``operations/run/`` (the run's glue): ``operations/<component>.py`` names a component."""
    stray = _without_operations()
    assert stray == [], (
        f"operations/<name>.py with no @operation: {stray}; move each to operations/util/ "
        "(a helper of operations) or operations/run/ (the run's glue)"
    )
