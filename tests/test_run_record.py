"""One record of the run per pyinfra State (``p40fleet.run_record``), and no State attribute
of ours anywhere else.

The project code and the tests are read with :mod:`ast` (nothing is imported). A sighting is
a ``getattr``/``setattr``/``hasattr``/``delattr`` on a State, or a store or delete of an
attribute on one (``state.x = ...``), whose name is not pyinfra's own State attribute (a name
that is no literal, ``getattr(state, _ATTR)`` with a constant of another module, counts). A
State is a name ``state``, ``*_state`` or ``run`` (the project's name for a run's State),
anything's ``.state`` (``host.state``, ``target.state``) and a parameter annotated ``State``.
``p40lab/`` is not read: its ``state`` is the lab's own (``p40lab/state.py``), and it imports
no pyinfra (checked below).
"""

from __future__ import annotations

import ast
import gc
import inspect
from pathlib import Path

from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_state

from p40fleet.run_record import RunRecord, run_record

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("deploy", "facts", "operations", "p40fleet", "benchmarks", "config.py", "tests")
RECORD = "p40fleet/run_record.py"
_ATTRIBUTE_CALLS = {"getattr", "setattr", "hasattr", "delattr"}


def _pyinfra_names() -> set[str]:
    """What pyinfra's State has of its own: its class, its annotations, a real one's fields."""
    made = State(Inventory((["@local"], {})), Config())
    return set(dir(State)) | set(inspect.get_annotations(State)) | set(vars(made))


def _annotated_states(tree: ast.AST) -> set[str]:
    """The parameters annotated ``State`` (``run: State``) anywhere in the module."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            text = ast.unparse(node.annotation).strip("'\"")
            if text == "State" or text.endswith(".State"):
                found.add(node.arg)
    return found


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's own string constants (``_X_ATTR = "..."``), to read ``getattr(s, _X)``."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def sightings(source: str, pyinfra: set[str]) -> list[str]:
    """Every State attribute of ours that ``source`` reads, stores or deletes (module doc)."""
    tree = ast.parse(source)
    params = _annotated_states(tree)
    constants = _constants(tree)

    def is_state(node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in ("state", "run") or node.id.endswith("_state") or node.id in params
        return isinstance(node, ast.Attribute) and node.attr == "state"

    def name_of(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return None

    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _ATTRIBUTE_CALLS
            and len(node.args) >= 2
            and is_state(node.args[0])
        ):
            name = name_of(node.args[1])
            if name not in pyinfra:
                where = ast.unparse(node.args[0])
                found.append((node.lineno, f"{node.func.id}({where}, {name or '?'})"))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
            if is_state(node.value) and node.attr not in pyinfra:
                store = "del {}" if isinstance(node.ctx, ast.Del) else "{} ="
                found.append((node.lineno, store.format(ast.unparse(node))))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def _sources() -> list[Path]:
    found: list[Path] = []
    for top in SCANNED:
        path = ROOT / top
        found += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return [p for p in found if ".venv" not in p.parts and p.relative_to(ROOT).as_posix() != RECORD]


def test_no_module_keeps_an_attribute_on_the_state():
    pyinfra = _pyinfra_names()
    stray = [
        f"{path.relative_to(ROOT).as_posix()} {seen}"
        for path in _sources()
        for seen in sightings(path.read_text(), pyinfra)
    ]
    assert not stray, (
        "attributes of ours on pyinfra's State (keep them as fields of "
        "p40fleet.run_record.RunRecord):\n  " + "\n  ".join(stray)
    )


def test_the_lab_imports_no_pyinfra_so_its_state_is_its_own():
    for path in sorted((ROOT / "p40lab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else names
                assert not any(m.split(".")[0] == "pyinfra" for m in modules), path


def test_the_scan_sees_each_form_and_passes_pyinfras_own_names():
    pyinfra = _pyinfra_names()
    seen = sightings(
        "_A = 'p40fleet_a'\n"
        "getattr(state, _A, None)\n"
        "setattr(host.state, 'p40fleet_b', {})\n"
        "hasattr(target_state, other._C)\n"
        "state.p40fleet_d = set()\n"
        "del target.state.p40fleet_e\n"
        "def f(run: State):\n    setattr(run, 'p40fleet_f', 1)\n"
        "def g(held: 'pyinfra.api.State', run: object):\n"
        "    getattr(run, 'p40fleet_g', None)\n    held.p40fleet_h = 1\n",
        pyinfra,
    )
    assert [s.split(": ", 1)[1] for s in seen] == [
        "getattr(state, p40fleet_a)",
        "setattr(host.state, p40fleet_b)",
        "hasattr(target_state, ?)",
        "state.p40fleet_d =",
        "del target.state.p40fleet_e",
        "setattr(run, p40fleet_f)",
        "getattr(run, p40fleet_g)",
        "held.p40fleet_h =",
    ]
    assert not sightings(
        "state.failed_hosts = set()\n"
        "getattr(state, 'is_executing', False)\n"
        "state.cwd = '/'\n"
        "getattr(host, 'state', None)\n"
        "fact.state = 'ok'\n"
        "monkeypatch.setattr(state, 'x', 1)\n",
        pyinfra,
    )


def test_one_record_per_state():
    first, second = State(), State()
    assert isinstance(run_record(first), RunRecord)
    assert run_record(first) is run_record(first)
    assert run_record(first) is not run_record(second)
    run_record(first).refused_hosts.add("lab1")
    assert run_record(second).refused_hosts == set()
    assert run_record(first).refused_hosts == {"lab1"}


def test_pyinfras_state_proxy_is_the_current_states_record():
    """``from pyinfra import state`` (the context proxy) reaches the current State's record,
    and one made through it is the State's, gone with it: not the proxy's, which lives on (a
    later State at the same address would find it)."""
    from pyinfra import state

    from p40fleet import run_record as module

    first, second = State(), State()
    with ctx_state.use(first):
        made = run_record(state)
        assert made is run_record(first)
    with ctx_state.use(second):
        assert run_record(state) is run_record(second) is not run_record(first)
    del first
    gc.collect()
    assert all(record is not made for record in module._RECORDS.values())


def test_the_state_gets_no_attribute_and_its_record_goes_with_it():
    made = State()
    before = dict(vars(made))
    record = run_record(made)
    record.lock_held.add("lab1")
    assert vars(made) == before
    from p40fleet import run_record as module

    assert made in module._RECORDS
    del made
    gc.collect()
    assert all(kept is not record for kept in module._RECORDS.values())
