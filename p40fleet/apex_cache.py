"""The controllers' Apex wheel cache, shared: one build per key across controllers. No pyinfra.

Several controllers may share one cache (``$P40FLEET_CACHE/apex`` on an NFS home, or a link to
one directory). Per build key, the controller that decides to build takes ``build.lock`` beside
the cache entry (``<cache>/apex/<key>/build.lock``) for the span from that decision to the
stored wheel; another controller that finds it held by a live holder builds nothing and waits
for the published wheel (:func:`wait_for_wheel`), checked by its recorded sha256.

The lock is a file created exclusively: a complete temporary file holding the holder's lines is
hard-linked onto the lock's name (``link(2)`` fails when the name exists: ``O_EXCL``'s rule,
and the lock never exists without its holder). ``flock`` is not used: it is not reliable
between NFS clients; ``link`` is atomic there (a lost reply is told by the temporary file's
link count). The holder refreshes the lock's mtime every :data:`HEARTBEAT_S` while it holds it.

Stale means: the holder is this controller (same ``controller_id``: ids are per machine) and its
process is gone (pid and start time), or the lock's mtime is older than :data:`STALE_S` by the
shared directory's own clock (a freshly written file's mtime: controllers' clocks may differ).
A stale lock is taken over in one path: claim it (an exclusive link named by its content), remove
it if it is still that file, try the exclusive link again; of any number of takers at most one
holds it then, and the one that removed it names the old holder.

A holder judged stale may still be alive (paused, or its refreshes lost on a slow NFS). It acts
on the lock only as its own: it releases it, and records a wheel, holding the same claim a taker
of its lock must hold, and only while the lock is still its file (text and inode); it refreshes
it through the file it read (``futimens`` lands on that inode, never on a lock linked since).
What it built after its lock was taken over is not recorded (:class:`LockLost`). The one window
left: a holder that pauses longer than :data:`STALE_S` inside that claim (a few syscalls), when
its claim is stale too; a lease without fencing cannot close it, and every wheel is still
checked by its sum before use.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone

from p40fleet import apex_build, controller
from p40fleet.run_record import run_record

__all__ = [
    "HEARTBEAT_S",
    "LOCK_FILE",
    "STALE_S",
    "WAIT_S",
    "Acquired",
    "BuildLock",
    "LockHolder",
    "LockLost",
    "await_other",
    "hold",
    "lock_for",
    "obtain",
    "part_of",
    "publish",
    "record",
    "release_for",
    "wait_for_wheel",
]

LOCK_FILE = "build.lock"
#: How often the holder refreshes the lock's mtime.
HEARTBEAT_S = 30.0
#: A lock not refreshed for this long is stale (its holder was killed or lost the directory).
STALE_S = 600.0
#: The longest a controller waits for another's wheel: longer than a cold Apex build.
WAIT_S = 2 * 3600.0
#: How often the waiter looks, and how often it says who it waits for.
POLL_S = 2.0
PROGRESS_S = 60.0
#: How often a taker tries again while another taker's claim is on a stale lock, and how long.
_RETRY_S, _TRIES = 0.05, 20
_FIELDS = ("controller", "controller_id", "pid", "pid_start", "since", "key")


def _pid_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22): a pid
    reused by another process has another one. Empty when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


@dataclass(frozen=True)
class LockHolder:
    """Who holds (or wants) a key's build lock."""

    controller: str  # hostname, for people to read
    controller_id: str
    pid: int
    pid_start: str
    since: str
    key: str

    @classmethod
    def me(cls, key: str) -> LockHolder:
        pid = os.getpid()
        since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return cls(socket.gethostname(), controller.controller_id(), pid, _pid_start(pid),
                   since, key)  # fmt: skip

    def text(self) -> str:
        return "".join(f"{name}={getattr(self, name)}\n" for name in _FIELDS)

    def describe(self) -> str:
        return (
            f"controller {self.controller} (pid {self.pid}, id {self.controller_id[:8]}) "
            f"since {self.since}"
        )

    def same_process(self, other: LockHolder) -> bool:
        return all(
            getattr(self, n) == getattr(other, n) for n in ("controller_id", "pid", "pid_start")
        )

    def gone_here(self) -> bool:
        """Whether this holder is this controller and its process no longer runs."""
        if self.controller_id != controller.controller_id():
            return False
        return _pid_start(self.pid) != self.pid_start or not self.pid_start


