"""Every adaptation of pyinfra, paramiko or inspect lives in ``p40fleet/runtime/``, listed here.

The project code (``deploy/``, ``facts/``, ``operations/``, ``p40fleet/``, ``p40lab/``,
``benchmarks/`` and ``config.py``; not ``tests/``, which patch on purpose, through pytest's
``monkeypatch``) is read with :mod:`ast` (nothing is imported) and each of these is a sighting:

- **cli**: an import of ``pyinfra_cli`` (the command line's internals, not ``pyinfra.api``);
- **internal**: a name imported from pyinfra beyond its public surface (:func:`_public`);
- **private**: an ``_underscore`` name imported from, or read off, pyinfra, paramiko or inspect;
- **patch**: a store or delete (``X.a = ...``, ``setattr(X, ...)``, ``del X.a``) on something
  reached from a pyinfra, paramiko, pyinfra_cli or inspect import (a class or a module, or
  what hangs off pyinfra's ``host``: ``host.connector.x = ...``). A store on the context
  objects ``host``, ``state``, ``config`` and ``inventory`` themselves is not counted: it
  patches nothing (an attribute of ours on the State is ``tests/test_run_record.py``'s to
  catch: the run's record is ``p40fleet.run_record``), and ``config.SUDO = True`` is pyinfra's
  own way;
- **sys.modules**: a write into ``sys.modules`` (``sys.modules[k] = m``, ``.update``,
  ``.setdefault``, ``del``): how ``inspect.getmodule`` is steered;
- **transport**: a reach into a connection's paramiko transport (``.connector.client``,
  ``get_transport``, ``_active_check_timeout``);
- **run order**: a host failed from outside an operation (``.fail_hosts(...)``): it leans on
  when pyinfra picks each operation's hosts (``p40fleet.runtime.host_gate`` says when).

``getattr(x, "name")`` reads as ``x.name`` and ``setattr(x, "name", v)`` as a store to it, so
neither form hides one. A sighting in ``p40fleet/runtime/`` must be listed in
:data:`ADAPTATIONS` under its module (what it adapts is the module's docstring); one anywhere
else fails, unless :data:`NOT_ADAPTATIONS` names it with the reason it adapts nothing.
"""

from __future__ import annotations

import ast
import functools
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("deploy", "facts", "operations", "p40fleet", "p40lab", "benchmarks", "config.py")
RUNTIME = "p40fleet/runtime/"

#: The adaptations, by the module that holds each: exactly the sightings the scan finds there.
ADAPTATIONS: dict[str, set[str]] = {
    "p40fleet/runtime/sshguard.py": {
        "patch: SSHConnector.<setattr>",  # run_shell_command, put_file, get_file
        "patch: SSHConnector.connect",
    },
    "p40fleet/runtime/ssh_poll.py": {
        "transport: .connector.client",
        "transport: .get_transport",
    },
    "p40fleet/runtime/deploy_frames.py": {"sys.modules: sys.modules[...] ="},
    "p40fleet/runtime/included.py": {"internal: Host.deploy"},
    "p40fleet/runtime/inventory.py": {
        "cli: pyinfra_cli.inventory.make_inventory",
        "internal: pyinfra.context.ctx_config",
        "internal: pyinfra.context.ctx_state",
    },
    "p40fleet/runtime/connector_args.py": {
        "internal: pyinfra.api.arguments.CONNECTOR_ARGUMENT_KEYS",
        "internal: pyinfra.api.arguments.pop_global_arguments",
    },
    "p40fleet/runtime/templates.py": {"internal: pyinfra.api.util.get_template"},
    "p40fleet/runtime/host_gate.py": {"run order: .fail_hosts"},
}

#: Sightings outside ``p40fleet/runtime/`` that adapt nothing of pyinfra, paramiko or inspect.
NOT_ADAPTATIONS: dict[tuple[str, str], str] = {
    ("p40fleet/verl_patches.py", "sys.modules: sys.modules[...] ="): (
        "importlib's recipe for importing a source file (files/verl_patches.py, the applier) "
        "as a module, under its own name: it stands for no deploy file's frame"
    ),
}

