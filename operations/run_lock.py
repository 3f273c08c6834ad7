"""The run lock: one p40fleet run per host at a time (``p40fleet.run_lock`` has the rules).

``operations.run.spec.validated_spec()`` calls :func:`hold` first, so every deploy that
changes hosts takes the lock before its first operation, and a deploy included by another one
(``deploy/full.py``) or named after it on the command line finds it already held by this run.

Why the lock is taken inside the operation's generator at execution time, with
``host.run_shell_command``, and not by a yielded command: a yielded command makes pyinfra report
a change on every run, and "a second run changes nothing" is this project's contract; the lock
is bookkeeping, not a change to the host's stack. A refusal is still a failing command, so the
host fails before its next operation, with the holder named.

Release: a pyinfra state callback removes the lock when this host's last operation succeeds, or
as soon as one of its operations fails (pyinfra runs nothing more on a failed host). A deploy
that is included never releases mid-run: only the end of the host's operations does. A run
killed outright (SIGKILL, a lost controller) leaves its lock: the next run on that controller
(the same ``controller_id``, ``p40fleet.controller``) sees its pid gone and takes it over;
another controller, ``BOOT_GRACE_S`` after a reboot of the host or after ``MAX_AGE_S`` by the
host's clock.
"""

from __future__ import annotations

import logging
import os
import socket

from pyinfra import host, state
from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.api.state import BaseStateCallback

from p40fleet import controller, run_lock
from p40fleet.facts.run_lock import RunLock
from p40fleet.facts.survey import Part, ask, part
from p40fleet.operations.refuse import record_refusals, refusal_message, say_when_dry
from p40fleet.run_lock import DEFAULT_PATH, Holder
from p40fleet.run_record import run_record
from p40fleet.runtime.connector_args import connector_arguments
from p40fleet.spec import StackSpec

__all__ = [
    "PATH_KEY", "defer_release", "hold", "lock_path", "refreshed", "release_for", "survey_parts",
    "take", "this_run",
]  # fmt: skip

logger = logging.getLogger("pyinfra")

#: Host data key that moves the lock (tests that run two "hosts" on one machine).
PATH_KEY = "p40fleet_run_lock"
_STEP = "run lock"


def lock_path() -> str:
    return str(host.data.get(PATH_KEY) or DEFAULT_PATH)


def this_run() -> Holder:
    """This run's holder for the current host (run id and controller id fixed once per run)."""
    return _holder(state, host.name)


def _holder(target_state, host_name: str) -> Holder:
    record = run_record(target_state)
    if record.lock_run is None:
        record.lock_run = (run_lock.new_run_id(), controller.controller_id())
    run = record.lock_run
    return Holder(socket.gethostname(), os.getpid(), run[0], host_name, controller_id=run[1])


def _decide(seen, me: Holder) -> run_lock.Decision:
    """The rules (``p40fleet.run_lock.decide``) on the host's answers: its clock, its boot."""
    return run_lock.decide(
        seen.exists, seen.text, seen.boot_id, me, now=seen.now, uptime_s=seen.uptime_s
    )


def _refusal(path: str, reason: str) -> FunctionCommand:
    fix = run_lock.FIX.format(path=path)
    message = refusal_message(host.name, _STEP, reason, fix)  # one refusal format
    record_refusals([(_STEP, reason, fix)])
    say_when_dry(message)

    def _fail(state, host) -> bool:  # noqa: ARG001 - pyinfra passes (state, host)
        for line in message.splitlines():
            host.log_styled(line, fg="red", log_func=logger.error)
        return False

    return FunctionCommand(_fail, (), {})


@operation(is_idempotent=False)
def take(path: str = DEFAULT_PATH):
    """
    Take this run's lock on the host, or fail the host naming the run that holds it.

    + path: the lock directory on the host

    Reports no change: the lock is taken at execution by a command run from here (see the
    module's doc); a dry run takes nothing.
    """
    me = this_run()
    seen = ask(host, RunLock, path=path)
    decision = _decide(seen, me)
    if decision.kind == "held":
        yield _refusal(path, decision.message)
        return
    if not state.is_executing:
        return  # prepare stage (and --dry): the lock is taken when the run executes
    if host.name in run_record(state).lock_held:
        return  # taken by this run already (pyinfra may run this body twice at execution)
    command = StringCommand(run_lock.acquire_command(path, me, decision.stale_text))
    ok, output = host.run_shell_command(
        command, **connector_arguments(host.current_op_global_arguments)
    )
    if ok:
        run_record(state).lock_held.add(host.name)
        if "stale run lock moved aside" in output.stdout:
            for line in run_lock_lines(decision.message):
                host.log_styled(line, fg="yellow", log_func=logger.warning)
        return
    said = [line for line in output.stderr_lines if line.strip()]
    holder = run_lock.parse_holder("\n".join(said[1:]))
    reason = (
        f"another p40fleet run holds this host: {holder.describe()}"
        if holder is not None
        else "; ".join(said) or "the lock could not be taken"
    )
    yield _refusal(path, reason)


