"""Facts asked once per host between changes, many of them in one command (pyinfra's public API).

pyinfra 3.10 has no fact cache: every ``host.get_fact`` runs a command, and every operation's
body runs twice (once while preparing, again while executing). This module keeps the answers
itself, through three public pieces of pyinfra:

* :class:`Survey`, a fact whose command runs many facts' commands, each in its own subshell
  (the ``requires_command`` check done in shell), and whose output is cut back into parts by
  markers; :func:`survey` asks it and files each part's answer, processed by the part's own
  ``process``/``default``, in the host's memo;
* :func:`ask` (``ask(host, Fact, **kwargs)``), which the operations call instead of
  ``host.get_fact``: an answer in the memo is served, any other is asked with ``host.get_fact``
  and kept;
* :class:`Forget`, a ``BaseStateCallback`` that turns a host's memo off for the rest of the
  run as soon as one of its operations changes (or may change) anything, or fails: from then on
  every ask is a live ``host.get_fact``, so an operation after a change sees it.

Nothing is patched and nothing happens on import: :func:`install` registers the callback for a
State (``deploy/preflight.py`` calls it; idempotent). Without it, :func:`ask` is
``host.get_fact`` (the unit tests' fake hosts, ``deploy/facts.py``).
"""

from __future__ import annotations

import copy
import functools
import inspect
import pickle
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gevent.lock
from pyinfra import logger
from pyinfra.api import FactBase, StringCommand
from pyinfra.api.state import BaseStateCallback

from p40fleet.jsonable import ToJson

MARKER = "@@p40fleet-survey"
MISSING = "missing"  # a part's status when its requires_command is not on the host
_BOOKS_ATTR = "p40fleet_survey_books"

#: One part of a survey: the fact class and its keyword arguments, frozen (see :func:`key`).
Part = tuple[type, tuple[tuple[str, Any], ...]]


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


@functools.cache
def _signature(cls: type) -> inspect.Signature:
    return inspect.signature(cls().command)


def key(cls: type, kwargs: dict[str, Any]) -> Part:
    """The memo's key for ``cls`` asked with ``kwargs``: defaults filled in from the signature
    of ``cls.command``, so ``ask(X)`` and ``ask(X, path=DEFAULT)`` are the same question."""
    try:
        bound = _signature(cls).bind(**kwargs)
        bound.apply_defaults()
        kwargs = dict(bound.arguments)
    except TypeError:
        pass  # pyinfra reports bad arguments its own way when the fact is asked
    return cls, _freeze(kwargs)


def part(cls: type, **kwargs: Any) -> Part:
    """A survey part: ``part(FreeSpace, path="/var/cache")``."""
    return key(cls, kwargs)


def one_write(command: Any) -> StringCommand:
    """``command`` with its stdout held by the shell and written at once when it ends.

    A survey's parts (and the verify probe's sections) each print a few lines, and sshd sends
    every write as its own packet: 270 packets of about 100 bytes for a 27 KB survey, each one
    decrypted and MAC-checked by paramiko in Python and handed across greenlets on the
    controller. Held in a shell variable and written by one ``printf``, the same bytes arrive
    in a few packets. The ``x`` keeps the trailing newlines that command substitution strips;
    the exit status is the command's.
    """
    return StringCommand(
        "p40fleet_out=$( (", command, '\n); rc=$?; printf x; exit "$rc" ); rc=$?;',
        'printf %s "${p40fleet_out%x}"; (exit "$rc")',
    )  # fmt: skip


