"""Long steps that speak at pyinfra's default verbosity: streamed output and durations.

pyinfra 3 prints a command's output as it arrives only when ``state.print_output`` is on
(``-vvv``); at the default verbosity a long command shows a spinner and nothing else. pyinfra's
documented way out is a Python callback (``FunctionCommand``, the mechanism behind
``python.call``) that calls ``host.run_shell_command(..., print_output=True)`` itself: the
connector then echoes each line, prefixed with ``[host]``, while the command runs.

* :func:`streamed` runs one command that way (downloads print their own progress lines) and
  logs how long it took.
* :class:`Stopwatch` brackets commands that stay plain ``StringCommand`` (the CUDA runfile, the
  Apex build): a start line naming the log, then the duration once they have finished.
"""

from __future__ import annotations

import time

from pyinfra.api import FunctionCommand, StringCommand

from p40fleet.runtime.connector_args import connector_arguments

__all__ = ["Stopwatch", "format_seconds", "streamed"]


def format_seconds(seconds: float) -> str:
    """``75.4`` -> ``1 min 15 s``; ``9.2`` -> ``9 s``."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole} s"
    return f"{whole // 60} min {whole % 60} s"


def _connector_arguments(host) -> dict:
    """The running operation's connector arguments (``_sudo``, ``_su_user``, ``_env``, ...).

    A callback does not receive them from pyinfra, so they are read from the operation being
    executed: without them a download under ``_sudo`` would run unprivileged.
    """
    return connector_arguments(host.current_op_global_arguments)


def _stream(state, host, command: StringCommand, what: str) -> bool:
    """Run ``command`` echoing its lines as they come; log the outcome and the duration."""
    start = time.monotonic()
    ok, _output = host.run_shell_command(command, print_output=True, **_connector_arguments(host))
    took = format_seconds(time.monotonic() - start)
    host.log(f"{what}: {'done in' if ok else 'failed after'} {took}")
    return ok


def streamed(command: StringCommand, what: str) -> FunctionCommand:
    """``command`` as a step whose output lines show at default verbosity (see module doc)."""
    return FunctionCommand(_stream, (command, what), {})


class Stopwatch:
    """Time the commands yielded between :meth:`start` and :meth:`stop` (on the controller)."""

    def __init__(self, what: str, log: str | None = None) -> None:
        self.what, self.log, self.started = what, log, 0.0

    def _stopwatch_start(self, state, host) -> bool:
        self.started = time.monotonic()
        where = f", log: {self.log}" if self.log else ""
        host.log(f"{self.what}: started{where}")
        return True

    def _stopwatch_stop(self, state, host) -> bool:
        where = f" (log: {self.log})" if self.log else ""
        took = format_seconds(time.monotonic() - self.started)
        host.log(f"{self.what}: done in {took}{where}")
        return True

    def start(self) -> FunctionCommand:
        """Yield before the long command: says it started and where its log is."""
        return FunctionCommand(self._stopwatch_start, (), {})

    def stop(self) -> FunctionCommand:
        """Yield after it: says how long it took (not reached when the command failed)."""
        return FunctionCommand(self._stopwatch_stop, (), {})
