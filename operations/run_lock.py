"""The run lock: one p40fleet run per host at a time (``p40fleet.run_lock`` has the rules).

``operations.run.spec.validated_spec()`` calls :func:`hold` first, so every deploy that
changes hosts queues the lock before its first operation, and a deploy included by another one
(``deploy/full.py``) or named after it on the command line finds it already queued by this run.

While preparing (``--dry`` too) only the lock's fact is read: a host another live run holds is
refused then (:func:`take` fails it, naming the holder), and its deploys add nothing. The lock
itself is taken by a pyinfra state callback, :class:`RunLockEvents` (installed once per State,
``p40fleet.runtime.host_gate``), before the run's first operation, on every queued host at
once: a host whose lock another run took meanwhile fails there, before any of its operations,
and the others go on. Not a yielded command: that makes pyinfra report a change on every run,
and "a second run changes nothing" is this project's contract; the lock is bookkeeping, not a
change to the host's stack. A ``--dry`` run executes nothing and takes no lock.

Release: the same callback removes the lock when this host's last operation succeeds, or
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
from typing import Any

import gevent
from pyinfra import host, state
from pyinfra.api import FunctionCommand, StringCommand, operation

from p40fleet import controller, run_lock
from p40fleet.facts.run_lock import RunLock
from p40fleet.facts.survey import Part, ask, part
from p40fleet.operations.refuse import record_refusals, refusal_message, say_when_dry
from p40fleet.run_lock import DEFAULT_PATH, Holder
from p40fleet.run_record import run_record
from p40fleet.runtime import host_gate
from p40fleet.runtime.connector_args import host_connector_arguments
from p40fleet.spec import StackSpec

__all__ = [
    "PATH_KEY", "RunLockEvents", "defer_release", "hold", "install", "lock_path", "refreshed",
    "release_for", "survey_parts", "take", "this_run",
]  # fmt: skip

logger = logging.getLogger("pyinfra")

#: Host data key that moves the lock (tests that run two "hosts" on one machine).
PATH_KEY = "p40fleet_run_lock"
_STEP = "run lock"


def lock_path() -> str:
    return _path_of(host)


def _path_of(target) -> str:
    return str(target.data.get(PATH_KEY) or DEFAULT_PATH)


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


def _say(target, message: str) -> None:
    for line in message.splitlines():
        target.log_styled(line, fg="red", log_func=logger.error)


def _refusal(path: str, reason: str) -> FunctionCommand:
    fix = run_lock.FIX.format(path=path)
    message = refusal_message(host.name, _STEP, reason, fix)  # one refusal format
    record_refusals([(_STEP, reason, fix)])
    say_when_dry(message)

    def _fail(state, host) -> bool:  # noqa: ARG001 - pyinfra passes (state, host)
        _say(host, message)
        return False

    return FunctionCommand(_fail, (), {})


@operation(is_idempotent=False)
def take(path: str = DEFAULT_PATH):
    """
    Fail this host, naming the run that holds its lock, when another live run holds it.

    + path: the lock directory on the host

    Reports no change and runs no command: the lock itself is taken before the run's first
    operation (:class:`RunLockEvents`, see the module's doc); a dry run takes nothing.
    """
    if host.name in run_record(state).lock_held:
        return  # executing, the lock taken (RunLockEvents): nothing to ask again
    decision = _decide(ask(host, RunLock, path=path), this_run())
    if decision.kind == "held":
        yield _refusal(path, decision.message)


def run_lock_lines(message: str, target=None) -> list[str]:
    return [f"host {(target or host).name}: {_STEP}: {message}"]


def hold() -> bool:
    """Queue this host's lock (:func:`take`, and the callback that takes it) once per run;
    False when the prepare stage already sees another live run holding it (the refusal is
    queued: add no more operations)."""
    queued = run_record(state).lock_queued
    if host.name in queued:
        return True  # re-entrant: an earlier deploy of this run queued it
    queued.add(host.name)
    install(state)
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
    after the run, ``operations.run.verify``) releases it with :func:`release_for`, in the
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
    return run_lock.release_command(_path_of(target), me)


def _acquire(target_state, target) -> str | None:
    """Take this run's lock on ``target`` now; None when taken, else the refusal (said)."""
    path = _path_of(target)
    me = _holder(target_state, target.name)
    decision = _decide(ask(target, RunLock, path=path), me)  # the survey's answer: no command
    if decision.kind == "held":  # seen so while preparing: take() says the same
        return _refuse(target, path, decision.message)
    command = StringCommand(run_lock.acquire_command(path, me, decision.stale_text))
    try:
        ok, output = target.run_shell_command(command, **host_connector_arguments(target))
    except Exception as exc:  # noqa: BLE001 - this host fails, the others go on
        return _refuse(target, path, f"the lock could not be taken: {exc}")
    if ok:
        run_record(target_state).lock_held.add(target.name)
        if "stale run lock moved aside" in output.stdout:
            for line in run_lock_lines(decision.message, target):
                target.log_styled(line, fg="yellow", log_func=logger.warning)
        return None
    said = [line for line in output.stderr_lines if line.strip()]
    holder = run_lock.parse_holder("\n".join(said[1:]))
    reason = (
        f"another p40fleet run holds this host: {holder.describe()}"
        if holder is not None
        else "; ".join(said) or "the lock could not be taken"
    )
    return _refuse(target, path, reason)


def _refuse(target, path: str, reason: str) -> str:
    fix = run_lock.FIX.format(path=path)
    message = refusal_message(target.name, _STEP, reason, fix)
    record_refusals([(_STEP, reason, fix)], target)
    _say(target, message)
    return message


class RunLockEvents(host_gate.HostGate):
    """Takes each queued host's lock before its first operation (``HostGate``: every host at
    once), removes it after the host's last operation, or at its first failure."""

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, str] = {}

    def admit(self, state, hosts: list[Any]) -> dict[Any, str]:
        queued = run_record(state).lock_queued
        wanted = [one for one in hosts if one.name in queued]  # verify-only hosts: no lock
        if state.pool is None or len(wanted) < 2:
            said = {one: _acquire(state, one) for one in wanted}
        else:  # as pyinfra runs an operation: the fleet waits for the slowest host only
            jobs = {one: state.pool.spawn(_acquire, state, one) for one in wanted}
            gevent.joinall(list(jobs.values()))
            said = {one: job.get() for one, job in jobs.items()}
        return {one: message for one, message in said.items() if message is not None}

    def _last_op(self, state, host) -> str | None:
        if host.name not in self.last:
            mine = [h for h in state.get_op_order() if h in state.ops[host]]
            self.last[host.name] = mine[-1] if mine else ""
        return self.last[host.name]

    def _release(self, state, host) -> None:
        command = release_for(host)
        if command is None:
            return
        try:
            host.run_shell_command(StringCommand(command), **host_connector_arguments(host))
        except Exception as exc:  # noqa: BLE001 - an unreachable host keeps its (now stale) lock
            logger.warning(f"{host.print_prefix}run lock not released: {exc}")

    def operation_host_success(self, state, host, op_hash, retry_count=0):  # noqa: ARG002
        if host.name in run_record(state).lock_deferred:
            return  # released after the run, with the verify probe (defer_release)
        if op_hash == self._last_op(state, host):
            self._release(state, host)

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):  # noqa: ARG002
        if not state.get_op_data_for_host(host, op_hash).global_arguments.get("_ignore_errors"):
            self._release(state, host)


def install(target_state) -> bool:
    """Add :class:`RunLockEvents` to ``target_state`` once; True when it was added now."""
    return host_gate.install(target_state, RunLockEvents)


def survey_parts(spec: StackSpec, path: str | None = None) -> list[Part]:  # noqa: ARG001
    """What :func:`hold` and :func:`take` ask: the lock at ``path``, a host's own (its data,
    :func:`lock_path`); none without one (``operations.run.survey``)."""
    return [part(RunLock, path=path)] if path else []
