"""Spec errors in admin words: :class:`SpecError`, and pydantic's errors translated into it.

One line per problem::

    host lab1: stack.cuda.sha256 = 'abc': expected 64 hex characters (sha256sum of the file)
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from p40fleet.spec.fields import _Problems
from p40fleet.spec.pins import StackSpec
from p40fleet.spec.proxy import redact


def _short_repr(value: Any, limit: int = 90) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SpecError(ValueError):
    """A stack spec that does not validate. ``str()`` is one admin-readable line per problem.

    ``host``, ``field``, ``value``, ``expected`` describe the first problem; ``problems`` holds
    all of them as ``(field, value, expected)`` tuples.
    """

    def __init__(
        self,
        host: str,
        field: str,
        value: Any,
        expected: str,
        *,
        problems: Iterable[tuple[str, Any, str]] | None = None,
    ):
        # A proxy URL's password never reaches an error text (nor the error's attributes).
        self.host = host
        self.field = field
        self.value = redact(value)
        self.expected = redact(expected)
        self.problems: tuple[tuple[str, Any, str], ...] = tuple(
            (f, redact(v), redact(e))
            for f, v, e in (problems if problems is not None else [(field, value, expected)])
        )
        super().__init__(str(self))

    @classmethod
    def from_problems(cls, host: str, problems: Iterable[tuple[str, Any, str]]) -> SpecError:
        problems = list(problems)
        field, value, expected = problems[0]
        return cls(host, field, value, expected, problems=problems)

    def lines(self) -> list[str]:
        return [
            f"host {self.host}: {field} = {_short_repr(value)}: {expected}"
            for field, value, expected in self.problems
        ]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __reduce__(self):
        return (_rebuild_spec_error, (self.host, self.problems))


def _rebuild_spec_error(host, problems):
    return SpecError.from_problems(host, problems)


def _unwrap_optional(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model class reached by following ``loc`` from StackSpec (None if not a model)."""
    model: Any = StackSpec
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _unwrap_optional(field.annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model
    return None


def _get_path(data: Any, loc: tuple) -> tuple[bool, Any]:
    for part in loc:
        if isinstance(data, Mapping) and part in data:
            data = data[part]
        elif isinstance(data, (list, tuple)) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return False, None
    return True, data


_TYPE_WORDS = {
    "string_type": "expected a string (in quotes)",
    "int_type": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    "bool_type": "expected True or False",
    "bool_parsing": "expected True or False",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "missing": "required setting is missing",
}


def _dotted(loc: tuple) -> str:
    text = "stack"
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _expected_for(error: Mapping[str, Any], loc: tuple) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = ", ".join(parent.model_fields) if parent else "?"
        return f"unknown key {loc[-1]!r} (allowed: {allowed})"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        model = _model_at(loc)
        if model is not None:
            return f"expected a dict with keys from: {', '.join(model.model_fields)}"
        return "expected a dict"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected', '')}"
    if kind == "greater_than":
        return f"expected a number greater than {ctx.get('gt')}"
    if kind in ("greater_than_equal", "less_than_equal"):
        model_field = loc[-1] if loc else ""
        if model_field == "uid":
            return "expected a uid from 1000 to 60000 (a regular, non-system user)"
        bound = ctx.get("ge", ctx.get("le"))
        word = "at least" if kind == "greater_than_equal" else "at most"
        return f"expected a number {word} {bound}"
    if kind == "string_too_short":
        return "expected a non-empty string"
    if kind in _TYPE_WORDS:
        return _TYPE_WORDS[kind]
    return f"{error['msg'][:1].lower()}{error['msg'][1:]}"


def _problems_from(exc: ValidationError, merged: Mapping, stack_host: Mapping | None) -> list:
    out: list[tuple[str, Any, str]] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, _Problems):
            items = [(loc + p.loc, p.value, p.expected) for p in cause.problems]
        else:
            found, value = _get_path(merged, loc)
            items = [(loc, value if found else error.get("input"), _expected_for(error, loc))]
        for full_loc, value, expected in items:
            if stack_host:
                in_host, _ = _get_path(stack_host, full_loc)
                if in_host:
                    expected = f"{expected}; value set in stack_host"
            field = _dotted(full_loc)
            out.append((field, value, expected))
    return out
