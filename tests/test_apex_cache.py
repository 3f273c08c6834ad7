"""One Apex wheel cache shared by several controllers (p40fleet/apex_cache.py, issue 28): per
build key one controller builds under the key's lock, the others wait for its wheel; a stale
lock is taken over; a wheel is published by rename, never torn under its final name.

Controllers are separate processes sharing one temporary cache dir, each with its own
``/etc/machine-id`` stand-in (so its own controller id), as two machines on one NFS home.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.facts.files import Directory, File

from p40fleet import apex_build, apex_cache, controller
from p40fleet.operations import apex
from p40fleet.operations.run import apex_fleet
from tests.opharness import run_op

REPO = Path(__file__).resolve().parent.parent
KEY = "v1-abc_torch2.4.1_cuda12.1_sm6.1_py3.10_cpp+cuda"

# One controller: waits for tmp/go, then obtains KEY's wheel; a build writes CHUNKS random
# chunks to the temporary name, one per DELAY s, and appends a line to tmp/builds.log.
CONTROLLER = """
import json, os, sys, time
from pathlib import Path
from p40fleet import apex_cache, controller
tmp, name, chunks, delay = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
(tmp / f"machine-{name}").write_text(name * 8 + "\\n")
controller.MACHINE_ID = tmp / f"machine-{name}"

def build(part):
    with open(tmp / "builds.log", "a") as log:
        log.write(name + "\\n")
    with open(part, "wb") as out:
        for _ in range(chunks):
            out.write(os.urandom(64 * 1024))
            out.flush()
            time.sleep(delay)

(tmp / f"ready-{name}").touch()
while not (tmp / "go").exists():
    time.sleep(0.005)
start = time.monotonic()
tar, built = apex_cache.obtain(sys.argv[5], build, str(tmp / "cache"), log=print,
                               poll_s=0.05, progress_s=0.5)
print(json.dumps({"name": name, "built": built, "sha": apex_cache.apex_build.sha256_of(tar),
                  "s": round(time.monotonic() - start, 3)}))
