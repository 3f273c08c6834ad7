"""The lab's systemctl double (p40lab/doubles/systemctl) in a temp root, with real processes.

What pyinfra's systemd operation and facts send (``show --all --property Id --property
SubState UNIT``, ``daemon-reload``, ``start``, ``restart``, ``enable``) must answer as the real
systemctl does, and started units must be supervised as systemd supervises them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from p40lab import doubles

DOUBLE = doubles.DOUBLES_DIR / "systemctl"
UNIT = "sleeper.service"


def unit_text(cmd: str, restart: str = "always", extra: str = "") -> str:
    return (
        "[Unit]\nDescription=test sleeper\n\n[Service]\nType=simple\n"
        f"ExecStart={cmd}\nRestart={restart}\nRestartSec=0.3\nTimeoutStopSec=3\n{extra}\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


@pytest.fixture
def root(tmp_path):
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    yield tmp_path
    for state in (tmp_path / "run/p40lab-systemd").glob("*.service.json"):
        ctl(tmp_path, "stop", state.name.removesuffix(".json"))


def ctl(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(DOUBLE), *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, "P40LAB_SYSTEMD_ROOT": str(root), **(env or {})},
    )  # fmt: skip


def booted(root: Path, text: str | None = None, name: str = UNIT) -> Path:
    assert ctl(root, "--p40lab-boot").returncode == 0
    if text is not None:
        (root / "etc/systemd/system" / name).write_text(text)
    return root


def prop(root: Path, name: str, key: str) -> str:
    return ctl(root, "show", "-p", key, "--value", name).stdout.strip()


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def pids_alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            out.append(pid)
    return out


def test_without_boot_it_says_what_real_systemctl_says_in_a_container(root):
    (root / "etc/systemd/system" / UNIT).write_text(unit_text("sleep 300"))
    shown = ctl(root, "show", "--property", "Id", UNIT)
    assert shown.returncode == 1 and "has not been booted with systemd" in shown.stderr
    assert ctl(root, "enable", UNIT).returncode == 0  # works offline, as the real one
    assert (root / f"etc/systemd/system/multi-user.target.wants/{UNIT}").is_symlink()


def test_pyinfra_facts_and_operation_commands(root, tmp_path):
    booted(root, unit_text("sleep 300"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\nexec {sys.executable} {DOUBLE} "$@"\n')
    (bin_dir / "systemctl").chmod(0o755)
    env = {**os.environ, "P40LAB_SYSTEMD_ROOT": str(root), "PATH": f"{bin_dir}:/usr/bin:/bin"}

    def fact(cls):
        command = cls().command(services=[UNIT]).get_raw_value()
        out = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return cls().process(out.stdout.splitlines())

    assert fact(SystemdStatus) == {UNIT: False} and fact(SystemdEnabled) == {UNIT: False}
    for command in ("systemctl daemon-reload", f"systemctl start {UNIT}",
                    f"systemctl enable {UNIT}"):  # fmt: skip
        subprocess.run(["sh", "-c", command], env=env, check=True, capture_output=True)
    assert fact(SystemdStatus) == {UNIT: True} and fact(SystemdEnabled) == {UNIT: True}
    shown = ctl(root, "show", "--all", "--property", "Id", "--property", "SubState", UNIT)
    assert shown.stdout == f"Id={UNIT}\nSubState=running\n"


def test_start_is_active_stop_kill_the_whole_unit(root):
    booted(root, unit_text("/bin/sh -c 'sleep 300 & sleep 301'"))
    assert ctl(root, "start", UNIT).returncode == 0
    active = ctl(root, "is-active", UNIT)
    assert (active.returncode, active.stdout) == (0, "active\n")
    main = int(prop(root, UNIT, "MainPID"))
    assert wait_for(lambda: len(children(main)) == 2)
    unit_pids = [main, *children(main)]
    assert ctl(root, "start", UNIT).returncode == 0 and int(prop(root, UNIT, "MainPID")) == main
    assert ctl(root, "stop", UNIT).returncode == 0
    assert pids_alive(unit_pids) == []
    inactive = ctl(root, "is-active", UNIT)
    assert (inactive.returncode, inactive.stdout) == (3, "inactive\n")
    assert prop(root, UNIT, "SubState") == "dead"


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_restart_always_brings_a_killed_main_process_back(root):
    booted(root, unit_text("sleep 300"))
    ctl(root, "start", UNIT)
    first = int(prop(root, UNIT, "MainPID"))
    os.kill(first, signal.SIGKILL)
    assert wait_for(lambda: prop(root, UNIT, "MainPID") not in ("0", str(first)))
    assert prop(root, UNIT, "NRestarts") == "1"
    assert ctl(root, "is-active", UNIT).stdout == "active\n"


def test_restart_no_leaves_a_failed_unit(root):
    booted(root, unit_text("/bin/sh -c 'exit 3'", restart="no"))
    ctl(root, "start", UNIT)
    assert wait_for(lambda: prop(root, UNIT, "ActiveState") == "failed")
    assert prop(root, UNIT, "SubState") == "failed" and prop(root, UNIT, "Result") == "exit-code"
    status = ctl(root, "status", UNIT)
    assert status.returncode == 3 and "Active: failed (failed)" in status.stdout


def test_unit_file_changes_need_daemon_reload(root, tmp_path):
    out = tmp_path / "out"
    booted(root, unit_text(f"/bin/sh -c 'echo one > {out}; exec sleep 300'"))
    ctl(root, "start", UNIT)
    assert wait_for(lambda: out.exists() and out.read_text() == "one\n")
    path = root / "etc/systemd/system" / UNIT
    path.write_text(unit_text(f"/bin/sh -c 'echo two > {out}; exec sleep 300'"))
    assert prop(root, UNIT, "NeedDaemonReload") == "yes"
    ctl(root, "restart", UNIT)  # without daemon-reload: the loaded (old) unit runs again
    assert wait_for(lambda: out.read_text() == "one\n") and out.read_text() == "one\n"
    assert ctl(root, "daemon-reload").returncode == 0
    assert prop(root, UNIT, "NeedDaemonReload") == "no"
    ctl(root, "restart", UNIT)
    assert wait_for(lambda: out.read_text() == "two\n")


def test_boot_starts_enabled_units_only(root):
    (root / "etc/systemd/system" / UNIT).write_text(unit_text("sleep 300"))
    (root / "etc/systemd/system/other.service").write_text(unit_text("sleep 300"))
    assert ctl(root, "enable", UNIT).returncode == 0
    assert ctl(root, "is-enabled", UNIT).stdout == "enabled\n"
    disabled = ctl(root, "is-enabled", "other.service")
    assert (disabled.returncode, disabled.stdout) == (1, "disabled\n")
    assert ctl(root, "--p40lab-boot").returncode == 0
    assert (root / "run/systemd/system").is_dir()
    assert ctl(root, "is-active", UNIT).stdout == "active\n"
    assert ctl(root, "is-active", "other.service").stdout == "inactive\n"


def test_unknown_units_and_unsupported_types(root):
    booted(root)
    missing = ctl(root, "start", "nope.service")
    assert missing.returncode == 5 and "Unit nope.service not found." in missing.stderr
    shown = ctl(root, "show", "-p", "Id,LoadState,SubState,UnitFileState", "nope.service")
    assert shown.stdout == "Id=nope.service\nLoadState=not-found\nSubState=dead\nUnitFileState=\n"
    assert ctl(root, "is-enabled", "nope.service").returncode == 1
    (root / "etc/systemd/system/fork.service").write_text(
        "[Service]\nType=forking\nExecStart=/bin/true\n"
    )
    refused = ctl(root, "start", "fork.service")
    assert refused.returncode == 1 and "Type=forking is not supported" in refused.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_user_environment_and_limits(root):
    out = Path(tempfile.mkdtemp(prefix="p40lab-systemctl-"))  # pytest's tmp is root-only
    out.chmod(0o777)
    script = (
        f"id -un > {out}/user; echo $HOME:$GREETING > {out}/env; "
        f"ulimit -n > {out}/nofile; exec sleep 300"
    )
    extra = "User=nobody\nEnvironment=GREETING=hi\nLimitNOFILE=4096\nWorkingDirectory=/\n"
    booted(root, unit_text(f"/bin/sh -c '{script}'", extra=extra))
    ctl(root, "start", UNIT)
    assert wait_for(lambda: (out / "nofile").exists() and (out / "nofile").read_text())
    assert (out / "user").read_text() == "nobody\n"
    assert (out / "env").read_text().endswith(":hi\n")
    assert (out / "nofile").read_text() == "4096\n"
    ctl(root, "stop", UNIT)
    shutil.rmtree(out)


def test_environment_file_is_read_at_start_and_a_missing_one_fails_it(root, tmp_path):
    """EnvironmentFile= as systemd reads it (the Ray unit's token): by the manager at every
    start, comments and quotes handled; missing without "-": the unit does not run."""
    out, env = tmp_path / "env-out", tmp_path / "unit.env"
    env.write_text('# the token\nTOKEN=abc123\nQUOTED="a b"\n')
    script = f"echo $TOKEN:$QUOTED > {out}; exec sleep 300"
    extra = f"EnvironmentFile={env}\nEnvironmentFile=-{tmp_path}/optional.env\n"
    booted(root, unit_text(f"/bin/sh -c '{script}'", extra=extra))
    ctl(root, "start", UNIT)
    assert wait_for(lambda: out.exists() and out.read_text())
    assert out.read_text() == "abc123:a b\n"
    ctl(root, "stop", UNIT)
    out.unlink()
    env.unlink()
    ctl(root, "start", UNIT)
    assert wait_for(lambda: "failed to load environment files" in _log(root))
    assert not out.exists() and prop(root, UNIT, "ActiveState") != "active"
    ctl(root, "stop", UNIT)


def _log(root: Path) -> str:
    path = root / "var/log/p40lab-systemd" / f"{UNIT}.log"
    return path.read_text() if path.exists() else ""


def test_install_puts_systemctl_and_its_boot_hook_in_the_host(tmp_path):
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "lib").symlink_to("usr/lib")
    doubles.install_system_doubles(tmp_path, "5.4.0-150-generic")
    assert os.access(tmp_path / "usr/bin/systemctl", os.X_OK)
    hook = tmp_path / doubles.SYSTEMD_BOOT_HOOK
    assert os.access(hook, os.X_OK) and "systemctl --p40lab-boot" in hook.read_text()
    assert (tmp_path / "etc/systemd/system").is_dir()