def _holder(text: str, key: str) -> LockHolder:
    """The holder a lock's text names (an unreadable lock is a stale one of nobody's)."""
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    try:
        return LockHolder(**{n: values[n] for n in _FIELDS if n != "pid"}, pid=int(values["pid"]))
    except (KeyError, ValueError):
        return LockHolder("?", "", 0, "", "?", key)


def _snapshot(path: str) -> tuple[str, os.stat_result] | None:
    """A file's text and stat, of one open file: the stat is that text's file's."""
    try:
        with open(path) as handle:
            return handle.read(), os.fstat(handle.fileno())
    except FileNotFoundError:
        return None


def _fs_now(directory: str) -> float:
    """The shared directory's clock: the mtime of a file written there now."""
    probe = os.path.join(directory, f".clock.{controller.controller_id()[:8]}.{os.getpid()}")
    with open(probe, "w"):
        pass
    try:
        return os.stat(probe).st_mtime
    finally:
        os.unlink(probe)


def _lock_path(local_tar: str) -> str:
    return os.path.join(os.path.dirname(local_tar), LOCK_FILE)


def _claim_of(name: str, text: str) -> str:
    """The claim a taker of the file ``name`` holding ``text`` (or its holder) must hold."""
    return f"{name}.takeover-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _mine_suffix() -> str:
    return f"{controller.controller_id()[:8]}-{os.getpid()}"


def part_of(local_tar: str) -> str:
    """This process's temporary name for ``local_tar``: two builders (one whose lock was taken
    over) never write one file."""
    return f"{local_tar}.part.{_mine_suffix()}"


class LockLost(RuntimeError):
    """This process's build lock was taken over (judged stale): its wheel is not recorded."""


@dataclass(frozen=True)
class Acquired:
    """What :meth:`BuildLock.acquire` saw: ``taken`` (free, or a stale lock taken over: then
    ``message`` names the old holder), or ``held`` by a live ``holder``; ``free`` when only
    looked at."""

    kind: str
    holder: LockHolder | None = None
    message: str = ""


