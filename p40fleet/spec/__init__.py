"""The validated stack spec: what a P40 host gets, pinned and checked before anything runs.

The package, one job per module (imports run one way: fields <- proxy, rules <- pins <- errors
<- load):

- ``pins.py``: the pinned models with their defaults, which are the real pins (start there),
  and the supported OS releases;
- ``fields.py``: validators, ``Annotated`` field types and the safe alphabets;
- ``rules.py``: the rules across fields (a changed pin with its own sum, the env inside the
  home, ports apart, ...), attached to the models in ``pins.py``;
- ``proxy.py``: ``stack.proxy`` and :func:`redact` (a proxy password never shown);
- ``errors.py``: :class:`SpecError` and pydantic's errors translated into admin words;
- ``load.py``: :func:`deep_merge`, :func:`load_spec`, :func:`spec_for_host` and its cache.

Every public name is re-exported here: ``from p40fleet.spec import StackSpec, load_spec``.
"""

from p40fleet.spec import pins as _pins
from p40fleet.spec.errors import SpecError
from p40fleet.spec.fields import Problem
from p40fleet.spec.load import (
    clear_spec_cache,
    deep_merge,
    host_key_problem,
    load_spec,
    spec_for_host,
    stray_host_key,
    trust_anchor_overrides,
)
from p40fleet.spec.pins import *  # noqa: F403  (the pinned models, listed once: pins.__all__)

__all__ = [
    *_pins.__all__,
    "Problem",
    "SpecError",
    "clear_spec_cache",
    "deep_merge",
    "host_key_problem",
    "load_spec",
    "spec_for_host",
    "stray_host_key",
    "trust_anchor_overrides",
]