"""


def _controller(tmp: Path, name: str, chunks: int = 8, delay: float = 0.1) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), controller.CACHE_ENV: str(tmp / "cache")}
    return subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(tmp), name, str(chunks), str(delay), KEY],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _start(tmp: Path, procs: list[subprocess.Popen], *names: str) -> None:
    """Start them at once, when each has imported and waits."""
    deadline = time.monotonic() + 60
    while not all((tmp / f"ready-{n}").exists() for n in names):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    (tmp / "go").touch()


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    return json.loads(out.strip().splitlines()[-1]) | {"out": out}


def test_two_controllers_racing_for_one_key_build_it_once_and_share_its_bytes(tmp_path):
    procs = [_controller(tmp_path, name, chunks=16) for name in ("a", "b")]
    _start(tmp_path, procs, "a", "b")
    results = [_result(p) for p in procs]
    assert (tmp_path / "builds.log").read_text().count("\n") == 1
    assert sorted(r["built"] for r in results) == [False, True], results
    tar = apex_build.controller_wheel(KEY, str(tmp_path / "cache"))
    assert {r["sha"] for r in results} == {apex_build.sha256_of(tar)}
    assert apex_build.controller_wheel_ok(tar)[0]
    waiter = next(r for r in results if not r["built"])
    assert "builds it; waited" in waiter["out"], waiter  # the progress line names the holder
    assert "controller " in waiter["out"] and "(pid " in waiter["out"]
    assert not os.path.exists(apex_cache.BuildLock.beside(tar).path)  # released


def _lock(path: Path, **fields) -> None:
    holder = {"controller": "ctl-old", "controller_id": "f" * 32, "pid": 4242, "pid_start": "1",
              "since": "2026-12-01T00:00:00Z", "key": KEY} | fields  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in holder.items()))


def test_a_stale_lock_is_taken_over_naming_its_old_holder_a_live_one_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv(controller.CACHE_ENV, str(tmp_path))
    tar = apex_build.controller_wheel(KEY)
    lock = apex_cache.BuildLock.beside(tar, stale_s=600)
    path = Path(lock.path)
    # another controller, refreshed just now: live
    _lock(path)
    assert lock.acquire().kind == "held"
    # the same one, not refreshed for 11 minutes by the cache dir's clock: stale
    old = time.time() - 660
    os.utime(path, (old, old))
    got = lock.acquire()
    assert got.kind == "taken" and lock.held_by_me(), got
    assert "took over the stale build lock of controller ctl-old (pid 4242" in got.message
    assert "not refreshed for 66" in got.message
    lock.release()
    assert not path.exists()
    # this controller, its process gone: stale at once
    dead = subprocess.Popen(["true"])
    dead.wait()
    _lock(path, controller_id=controller.controller_id(), pid=dead.pid, pid_start="123")
    got = apex_cache.BuildLock.beside(tar).acquire()
    assert got.kind == "taken" and f"its process {dead.pid} no longer runs" in got.message
    # this controller, another live process of it (a second run from this machine): live
    parent = os.getppid()
    other_run = replace(apex_cache.LockHolder.me(KEY), pid=parent,
                        pid_start=apex_cache._pid_start(parent))  # fmt: skip
    path.write_text(other_run.text())
    assert apex_cache.BuildLock.beside(tar).acquire().kind == "held"


def test_a_torn_wheel_is_never_visible_under_the_final_name(tmp_path):
    tar = apex_build.controller_wheel(KEY, str(tmp_path / "cache"))
    seen: list[bytes] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                seen.append(Path(tar).read_bytes())
            except FileNotFoundError:
                pass
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # a controller killed half way through writing the wheel: nothing under the final name
        killed = _controller(tmp_path, "a", chunks=40, delay=0.05)
        _start(tmp_path, [killed], "a")
        deadline = time.monotonic() + 60
        while not any(p.stat().st_size > 64 * 1024 for p in Path(tar).parent.glob("*.part.*")):
            assert time.monotonic() < deadline and killed.poll() is None
            time.sleep(0.01)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert not os.path.exists(tar) and not apex_build.controller_wheel_ok(tar)[0]
        # the next controller of that machine takes its lock over and publishes a whole wheel
        again = _result(_controller(tmp_path, "a", chunks=8, delay=0.02))
    finally:
        stop.set()
        watcher.join()
    assert again["built"] and "took over the stale build lock" in again["out"], again
    whole = Path(tar).read_bytes()
    assert len(whole) == 8 * 64 * 1024 and apex_build.controller_wheel_ok(tar)[0]
    assert seen and all(view == whole for view in seen), {len(v) for v in seen}


# -- in a pyinfra run: the election and the upload -------------------------------------------


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv(controller.CACHE_ENV, str(tmp_path))
    return tmp_path


def _other_controller_holds(tar: str) -> Path:
    path = Path(apex_cache.BuildLock.beside(tar).path)
    _lock(path, controller="ctl-b")  # refreshed just now
    return path


def test_a_run_elects_no_builder_while_another_controller_holds_the_keys_lock(cache):
    from tests.test_apex import P40, P40_KEY, FakeHost, _fleet, gpu  # the election's fleet

    key = P40_KEY
    tar = apex_build.controller_wheel(key)
    path = _other_controller_holds(tar)
    assert apex_fleet.builder(_fleet(FakeHost("lab1", [gpu(P40)])), key) is None
    path.unlink()
    state = _fleet(FakeHost("lab1", [gpu(P40)]))
    assert apex_fleet.builder(state, key) == "lab1"  # free: this run builds, holding the lock
    lock = apex_cache.BuildLock.beside(tar)
    assert lock.holder() is not None and lock.holder().same_process(lock.me)
    apex_cache.release_for(state, tar)  # as fetch_wheel does once it stored the wheel
    assert not path.exists()


def test_the_upload_waits_for_the_other_controllers_wheel_then_uses_it(cache):
    tar = apex_build.controller_wheel(KEY)
    path = _other_controller_holds(tar)

    def other_controller_stores() -> None:
        time.sleep(0.5)
        Path(f"{tar}.part").write_bytes(b"wheel")
        apex_cache.record(f"{tar}.part", tar)
        path.unlink()

    result = run_op(
        apex.put_wheel, local_tar=tar, remote_tar="/w/apex-wheel.tar", user="verl",
        facts={File: None, Directory: None}, default_facts=True,
    )  # fmt: skip
    writer = threading.Thread(target=other_controller_stores)
    writer.start()
    lines: list[str] = []
    host = SimpleNamespace(name="lab1", log_styled=lambda m, **_: lines.append(m))
    try:
        assert result.functions[0].function(None, host) is True
    finally:
        writer.join()
    assert apex_build.controller_wheel_ok(tar)[0]
    # released without a wheel (that controller's build failed): refused, naming the fix
    os.unlink(tar)
    _other_controller_holds(tar)
    threading.Timer(0.3, path.unlink).start()
    assert result.functions[0].function(None, host) is False
    assert "released without a wheel" in lines[-1] and "fix: re-run" in lines[-1], lines


def test_a_dry_run_takes_no_lock_but_sees_one_held(cache, monkeypatch):
    from tests.test_apex import P40, P40_KEY, FakeHost, _fleet, gpu

    monkeypatch.setattr(sys, "argv", ["pyinfra", "--dry", "inv.py", "deploy/python.py"])
    tar = apex_build.controller_wheel(P40_KEY)
    assert apex_fleet.builder(_fleet(FakeHost("lab1", [gpu(P40)])), P40_KEY) == "lab1"
    assert not os.path.exists(apex_cache.BuildLock.beside(tar).path)  # it builds nothing
    _other_controller_holds(tar)
    assert apex_fleet.builder(_fleet(FakeHost("lab1", [gpu(P40)])), P40_KEY) is None


def test_of_three_controllers_racing_for_one_stale_lock_one_believes_it_holds_it(
    monkeypatch, tmp_path
):
    """B judges the stale lock, then A takes it over first; a newcomer C links the moment the
    name is free while B acts: exactly one of them may end up holding it."""
    monkeypatch.setenv(controller.CACHE_ENV, str(tmp_path))
    tar = apex_build.controller_wheel(KEY)
    locks = {}
    for name in "abc":
        lock = apex_cache.BuildLock.beside(tar)
        lock.me = replace(lock.me, controller=f"ctl-{name}", controller_id=name * 32)
        locks[name] = lock
    a, b, c = locks.values()
    path = Path(b.path)
    _lock(path)
    old = time.time() - 660
    os.utime(path, (old, old))
    got: dict[str, apex_cache.Acquired] = {}
    judge, busy = b.stale_why, threading.local()

    def b_judged_then_a_took_over(*args):
        why = judge(*args)
        if "a" not in got:
            got["a"] = a.acquire()
        return why

    def newcomer_when_free(primitive):
        def wrapped(*args, **kwargs):
            try:
                return primitive(*args, **kwargs)
            finally:
                if not busy.__dict__ and "c" not in got and "a" in got and not path.exists():
                    busy.on = True
                    got["c"] = c.acquire()
                    del busy.on

        return wrapped

    monkeypatch.setattr(b, "stale_why", b_judged_then_a_took_over)
    for name in ("link", "rename", "replace", "unlink"):
        monkeypatch.setattr(os, name, newcomer_when_free(getattr(os, name)))
    got["b"] = b.acquire()
    monkeypatch.undo()
    taken = [n for n, g in got.items() if g.kind == "taken"]
    assert len(taken) == 1 and locks[taken[0]].held_by_me(), (got, path.read_text())
    assert "took over the stale build lock of controller ctl-old" in got[taken[0]].message
    for lock in locks.values():
        lock.release()
    assert not path.exists() and os.listdir(path.parent) == [], os.listdir(path.parent)


def test_a_takers_claim_on_a_stale_lock_is_respected_while_it_lives(monkeypatch, tmp_path):
    monkeypatch.setenv(controller.CACHE_ENV, str(tmp_path))
    tar = apex_build.controller_wheel(KEY)
    path = Path(apex_cache.BuildLock.beside(tar).path)
    _lock(path)
    old = time.time() - 660
    os.utime(path, (old, old))
    digest = apex_cache.hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    claim = Path(f"{path}.takeover-{digest}")
    # another controller's taker, claiming it just now: the lock is left to it
    _lock(claim, controller="ctl-b", controller_id="b" * 32)
    got = apex_cache.BuildLock.beside(tar).acquire()
    assert got.kind == "held" and got.holder.controller == "ctl-old" and path.exists(), got
    # a taker of this controller killed between its claim and the removal: taken over
    dead = subprocess.Popen(["true"])
    dead.wait()
    _lock(claim, controller_id=controller.controller_id(), pid=dead.pid, pid_start="123")
    lock = apex_cache.BuildLock.beside(tar)
    got = lock.acquire()
    assert got.kind == "taken" and lock.held_by_me(), got
    assert "took over the stale build lock of controller ctl-old" in got.message
    lock.release()
    assert os.listdir(path.parent) == [], os.listdir(path.parent)


# -- a holder judged stale but alive (paused, or its refreshes lost): it wakes and acts ------


def _holders(monkeypatch, tmp_path) -> tuple[apex_cache.BuildLock, apex_cache.BuildLock, str]:
    """Controllers A and B (two controller ids) of one key; A holds its lock, silent for 11
    minutes by the cache dir's clock: B may take it over."""
    monkeypatch.setenv(controller.CACHE_ENV, str(tmp_path))
    tar = apex_build.controller_wheel(KEY)
    a, b = (apex_cache.BuildLock.beside(tar) for _ in "ab")
    a.me = replace(a.me, controller="ctl-a", controller_id="a" * 32)
    b.me = replace(b.me, controller="ctl-b", controller_id="b" * 32)
    assert a.acquire().kind == "taken"
    old = time.time() - 660
    os.utime(a.path, (old, old))
    return a, b, tar


