"""Per-host refusal: stop one host, with a clear message, without aborting the whole run.

An exception raised while pyinfra builds the operations of a deploy (the "prepare" stage) ends
the run for *every* host. A host whose settings are wrong must instead fail on its own, so the
refusal is an operation: it is queued for that host only and fails when executed. pyinfra then
marks the host failed and runs none of its later operations; the other hosts carry on.

Every deploy starts with ``operations.run.spec.validated_spec()``, which refuses a host with a
bad spec this way. Real output (``@local`` with a bad spec next to a good second host)::

    --> Starting operation: Refuse: stack spec
        [@chroot//] Skipped
        [@local]    host @local: stack spec: stack.cuda.sha256 = 'abc': expected 64 hex
                    characters (the sha256sum of the file), got 3 characters
        [@local]    host @local: stack spec: stack.user.uid = 7: expected a uid from 1000 to
                    60000 (a regular, non-system user); value set in stack_host — fix: correct
                    the value in the inventory (stack_host) or inventories/group_data/all.py ...
        [@local]    Error: executed 0 commands

    --> Starting operation: touch marker
        [@chroot//] Success

(each message is one line in the real output; wrapped here). pyinfra exits 1 when any host
failed. While preparing a refused host logs
``[@local] stack spec invalid (2 problems: stack.cuda.sha256, stack.user.uid): this host will be
refused``. A dry run (``--dry``, which executes nothing) prints every refusal's lines while it
prepares, the same lines (reason and fix, every spec problem in full) a real run prints when it
executes the refusal; nothing is sent to the host for them.
"""

from __future__ import annotations

import logging
import sys

from pyinfra import host, state
from pyinfra.api import FunctionCommand, operation

from p40fleet.run_record import run_record

__all__ = [
    "dry_run",
    "host_refusals",
    "refusal_message",
    "refuse",
    "refuse_option_ref",
    "say_when_dry",
]

logger = logging.getLogger("pyinfra")


def refusal_message(host_name: str, step: str, reason: str, remedy: str) -> str:
    """The text a refusal prints: ``host X: <step>: <reason> — fix: <remedy>``.

    A multi-line ``reason`` gives one ``host X: <step>: <line>`` line per reason line (each one
    grep-able), the remedy goes after the last.
    """
    lines = [line for line in reason.splitlines() if line.strip()] or [""]
    out = [f"host {host_name}: {step}: {line}" for line in lines]
    out[-1] += f" — fix: {remedy}"
    return "\n".join(out)


def dry_run() -> bool:
    """True in ``pyinfra … --dry`` (pyinfra keeps the flag in its CLI only: read its argv)."""
    return "--dry" in sys.argv[1:]


def say_when_dry(message: str) -> None:
    """In a dry run, log a refusal's lines now (while preparing): a dry run never executes the
    operation that would print them."""
    if dry_run() and not state.is_executing:
        host.log_styled("dry run: a real run refuses this host with:", log_func=logger.warning)
        for line in message.splitlines():
            host.log_styled(line, fg="yellow", log_func=logger.warning)


@operation(is_idempotent=False)
def refuse(step: str, reason: str, remedy: str):
    """
    Fail the current host at execution time with an explanation; change nothing.

    + step: what was about to happen (e.g. ``"stack spec"``, ``"driver install"``)
    + reason: why this host cannot go on
    + remedy: what the admin should do about it

    The host is marked failed: its later operations do not run; other hosts are unaffected.
    A dry run (which executes nothing) prints the same lines while it prepares.
    """
    message = refusal_message(host.name, step, reason, remedy)
    say_when_dry(message)

    def _fail(state, host) -> bool:  # noqa: ARG001 - pyinfra passes (state, host) by name
        # Returning False fails the operation (and so the host) without a Python traceback.
        for line in message.splitlines():
            host.log_styled(line, fg="red", log_func=logger.error)
        return False

    yield FunctionCommand(_fail, (), {})


def refused_hosts() -> set[str]:
    """Hosts already refused in this run (by the preflight or an invalid spec)."""
    return run_record(state).refused_hosts


def host_refusals(target) -> list[tuple[str, str, str]]:
    """``(step, reason, fix)`` of each refusal queued for ``target`` in this run (the report's
    REFUSED checks: ``operations.run.verify``)."""
    return list(run_record(target.state).refusals.get(target.name, []))


def record_refusals(refusals: list[tuple[str, str, str]], target=None) -> None:
    """Remember why the current host (or ``target``, outside an operation) is refused (for
    the report after the run)."""
    run, name = (state, host.name) if target is None else (target.state, target.name)
    known = run_record(run).refusals.setdefault(name, [])
    known.extend(r for r in refusals if r not in known)


def refuse_host(
    step: str,
    reason: str,
    remedy: str,
    name: str | None = None,
    refusals: list[tuple[str, str, str]] | None = None,
) -> None:
    """Queue ``refuse`` for the current host and remember it: later deploys add nothing for it.

    ``refusals``: the ``(step, reason, fix)`` behind a combined ``reason`` (the report lists
    each one); by default the refusal itself."""
    refused_hosts().add(host.name)
    record_refusals(refusals if refusals is not None else [(step, reason, remedy)])
    refuse(step=step, reason=reason, remedy=remedy, name=name or f"Refuse: {step}")


def refuse_option_ref(step: str, ref: str, field: str, example: str):
    """The refusal of a git ref that starts with '-' (git would read it as an option, and
    ``git checkout`` has no ``--end-of-options``): a generator for ``yield from``."""
    return refuse._inner(
        step=step,
        reason=f"ref {ref!r} starts with '-': git would read it as an option",
        remedy=f"set {field} to the tag or branch name, e.g. {example}",
    )