class Survey(FactBase[dict[int, tuple[str, list[str]]]]):
    """Many facts' commands in one: ``{index: (status, stdout lines)}`` for every part whose
    end marker came back (status: the exit status as text, or ``missing``). Exits 0.

    ``commands`` is ``((command, requires_command or None), ...)`` as the parts' own
    ``command``/``requires_command`` return them; ``token`` makes the markers unguessable by
    anything a part prints.
    """

    def command(self, commands: tuple, token: str) -> StringCommand:
        pieces: list[Any] = []
        for index, (command, requires) in enumerate(commands):
            if requires:
                pieces += ["if command -v", requires, ">/dev/null 2>&1; then (", command, "\n);"]
                pieces += [f"printf '\\n{MARKER} {token} {index} %s\\n' \"$?\";", "else"]
                pieces += [f"printf '\\n{MARKER} {token} {index} {MISSING}\\n';", "fi\n"]
            else:
                # the newline before the marker ends a part's last line when it has none
                pieces += ["(", command, "\n);"]
                pieces.append(f"printf '\\n{MARKER} {token} {index} %s\\n' \"$?\"\n")
        pieces.append("true")
        return one_write(StringCommand(*pieces))

    def process(self, output: list[str]) -> dict[int, tuple[str, list[str]]]:
        # the token is not known here: a marker line is MARKER, token, index, status
        sections: dict[int, tuple[str, list[str]]] = {}
        current: list[str] = []
        for line in output:
            fields = line.split(" ")
            if len(fields) != 4 or fields[0] != MARKER or not fields[2].isdigit():
                current.append(line)
                continue
            if current and current[-1] == "":
                current.pop()  # the newline the marker's printf added
            sections[int(fields[2])] = (fields[3], current)
            current = []
        return sections

    @staticmethod
    def default() -> dict[int, tuple[str, list[str]]]:
        return {}


@dataclass
class _Book(ToJson):
    """One host's answers in one run."""

    memo: dict[Part, _Kept] = field(default_factory=dict)
    tried: set[Part] = field(default_factory=set)  # asked by a survey once: never again
    live: bool = False  # an operation changed (or may have changed) the host: ask live
    last_op: str | None = None
    # a host's facts are asked from several greenlets (another host's deploy may ask them)
    lock: gevent.lock.RLock = field(default_factory=gevent.lock.RLock)


@dataclass(frozen=True)
class _Kept(ToJson):
    """An answer as the memo keeps it: pickled, so that every ask gets its own copy.

    Unpickling copies an answer several times faster than ``copy.deepcopy`` (about 170 asks
    per host in a no-op run); an answer pickle cannot take is kept and served by deepcopy.
    """

    pickled: bytes | None
    data: Any = None

    @classmethod
    def of(cls, data: Any) -> _Kept:
        try:
            return cls(pickle.dumps(data, pickle.HIGHEST_PROTOCOL))
        except Exception:  # noqa: BLE001 - not picklable (a lambda, a lock): copy it instead
            return cls(None, copy.deepcopy(data))

    def copy(self) -> Any:
        if self.pickled is None:
            return copy.deepcopy(self.data)
        return pickle.loads(self.pickled)  # noqa: S301 - bytes this process pickled itself


def _books(state: Any) -> dict[str, _Book] | None:
    return getattr(state, _BOOKS_ATTR, None) if state is not None else None


def _book(host: Any) -> _Book | None:
    books = _books(getattr(host, "state", None))  # a test's stand-in host has no state
    if books is None:
        return None
    return books.setdefault(host.name, _Book())


def _answer(fact: FactBase, status: str, lines: list[str]) -> tuple[bool, Any]:
    """(kept, data): what ``host.get_fact`` returns for this output, when that is certain."""
    if status == MISSING:
        return True, fact.default()  # what pyinfra gives a missing command while preparing
    if status != "0":
        return False, None  # pyinfra looks at stderr and may fail the host: let it, live
    if not lines:
        return True, fact.default()
    try:
        return True, fact.process(lines)
    except Exception:  # noqa: BLE001 - asked live, pyinfra decides what the error means
        return False, None