_ROOTS = ("pyinfra", "pyinfra_cli", "paramiko", "inspect")
#: pyinfra's context objects: a store on them patches nothing of pyinfra (see the module doc).
_CONTEXT = {"host", "state", "config", "inventory"}
_PYINFRA_TOP = {"host", "state", "config", "inventory", "local", "logger"}
_TRANSPORT = {"get_transport", "_active_check_timeout"}
#: ``op._inner``: pyinfra's own way to run an operation inside another (``api/operation.py``
#: tells the user to call it; ``arguments_typed.py`` types it), so not a private name.
_DOCUMENTED_UNDERSCORE = {"_inner"}
_SYS_MODULES_WRITES = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__"}


def _public_module(module: str) -> bool:
    """A pyinfra module whose every public name is public: the API's exports and exceptions,
    the facts, the operations and the connectors (pyinfra's plugin interface)."""
    return module in ("pyinfra", "pyinfra.api", "pyinfra.api.exceptions") or module.startswith(
        ("pyinfra.facts", "pyinfra.operations", "pyinfra.connectors")
    )


def _public(module: str, name: str) -> bool:
    """pyinfra's public surface: ``from pyinfra import host/state/...``, what ``pyinfra.api``
    exports (from whichever submodule defines it), its exceptions, the facts, the operations
    and the connectors."""
    if name.startswith("_"):
        return False
    if module == "pyinfra":
        return name in _PYINFRA_TOP
    if _public_module(module):
        return True
    api = importlib.import_module("pyinfra.api")
    exported = getattr(api, name, None)
    if exported is None:
        return False
    if module == "pyinfra.api":
        return True
    try:
        return getattr(importlib.import_module(module), name, None) is exported
    except ImportError:
        return False


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` (``getattr(a, "b")`` alike; a name not a literal is ``<getattr>``) as
    ``["a", "b", "c"]``; None when the root is not a plain name (a call, a subscript)."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif _is_getattr(node):
            name = node.args[1]
            parts.append(name.value if isinstance(name, ast.Constant) else "<getattr>")
            node = node.args[0]
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            return parts[::-1]
        else:
            return None


def _is_call_of(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == name
        and len(node.args) >= 2
    )


def _is_getattr(node: ast.AST) -> bool:
    return _is_call_of(node, "getattr") or _is_call_of(node, "hasattr")


def _bound_imports(tree: ast.AST) -> dict[str, str]:
    """Names bound by an import of pyinfra, pyinfra_cli, paramiko or inspect -> what they are."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in _ROOTS:
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] in _ROOTS:
                for alias in node.names:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def sightings(source: str) -> Iterator[str]:
    """Every sighting (see the module's doc) in one module's ``source``."""
    tree = ast.parse(source)
    bound = _bound_imports(tree)

    def reached(owner: list[str]) -> bool:
        """Is ``owner`` (what is stored on) pyinfra's, paramiko's or inspect's? ``state`` or
        ``host`` itself is not (no patch), what hangs off it is (``host.connector``)."""
        if owner[0] not in bound:
            return False
        return len(owner) > 1 or owner[0] not in _CONTEXT

    def store(target: ast.AST, attr: str | None = None) -> Iterator[str]:
        chain = _dotted(target)
        if chain is None:
            return
        if attr is not None:
            chain = [*chain, attr]
        if len(chain) > 1 and reached(chain[:-1]):
            yield f"patch: {'.'.join(chain)}"

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            top = node.module.split(".")[0]
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if top == "pyinfra_cli":
                    yield f"cli: {full}"
                elif top in _ROOTS and alias.name.startswith("_"):
                    yield f"private: {full}"
                elif top == "pyinfra" and not _public(node.module, alias.name):
                    yield f"internal: {full}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top == "pyinfra_cli":
                    yield f"cli: {alias.name}"
                elif top == "pyinfra" and not _public_module(alias.name):
                    yield f"internal: {alias.name}"
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                for one in target.elts if isinstance(target, ast.Tuple | ast.List) else [target]:
                    if isinstance(one, ast.Subscript) and _dotted(one.value) == ["sys", "modules"]:
                        yield "sys.modules: sys.modules[...] ="
                    elif isinstance(one, ast.Attribute):
                        yield from store(one)
        elif isinstance(node, ast.Call):
            func = node.func
            if _is_call_of(node, "setattr") or _is_call_of(node, "delattr"):
                name = node.args[1]
                attr = name.value if isinstance(name, ast.Constant) else "<setattr>"
                yield from store(node.args[0], attr)
            elif isinstance(func, ast.Attribute) and func.attr in _SYS_MODULES_WRITES:
                if _dotted(func.value) == ["sys", "modules"]:
                    yield f"sys.modules: sys.modules.{func.attr}"
            # Host.deploy: pyinfra's own context behind @deploy and local.include (internal)
            called = _dotted(func)
            if called and called[-2:] == ["host", "deploy"] and called[0] in bound:
                yield "internal: Host.deploy"
            elif isinstance(func, ast.Attribute) and func.attr == "fail_hosts":
                yield "run order: .fail_hosts"
        if isinstance(node, ast.Attribute) or _is_getattr(node):
            chain = _dotted(node)
            if chain is None:
                continue
            last = chain[-1]
            if last in _TRANSPORT:
                yield f"transport: .{last}"
            elif last == "client" and len(chain) > 1 and chain[-2] == "connector":
                yield "transport: .connector.client"
            elif last.startswith("_") and not last.startswith("__") and chain[0] in bound:
                if last in _DOCUMENTED_UNDERSCORE:
                    continue
                yield f"private: {'.'.join(chain)}"


def _sources() -> list[Path]:
    found: list[Path] = []
    for top in SCANNED:
        path = ROOT / top
        found += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return found


@functools.cache
def tree_sightings() -> dict[str, frozenset[str]]:
    """``relative path -> its sightings`` for every scanned module with at least one."""
    found: dict[str, set[str]] = {}
    for path in _sources():
        seen = frozenset(sightings(path.read_text()))
        if seen:
            found[path.relative_to(ROOT).as_posix()] = seen
    return found


def test_no_adaptation_of_pyinfra_paramiko_or_inspect_outside_the_runtime():
    stray = sorted(
        f"{path}: {seen}"
        for path, found in tree_sightings().items()
        if not path.startswith(RUNTIME)
        for seen in found
        if (path, seen) not in NOT_ADAPTATIONS
    )
    assert not stray, (
        "adaptations of pyinfra/paramiko/inspect outside p40fleet/runtime/ (move each to a "
        "module there, installed through a pyinfra hook where one exists, and list it in "
        "ADAPTATIONS):\n  " + "\n  ".join(stray)
    )


def test_the_runtime_holds_exactly_the_listed_adaptations():
    found = {p: s for p, s in tree_sightings().items() if p.startswith(RUNTIME)}
    assert found == ADAPTATIONS


def test_every_exception_is_still_there():
    found = tree_sightings()
    assert [key for key in NOT_ADAPTATIONS if key[1] not in found.get(key[0], set())] == []


def test_each_runtime_module_says_what_it_adapts_why_and_against_which_versions():
    for path in sorted((ROOT / RUNTIME).glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if path.name == "__init__.py":
            listed = {Path(p).stem for p in ADAPTATIONS}
            assert all(f"runtime.{stem}`" in doc for stem in listed), doc
            continue
        assert "Adapts" in doc, f"{path.name}: say what it adapts"
        assert "Checked against pyinfra 3." in doc, f"{path.name}: say the version checked"
        assert f"{RUNTIME}{path.name}" in ADAPTATIONS, f"{path.name}: list it in ADAPTATIONS"


