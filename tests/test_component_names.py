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


#: facts/ and operations/ modules that several components share, or whose tests sit under
#: another name in docs/internals.md's Layout table: the test file that imports them.
TESTED_ELSEWHERE = {
    "facts/env.py": "test_conda.py",  # the env's python and markers: conda, torch, Apex, verl
    "facts/home.py": "test_homesafe.py",  # the training user's files, read as that user
    "facts/host.py": "test_host_facts.py",  # OS, kernel, space, CPUs, memory: every layer's
    "facts/packages.py": "test_driver.py",  # dpkg's state: the driver's build prerequisites
    "operations/training_user.py": "test_homesafe.py",  # the user whose home root never acts in
    "facts/footprint.py": "test_uninstall.py",  # what uninstall reads; test_footprint: the doc
    "operations/ray.py": "test_ray_ops.py",  # test_ray.py: p40fleet/ray.py and the Ray checks
}


def _layer_modules() -> list[str]:
    return [
        f"{layer}/{p.name}"
        for layer in ("facts", "operations")
        for p in sorted((ROOT / layer).glob("*.py"))
        if p.stem != "__init__"
    ]


def _imported(test_file: Path) -> set[str]:
    """Every module ``test_file`` imports (``from p40fleet.facts import env`` counts as
    ``p40fleet.facts.env``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(test_file.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _dotted(module: str) -> str:
    return "p40fleet." + module.removesuffix(".py").replace("/", ".")


def test_a_components_facts_and_operations_share_its_test_files_name():
    """``facts/<c>.py`` and ``operations/<c>.py`` are tested in ``tests/test_<c>.py``, which
    imports them: one component, one name (facts/mirror.py and operations/mirror.py, the apt
    source included, in tests/test_mirror.py)."""
    wrong = []
    for module in _layer_modules():
        test = ROOT / "tests" / TESTED_ELSEWHERE.get(module, f"test_{Path(module).stem}.py")
        if not test.is_file() or _dotted(module) not in _imported(test):
            wrong.append(f"{module}: {test.relative_to(ROOT)}")
    assert wrong == [], f"facts/operations modules not imported by their test file: {wrong}"
    stale = sorted(set(TESTED_ELSEWHERE) - set(_layer_modules()))
    assert stale == [], f"TESTED_ELSEWHERE names modules that are gone: {stale}"


#: ``survey`` names one thing, the one command per host that answers many facts: its fact and
#: memo, and the run's list of what each module asks (``survey_parts(spec)``, declared by each).
SURVEY_MODULES = ("facts/survey.py", "operations/run/survey.py")


def test_only_the_survey_modules_define_a_survey():
    """A function or class named ``*survey*`` outside SURVEY_MODULES says survey for another
    thing (deploy/facts.py's fleet-table row was ``_survey()``)."""
    found = []
    code = [
        p
        for top in ("deploy", "facts", "operations", "p40fleet")
        for p in (ROOT / top).rglob("*.py")
    ]
    for path in sorted(code):
        relative = path.relative_to(ROOT).as_posix()
        if relative in SURVEY_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            defines = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if defines and "survey" in node.name.lower() and node.name != "survey_parts":
                found.append(f"{relative}:{node.lineno} {node.name}")
    assert found == [], f"named survey outside {SURVEY_MODULES}: {found}"