def _paused_before(monkeypatch, name: str, path: str, then) -> list[bool]:
    """``os.<name>`` that, the first time it acts on ``path`` (or a descriptor), runs ``then``
    before acting: the holder woke there, between its last look and its act."""
    primitive, fired = getattr(os, name), []

    def paused(target, *args, **kwargs):
        if not fired and (target == path or isinstance(target, int)):
            fired.append(True)
            then()
        return primitive(target, *args, **kwargs)

    monkeypatch.setattr(os, name, paused)
    return fired


def test_a_holder_that_wakes_after_its_takeover_releases_nothing_of_the_new_holders(
    monkeypatch, tmp_path
):
    """A looked (the lock was its own), then paused; B took over in that pause. Before, A's
    unlink removed B's lock (a third controller could then take it: two builders). A releases
    holding the claim a taker of its lock must hold, so B waits for it; its lock stays B's."""
    a, b, _tar = _holders(monkeypatch, tmp_path)
    got = {}
    fired = _paused_before(monkeypatch, "unlink", a.path, lambda: got.update(b=b.acquire()))
    a.release()
    monkeypatch.undo()
    assert fired, "A's release removed nothing"
    assert not (got["b"].kind == "taken" and not b.held_by_me()), "A removed B's lock"
    assert got["b"].kind == "held" and got["b"].holder.controller == "ctl-a", got
    assert not os.path.exists(a.path)  # A's own, removed; B takes it now
    assert b.acquire().kind == "taken" and b.held_by_me()
    b.release()
    assert os.listdir(os.path.dirname(a.path)) == []  # no claim left behind


