"""Run a pyinfra operation offline: facts in, commands out.

Every ``@operation()`` keeps its undecorated generator as ``op._inner``. Calling it inside
``ctx_state.use(state)`` + ``ctx_host.use(host)`` runs exactly the code pyinfra runs on a real
host, except that here ``host.get_fact`` answers from a dict given by the test (nothing connects
anywhere) and ``host.noop``/``host.log`` are recorded.

Usage::

    from tests.opharness import at, run_op
    from p40fleet.facts.host import FreeSpace
    from p40fleet.facts.cuda import CudaToolkit, GccMajor

    result = run_op(
        cuda.toolkit,                       # the decorated operation (or its ._inner)
        runfile="/var/cache/p40fleet/cuda.run", version="11.8.0", ...,   # the op's arguments
        facts={
            GccMajor: 11,                                        # asked with any arguments
            at(FreeSpace, path="/var/cache/p40fleet"): info,     # only with these arguments
            CudaToolkit: lambda cuda_dir: CudaInstall(),         # called with the arguments
        },
        data={"stack": {...}},              # host data (optional)
    )
    result.commands     # ["mkdir -p /tmp", "sh /var/cache/... --silent ..."]  (str)
    result.raw          # the yielded pyinfra command objects
    result.noops        # ["CUDA 11.8.89 already installed ..."]
    result.logs         # messages given to host.log / host.log_styled
    result.failures     # messages of refusals (FunctionCommands named _fail / _refuse)
    result.asked        # every fact asked, as FactKey(cls, kwargs) (str(): "Fact(path='/x')")
    result.changed      # bool(commands)

Strings in ``commands``:

* ``StringCommand`` -> its raw (unmasked) shell string, quoting as the host would see it;
* ``FileUploadCommand`` -> ``"upload <dest>"``; its text in ``result.uploads[dest]``;
* ``FunctionCommand`` -> ``"function <name>"`` (``result.functions`` holds the objects).

A key made with ``at()`` wins over a bare class key. Facts a test does not provide raise
:class:`MissingFact` (naming the fact and its arguments), so a test always states what the
host looks like. Pass ``default_facts=True`` to answer
missing ones with the fact's ``default()`` instead.

Fact arguments are matched after binding them to the fact's ``command`` signature, so
``host.get_fact(X, "/a")`` and ``host.get_fact(X, path="/a")`` hit the same ``at(X, path="/a")``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from io import StringIO
from typing import Any

from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.context import ctx_host, ctx_state

__all__ = ["FactKey", "MissingFact", "OpResult", "at", "make_host", "run_op"]

#: Names a refusal's FunctionCommand may have (operations.refuse.refuse uses ``_fail``).
FAIL_FUNCTION_NAMES = ("_fail", "_refuse")
#: Timing steps (operations.util.progress.Stopwatch) change nothing: left out of ``commands``.
TIMING_TEXTS = ("function _stopwatch_start", "function _stopwatch_stop")


@dataclass(frozen=True)
class FactKey:
    """A fact class plus the exact arguments it is asked with (see :func:`at`)."""

    cls: type
    kwargs: tuple[tuple[str, Any], ...]

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs)
        return f"{self.cls.__name__}({args})"


def _frozen(value: Any) -> Any:
    """Lists (e.g. pyinfra's ``services=[...]``) as tuples, so fact keys stay hashable."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def at(cls: type, **kwargs: Any) -> FactKey:
    """Key for ``facts``: fact ``cls`` asked with exactly these keyword arguments."""
    return FactKey(cls, tuple(sorted((k, _frozen(v)) for k, v in kwargs.items())))


class MissingFact(KeyError):
    """The operation asked for a fact the test did not give."""


@dataclass
class OpResult:
    commands: list[str] = field(default_factory=list)
    raw: list[Any] = field(default_factory=list)
    noops: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    uploads: dict[str, str] = field(default_factory=dict)
    functions: list[FunctionCommand] = field(default_factory=list)
    facts_asked: list[str] = field(default_factory=list)
    asked: list[FactKey] = field(default_factory=list)  # the same asks, as keys

    @property
    def changed(self) -> bool:
        return bool(self.raw)

    @property
    def failures(self) -> list[str]:
        """Texts of refusal commands: their closure's ``message`` or their arguments."""
        out = []
        for func in self.functions:
            if func.function.__name__ not in FAIL_FUNCTION_NAMES:
                continue
            out.append(_function_text(func))
        return out

    @property
    def text(self) -> str:
        """Everything as one string (commands, failures, noops, logs) for loose asserts."""
        return "\n".join([*self.commands, *self.failures, *self.noops, *self.logs])


def _function_text(func: FunctionCommand) -> str:
    closure = inspect.getclosurevars(func.function)
    parts = [str(v) for v in closure.nonlocals.values() if isinstance(v, str)]
    parts += [str(a) for a in func.args] + [str(v) for v in func.kwargs.values()]
    return "\n".join(parts)


def _bound_kwargs(cls: type, args: tuple, kwargs: dict) -> dict[str, Any]:
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("_")}
    try:
        sig = inspect.signature(cls().command)
        bound = sig.bind(*args, **kwargs)
    except (TypeError, ValueError):
        if args:
            raise
        return dict(kwargs)
    return dict(bound.arguments)