class BuildLock:
    """The build lock of one key in one cache dir, for this process."""

    def __init__(self, path: str, key: str, stale_s: float = STALE_S,
                 heartbeat_s: float = HEARTBEAT_S) -> None:  # fmt: skip
        self.key, self.path = key, path
        self.stale_s, self.heartbeat_s = stale_s, heartbeat_s
        self.me = LockHolder.me(key)
        self._stop = threading.Event()
        self._ino: int | None = None  # the inode of the lock this process linked

    @classmethod
    def beside(cls, local_tar: str, **bounds: float) -> BuildLock:
        """The lock of the cache entry holding ``local_tar`` (its directory is the key)."""
        return cls(_lock_path(local_tar), os.path.basename(os.path.dirname(local_tar)), **bounds)

    def holder(self) -> LockHolder | None:
        """The lock's holder now; None when free."""
        seen = _snapshot(self.path)
        return _holder(seen[0], self.key) if seen else None

    def stale_why(self, holder: LockHolder, mtime: float | None = None) -> str | None:
        """Why ``holder``'s lock (last refreshed at ``mtime``: the lock's now when not given) is
        stale, or None while it is live."""
        if holder.gone_here():
            return f"its process {holder.pid} no longer runs on this controller"
        try:
            mtime = os.stat(self.path).st_mtime if mtime is None else mtime
        except FileNotFoundError:
            return None
        age = _fs_now(os.path.dirname(self.path)) - mtime
        if age > self.stale_s:
            return (
                f"not refreshed for {age:.0f} s by the cache dir's clock (stale after "
                f"{self.stale_s:.0f} s)"
            )
        return None

    def acquire(self) -> Acquired:
        """Take the lock, or say who holds it; a stale lock is removed (:meth:`_remove_stale`)
        and the exclusive link tried again."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        took_over = ""
        for _attempt in range(_TRIES):
            ino = self._link(self.path)
            if ino is not None:
                self._ino = ino
                self._start_heartbeat()
                return Acquired("taken", None, took_over)
            seen = _snapshot(self.path)
            if seen is None:
                continue  # released meanwhile
            holder = _holder(seen[0], self.key)
            if holder.same_process(self.me):
                self._ino = seen[1].st_ino
                return Acquired("taken")
            why = self.stale_why(holder, seen[1].st_mtime)
            if why is None:
                return Acquired("held", holder)
            if self._remove_stale(self.path, seen):
                took_over = f"took over the stale build lock of {holder.describe()}: {why}"
            else:
                time.sleep(_RETRY_S)  # another taker's claim: it is done within milliseconds
        return Acquired("held", self.holder())

    def _remove_stale(self, name: str, seen: tuple[str, os.stat_result]) -> bool:
        """Remove the stale file ``name`` while it is still the one ``seen``; of any number of
        takers at most one does. Each first claims it by an exclusive link whose name comes
        from its text (renaming the name aside would move whatever file is there by then, a
        lock taken meanwhile included). A claim whose taker died is stale as a lock is, and
        removed the same way."""
        claim = _claim_of(name, seen[0])
        if self._link(claim) is None:
            other = _snapshot(claim)
            if other and self.stale_why(_holder(other[0], self.key), other[1].st_mtime):
                self._remove_stale(claim, other)
            return False
        try:
            now = _snapshot(name)
            if now is None or (now[0], now[1].st_ino) != (seen[0], seen[1].st_ino):
                return False  # another taker removed it first
            os.unlink(name)  # till here only its own (stale) holder could have changed it
            return True
        finally:
            os.unlink(claim)

    def _link(self, name: str) -> int | None:
        """Create ``name`` exclusively, holding this process's lines: its inode, None when
        ``name`` exists."""
        tmp = f"{name}.{self.me.controller_id[:8]}.{self.me.pid}.tmp"
        with open(tmp, "w") as handle:
            handle.write(self.me.text())
            handle.flush()
            os.fsync(handle.fileno())
            ino = os.fstat(handle.fileno()).st_ino
        try:
            os.link(tmp, name)
            return ino
        except FileExistsError:
            return None
        except OSError:
            return ino if os.stat(tmp).st_nlink == 2 else None  # NFS: made, its reply lost
        finally:
            os.unlink(tmp)

    def _is_mine(self, seen: tuple[str, os.stat_result] | None) -> bool:
        """Whether ``seen`` is the lock file this process linked (its text and its inode)."""
        return (
            seen is not None
            and self._ino is not None
            and (seen[0], seen[1].st_ino) == (self.me.text(), self._ino)
        )

    def held_by_me(self) -> bool:
        return self._is_mine(_snapshot(self.path))

    @contextmanager
    def _owned(self) -> Iterator[bool]:
        """Whether this process holds the lock, asked holding the claim a taker of its lock
        must hold to remove it (:meth:`_remove_stale`): till the block ends it stays this
        process's, unless the block outlasts ``stale_s`` (the claim is stale then, too). A live
        taker's claim means the lock is being taken over: not this process's any more."""
        claim = _claim_of(self.path, self.me.text())
        for _attempt in range(_TRIES):
            if self._link(claim) is not None:
                break
            other = _snapshot(claim)
            if other is None:
                continue  # that taker is done
            if not self.stale_why(_holder(other[0], self.key), other[1].st_mtime):
                yield False
                return
            self._remove_stale(claim, other)  # a taker that died holding it
        else:
            yield False
            return
        try:
            yield self._is_mine(_snapshot(self.path))
        finally:
            os.unlink(claim)

    def _refresh(self) -> bool:
        """Refresh the lock's mtime while it is this process's; False once it is not. The
        refresh is of the file read (``futimens``): it never refreshes a lock linked since."""
        try:
            with open(self.path) as handle:
                seen = handle.read(), os.fstat(handle.fileno())
                if not self._is_mine(seen):
                    return False
                os.utime(handle.fileno())
                return True
        except FileNotFoundError:
            return False

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        threading.Thread(target=self._heartbeat, daemon=True, name="apex-lock").start()
        atexit.register(self.release)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if not self._refresh():
                    return  # taken over: record() refuses this process's wheel
            except OSError:
                continue  # the shared directory's hiccup (ESTALE, EIO): try at the next beat

    def release(self) -> None:
        """Remove the lock when this process holds it (idempotent); a lock taken over from this
        process is left to its new holder."""
        self._stop.set()
        if self.held_by_me():
            with self._owned() as mine:
                if mine:
                    os.unlink(self.path)
        atexit.unregister(self.release)

    def lost_why(self) -> str:
        """Why the lock is not this process's any more, naming its holder now."""
        holder = self.holder()
        now = f"held now by {holder.describe()}" if holder else "free now"
        return (
            f"the build lock of {self.key} was taken over from {self.me.describe()} "
            f"(judged stale: not refreshed for {self.stale_s:.0f} s, the process paused or its "
            f"refreshes lost); {now}"
        )


