"""JSON for the facts' answers: ``pyinfra INVENTORY fact facts.X.Y`` and ``pyinfra --json``.

pyinfra's CLI serialises a fact's answer with ``json.dumps(..., default=json_encode)``
(``pyinfra_cli/util.py``): dicts, lists, strings, numbers and sets pass, an object with a
``to_json()`` method is written as what it returns, anything else is ``TypeError: Cannot
serialize``. Every dataclass a fact returns (or holds) inherits :class:`ToJson`; a set of names
is a :class:`NameSet`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set
from datetime import date, datetime
from typing import Any

__all__ = ["NameSet", "ToJson", "plain"]


def plain(value: Any) -> Any:
    """``value`` as JSON's types: dataclasses as dicts, sets sorted, mappings with str keys,
    times in ISO 8601."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {
            k if isinstance(k, (str, int, float, bool)) else str(k): plain(v)
            for k, v in value.items()
        }
    if isinstance(value, Set):
        items = [plain(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


class ToJson:
    """The ``to_json()`` hook pyinfra's CLI uses: a dataclass as a dict of its fields."""

    __slots__ = ()

    def to_json(self) -> Any:
        return plain(self)


class NameSet(frozenset, ToJson):
    """A frozenset of names that pyinfra's CLI writes as a sorted list."""

    __slots__ = ()
