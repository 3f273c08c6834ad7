"""The ``lab`` fixture: the simulated lab, brought up once per test session, torn down at the end.

    def test_x(lab):
        lab.ssh("lab1", "hostname")              # CompletedProcess (text); check=True raises
        lab.reboot("lab1"); lab.reinstall("lab3")       # keep_host_key=False: a new key
        lab.pyinfra("inventories/sim.py", "exec", "--", "hostname")
        lab.root("lab1") / "etc/hostname"         # the host's disk, seen from the controller

Hosts (default): lab1 4xP40, lab2 8xP40, lab3 1xP100, lab4 2xH200 (``P40LAB_TEST_GPUS`` to
change). Needs root; when the lab cannot start the session FAILS with the reason (never skips).

The lab is the tests' own instance (``tests/conftest.py``: ``$P40LAB_INSTANCE`` =
``$P40LAB_TEST_INSTANCE``, default ``test``): its own state dir, bridge, subnet, netns, mirror
and keys. Host names stay lab1..labN (inventory names; each instance has its own inventory).
So a lab the user started (the default instance, e.g. left up by ``make demo``) keeps running,
and the session fails at teardown if it changed (state file, supervisors, mirror, netns,
mounts, links or routes). A stale test lab (killed session) is cleared by ``up``; a running one
is refused unless ``P40LAB_REUSE=1``: then it is used as is and left up.
``P40LAB_NO_MIRROR=1`` skips the p40lab.mirror hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
DEFAULT_GPUS = "4xP40,8xP40,1xP100,2xH200"


def instance_snapshot(instance: str = "") -> dict:
    """``p40lab.hosts.snapshot()`` of another lab instance ("": the default one), read in a
    subprocess: this process's p40lab is bound to the test instance."""
    env = {k: v for k, v in os.environ.items() if k not in ("P40LAB_INSTANCE", "P40LAB_STATE")}
    if instance:
        env["P40LAB_INSTANCE"] = instance
    code = "import json; from p40lab import hosts; print(json.dumps(hosts.snapshot()))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