_WAITERS: dict[str, threading.Lock] = {}


def hold(run: object, lock: BuildLock) -> None:
    """Keep ``lock`` in the run's record (``run``: pyinfra's state) until :func:`release_for`
    (or exit)."""
    run_record(run).apex_build_locks[lock.path] = lock


def lock_for(run: object, local_tar: str) -> BuildLock | None:
    """The lock this run holds of ``local_tar``'s cache entry (None: it holds none)."""
    return run_record(run).apex_build_locks.get(_lock_path(local_tar))


def release_for(run: object, local_tar: str) -> None:
    """Release this run's lock of ``local_tar``'s cache entry (stored, or not: either way)."""
    lock = run_record(run).apex_build_locks.pop(_lock_path(local_tar), None)
    if lock is not None:
        lock.release()


def await_other(
    local_tar: str,
    log: Callable[[str], None],
    wait_s: float = WAIT_S,
    poll_s: float = POLL_S,
    progress_s: float = PROGRESS_S,
    stale_s: float = STALE_S,
) -> tuple[bool, str] | None:
    """None when no other live process holds the build lock of ``local_tar``'s entry; else
    :func:`wait_for_wheel`'s answer. One waiter per entry logs; the run's other hosts wait
    for it and then look again."""
    lock = BuildLock.beside(local_tar, stale_s=stale_s)
    holder = lock.holder()
    if holder is None or holder.same_process(lock.me):
        return None
    with _WAITERS.setdefault(lock.path, threading.Lock()):
        return wait_for_wheel(lock, local_tar, log, wait_s, poll_s, progress_s)


