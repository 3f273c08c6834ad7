"""Every ``stack`` setting with its default, generated from the spec itself.

``python -m p40fleet.spec.table --write`` rewrites ``docs/settings.md``;
``tests/test_spec_table.py`` fails when the file and the spec disagree (a setting added, a
default changed), so the table never drifts. The "what" column is the comment above the
field in ``p40fleet/spec/``.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
import typing
from collections.abc import Iterator

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from p40fleet import gendoc
from p40fleet.gendoc import cell
from p40fleet.paths import REPO
from p40fleet.spec.pins import StackSpec

DOC = REPO / "docs" / "settings.md"
_FIELD = re.compile(r"^\s{4}(\w+)\s*:")


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """``{field: the comment block right above it}`` in the class body (all bases)."""
    out: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            lines = inspect.getsource(cls).splitlines()
        except (OSError, TypeError):
            continue
        block: list[str] = []
        for line in lines[1:]:
            stripped = line.strip()
            if stripped.startswith("#") and re.match(r"^ {4}#", line):
                block.append(stripped.lstrip("#").strip())
                continue
            match = _FIELD.match(line)
            if match and match[1] in cls.model_fields and block:
                out[match[1]] = " ".join(block)
            block = []
    return out


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def rows(model: type[BaseModel] = StackSpec, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """``(setting, default, what)`` for every leaf setting, depth first in declaration order.
    A setting that is a model of its own (``mirror``, ``proxy``, an archive) with no default
    is listed (default: unset), then its fields."""
    notes = _comments(model)
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        default = field.get_default(call_default_factory=True)
        what = notes.get(name, "")
        nested = _models_in(field.annotation)
        if isinstance(default, BaseModel):
            yield from rows(type(default), path + ".")
            continue
        yield path, _show(default), what
        for sub in nested:
            yield from rows(sub, path + ".")


def _show(value: object) -> str:
    if value is PydanticUndefined:
        return "required (when the section is set)"
    if value is None:
        return "unset"
    if isinstance(value, (tuple, list)) and not value:
        return "(none)"
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def render() -> str:
    table = list(rows())
    lines = [
        "# Every `stack` setting and its default",
        "",
        "Generated from `p40fleet/spec/` by `python -m p40fleet.spec.table --write`;",
        "`tests/test_spec_table.py` keeps it in sync. Set them in `inventories/group_data/all.py`",
        "(`stack = {...}`, nested dicts) or per host (`stack_host`). A nested setting that is",
        "unset (`mirror`, `proxy`, an archive) takes the fields under it only when you set it.",
        f"{len(table)} settings.",
        "",
        "| setting | default | what |",
        "|---|---|---|",
    ]
    for path, default, what in table:
        lines.append(f"| `{path}` | {cell(default)} | {cell(what)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return gendoc.main("p40fleet.spec.table", lambda: {DOC: render()}, argv)


if __name__ == "__main__":
    sys.exit(main())