def run_lock_lines(message: str) -> list[str]:
    return [f"host {host.name}: {_STEP}: {message}"]


def hold() -> bool:
    """Queue :func:`take` for this host once per run; False when the prepare stage already
    sees another live run holding it (the refusal is queued: add no more operations)."""
    queued = run_record(state).lock_queued
    if host.name in queued:
        return True  # re-entrant: an earlier deploy of this run queued it
    queued.add(host.name)
    _register_release()
    path = lock_path()
    take(name="Take the p40fleet run lock", path=path)
    seen = ask(host, RunLock, path=path)
    return _decide(seen, this_run()).kind != "held"


def refreshed():
    """Commands for an operation that rebooted the host: our holder gets the new boot_id; the
    command fails this host (exit 75) when another run took the lock over meanwhile."""
    if host.name in run_record(state).lock_held:
        yield StringCommand(run_lock.refresh_command(lock_path(), this_run()))


def defer_release() -> None:
    """This host's lock outlives its last operation: whoever runs last on it (the verification
    after the run, ``operations.run.verification``) releases it with :func:`release_for`, in the
    same command as its probe. A failing operation still releases at once."""
    run_record(state).lock_deferred.add(host.name)


def release_for(target) -> str | None:
    """The release command for ``target`` when this run still holds its lock (it is then
    counted as released: run it), else None."""
    locked = run_record(target.state).lock_held
    if target.name not in locked:
        return None
    locked.discard(target.name)
    me = _holder(target.state, target.name)
    return run_lock.release_command(str(target.data.get(PATH_KEY) or DEFAULT_PATH), me)


class _Release(BaseStateCallback):
    """Removes the lock after a host's last operation, or at its first failure."""

    def __init__(self) -> None:
        self.last: dict[str, str] = {}

    def _last_op(self, state, host) -> str | None:
        if host.name not in self.last:
            mine = [h for h in state.get_op_order() if h in state.ops[host]]
            self.last[host.name] = mine[-1] if mine else ""
        return self.last[host.name]

    def _release(self, state, host, op_hash) -> None:
        locked = run_record(state).lock_held
        if host.name not in locked:
            return
        locked.discard(host.name)
        arguments = state.get_op_data_for_host(host, op_hash).global_arguments
        me = _holder(state, host.name)
        path = str(host.data.get(PATH_KEY) or DEFAULT_PATH)
        try:
            host.run_shell_command(
                StringCommand(run_lock.release_command(path, me)),
                **connector_arguments(arguments),
            )
        except Exception as exc:  # noqa: BLE001 - an unreachable host keeps its (now stale) lock
            logger.warning(f"{host.print_prefix}run lock not released: {exc}")

    def operation_host_success(self, state, host, op_hash, retry_count=0):  # noqa: ARG002
        if host.name in run_record(state).lock_deferred:
            return  # released after the run, with the verify probe (defer_release)
        if op_hash == self._last_op(state, host):
            self._release(state, host, op_hash)

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):  # noqa: ARG002
        if not state.get_op_data_for_host(host, op_hash).global_arguments.get("_ignore_errors"):
            self._release(state, host, op_hash)


def _register_release() -> None:
    record = run_record(state)
    if not record.lock_release_registered:
        record.lock_release_registered = True
        state.add_callback_handler(_Release())


def survey_parts(spec: StackSpec, path: str | None = None) -> list[Part]:  # noqa: ARG001
    """What :func:`hold` and :func:`take` ask: the lock at ``path``, a host's own (its data,
    :func:`lock_path`); none without one (``operations.run.survey``)."""
    return [part(RunLock, path=path)] if path else []
