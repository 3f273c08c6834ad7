"""The project's shell scripts rendered from ``files/*.sh.j2`` (the verify probe, the smoke
step, the collective check): one jinja environment for all of them. Strict (an unknown name is
an error, not an empty string), no HTML escaping, trailing newline kept, and a ``q`` filter that
quotes a value as one shell word."""

from __future__ import annotations

import shlex
from functools import cache, lru_cache
from pathlib import Path

import jinja2

__all__ = ["shell_template"]


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env


@cache
def shell_template(path: Path) -> jinja2.Template:
    """The template at ``path``, read once."""
    return _environment().from_string(Path(path).read_text())