def survey(host: Any, parts: Sequence[Part]) -> int:
    """Ask every part not yet answered on ``host`` in one command; keep the answers.

    Returns how many parts were answered (0 without :func:`install`: nothing is asked).
    A part the survey cannot answer as pyinfra would (non-zero exit, processing error, an
    unmet precondition) is left out: :func:`ask` asks it live later.
    """
    book = _book(host)
    if book is None:
        return 0
    with book.lock:
        if book.live:
            return 0
        todo: list[tuple[Part, FactBase, Any, Any]] = []
        for cls, kwargs in parts:
            if (cls, kwargs) in book.tried:
                continue
            book.tried.add((cls, kwargs))
            fact = cls()
            arguments = dict(kwargs)
            try:
                if fact.check_preconditions(host.state, host) or fact.shell_executable:
                    continue
                command = fact.command(**arguments)
                requires = fact.requires_command(**arguments)
            except Exception:  # noqa: BLE001 - asked live later, with pyinfra's own error
                continue
            todo.append(((cls, kwargs), fact, command, requires))
        if not todo:
            return 0
        sections = host.get_fact(
            Survey, commands=tuple((c, r) for _, _, c, r in todo), token=secrets.token_hex(6)
        )
        kept = 0
        for index, (memo_key, fact, _, _) in enumerate(todo):
            if index in sections:
                keep, data = _answer(fact, *sections[index])
                if keep:
                    book.memo[memo_key] = _Kept.of(data)
                    kept += 1
        logger.debug(f"{host.print_prefix}survey: {kept}/{len(todo)} facts in one command")
        return kept


def ask(host: Any, cls: type, **kwargs: Any) -> Any:
    """``host.get_fact(cls, **kwargs)``, answered from the host's memo while it holds."""
    book = _book(host)
    if book is None:
        return host.get_fact(cls, **kwargs)
    memo_key = key(cls, kwargs)
    with book.lock:
        if not book.live and memo_key in book.memo:
            return book.memo[memo_key].copy()
        data = host.get_fact(cls, **kwargs)
        if not book.live and host not in host.state.failed_hosts:
            book.memo[memo_key] = _Kept.of(data)
        return data


def answered(host: Any, cls: type, **kwargs: Any) -> bool:
    """Whether :func:`ask` would answer from the memo (no command)."""
    book = _book(host)
    return book is not None and not book.live and key(cls, kwargs) in book.memo


class Forget(BaseStateCallback):
    """Turns a host's memo off once one of its operations changes or may change anything.

    Checked when each operation starts on a host: the operation itself yields commands
    (pyinfra found so while preparing), or the previous one executed commands (also those it
    yielded only at execution). An operation that fails turns it off too.
    """

    @staticmethod
    def _off(host: Any) -> None:
        book = _book(host)
        if book is not None:
            with book.lock:
                book.live = True
                book.memo.clear()

    @classmethod
    def operation_host_start(cls, state, host, op_hash) -> None:
        book = _book(host)
        if book is None or op_hash not in state.ops[host]:
            return  # pyinfra skips this operation on this host
        previous, book.last_op = book.last_op, op_hash
        # will_change: found while preparing, or (pyinfra -y skips change detection) found now
        # by pyinfra running the operation's body on the memo, which still holds here
        meta = state.get_op_data_for_host(host, op_hash).operation_meta
        if meta.will_change:
            cls._off(host)
            return
        if previous is not None and previous in state.ops[host]:
            before = state.get_op_data_for_host(host, previous).operation_meta
            if before.is_complete() and before.executed:
                cls._off(host)

    @classmethod
    def operation_host_error(cls, state, host, op_hash, retry_count=0, max_retries=0) -> None:  # noqa: ARG003
        cls._off(host)


def install(state: Any) -> None:
    """Keep answers for ``state``'s hosts and forget them after a change (idempotent)."""
    if _books(state) is None:
        setattr(state, _BOOKS_ATTR, {})
        state.add_callback_handler(Forget())


def changed(host: Any) -> bool:
    """Whether an operation of this run changed (or may have changed) ``host`` so far."""
    book = _book(host)
    return book is not None and book.live