def make_host(data: Mapping[str, Any] | None = None, name: str = "lab1"):
    """A real pyinfra ``(state, host)`` pair for an inventory of one host (never connected)."""
    inventory = Inventory(([(name, dict(data or {}))], {}))
    state = State(inventory, Config())
    return state, inventory.get_host(name)


def _render(command: Any, result: OpResult) -> str:
    if isinstance(command, str):
        return command.strip()
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    if isinstance(command, FileUploadCommand):
        src = command.src
        if isinstance(src, StringIO):
            result.uploads[command.dest] = src.getvalue()
        elif hasattr(src, "read"):
            result.uploads[command.dest] = src.read()
        return f"upload {command.dest}"
    if isinstance(command, FunctionCommand):
        result.functions.append(command)
        return f"function {command.function.__name__}"
    return repr(command)


def run_op(
    op: Callable[..., Any],
    *args: Any,
    facts: Mapping[type | FactKey, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    default_facts: bool = False,
    host_name: str = "lab1",
    **kwargs: Any,
) -> OpResult:
    """Run ``op``'s generator (``op._inner`` if decorated) for one fake host; see module doc."""
    facts = dict(facts or {})
    state, host = make_host(data, host_name)
    result = OpResult()

    def get_fact(cls: type, *fargs: Any, **fkwargs: Any) -> Any:
        bound = _bound_kwargs(cls, fargs, fkwargs)
        key = FactKey(cls, tuple(sorted((k, _frozen(v)) for k, v in bound.items())))
        result.facts_asked.append(str(key))
        result.asked.append(key)
        if key in facts:
            value = facts[key]
        elif cls in facts:
            value = facts[cls]
        elif default_facts:
            return cls().default()
        else:
            raise MissingFact(f"test gave no fact {key} (add it to facts=...)")
        return value(**bound) if callable(value) and not isinstance(value, type) else value

    def log(message: str, log_func: Any = None) -> None:  # noqa: ARG001
        result.logs.append(message)

    def log_styled(message: str, log_func: Any = None, **_: Any) -> None:  # noqa: ARG001
        result.logs.append(message)

    host.get_fact = get_fact  # type: ignore[method-assign]
    host.noop = result.noops.append  # type: ignore[method-assign]
    host.log = log  # type: ignore[method-assign]
    host.log_styled = log_styled  # type: ignore[method-assign]

    func = getattr(op, "_inner", op)
    with ctx_state.use(state), ctx_host.use(host):
        for command in func(*args, **kwargs):
            result.raw.append(command)
            text = _render(command, result)
            if text not in TIMING_TEXTS:  # util.progress.Stopwatch: in raw/functions only
                result.commands.append(text)
    return result


def commands_of(results: Iterable[OpResult]) -> list[str]:
    """All commands of several results, in order (for multi-op scenarios)."""
    return [c for r in results for c in r.commands]
