"""The project's static import graph: no import circles, and the layers import one way.

The graph is read with :mod:`ast` from the source of ``deploy/``, ``facts/``, ``operations/``,
``p40fleet/`` and ``p40lab/`` (nothing is imported). An edge ``a -> b`` is any ``import`` or
``from ... import`` in ``a`` that names a project module ``b``, **at module level and inside
functions alike** (a function-level import is a circle that is only postponed); imports under
``if TYPE_CHECKING:`` are left out (they never run). ``from pkg import name`` counts as an edge
to ``pkg.name`` when that is a module, else to ``pkg`` itself; relative imports are resolved.
A module's own parent package (run by Python before the module) is not an edge unless the
module names it. ``deploy/*.py`` are files pyinfra executes, not a package: they are nodes
named ``deploy.<stem>`` that nothing may import.

A circle is a strongly connected component of more than one module; the test lists each one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Each scanned folder and the dotted name its modules import by: facts/ and operations/ are
#: installed as ``p40fleet.facts`` and ``p40fleet.operations`` (pyproject.toml's package-dir).
PACKAGES = {
    "deploy": "deploy",
    "facts": "p40fleet.facts",
    "operations": "p40fleet.operations",
    "p40fleet": "p40fleet",
    "p40lab": "p40lab",
}


def _modules() -> dict[str, Path]:
    """Every project module by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for folder, dotted in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [dotted, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, skipping ``if TYPE_CHECKING:`` bodies (not their else)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _edges(name: str, is_package: bool, tree: ast.AST, modules: Iterable[str]) -> set[str]:
    """The project modules that module ``name`` (its source parsed as ``tree``) imports."""
    modules = set(modules)

    def known(target: str) -> str | None:
        """The module ``target`` is, or the nearest project package above it."""
        while target:
            if target in modules:
                return target
            target = target.rpartition(".")[0]
        return None

    edges: set[str] = set()
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        for target in targets:
            hit = known(target)
            if hit is not None and hit != name:
                edges.add(hit)
    return edges


def import_graph() -> dict[str, set[str]]:
    """``module -> the project modules it imports`` (see the module doc for what counts)."""
    modules = _modules()
    return {
        name: _edges(name, path.name == "__init__.py", ast.parse(path.read_text()), modules)
        for name, path in modules.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    arrows = [f"    {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return f"  circle of {len(component)}: {', '.join(component)}\n" + "\n".join(arrows)


def test_the_project_imports_in_no_circle():
    graph = import_graph()
    found = circles(graph)
    assert not found, f"{len(found)} import circle(s):\n" + "\n".join(
        _describe(graph, c) for c in found
    )


#: Subpackages of p40fleet that are layers of their own (the user's folders, and the deploys'
#: bodies, which are the deploy layer packaged).
LAYER_PACKAGES = {"p40fleet.facts": "facts", "p40fleet.operations": "operations",
                  "p40fleet.deploys": "deploy"}  # fmt: skip


def _top(module: str) -> str:
    """The layer a module belongs to."""
    for package, layer in LAYER_PACKAGES.items():
        if module == package or module.startswith(package + "."):
            return layer
    return module.split(".", 1)[0]


#: Which top-level folder may import which (besides itself). The floors, top to bottom:
#: ``deploy`` -> ``operations`` -> ``facts`` -> ``p40fleet``; ``p40lab`` (the simulated lab)
#: stands beside them and reads only the pure core's pins.
ALLOWED = {
    "deploy": {"operations", "facts", "p40fleet"},
    "operations": {"facts", "p40fleet"},
    "facts": {"p40fleet"},
    "p40fleet": set(),
    "p40lab": {"p40fleet"},
}


def test_the_layers_import_one_way():
    """Nothing imports ``deploy/``; ``operations/`` no deploy; ``facts/`` no operations or
    deploy; ``p40fleet/`` none of the others; the lab none of the deploy code."""
    graph = import_graph()
    wrong = sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if _top(b) != _top(a) and _top(b) not in ALLOWED[_top(a)]
    )
    assert not wrong, "imports against the floors:\n  " + "\n  ".join(wrong)


def test_the_reader_counts_function_level_imports_and_skips_type_checking():
    """The reader itself, on a made-up module: what is an edge and what is not."""
    source = """
from typing import TYPE_CHECKING
import os
from pkg import sub, CONSTANT
from . import sibling
from .deep.inner import thing
if TYPE_CHECKING:
    from pkg.hidden import Only
else:
    import pkg.shown

def lazy():
    from pkg.later import call
"""
    modules = ["pkg", "pkg.sub", "pkg.me", "pkg.sibling", "pkg.deep", "pkg.deep.inner",
               "pkg.hidden", "pkg.shown", "pkg.later"]  # fmt: skip
    edges = _edges("pkg.me", False, ast.parse(source), modules)
    assert edges == {"pkg", "pkg.sub", "pkg.sibling", "pkg.deep.inner", "pkg.shown", "pkg.later"}
    # in a package's __init__, "." is the package itself
    assert _edges("pkg", True, ast.parse("from .sub import x"), modules) == {"pkg.sub"}


def test_circles_are_the_strongly_connected_components():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "e"}, "e": set()}) == [
        ["a", "b"],
        ["c", "d"],
    ]
    assert circles({"a": {"b"}, "b": set()}) == []
    # the real graph sees a real function-level import (p40fleet/runtime/sshguard.py reports there)
    assert import_graph()["p40fleet.runtime.sshguard"] >= {"p40fleet.report"}


def test_the_user_folders_are_imported_only_by_their_package_names():
    """``facts/`` and ``operations/`` are importable from the checkout as top-level names too
    (pyinfra puts the working directory on sys.path); a module imported under both names is
    two modules (two fact classes, two caches), and an installed p40fleet has no such names."""
    wrong = []
    for folder in (*PACKAGES, "tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in _imports(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if not node.level
                    else []
                )
                wrong += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: {name}"
                    for name in names
                    if name.split(".", 1)[0] in ("facts", "operations")
                ]
    assert not wrong, "import these as p40fleet.facts / p40fleet.operations:\n  " + "\n  ".join(
        wrong
    )
