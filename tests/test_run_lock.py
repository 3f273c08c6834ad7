"""The run lock: who holds it, when it is stale, and the host-side commands (run with sh here).

The decisions are pure (``p40fleet.run_lock.decide``); the commands run with ``sh`` in a temp
dir, two at once for the races; the operation runs offline (tests/opharness.py) and, end to end,
under the real pyinfra CLI on ``@local`` (as tests/test_refuse.py does).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from p40fleet import controller, run_lock
from p40fleet.facts.run_lock import RunLock, RunLockState
from p40fleet.operations import run_lock as op
from p40fleet.run_lock import BOOT_GRACE_S, MAX_AGE_S, Holder
from p40fleet.run_record import run_record
from tests.opharness import run_op

REPO = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 11, 30, 23, 0, 0, tzinfo=timezone.utc)
CTL_ID = "c" * 32  # this controller's id (p40fleet.controller.controller_id)
ME = Holder("ctl", 100, "run-me", "lab2", "2026-11-30T23:00:00Z", controller_id=CTL_ID)
BOOT = "boot-1"
UP = 3600.0  # the host's uptime: an hour since its boot


def holder_text(controller="ctl", pid=7, run="run-a", host="lab2", since="2026-11-30T22:59:58Z",
                boot=BOOT, controller_id=None) -> str:  # fmt: skip
    if controller_id is None:  # the hostname stands for the controller in these cases
        controller_id = CTL_ID if controller == "ctl" else controller.ljust(32, "0")
    return "\n".join(Holder(controller, pid, run, host, since, boot, controller_id).lines())


def recent() -> str:
    """A holder's start two seconds ago by the real clock: for checks that read it."""
    return (datetime.now(timezone.utc) - timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")


def decide(text, *, alive=True, boot=BOOT, exists=True, now=NOW, uptime=UP):
    return run_lock.decide(exists, text, boot, ME, now=now, uptime_s=uptime,
                           pid_alive=lambda pid: alive)  # fmt: skip


# ------------------------------------------------------------------------- decisions


def test_free_and_reentrant():
    assert decide("", exists=False).kind == "free"
    assert decide(holder_text(run="run-me", pid=100)).kind == "ours"


def test_same_machine_twice_in_one_run_is_refused():
    decision = decide(holder_text(run="run-me", host="lab2-again"))
    assert decision.kind == "held" and "listed twice" in decision.message


def test_live_run_is_named():
    decision = decide(holder_text(controller="ctl-b", pid=4242))
    assert decision.kind == "held"
    assert "run run-a of controller ctl-b (pid 4242) since 2026-11-30T22:59:58Z" in decision.message
    # on this controller: a live pid holds it even after a reboot (that run rebooted the host)
    assert decide(holder_text(), alive=True, boot="boot-2").kind == "held"


def test_crashed_run_on_this_controller_is_stale():
    text = holder_text(pid=7)
    decision = decide(text, alive=False)
    assert decision.kind == "stale" and decision.stale_text == text
    assert "pid 7 no longer runs on ctl" in decision.message
    assert "took over the stale lock of run run-a" in decision.message


def test_other_controller_stale_after_reboot_or_max_age():
    other = holder_text(controller="ctl-b")
    assert decide(other, boot="boot-2").kind == "stale"
    assert "rebooted" in decide(other, boot="boot-2").message
    later = NOW + timedelta(seconds=MAX_AGE_S + 60)
    assert decide(other, now=later).kind == "stale"
    assert "by the host's clock" in decide(other, now=later).message
    assert decide(other, now=NOW + timedelta(seconds=MAX_AGE_S - 60)).kind == "held"


def test_same_hostname_other_controller_id_is_held_not_crashed():
    """N8: a clone with this controller's hostname holds a live lock: its pid is not looked
    up here (it runs elsewhere), the lock is held."""
    clone = holder_text(controller="ctl", pid=41234, controller_id="d" * 32)
    decision = decide(clone, alive=False)
    assert decision.kind == "held", decision
    assert "controller ctl (pid 41234)" in decision.message
    # a lock of an earlier version (no controller_id): never taken for this controller's own
    legacy = "\n".join(line for line in holder_text(pid=41234).splitlines()
                       if not line.startswith("controller_id="))  # fmt: skip
    assert decide(legacy, alive=False).kind == "held"
    assert run_lock.parse_holder(legacy).controller_id == ""


def test_age_is_measured_on_the_hosts_clock():
    """N8: ``now`` is the host's clock (facts.run_lock); the holder's ``since`` the host's too,
    so a controller 25 h ahead takes nothing over; a lock 25 h old by the host's clock is."""
    other = holder_text(controller="ctl-b", since="2026-11-30T22:00:00Z")
    assert decide(other, now=datetime(2026, 11, 30, 23, 0, tzinfo=timezone.utc)).kind == "held"
    assert decide(other, now=datetime(2026, 12, 1, 23, 1, tzinfo=timezone.utc)).kind == "stale"


def test_a_reboot_takes_over_only_after_the_grace():
    """N8: the run that rebooted the host refreshes its holder when it is back; until the host
    has been up BOOT_GRACE_S, another controller waits (held, saying why); unknown uptime:
    held."""
    other = holder_text(controller="ctl-b")
    early = decide(other, boot="boot-2", uptime=60)
    assert early.kind == "held" and "rebooted 1 min ago" in early.message, early
    assert decide(other, boot="boot-2", uptime=BOOT_GRACE_S + 1).kind == "stale"
    assert decide(other, boot="boot-2", uptime=None).kind == "held"


def test_unreadable_holder_is_held_not_guessed():
    assert decide("garbage").kind == "held"


def test_fact_parses_present_and_absent():
    fact = RunLock()
    assert "head -c 4096" in fact.command("/var/lib/p40fleet/run.lock")
    assert fact.process(["boot_id=b1"]) == RunLockState(False, "", "b1")
    clock = ["now=2026-11-30T23:00:00Z", "uptime=3600.25"]
    got = fact.process(["boot_id=b1", *clock, "lock=present", *holder_text().splitlines()])
    assert got == RunLockState(True, holder_text(), "b1", NOW, 3600.25)
    # the real command here: the host's clock and uptime come back
    out = sh(fact.command(str(Path("/nonexistent/run.lock")))).stdout.splitlines()
    seen = fact.process(out)
    assert (
        seen.now is not None and abs((seen.now - datetime.now(timezone.utc)).total_seconds()) < 60
    )
    if Path("/proc/uptime").exists():
        assert seen.uptime_s is not None and seen.uptime_s > 0


# ------------------------------------------------------------------- host-side shell


def sh(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)


def test_acquire_release_and_refusal_in_a_temp_dir(tmp_path):
    path = str(tmp_path / "p40fleet" / "run.lock")
    a = Holder("ctl", 1, "run-a", "lab2", "2026-11-30T23:00:00Z")
    b = Holder("ctl-b", 2, "run-b", "lab2", "2026-11-30T23:00:02Z")
    assert sh(run_lock.acquire_command(path, a)).returncode == 0
    held = Path(path, "holder").read_text()
    assert "run=run-a" in held and "boot_id=" in held and held.endswith("\n")
    assert sh(run_lock.acquire_command(path, a)).returncode == 0  # re-entrant
    refused = sh(run_lock.acquire_command(path, b))
    assert refused.returncode == 75 and "run=run-a" in refused.stderr
    assert sh(run_lock.release_command(path, b)).returncode == 0
    assert Path(path).is_dir()  # not b's to release
    assert sh(run_lock.release_command(path, a)).returncode == 0
    assert not Path(path).exists()
    assert [p.name for p in (tmp_path / "p40fleet").iterdir()] == []  # no temp dir left


def _race(scripts: list[str]) -> list[int]:
    procs = [subprocess.Popen(["sh", "-c", s], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for s in scripts]  # fmt: skip
    return [p.wait(timeout=30) for p in procs]


def test_two_runs_that_both_saw_no_lock_one_wins(tmp_path):
    for attempt in range(10):
        path = str(tmp_path / f"try{attempt}" / "run.lock")
        runs = [Holder("ctl", i, f"run-{i}", "lab2", "2026-11-30T23:00:00Z") for i in range(4)]
        codes = _race([run_lock.acquire_command(path, h) for h in runs])
        assert sorted(codes) == [0, 75, 75, 75], codes
        winner = runs[codes.index(0)]
        assert f"run={winner.run}" in Path(path, "holder").read_text()


def test_two_runs_taking_over_one_stale_lock_one_wins(tmp_path):
    for attempt in range(10):
        path = tmp_path / f"try{attempt}" / "run.lock"
        path.mkdir(parents=True)
        stale = holder_text(pid=999999)
        (path / "holder").write_text(stale + "\n")
        runs = [Holder("ctl", i, f"run-{i}", "lab2", "2026-11-30T23:00:00Z") for i in range(4)]
        codes = _race([run_lock.acquire_command(str(path), h, stale) for h in runs])
        assert sorted(codes) == [0, 75, 75, 75], codes
        winner = runs[codes.index(0)]
        assert f"run={winner.run}" in (path / "holder").read_text()


def test_takeover_only_replaces_the_exact_stale_holder(tmp_path):
    path = tmp_path / "run.lock"
    path.mkdir()
    (path / "holder").write_text(holder_text(run="run-new") + "\n")  # someone took it since
    result = sh(run_lock.acquire_command(str(path), ME, holder_text(run="run-old")))
    assert result.returncode == 75 and "run=run-new" in result.stderr


def test_refresh_writes_the_new_boot_id(tmp_path):
    path = tmp_path / "run.lock"
    path.mkdir()
    (path / "holder").write_text("\n".join(ME.lines()[:-1]) + "\nboot_id=old\n")
    assert sh(run_lock.refresh_command(str(path), ME)).returncode == 0
    boot = Path(run_lock.BOOT_ID).read_text().strip()
    assert (path / "holder").read_text().splitlines()[-1] == f"boot_id={boot}"
    assert run_lock.parse_holder((path / "holder").read_text()).controller_id == CTL_ID


def test_refresh_after_a_takeover_fails_the_host(tmp_path):
    """N8: A rebooted the host, B took the lock over meanwhile: A's refresh exits 75 naming B
    (and leaves B's holder alone) instead of going on without the lock."""
    path = str(tmp_path / "run.lock")
    a = Holder("ctl-01", 111, "aaaaaaaaaaaa", "lab1", controller_id="a" * 32)
    b = Holder("ctl-02", 222, "bbbbbbbbbbbb", "lab1", controller_id="b" * 32)
    assert sh(run_lock.acquire_command(path, a)).returncode == 0
    stale = Path(path, "holder").read_text().strip("\n")
    assert sh(run_lock.acquire_command(path, b, stale)).returncode == 0  # B's takeover
    taken = Path(path, "holder").read_text()
    refresh = sh(run_lock.refresh_command(path, a))
    assert refresh.returncode == 75, refresh
    assert "no longer held by run aaaaaaaaaaaa" in refresh.stderr
    assert "run=bbbbbbbbbbbb" in refresh.stderr
    assert Path(path, "holder").read_text() == taken


def test_since_is_written_by_the_hosts_clock(tmp_path):
    """N8: the holder's ``since`` is the host's ``date -u``, not the controller's."""
    path = str(tmp_path / "run.lock")
    me = Holder("ctl", 1, "run-a", "lab2", since="1999-01-01T00:00:00Z", controller_id=CTL_ID)
    assert sh(run_lock.acquire_command(path, me)).returncode == 0
    held = run_lock.parse_holder(Path(path, "holder").read_text())
    written = datetime.strptime(held.since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert abs((written - datetime.now(timezone.utc)).total_seconds()) < 60
    assert held.controller_id == CTL_ID and held.controller == "ctl"


def test_controller_id_is_random_kept_and_not_the_hostname(tmp_path, monkeypatch):
    """N8: one id per controller cache, made once (0600), kept across runs; a garbled file is
    replaced; two caches (two controllers, even with one hostname) have two ids."""
    monkeypatch.setenv(controller.CACHE_ENV, str(tmp_path / "a"))
    first = controller.controller_id()
    assert len(first) == 32 and first == controller.controller_id()
    stored = controller.id_path()
    assert stored.parent == tmp_path / "a" and stored.name.startswith("controller-id.")
    assert stored.read_text().strip() == first and stored.stat().st_mode & 0o777 == 0o600
    assert socket.gethostname() not in first
    monkeypatch.setenv(controller.CACHE_ENV, str(tmp_path / "b"))
    assert controller.controller_id() != first
    stored.write_text("garbage\n")
    monkeypatch.setenv(controller.CACHE_ENV, str(tmp_path / "a"))
    again = controller.controller_id()
    assert again != first and stored.read_text().strip() == again


def test_two_machines_sharing_one_cache_dir_are_two_controllers(tmp_path, monkeypatch):
    """An NFS home shared by two controllers: each machine keeps its own id there, so one never
    takes the other's live lock for a crashed run of its own; each keeps its id across runs."""
    monkeypatch.setenv(controller.CACHE_ENV, str(tmp_path / "shared"))
    ids = {}
    for machine in ("a" * 32, "b" * 32, "a" * 32):
        (tmp_path / "machine-id").write_text(machine + "\n")
        monkeypatch.setattr(controller, "MACHINE_ID", tmp_path / "machine-id")
        ids.setdefault(machine, set()).add(controller.controller_id())
    assert len(ids["a" * 32]) == 1 and ids["a" * 32] != ids["b" * 32], ids
    assert len(list((tmp_path / "shared").glob("controller-id.*"))) == 2


# --------------------------------------------------------------------- the operation


def test_operation_refuses_a_held_host_at_prepare_and_takes_nothing_else():
    seen = RunLockState(True, holder_text(controller="ctl-b", pid=4242, since=recent()), BOOT)
    result = run_op(op.take, path="/var/lib/p40fleet/run.lock", facts={RunLock: seen},
                    host_name="lab2")  # fmt: skip
    assert result.commands == ["function _fail"]
    (failure,) = result.failures
    assert failure.startswith("host lab2: run lock: another p40fleet run holds this host: run ")
    assert "controller ctl-b (pid 4242)" in failure
    assert "rm -rf /var/lib/p40fleet/run.lock" in failure


def test_operation_changes_nothing_while_preparing():
    result = run_op(op.take, facts={RunLock: RunLockState(False, "", BOOT)})
    assert result.commands == []  # taken at execution, and never reported as a change


# ------------------------------------------------------------- end to end on @local

DEPLOY = """
from pyinfra.operations import server
from p40fleet.operations.run.spec import validated_spec
from p40fleet.operations.run_lock import hold
spec = validated_spec()
if spec is not None:
    hold()  # a second deploy of the same run: re-entrant
    server.shell(name="touch marker", commands=["touch {marker}"])
"""


def pyinfra_local(tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    marker = tmp_path / "marker"
    marker.unlink(missing_ok=True)
    lock = tmp_path / "run.lock"
    (tmp_path / "inv.py").write_text(
        f"hosts = [('@local', {{'stack': {{}}, 'p40fleet_run_lock': {str(lock)!r}}})]\n"
    )
    (tmp_path / "deploy.py").write_text(DEPLOY.format(marker=marker))
    env = {**os.environ, "PYTHONPATH": str(REPO), controller.CACHE_ENV: str(tmp_path / "ctl")}
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", str(tmp_path / "inv.py"),
         str(tmp_path / "deploy.py")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return proc, marker


@pytest.mark.skipif(not Path(run_lock.BOOT_ID).exists(), reason="needs Linux /proc")
def test_end_to_end_held_refused_stale_taken_over_and_released(tmp_path, monkeypatch):
    lock = tmp_path / "run.lock"
    proc, marker = pyinfra_local(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and marker.exists(), out
    assert not lock.exists(), out  # released at the end of the run
    assert "[@local] No changes" in out.split("touch marker")[0], out  # the lock: no change

    lock.mkdir()
    boot = Path(run_lock.BOOT_ID).read_text().strip()  # this boot: not stale by a reboot
    other = holder_text(controller="ctl-b", pid=4242, host="@local", boot=boot, since=recent())
    (lock / "holder").write_text(other + "\n")
    proc, marker = pyinfra_local(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and not marker.exists(), out
    assert "host @local: run lock: another p40fleet run holds this host: run run-a of " \
           "controller ctl-b (pid 4242)" in out, out  # fmt: skip
    assert (lock / "holder").exists()  # not ours: left alone

    # N8: this hostname but another controller (a clone), its pid not running here: held
    clone = holder_text(controller=socket.gethostname(), pid=999999, host="@local", boot=boot,
                        controller_id="e" * 32, since=recent())  # fmt: skip
    (lock / "holder").write_text(clone + "\n")
    proc, marker = pyinfra_local(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and not marker.exists(), out
    assert "another p40fleet run holds this host" in out and "pid 999999" in out, out

    monkeypatch.setenv(controller.CACHE_ENV, str(tmp_path / "ctl"))
    ours = controller.controller_id()  # the id the pyinfra runs above kept in their cache
    (lock / "holder").write_text(holder_text(controller=socket.gethostname(), pid=999999,
                                             host="@local", boot=boot,
                                             controller_id=ours) + "\n")  # fmt: skip
    proc, marker = pyinfra_local(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and marker.exists(), out
    assert "run lock: took over the stale lock of run run-a" in out and "pid 999999" in out, out
    assert not lock.exists(), out


def test_a_deferred_release_is_given_once_to_whoever_runs_last(tmp_path):
    """deploy/full.py: the verify probe after the run carries the release (one command, not
    two); the release callback leaves such a host alone and a host not locked gets none."""
    from pyinfra.context import ctx_host, ctx_state

    from tests.opharness import make_host

    state, host = make_host({op.PATH_KEY: str(tmp_path / "lock")})
    with ctx_state.use(state), ctx_host.use(host):
        me = op.this_run()
        op.defer_release()
    assert op.release_for(host) is None  # not taken by this run: nothing to release
    run_record(state).lock_held = {host.name}  # as take() leaves it at execution
    command = op.release_for(host)
    assert command == run_lock.release_command(str(tmp_path / "lock"), me)
    assert op.release_for(host) is None  # given once
    release = op.RunLockEvents()
    release.last[host.name] = "op"
    release.operation_host_success(state, host, "op")  # deferred: no command, no error


# ------------------------------------------- the callback that takes the lock (#29)


def _fleet(names, tmp_path):
    """A real State of connected hosts, each its own lock path, whose shell commands are
    recorded (and answered by ``answer(name, command)``) and whose RunLock fact says free."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.connectors.util import CommandOutput, OutputLine

    hosts = [(n, {op.PATH_KEY: str(tmp_path / f"lock-{n}")}) for n in names]
    state = State(Inventory((hosts, {})), Config())
    sent: dict[str, list[str]] = {n: [] for n in names}
    said: list[str] = []
    answers: dict[str, tuple[bool, list[str]]] = {}
    for one in state.inventory:
        state.activate_host(one)

        def run_shell_command(command, _name=one.name, **_):
            sent[_name].append(str(command.get_raw_value()))
            ok, stderr = answers.get(_name, (True, []))
            return ok, CommandOutput([OutputLine("stderr", line) for line in stderr])

        one.run_shell_command = run_shell_command
        one.get_fact = lambda cls, **kw: RunLockState(False, "", BOOT)
        one.log_styled = lambda message, _name=one.name, **kw: said.append(f"{_name}: {message}")
    return state, sent, said, answers


def _queue(state, name):
    """What a deploy's validated_spec() does for ``name`` while preparing: hold()."""
    from pyinfra.context import ctx_host, ctx_state

    with ctx_state.use(state), ctx_host.use(state.inventory.get_host(name)):
        return op.hold()


def test_the_callback_takes_each_queued_hosts_lock_before_the_first_operation(tmp_path):
    """At the run's first operation_start, before pyinfra picks the operation's hosts: a and b
    queued the lock, c (a verify-only deploy's host) did not; b's lock was taken meanwhile by
    another live run: b fails there, naming it, and a goes on holding its lock."""
    state, sent, said, answers = _fleet(["a", "b", "c"], tmp_path)
    assert _queue(state, "a") and _queue(state, "b")
    assert [h for h in state.callback_handlers if isinstance(h, op.RunLockEvents)] != []
    assert sent == {"a": [], "b": [], "c": []}  # preparing takes nothing (--dry neither)
    other = holder_text(controller="ctl-b", pid=4242, host="b")
    answers["b"] = (False, ["p40fleet run lock ... is held:", *other.splitlines()])
    state.is_executing = True
    state.trigger_callbacks("operation_start", state.get_op_order()[0])
    me = op._holder(state, "a")
    assert sent["a"] == [run_lock.acquire_command(str(tmp_path / "lock-a"), me)]
    assert len(sent["b"]) == 1 and sent["c"] == []
    assert run_record(state).lock_held == {"a"}
    assert {h.name for h in state.failed_hosts} == {"b"}
    assert "b: host b: run lock: another p40fleet run holds this host: run run-a of controller " \
           "ctl-b (pid 4242)" in said[0], said  # fmt: skip
    (refusal,) = run_record(state).refusals["b"]
    assert refusal[0] == "run lock" and "pid 4242" in refusal[1]
    # a's last operation: released, with the same holder
    a = state.inventory.get_host("a")
    state.trigger_callbacks("operation_host_success", a, state.get_op_order()[-1])
    assert sent["a"][-1] == run_lock.release_command(str(tmp_path / "lock-a"), me)
    assert run_record(state).lock_held == set()


def test_the_callback_releases_at_a_hosts_first_failure(tmp_path):
    state, sent, _, _ = _fleet(["a"], tmp_path)
    assert _queue(state, "a")
    state.is_executing = True
    first = state.get_op_order()[0]
    state.trigger_callbacks("operation_start", first)
    assert run_record(state).lock_held == {"a"}
    state.trigger_callbacks("operation_host_error", state.inventory.get_host("a"), first)
    me = op._holder(state, "a")
    assert sent["a"][-1] == run_lock.release_command(str(tmp_path / "lock-a"), me)
    assert len(sent["a"]) == 2 and run_record(state).lock_held == set()


def test_the_callback_is_installed_once_per_state(tmp_path):
    state, *_ = _fleet(["a", "b"], tmp_path)
    assert _queue(state, "a") and _queue(state, "b") and _queue(state, "a")
    assert op.install(state) is False
    again, *_ = _fleet(["a"], tmp_path)
    assert _queue(again, "a")
    for one in (state, again):
        assert sum(isinstance(h, op.RunLockEvents) for h in one.callback_handlers) == 1


def test_the_operation_takes_no_lock_even_when_executing(tmp_path):
    """pyinfra runs an operation's body again when it executes: that pass takes nothing now
    (the callback did), so a State without the callback takes no lock."""
    from pyinfra.context import ctx_host, ctx_state

    state, sent, _, _ = _fleet(["a"], tmp_path)
    state.is_executing = True
    with ctx_state.use(state), ctx_host.use(state.inventory.get_host("a")):
        commands = list(op.take._inner(path=str(tmp_path / "lock-a")))
    assert commands == [] and sent == {"a": []}
    assert run_record(state).lock_held == set()
    assert not any(isinstance(h, op.RunLockEvents) for h in state.callback_handlers)


RACE_DEPLOY = """
from pathlib import Path
from pyinfra import host
from pyinfra.operations import server
from p40fleet.operations.run.spec import validated_spec
name = host.name.replace("/", "_")
server.shell(name="early", commands=["touch {markers}/early-" + name])  # before the lock's op
spec = validated_spec()
if spec is not None:
    if host.name == "@local":  # another run takes this host's lock after we read it free
        lock = Path(host.data.p40fleet_run_lock)
        lock.mkdir()
        (lock / "holder").write_text({holder!r})
    server.shell(name="touch marker", commands=["touch {markers}/late-" + name])
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("chroot") is None or not Path(run_lock.BOOT_ID).exists(),
    reason="a second local host needs the chroot connector (root + chroot), and Linux /proc",
)
@pytest.mark.parametrize("mode", [[], ["--serial"]])
def test_a_host_whose_lock_is_taken_meanwhile_fails_before_its_first_operation(tmp_path, mode):
    """The lock is taken before the run's first operation, whichever it is (here one a deploy
    queued before validated_spec): @local, whose lock another live run took after the
    prepare stage read it free, runs none of its operations; @chroot// runs all of them."""
    markers = tmp_path / "markers"
    markers.mkdir()
    boot = Path(run_lock.BOOT_ID).read_text().strip()
    other = holder_text(controller="ctl-b", pid=4242, host="@local", boot=boot, since=recent())
    (tmp_path / "inv.py").write_text(
        f"hosts = [(n, {{'stack': {{}}, 'p40fleet_run_lock': {str(tmp_path)!r} + '/lock-' + s}})"
        " for n, s in (('@local', 'local'), ('@chroot//', 'chroot'))]\n"
    )
    deploy = RACE_DEPLOY.format(markers=markers, holder=other + "\n")
    (tmp_path / "deploy.py").write_text(deploy)
    env = {**os.environ, "PYTHONPATH": str(REPO), controller.CACHE_ENV: str(tmp_path / "ctl")}
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", *mode, str(tmp_path / "inv.py"),
         str(tmp_path / "deploy.py")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert sorted(p.name for p in markers.iterdir()) == ["early-@chroot__", "late-@chroot__"], out
    assert "host @local: run lock: another p40fleet run holds this host: run run-a of " \
           "controller ctl-b (pid 4242)" in out, out  # fmt: skip
    assert "Traceback" not in out, out
    assert (tmp_path / "lock-local" / "holder").read_text() == other + "\n"  # not ours
    assert not (tmp_path / "lock-chroot").exists(), out  # released at the end of the run


COUNTED_DEPLOY = """
from pyinfra import host, state
from pyinfra.operations import server
from p40fleet.facts.survey import install
from p40fleet.operations.run.spec import validated_spec
from p40fleet.operations.run.survey import survey_host
from p40fleet.spec import spec_for_host
install(state)
survey_host(host, spec_for_host(host))  # as deploy/preflight.py: the lock's fact in it
spec = validated_spec()
if spec is not None:
    server.shell(name="touch marker", commands=["touch {marker}"])
"""


@pytest.mark.skipif(not Path(run_lock.BOOT_ID).exists(), reason="needs Linux /proc")
def test_the_lock_costs_one_command_to_take_and_one_to_release(tmp_path):
    """No command more than before the callback (#29): the survey answers the lock's fact,
    the callback takes it in one command, the last operation's end releases it in one."""
    lock, marker = tmp_path / "run.lock", tmp_path / "marker"
    (tmp_path / "inv.py").write_text(
        f"hosts = [('@local', {{'stack': {{}}, 'p40fleet_run_lock': {str(lock)!r}}})]\n"
    )
    (tmp_path / "deploy.py").write_text(COUNTED_DEPLOY.format(marker=marker))
    env = {**os.environ, "PYTHONPATH": str(REPO), controller.CACHE_ENV: str(tmp_path / "ctl")}
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "--debug", str(tmp_path / "inv.py"),
         str(tmp_path / "deploy.py")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and marker.exists() and not lock.exists(), out
    sent = [line.split("Running command on localhost: ", 1)[1]
            for line in out.splitlines() if "Running command on localhost: " in line]  # fmt: skip
    assert len(sent) == 4, sent
    survey, take, touch, release = sent
    assert "p40fleet_out=" in survey and f"L={lock}" in take and f"touch {marker}" in touch
    assert release.startswith("sh -c 'if grep -qxF run="), sent
