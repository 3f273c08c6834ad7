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

Time: the default lab comes up lazily, before the next test that uses the lab
(:meth:`Lab.release` after a module's own lab; a module that brings up its own shape next
would take the default down at once). ``test_flows.py`` runs first among the lab modules: its
fresh fleet's converged disks are kept as seeds (:meth:`Lab.save_seed`) that modules about
something other than a first converge start from (``lab.up(..., seed=...)``: the host's upper
layer is a copy of the seed, then ``p40lab up --keep-disks`` gives it its own identity, and
``deploy/full.py`` converges what differs). Run alone, such a module converges fresh disks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
DEFAULT_GPUS = "4xP40,8xP40,1xP100,2xH200"
#: The lab module whose fresh fleet seeds the others: it runs first among the lab modules.
SEEDING_MODULE = "test_flows.py"


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
        #: the default lab is owed to the next test that uses the lab (:meth:`release`)
        self.default_wanted = True
        #: hosts of the last ``up`` whose disks started from a seed
        self.seeded: list[str] = []
        #: seed name -> its hard-linked files' signature when it was saved
        self.seed_signatures: dict[str, dict] = {}
        #: what the seeds did this session (saved, planted, dropped and why): pytest's summary
        self.seed_log: list[str] = []

    # --- lifecycle -------------------------------------------------------------------------
    def up(self, gpus: str | None = None, seed: dict[str, str] | None = None, **plan_kw) -> dict:
        """Fresh disks, or for the hosts in ``seed`` (host -> seed name) a clone of that saved
        disk (a seed not saved in this session, or written since: a fresh disk)."""
        from p40lab import base, hosts, plan

        base.build()  # no-op when cached
        specs = plan.plan(None, gpus or self.gpus, **plan_kw)
        seeds = {h: self.seed_dir(s) for h, s in (seed or {}).items()}
        seeds = {h: d for h, d in seeds.items() if d.name in self.seed_signatures}
        t0 = time.monotonic()
        if seeds:
            seeds = self._plant_seeds(specs, seeds)
        data = hosts.up(specs, mirror=self.mirror, keep_disks=bool(seeds))
        self.up_seconds = time.monotonic() - t0
        self.default_wanted = False
        self.seeded = sorted(seeds)
        if seed:
            self.seed_log.append(f"up {gpus or self.gpus}: seeded {self.seeded or 'none'} "
                                 f"of {sorted(seed)}, {self.up_seconds:.1f} s")  # fmt: skip
        return data

    def release(self) -> None:
        """A module done with its own lab: down now, the default lab before the next test
        that uses the lab."""
        self.down()
        self.default_wanted = True

    def ensure_default(self) -> None:
        if not self.default_wanted:
            return
        from p40lab.state import LabError

        error = None
        try:
            self.up()
        except LabError as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - report anything, loudly
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:  # outside the except: no chained traceback noise
            pytest.fail(f"the simulated lab could not start: {error}", False)

    # --- seeds: converged disks kept for other modules -------------------------------------
    @staticmethod
    def seed_dir(name: str) -> Path:
        from p40lab import state

        return state.LAB_DIR / "test-seeds" / name

    def save_seed(self, host: str, name: str) -> float:
        """Keep ``host``'s upper layer (the running lab's) as seed ``name``; seconds taken.
        A clone (``p40lab.disks.clone_upper``: its big trees hard-linked, the rest copied) and
        the linked trees' signature, which :meth:`up` checks before planting it."""
        from p40lab import disks

        t0 = time.monotonic()
        target = self.seed_dir(name)
        disks.clone_upper(self.root(host).parent / "upper", target)
        self.seed_signatures[name] = disks.linked_signature(target)
        self.seed_log.append(f"seed {name} saved from {host} in {time.monotonic() - t0:.1f} s")
        return time.monotonic() - t0

    def _plant_seeds(self, specs: list, seeds: dict[str, Path]) -> dict[str, Path]:
        """``up --keep-disks`` keeps every upper: fresh ones for the hosts without a seed,
        clones for the others; disks of hosts not in ``specs`` go (as a plain ``up``). A seed
        whose hard-linked files were written in place since it was saved (through the host it
        came from, or a clone) is not used: those hosts get fresh disks. Returns the seeds
        planted."""
        from p40lab import disks, plan, state

        intact = {}
        for name in {d.name for d in seeds.values()}:
            now, then = disks.linked_signature(self.seed_dir(name)), self.seed_signatures[name]
            changed = sorted(k for k in now.keys() | then.keys() if now.get(k) != then.get(k))
            intact[name] = not changed
            if changed:
                self.seed_log.append(
                    f"seed {name}: {len(changed)} linked file(s) changed since it was saved "
                    f"({', '.join(changed[:5])}): fresh disks instead"
                )
        seeds = {h: d for h, d in seeds.items() if intact[d.name]}
        wanted = {s.name for s in specs}
        for old in state.HOSTS_DIR.glob(f"{state.HOST_PREFIX}*"):
            if old.name not in wanted and old.name[len(state.HOST_PREFIX) :].isdigit():
                shutil.rmtree(old, ignore_errors=True)
        for spec in specs:
            disks.wipe_upper(spec.name)
            if spec.name in seeds:
                disks.clone_upper(seeds[spec.name], plan.host_dirs(spec.name)["upper"])
        return seeds

    def drop_seeds(self) -> None:
        shutil.rmtree(self.seed_dir("x").parent, ignore_errors=True)
        self.seed_signatures.clear()

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


