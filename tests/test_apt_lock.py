"""operations.util.apt_lock: apt steps wait for the dpkg lock (bounded), say who holds it, then fail
naming host, step, holder and fix. The waiting script runs for real here, against a process
holding an fcntl lock (as apt and unattended-upgrade take it) on stand-in lock files."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyinfra.api import FunctionCommand
from pyinfra.facts.deb import DebPackages

from p40fleet.facts.host import KernelHeaders, KernelInfo
from p40fleet.facts.mirror import AptSources, AptSourceState
from p40fleet.facts.packages import DebInstalled
from p40fleet.operations import driver, mirror
from p40fleet.operations.util import apt_lock
from tests.opharness import at, run_op

REPO = Path(__file__).resolve().parent.parent
KR = "5.4.0-150-generic"
HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def apt_commands(result) -> list[str]:
    """The apt command line of each lock-guarded step an operation yielded."""
    out = []
    for fn in result.functions:
        if fn.function.__name__ == "_stream":
            lines = fn.args[0].get_raw_value().splitlines()
            rest = next(i for i, line in enumerate(lines) if line.startswith("p40_rest="))
            out.append(lines[rest + 1].split(" || {")[0])
    return out


def script_of(fn: FunctionCommand, lock_dir: Path) -> str:
    """The step's shell text with the lock files moved under ``lock_dir``."""
    text = fn.args[0].get_raw_value()
    for path in apt_lock.LOCK_FILES:
        text = text.replace(path, str(lock_dir / Path(path).name))
    return text


@pytest.fixture()
def hold(tmp_path):
    """hold(seconds): a process holding lock-frontend under tmp_path; returns it."""
    procs = []

    def start(seconds: float) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(tmp_path / "lock-frontend"), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "locked"
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def run_script(
    text: str, timeout: float = 60, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        ["sh", "-c", text], capture_output=True, text=True, timeout=timeout, env=env
    )
    return proc, time.monotonic() - t0


LATE_DATE = """import sys, time
from pathlib import Path
first = Path(sys.argv[0]).with_name("first")
if not first.exists():
    first.write_text(repr(time.time()))
print(1000 + int(time.time() - float(first.read_text()) + 0.99))
"""