def test_a_holder_that_wakes_after_its_takeover_never_refreshes_the_new_holders_lock(
    monkeypatch, tmp_path
):
    """A read its lock for a refresh, then paused; B took over and went silent. Before, A's
    utime by name refreshed B's lock (B dead would stay live for STALE_S more); A refreshes the
    file it read, and at its next beat sees the lock is not its own and stops."""
    a, b, _tar = _holders(monkeypatch, tmp_path)
    b_silent = time.time() - 300

    def b_takes_over() -> None:
        assert b.acquire().kind == "taken"
        os.utime(b.path, (b_silent, b_silent))  # B's own refreshes, as late as they may be
        a._stop.set()  # one beat of A's, driven here

    a.heartbeat_s = 0
    fired = _paused_before(monkeypatch, "utime", a.path, b_takes_over)
    a._heartbeat()
    monkeypatch.undo()
    assert fired and b.held_by_me() and not a.held_by_me()
    assert abs(os.stat(b.path).st_mtime - b_silent) < 1, "A refreshed B's lock"
    b.release()


def test_a_builder_whose_lock_was_taken_over_mid_build_leaves_the_new_holders_wheel(
    monkeypatch, tmp_path
):
    """A's build outlived its lock (B took it over and stored its wheel meanwhile). Before, A's
    record renamed its own tar over B's; now it is not recorded (naming what happened) and A
    uses B's wheel."""
    monkeypatch.setenv(controller.CACHE_ENV, str(tmp_path))
    tar = apex_build.controller_wheel(KEY)
    b = apex_cache.BuildLock.beside(tar)
    b.me = replace(b.me, controller="ctl-b", controller_id="b" * 32)
    lines: list[str] = []

    def a_builds(part: str) -> None:
        old = time.time() - 660
        os.utime(b.path, (old, old))  # A's lock: its refreshes stopped
        got = b.acquire()
        assert got.kind == "taken" and "took over the stale build lock of controller" in got.message
        Path(f"{tar}.part.b").write_bytes(b"B's wheel")
        apex_cache.record(f"{tar}.part.b", tar)
        b.release()
        Path(part).write_bytes(b"A's wheel")

    local, built = apex_cache.obtain(KEY, a_builds, log=lines.append, poll_s=0.01)
    assert local == tar and Path(tar).read_bytes() == b"B's wheel", lines
    assert apex_build.controller_wheel_ok(tar)[0] and built is False
    assert any(f"was taken over from controller {socket.gethostname()}" in m for m in lines)
    assert sorted(os.listdir(os.path.dirname(tar))) == ["apex-wheel.tar", "apex-wheel.tar.sha256"]