def publish(part: str, final: str) -> None:
    """``part`` (a complete file in ``final``'s directory) renamed onto ``final`` once it is on
    disk: a reader sees the old file or the new one, never a torn one."""
    with open(part, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(part, final)
    fd = os.open(os.path.dirname(final) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def wait_for_wheel(
    lock: BuildLock,
    local_tar: str,
    log: Callable[[str], None],
    wait_s: float = WAIT_S,
    poll_s: float = POLL_S,
    progress_s: float = PROGRESS_S,
) -> tuple[bool, str]:
    """(ok, why): wait while another live controller holds ``lock`` until ``local_tar`` matches
    its recorded sum. Not ok when the holder released the lock without a wheel (its build
    failed), went stale, or ``wait_s`` passed; every ``progress_s`` a line names the holder."""
    start = last = time.monotonic()
    while True:
        ok, why = apex_build.controller_wheel_ok(local_tar)
        if ok:
            return ok, why
        holder = lock.holder()
        waited = time.monotonic() - start
        if holder is None or holder.same_process(lock.me):
            ok, why = apex_build.controller_wheel_ok(local_tar)  # published, then released
            if ok:
                return ok, why
            return False, f"the build lock of {lock.key} was released without a wheel ({why})"
        stale = lock.stale_why(holder)
        if stale is not None:
            return False, f"{holder.describe()} holds the build lock of {lock.key}, {stale}"
        if waited >= wait_s:
            return False, (
                f"{holder.describe()} still holds the build lock of {lock.key} after "
                f"{waited:.0f} s (the wait's bound)"
            )
        if time.monotonic() - last >= progress_s:
            last = time.monotonic()
            log(f"apex wheel {lock.key}: {holder.describe()} builds it; waited {waited:.0f} s "
                f"of at most {wait_s:.0f} s")  # fmt: skip
        time.sleep(poll_s)


def obtain(
    key: str,
    build: Callable[[str], None],
    cache_dir: str | None = None,
    log: Callable[[str], None] = print,
    **wait: float,
) -> tuple[str, bool]:
    """(the wheel tar, built here): the controller-side rule in one call. A wheel in the cache
    matching its sum is used; else under the key's lock ``build(part)`` writes the tar to a
    temporary name and it is published with its sum; a live holder's wheel is waited for, as is
    the new holder's when this process's lock was taken over during its build."""
    local_tar = apex_build.controller_wheel(key, cache_dir)
    if apex_build.controller_wheel_ok(local_tar)[0]:
        return local_tar, False
    lock, part = BuildLock.beside(local_tar), part_of(local_tar)
    got = lock.acquire()
    if got.kind == "held":
        ok, why = wait_for_wheel(lock, local_tar, log, **wait)
        if not ok:
            raise RuntimeError(why)
        return local_tar, False
    if got.message:
        log(got.message)
    try:
        if apex_build.controller_wheel_ok(local_tar)[0]:  # published before we took the lock
            return local_tar, False
        build(part)
        record(part, local_tar, lock=lock)
        return local_tar, True
    except LockLost as lost:
        log(f"{lost}: waiting for that wheel")
    finally:
        lock.release()
        if os.path.exists(part):  # a failed build's: this process's name, no re-run reuses it
            os.unlink(part)
    ok, why = wait_for_wheel(lock, local_tar, log, **wait)
    if not ok:
        raise RuntimeError(why)
    return local_tar, False


def record(
    part: str, local_tar: str, digest: str | None = None, lock: BuildLock | None = None
) -> str:
    """Publish the complete tar ``part`` (of sha256 ``digest``: computed when not given) as
    ``local_tar``, then its sum beside it: a reader that sees the tar before its sum finds them
    not matching and waits or builds, never takes a tar unchecked. Under ``lock`` (the key's,
    this process's) both are published only while it is still this process's, holding its
    claim; else :class:`LockLost` (naming its holder now) and ``part`` is removed: a builder
    whose lock was taken over never replaces the new holder's wheel or its sum."""
    digest = digest or apex_build.sha256_of(part)
    tmp = f"{local_tar}.sha256.{_mine_suffix()}.tmp"
    with open(tmp, "w") as handle:
        handle.write(f"{digest}  {apex_build.WHEEL_TAR}\n")
    if lock is None:
        publish(part, local_tar)
        publish(tmp, f"{local_tar}.sha256")
        return digest
    for name in (part, tmp):  # on disk before the claim: under it only the renames
        with open(name, "rb+") as handle:
            os.fsync(handle.fileno())
    with lock._owned() as mine:
        if mine:
            publish(part, local_tar)
            publish(tmp, f"{local_tar}.sha256")
            return digest
    for name in (part, tmp):
        os.unlink(name)
    raise LockLost(lock.lost_why())