def test_the_runtime_is_installed_explicitly_never_on_import():
    """Importing every runtime module patches nothing and enters nothing in sys.modules
    beyond the modules themselves (a fresh interpreter)."""
    import subprocess
    import sys

    script = """
import sys
from pyinfra.connectors.ssh import SSHConnector
before = {n: SSHConnector.__dict__.get(n) for n in
          ("connect", "run_shell_command", "put_file", "get_file")}
import p40fleet.runtime.connector_args, p40fleet.runtime.deploy_frames, p40fleet.runtime.inventory
import p40fleet.runtime.ssh_poll, p40fleet.runtime.sshguard, p40fleet.runtime.templates
import p40fleet.runtime.host_gate
from p40fleet.runtime import deploy_frames
changed = [n for n, m in before.items() if SSHConnector.__dict__.get(n) is not m]
entered = [n for n in sys.modules if n.startswith(deploy_frames.PREFIX)]
assert not changed and not entered, (changed, entered)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# The scan itself, on made-up modules: what is a sighting and what is not.


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "from pyinfra_cli.inventory import make_inventory",
            "cli: pyinfra_cli.inventory.make_inventory",
        ),
        ("import pyinfra_cli.util", "cli: pyinfra_cli.util"),
        (
            "from pyinfra.api.arguments import pop_global_arguments",
            "internal: pyinfra.api.arguments.pop_global_arguments",
        ),
        ("from pyinfra.api.util import get_template", "internal: pyinfra.api.util.get_template"),
        ("from pyinfra.api.host import _x", "private: pyinfra.api.host._x"),
        ("import pyinfra.api.util\npyinfra.api.util.get_template(s)", "internal: pyinfra.api.util"),
        (
            "import paramiko\nparamiko.Transport._active_check_timeout = 1",
            "patch: paramiko.Transport._active_check_timeout",
        ),
        (
            "from pyinfra.connectors.ssh import SSHConnector\nSSHConnector.connect = f",
            "patch: SSHConnector.connect",
        ),
        (
            "from pyinfra.connectors.ssh import SSHConnector as C\nsetattr(C, name, f)",
            "patch: C.<setattr>",
        ),
        ("from pyinfra.api import Host\nsetattr(Host, 'get_fact', f)", "patch: Host.get_fact"),
        ("from pyinfra.api import State\ndel State.fail_hosts", "patch: State.fail_hosts"),
        (
            "import pyinfra.api.host\npyinfra.api.host.Host.connect = f",
            "patch: pyinfra.api.host.Host.connect",
        ),
        ("import inspect\ninspect.getmodule = f", "patch: inspect.getmodule"),
        (
            "from pyinfra import host\nhost.connector_cls.run_shell_command = f",
            "patch: host.connector_cls.run_shell_command",
        ),
        ("from pyinfra import host\nhost._x", "private: host._x"),
        ("import inspect\ninspect._filesbymodname.clear()", "private: inspect._filesbymodname"),
        ("import sys\nsys.modules['x'] = m", "sys.modules: sys.modules[...] ="),
        ("import sys\nsys.modules.update(x=m)", "sys.modules: sys.modules.update"),
        ("import sys\nsys.modules.setdefault('x', m)", "sys.modules: sys.modules.setdefault"),
        ("h.connector.client.get_transport().sock.settimeout(1)", "transport: .get_transport"),
        ("getattr(getattr(h, 'connector', None), 'client', None)", "transport: .connector.client"),
        ("t = getattr(c, 'get_transport')()", "transport: .get_transport"),
        (
            "from pyinfra import host\nwith host.deploy('x', None, None):\n    pass",
            "internal: Host.deploy",
        ),
        ("def operation_start(state, op):\n    state.fail_hosts({h})", "run order: .fail_hosts"),
    ],
)
def test_the_scan_sees(source, expected):
    assert expected in set(sightings(source))


@pytest.mark.parametrize(
    "source",
    [
        "from pyinfra import host, state, local, logger",
        "from pyinfra.api import FactBase, StringCommand, operation, BaseStateCallback",
        "from pyinfra.api.state import BaseStateCallback",  # exported by pyinfra.api too
        "from pyinfra.api.exceptions import ConnectError",
        "from pyinfra.facts.server import Users\nfrom pyinfra.operations import files",
        "from pyinfra.connectors.ssh import SSHConnector\nissubclass(c, SSHConnector)",
        "import paramiko\nt = paramiko.Transport(sock)",
        "import inspect\ninspect.signature(f)\ninspect.getsource(c)",
        "from pyinfra import state\nsetattr(state, 'p40fleet_x', 1)",  # test_run_record's
        "from pyinfra import state\nstate.p40fleet_y = {}",
        "from pyinfra import config\nconfig.SUDO = True",  # pyinfra's own deploy-file config
        "import sys\nx = sys.modules.get('a')\nsys.modules['a'].b",
        "sock.settimeout(1.0)",  # a socket of one's own (p40lab)
        "from pyinfra.operations import files\nfiles.put._inner(src=s, dest=d)",
        "def f(g):\n    g.p40fleet_guarded = True",
    ],
)
def test_the_scan_passes(source):
    assert list(sightings(source)) == []