def test_a_fetched_wheel_is_not_recorded_once_the_runs_lock_was_taken_over(monkeypatch, tmp_path):
    """The builder host's copy arrives after this run's lock was taken over (B builds the key
    now): the copy is not recorded over B's coming wheel, the line names B, B keeps its lock
    and this run's uploads wait for B's wheel (the fetch itself did not fail)."""
    from pyinfra.api import State

    from tests.test_apex import _wheel_tar

    a, b, tar = _holders(monkeypatch, tmp_path)
    run = State()
    apex_cache.hold(run, a)
    assert b.acquire().kind == "taken"  # A's run is still building
    result = run_op(apex.fetch_wheel, remote_tar="/w/apex-wheel.tar", local_tar=tar, facts={},
                    default_facts=True)  # fmt: skip
    part = apex_cache.part_of(tar)
    _wheel_tar(part)
    Path(f"{part}.sha256").write_text(apex_build.sha256_of(part) + "\n")
    lines: list[str] = []
    host = SimpleNamespace(name="lab1", log_styled=lambda m, **_: lines.append(m))
    assert result.functions[-1].function(run, host) is True
    assert not os.path.exists(tar) and b.held_by_me(), lines
    assert "held now by controller ctl-b (pid" in lines[-1] and "not recorded" in lines[-1]
    assert sorted(os.listdir(os.path.dirname(tar))) == ["build.lock"]  # A's copies removed
    b.release()