def late_clock(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``date +%s`` starts 0.01 s before a tick, as a real start may."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "date").write_text(f"#!{sys.executable}\n{LATE_DATE}")
    (shim / "date").chmod(0o755)
    return {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}


def test_lock_option_is_apts_own_timeout():
    assert apt_lock.lock_option() == "-o DPkg::Lock::Timeout=600"
    assert apt_lock.lock_option(30) == "-o DPkg::Lock::Timeout=30"


def test_the_script_is_posix_sh():
    text = apt_lock.update("lab1", "apt source", 30).args[0].get_raw_value()
    for shell in ("dash", "sh"):
        if subprocess.run(["which", shell], capture_output=True).returncode == 0:
            assert subprocess.run([shell, "-n", "-c", text]).returncode == 0, shell


def test_a_free_lock_runs_the_command_at_once(tmp_path):
    fn = apt_lock.guarded("echo ran", "lab1", "driver build prerequisites", 30)
    proc, took = run_script(script_of(fn, tmp_path))
    assert proc.returncode == 0 and proc.stdout.splitlines() == ["ran"], proc
    assert took < 5


def test_a_held_lock_is_waited_for_with_a_progress_line_naming_the_holder(tmp_path, hold):
    holder = hold(3)
    fn = apt_lock.guarded("echo ran", "lab1", "driver build prerequisites", 30)
    proc, took = run_script(script_of(fn, tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "ran" and took >= 2
    first = lines[0]
    assert re.match(
        r"lab1: driver build prerequisites: waiting for the dpkg lock \([01] s of 30 s\): ", first
    ), first
    assert f"held by PID {holder.pid} ({sys.executable} -c  import fcntl" in first


def test_a_process_with_the_file_open_but_no_lock_is_not_a_holder(tmp_path):
    """An apt waiting for the lock has it open and holds nothing: it is not waited for."""
    lock = tmp_path / "lock-frontend"
    lock.touch()
    opener = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); time.sleep(30)", str(lock)]
    )
    try:
        time.sleep(0.5)
        fn = apt_lock.guarded("echo ran", "lab1", "apt source", 30)
        proc, took = run_script(script_of(fn, tmp_path))
        assert proc.stdout.splitlines() == ["ran"] and took < 5, proc
    finally:
        opener.kill()
        opener.wait()


def test_progress_repeats_every_15_s_while_held(tmp_path, hold):
    hold(17)
    fn = apt_lock.guarded("echo ran", "lab1", "apt source", 60)
    proc, _ = run_script(script_of(fn, tmp_path))
    waits = [line for line in proc.stdout.splitlines() if "waiting for the dpkg lock" in line]
    assert len(waits) == 2, proc.stdout
    first, second = (int(re.search(r"\((\d+) s of 60 s\)", w).group(1)) for w in waits)
    assert first <= 1 and 15 <= second - first <= 16, waits


def test_a_holder_gone_between_scan_and_read_leaves_no_shell_noise(tmp_path):
    """A process may end between the fd scan and reading its cmdline: no stray error."""
    text = apt_lock.guarded("echo ran", "lab1", "apt source", 30).args[0].get_raw_value()
    fake = re.sub(r"find /proc/\[0-9\]\*/fd .*? 2>/dev/null", "echo /proc/999999999/fd/3", text)
    fake = fake.replace("/proc/locks", "/dev/null").replace("|| continue", "|| :")
    proc, _ = run_script(fake.replace("while p40_h=$(p40_holders)", "p40_holders\nwhile false"))
    assert proc.stderr == "" and "PID 999999999 ()" in proc.stdout, proc


def test_past_the_bound_it_fails_naming_host_step_holder_and_fix(tmp_path, hold):
    holder = hold(60)
    fn = apt_lock.guarded("echo ran", "lab2", "apt source", 2)
    proc, took = run_script(script_of(fn, tmp_path), env=late_clock(tmp_path))
    assert proc.returncode == 1 and "ran" not in proc.stdout
    assert 2 <= took < 30  # the bound, not the holder's 60 s
    err = proc.stderr
    assert err.startswith("lab2: apt source: the dpkg lock is still held after 2 s by ")
    assert f"PID {holder.pid} (" in err
    assert "unattended-upgrades" in err and "stack.policy.dpkg_lock_wait_s" in err
    assert "then re-run" in err


def test_apt_failing_while_the_lock_is_taken_again_names_the_holder(tmp_path):
    lock = tmp_path / "lock-frontend"
    grab = f"{sys.executable} -c '{HOLDER}' {lock} 5 & sleep 1; (exit 100)"
    fn = apt_lock.guarded(grab, "lab1", "apt source", 30, failed="the mirror did not answer")
    proc, _ = run_script(script_of(fn, tmp_path))
    assert proc.returncode == 100
    assert "lab1: apt source: apt failed while the dpkg lock is held by PID" in proc.stderr
    assert "the mirror did not answer" not in proc.stderr


def test_apt_failing_otherwise_says_the_steps_own_cause(tmp_path):
    fn = apt_lock.guarded(
        "(exit 100)", "lab1", "apt source", 30, failed="the mirror did not answer"
    )
    proc, _ = run_script(script_of(fn, tmp_path))
    assert proc.returncode == 100 and proc.stderr.strip() == "the mirror did not answer"


# --- the apt steps of the project -------------------------------------------------------------


def test_driver_prereqs_update_and_install_wait_for_the_lock():
    r = run_op(
        driver.build_prereqs,
        lock_wait_s=45,
        facts={
            KernelHeaders: KernelInfo(KR, None, False),
            at(DebInstalled, packages=driver.BUILD_PACKAGES): frozenset(driver.BUILD_PACKAGES)
            - {"build-essential"},
            DebPackages: {},
        },
    )
    assert [fn.function.__name__ for fn in r.functions] == ["_stream", "_stream"]
    update, install = apt_commands(r)
    assert update == 'apt-get -q -o DPkg::Lock::Timeout="$p40_rest" update'
    assert "DEBIAN_FRONTEND=noninteractive apt-get -y" in install
    assert install.endswith(
        f'install -o DPkg::Lock::Timeout="$p40_rest" linux-headers-{KR} build-essential'
    )
    for fn in r.functions:
        text = fn.args[0].get_raw_value()
        assert "p40_t=45;" in text and "lab1: driver build prerequisites: " in text


def test_driver_prereqs_installed_sends_nothing():
    r = run_op(
        driver.build_prereqs,
        facts={
            KernelHeaders: KernelInfo(KR, f"/lib/modules/{KR}/build", True),
            at(DebInstalled, packages=driver.BUILD_PACKAGES): frozenset(driver.BUILD_PACKAGES),
        },
    )
    assert r.commands == [] and r.functions == []


def test_mirror_update_waits_for_the_lock_and_keeps_its_own_remedy():
    r = run_op(
        mirror.mirror,
        url="http://m/apt",
        suite="./",
        trusted=True,
        lock_wait_s=120,
        facts={at(AptSources, key_path=None): AptSourceState()},
    )
    assert apt_commands(r) == ['apt-get update -q -o DPkg::Lock::Timeout="$p40_rest"']
    text = r.functions[-1].args[0].get_raw_value()
    assert "p40_t=120;" in text and "lab1: apt source: waiting for the dpkg lock" in text
    assert "apt-get update failed with the mirror source" in text


def test_no_apt_command_in_operations_bypasses_the_lock_wait():
    """pyinfra's apt operations and apt-get command lines only through operations.util.apt_lock."""
    for path in sorted((REPO / "operations").rglob("*.py")):  # util/, run/ too
        if path.name == "apt_lock.py":
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module == "pyinfra.operations":
                names = {alias.name for alias in node.names}
                assert "apt" not in names, f"{path.name}:{node.lineno}: pyinfra's apt, unguarded"
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith(("apt-get ", "apt ")):
                    assert "apt_lock." in text, f"{path.name}:{node.lineno}: {node.value!r}"