class Lab:
    """Helpers around the running lab (in-process p40lab calls, ssh/pyinfra subprocesses)."""

    def __init__(self, gpus: str = DEFAULT_GPUS, mirror: bool = True) -> None:
        self.gpus = gpus
        self.mirror = mirror
        self.up_seconds: float | None = None
        #: the default instance (the user's lab) as it was before the test lab came up
        self.user_lab_before: dict | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def up(self, gpus: str | None = None, **plan_kw) -> dict:
        from p40lab import base, hosts, plan

        base.build()  # no-op when cached
        specs = plan.plan(None, gpus or self.gpus, **plan_kw)
        t0 = time.monotonic()
        data = hosts.up(specs, mirror=self.mirror)
        self.up_seconds = time.monotonic() - t0
        return data

    def down(self) -> dict[str, list[str]]:
        from p40lab import hosts

        return hosts.down()

    def leftovers(self) -> dict[str, list[str]]:
        from p40lab import hosts

        return {k: v for k, v in hosts.leftovers().items() if v}

    # --- state -----------------------------------------------------------------------------
    @staticmethod
    def instance_snapshot(instance: str = "") -> dict:
        """``p40lab.hosts.snapshot()`` of lab instance ``instance`` ("": the default, user's)."""
        return instance_snapshot(instance)

    @property
    def state(self) -> dict:
        from p40lab import state

        return state.load()

    @property
    def hosts(self) -> list[str]:
        return [h["name"] for h in self.state["hosts"]]

    def host(self, name: str) -> dict:
        from p40lab import hosts

        return hosts.get_host(name)

    def root(self, name: str) -> Path:
        """The host's merged rootfs as seen from the controller."""
        return Path(self.host(name)["root"])

    # --- actions ---------------------------------------------------------------------------
    def ssh(
        self,
        host: str,
        cmd: str,
        *,
        check: bool = False,
        timeout: float = 120,
        input=None,
        user: str = "root",
    ) -> subprocess.CompletedProcess:
        from p40lab import hosts

        argv = hosts.ssh_argv(self.host(host), cmd, user=user)
        # input, or stdin from /dev/null: never both keys (some Pythons refuse stdin=None too)
        feed = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, **feed
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(
                f"ssh {host} {cmd!r} failed rc={proc.returncode}\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def reboot(self, host: str, wait: bool = True) -> float:
        from p40lab import hosts

        return hosts.reboot(host, wait=wait)

    def reinstall(self, host: str, keep_host_key: bool = True) -> float:
        """OS reinstall. Tests that are not about host keys restore the old key (an admin with
        a backup of /etc/ssh); ``keep_host_key=False`` is a real reinstall's new key, which the
        lab's known_hosts refuses until ``python -m p40fleet.rekey`` (see :meth:`rekey`)."""
        from p40lab import hosts

        return hosts.reinstall(host, keep_host_key=keep_host_key)

    def host_key_fingerprint(self, host: str) -> str:
        """The host's ed25519 fingerprint, as its console shows it (``p40lab
        host-key-fingerprint``)."""
        out = subprocess.run(
            [sys.executable, "-m", "p40lab", "host-key-fingerprint", host], cwd=REPO,
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        return next(line.split()[0] for line in out.splitlines() if "ssh-ed25519" in line)

    def rekey(self, host: str, *args: str) -> subprocess.CompletedProcess:
        """``python -m p40fleet.rekey inventories/sim.py HOST ARGS`` (the runbook's step)."""
        return subprocess.run(
            [sys.executable, "-m", "p40fleet.rekey", "inventories/sim.py", host, *args],
            cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def pyinfra(
        self, inventory: str, deploy: str, *args: str, timeout: float = 900, env=None
    ) -> subprocess.CompletedProcess:
        """``python -m pyinfra -y INVENTORY DEPLOY ARGS...`` from the repo root (output: text).

        pyinfra exits 0 with a wrong inventory and 0 hosts: assert host counts on the output.
        """
        argv = [sys.executable, "-m", "pyinfra", "-y", inventory, deploy, *args]
        return subprocess.run(
            argv, cwd=REPO, capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
        )  # fmt: skip


@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0:
        pytest.fail("the lab tests need root (netns, overlayfs, mounts): run them as root", False)
    from p40lab import hosts, state
    from p40lab.state import LabError

    if not state.INSTANCE:
        pytest.fail("the lab tests must run in their own lab instance (tests/conftest.py)", False)

    the_lab = Lab(
        gpus=os.environ.get("P40LAB_TEST_GPUS", DEFAULT_GPUS),
        mirror=os.environ.get("P40LAB_NO_MIRROR") != "1",
    )
    the_lab.user_lab_before = instance_snapshot()
    reuse = os.environ.get("P40LAB_REUSE") == "1"
    running = [
        h["name"] for h in state.load().get("hosts", []) if state.pid_alive(h.get("supervisor_pid"))
    ]
    if running and reuse:
        yield the_lab
        return
    if running:
        pytest.fail(
            f"the test lab (instance {state.INSTANCE}) is already up ({', '.join(running)}): "
            f"another test session? else run `{state.cli('down')}` "
            "(or set P40LAB_REUSE=1 to test against it)",
            False,
        )
    error = None
    try:
        the_lab.up()
    except LabError as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 - report anything, loudly
        error = f"{type(exc).__name__}: {exc}"
    if error is not None:  # outside the except: no chained traceback noise
        pytest.fail(f"the simulated lab could not start: {error}", False)
    try:
        yield the_lab
    finally:
        left = {k: v for k, v in hosts.down().items() if v}
        if left:
            pytest.fail(f"lab teardown left things behind: {left}", False)
        after = instance_snapshot()
        if after != the_lab.user_lab_before:
            changed = sorted(k for k in after if after[k] != the_lab.user_lab_before.get(k))
            pytest.fail(f"the tests changed the default (user's) lab: {changed}", False)