_SESSION_LAB: list[Lab | None] = [None]


def pytest_terminal_summary(terminalreporter):
    """What the seeds did, in CI's log too (pytest captures the tests' own prints)."""
    the_lab = _SESSION_LAB[0]
    if the_lab is not None and the_lab.seed_log:
        terminalreporter.write_sep("-", "lab seeds")
        for line in the_lab.seed_log:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0:
        pytest.fail("the lab tests need root (netns, overlayfs, mounts): run them as root", False)
    from p40lab import hosts, state

    if not state.INSTANCE:
        pytest.fail("the lab tests must run in their own lab instance (tests/conftest.py)", False)

    the_lab = _SESSION_LAB[0] = Lab(
        gpus=os.environ.get("P40LAB_TEST_GPUS", DEFAULT_GPUS),
        mirror=os.environ.get("P40LAB_NO_MIRROR") != "1",
    )
    the_lab.user_lab_before = instance_snapshot()
    reuse = os.environ.get("P40LAB_REUSE") == "1"
    running = [
        h["name"] for h in state.load().get("hosts", []) if state.pid_alive(h.get("supervisor_pid"))
    ]
    if running and reuse:
        the_lab.default_wanted = False
        yield the_lab
        return
    if running:
        pytest.fail(
            f"the test lab (instance {state.INSTANCE}) is already up ({', '.join(running)}): "
            f"another test session? else run `{state.cli('down')}` "
            "(or set P40LAB_REUSE=1 to test against it)",
            False,
        )
    the_lab.drop_seeds()  # of a killed session
    try:
        yield the_lab
    finally:
        the_lab.drop_seeds()
        left = {k: v for k, v in hosts.down().items() if v}
        if left:
            pytest.fail(f"lab teardown left things behind: {left}", False)
        after = instance_snapshot()
        if after != the_lab.user_lab_before:
            changed = sorted(k for k in after if after[k] != the_lab.user_lab_before.get(k))
            pytest.fail(f"the tests changed the default (user's) lab: {changed}", False)


@pytest.fixture(autouse=True)
def _default_lab(request):
    """The default lab, up before a test that uses the lab when a module released its own."""
    if "lab" in request.fixturenames:
        request.getfixturevalue("lab").ensure_default()


def pytest_collection_modifyitems(config, items):
    """The seeding module first among the lab modules (the others keep their order and slots)."""
    slots = [i for i, item in enumerate(items) if item.get_closest_marker("lab")]
    lab_items = [items[i] for i in slots]
    lab_items.sort(key=lambda item: item.path.name != SEEDING_MODULE)  # stable
    for i, item in zip(slots, lab_items, strict=True):
        items[i] = item
