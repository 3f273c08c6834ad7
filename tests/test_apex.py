"""Apex: the build key arithmetic (p40fleet/apex_build.py) and the builder election
(operations/run/apex_fleet.py) on hosts that answer facts from a table, without a pyinfra run.

The operations themselves (build, fetch, put, install): facts in, commands out (tests/opharness.py),
at the end of this file.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import subprocess
from collections import Counter
from types import SimpleNamespace

import pytest
from pyinfra.api import State
from pyinfra.facts.files import Directory, File

from p40fleet import apex_build, apex_cache, preflight
from p40fleet.facts.env import Dist, EnvDistributions, EnvPython, EnvPythonState, MarkerText
from p40fleet.facts.gpu import PciGpu, PciGpus
from p40fleet.gpu_catalog import lookup
from p40fleet.operations import apex, conda
from p40fleet.operations.run import apex_fleet
from p40fleet.privdrop import STAGE_DIR
from p40fleet.spec import SpecError, load_spec
from tests.opharness import run_op
from tests.probe_answers import checks_for, only_failures, sections

SPEC = load_spec("lab1", {})
ENV = "/home/verl/miniconda3/envs/verl-p40"
PY = f"{ENV}/bin/python"


def test_arch_list_only_present_arches():
    assert apex_build.arch_list([(6, 1)] * 4) == "6.1"
    assert apex_build.arch_list([(6, 1), (6, 0), (6, 1)]) == "6.0;6.1"


def test_max_jobs_rule():
    gib = 1024**3
    assert apex_build.max_jobs(16, 32 * gib) == 8  # memory-bound: 32 GiB // 4
    assert apex_build.max_jobs(4, 128 * gib) == 4  # cpu-bound
    assert apex_build.max_jobs(8, 2 * gib) == 1  # at least one
    assert apex_build.max_jobs(None, None) == 1


def test_cuda_ext_from_the_torch_pin_unless_set():
    cpu = load_spec("lab1", {"torch": {"version": "2.13.0+cpu"}})
    assert apex_build.for_spec(SPEC, [gpu(P40)]).cuda_ext is True
    build = apex_build.for_spec(cpu, [gpu(P40)])
    assert (build.cuda_ext, build.cuda) == (False, None) and build.key.endswith("_cpp")
    forced = load_spec("lab1", {"apex": {"cuda_ext": False}})
    assert apex_build.for_spec(forced, [gpu(P40)]).cuda_ext is False


def _build(**kw):
    base = dict(
        ref="25.09",
        commit="4bdecd06b3c4b2c0a8fb6603829a8f9f05a42b49",
        torch="2.6.0+cu118",
        cuda="11.8.0",
        arch_list="6.1",
        python="3.10",
        cuda_ext=True,
    )
    return apex_build.ApexBuild(**{**base, **kw})


def test_build_key_changes_with_inputs():
    key = _build().key
    assert key == "25.09-4bdecd06b3c4_torch2.6.0+cu118_cuda11.8.0_sm6.1_py3.10_cpp+cuda"
    assert _build(arch_list="6.0;6.1").key != key and _build(torch="2.6.1+cu118").key != key


def test_install_imports_the_extension_modules_of_the_build():
    assert _build().verify_code == "import torch, apex, apex_C, amp_C, fused_layer_norm_cuda"
    assert _build(cuda_ext=False, cuda=None).verify_code == "import torch, apex, apex_C"


def gpu(device: int, bus: str = "0000:00:06.0") -> PciGpu:
    return PciGpu(bus, 0x10DE, device, 0x030200, 0x10DE, 0x11D9, lookup(device))


P40, P100, H200 = 0x1B38, 0x15F8, 0x2335
HEALTHY = EnvPythonState("ok", "3.10.12")


def test_build_for_spec_the_hosts_arches_and_the_pins():
    build = apex_build.for_spec(SPEC, [gpu(P40), gpu(P40, "0000:00:07.0")])
    assert (build.arch_list, build.python, build.cuda_ext) == ("6.1", "3.10", True)
    assert build.cuda == SPEC.cuda.version and build.commit == SPEC.apex.commit
    assert apex_build.for_spec(SPEC, [gpu(P100)]).key != build.key


def test_controller_wheel_path(monkeypatch, tmp_path):
    monkeypatch.setenv("P40FLEET_CACHE", str(tmp_path))
    assert apex_build.controller_wheel("K") == os.path.join(
        str(tmp_path), "apex", "K", "apex-wheel.tar"
    )
    assert apex_build.host_sum("/var/cache/p40fleet", "K") == "/var/cache/p40fleet/apex-K.sha256"


# -- the election rule (pure) ---------------------------------------------------------------


def _first(key, keys, need, in_cache=False):
    asked = []

    def needs(name):
        asked.append(name)
        return name in need

    builder = apex_build.first_builder(key, in_cache, keys, keys.get, needs)
    return builder, asked


def test_one_builder_per_key_the_first_in_inventory_order_that_needs_it():
    keys = {"lab1": "A", "lab2": "A", "lab3": "B", "lab4": "A", "lab5": "B"}
    everyone = set(keys)
    assert _first("A", keys, everyone)[0] == "lab1"
    assert _first("B", keys, everyone)[0] == "lab3"
    # lab1 has apex at A already: the next host of that key builds, not a host of another key
    assert _first("A", keys, everyone - {"lab1"})[0] == "lab2"
    assert _first("A", keys, {"lab3", "lab5"})[0] is None  # nobody of key A needs it


def test_hosts_after_the_builder_and_of_other_keys_are_not_asked():
    keys = {"lab1": "B", "lab2": "A", "lab3": "A", "lab4": None}
    builder, asked = _first("A", keys, set(keys))
    assert builder == "lab2" and asked == ["lab2"]


def test_wheel_in_the_controller_cache_means_nobody_builds_and_nobody_is_asked():
    keys = {"lab1": "A", "lab2": "A"}
    assert _first("A", keys, set(keys), in_cache=True) == (None, [])


# -- the election on inventory hosts (their own facts) --------------------------------------


class FakeHost:
    """A host that answers facts from a table and counts what it was asked."""

    def __init__(self, name, gpus, recorded=None, env=HEALTHY, stack=None):
        self.name, self.data = name, {"stack": stack or {}}
        self.answers = {
            PciGpus: gpus,
            EnvPython: env,
            MarkerText: recorded,
            EnvDistributions: {"apex": Dist("0.1")} if recorded else {},
        }
        self.asked: Counter = Counter()
        # the env records the conda lock it was made from (the spec's): made from it
        try:
            self.lock_sum = preflight.conda_lock_sum(load_spec(name, stack or {}))
        except SpecError:
            self.lock_sum = None  # refused by the preflight: never asked

    def get_fact(self, cls, *args, **kwargs):
        self.asked[cls] += 1
        if cls is MarkerText and kwargs.get("path", "").endswith(conda.LOCK_MARKER):
            return self.lock_sum
        return self.answers[cls]


class FakeInventory(list):
    def __init__(self, hosts, inactive=()):
        super().__init__(hosts)
        self.inactive = set(inactive)

    def get_active_hosts(self):
        return [h for h in reversed(self) if h.name not in self.inactive]  # a set: no order


class _FakeState(SimpleNamespace):
    """A run's state: its inventory, and one record of the run (hashable, as pyinfra's)."""

    __hash__ = object.__hash__


def _fleet(*hosts, inactive=()):
    return _FakeState(inventory=FakeInventory(hosts, inactive))


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("P40FLEET_CACHE", str(tmp_path))
    return tmp_path


P40_KEY = apex_build.for_spec(SPEC, [gpu(P40)]).key
P100_KEY = apex_build.for_spec(SPEC, [gpu(P100)]).key


def test_the_lab_fleet_one_builder_per_key_the_rest_get_the_wheel(cache):
    """As tests/lab/test_flows.py's fleet: lab1 and lab2 share a key, lab3's P100 builds its
    own, lab4's H200 runs no Python layer; an inactive host is never asked."""
    lab0 = FakeHost("lab0", [gpu(P40)])
    lab1, lab2 = FakeHost("lab1", [gpu(P40)]), FakeHost("lab2", [gpu(P40)])
    lab3, lab4 = FakeHost("lab3", [gpu(P100)]), FakeHost("lab4", [gpu(H200)])
    state = _fleet(lab0, lab1, lab2, lab3, lab4, inactive={"lab0"})
    assert apex_fleet.builder(state, P40_KEY) == "lab1"
    assert apex_fleet.builder(state, P100_KEY) == "lab3"
    assert not lab0.asked
    assert lab2.asked == Counter({PciGpus: 1})  # its key only: lab1 builds it already
    # its apex key and the env's conda lock record; none of lab4 (after the last builder)
    assert lab3.asked[MarkerText] == 2 and not lab4.asked
    # lab4's H200 is refused (no Python layer): nobody builds its key, lab4 least of all
    assert apex_fleet.builder(state, apex_build.for_spec(SPEC, [gpu(H200)]).key) is None
    assert lab4.asked == Counter({PciGpus: 1})


def test_decided_once_per_run_and_key(cache):
    lab1 = FakeHost("lab1", [gpu(P40)])
    state = _fleet(lab1)
    assert apex_fleet.builder(state, P40_KEY) == apex_fleet.builder(state, P40_KEY) == "lab1"
    assert lab1.asked[PciGpus] == 1


def test_a_host_at_the_key_already_does_not_build_the_next_one_does(cache):
    lab1 = FakeHost("lab1", [gpu(P40)], recorded=P40_KEY)
    lab2 = FakeHost("lab2", [gpu(P40)])
    assert apex_fleet.builder(_fleet(lab1, lab2), P40_KEY) == "lab2"
    stale = FakeHost("lab1", [gpu(P40)], recorded="OLD")
    assert apex_fleet.builder(_fleet(stale, lab2), P40_KEY) == "lab1"
    # an env recreated in this run is empty whatever its key file said
    gone = FakeHost("lab1", [gpu(P40)], recorded=P40_KEY, env=EnvPythonState("missing"))
    assert apex_fleet.builder(_fleet(gone, lab2), P40_KEY) == "lab1"


def test_wheel_on_the_controller_no_builder_and_no_other_host_asked(cache):
    tar = apex_build.controller_wheel(P40_KEY)
    os.makedirs(os.path.dirname(tar))
    with open(tar, "wb") as handle:
        handle.write(b"wheel")
    with open(f"{tar}.sha256", "w") as handle:
        handle.write(apex_build.sha256_of(tar) + "  apex-wheel.tar\n")
    lab1 = FakeHost("lab1", [gpu(P40)])
    assert apex_fleet.builder(_fleet(lab1), P40_KEY) is None
    assert not lab1.asked
    with open(tar, "ab") as handle:  # swapped after its sum was recorded: built again
        handle.write(b"!")
    assert apex_fleet.builder(_fleet(lab1), P40_KEY) == "lab1"


def test_a_host_whose_spec_is_refused_is_skipped(cache):
    bad = FakeHost("lab1", [gpu(P40)], stack={"python_version": "not a version"})
    lab2 = FakeHost("lab2", [gpu(P40)])
    assert apex_fleet.builder(_fleet(bad, lab2), P40_KEY) == "lab2"
    assert not bad.asked


# -- per-host decisions next to their components ----------------------------------------------


def test_apex_needed_from_the_key_file_and_the_env():
    def needed(recorded, dists, **kw):
        host = SimpleNamespace(
            get_fact=lambda cls, **_: {MarkerText: recorded, EnvDistributions: dists}[cls]
        )
        return apex.needed(PY, ENV, "K", "verl", target=host, **kw)

    assert not needed("K", {"apex": Dist("0.1")})
    assert needed("OLD", {"apex": Dist("0.1")})
    assert needed("K", {})  # key file left behind, apex uninstalled
    assert needed("K", {"apex": Dist("0.1")}, fresh_env=True)
    assert needed("K", {"apex": Dist("0.1")}, force=True)


def test_env_fresh_when_rebuilt_or_forced():
    def fresh(state, force=False):
        host = SimpleNamespace(get_fact=lambda cls, **_: state)
        return conda.env_fresh("/p", "verl-p40", "3.10.12", "verl", force, target=host)

    assert not fresh(EnvPythonState("ok", "3.10.12"))
    assert fresh(EnvPythonState("ok", "3.11.2"))
    assert fresh(EnvPythonState("missing"))
    assert fresh(EnvPythonState("ok", "3.10.12"), force=True)


def test_the_spec_derives_the_apex_build_once():
    spec = load_spec("lab1", {})
    p40 = [gpu(P40, "0000:01:00.0"), gpu(P40, "0000:02:00.0")]
    assert spec.apex_build(p40) == apex_build.for_spec(spec, p40)
    assert spec.apex_build(p40).arch_list == "6.1"


# -- apex ----------------------------------------------------------------------------------


BUILD = apex_build.BUILD_HOME
ACCOUNT = apex_build.BUILD_ACCOUNT
AS_ACCOUNT = f"su -s /bin/sh {ACCOUNT} -c "


def _build_op(cuda_ext=True):
    return run_op(
        apex.build_wheel,
        python=PY,
        env_dir=ENV,
        remote="http://m/git/apex.git",
        ref="25.09",
        commit="4bdecd06b3c4b2c0a8fb6603829a8f9f05a42b49",
        key="K",
        cuda_home="/usr/local/cuda-11.8",
        arch_list="6.0;6.1",
        max_jobs=6,
        cuda_ext=cuda_ext,
        user="verl",
        facts={},
    )


def test_build_wheel_flags():
    result = _build_op()
    build = next(c for c in result.commands if " wheel " in c)
    assert "CUDA_HOME=/usr/local/cuda-11.8" in build
    assert "TORCH_CUDA_ARCH_LIST=6.0;6.1" in build and "MAX_JOBS=6" in build
    for flag in ("--no-build-isolation", "--no-deps", f"-w {BUILD}/wheels"):
        assert flag in build
    assert "--config-settings --build-option=--cpp_ext" in build
    assert "--config-settings --build-option=--cuda_ext" in build
    assert f"{AS_ACCOUNT}'git clone --quiet http://m/git/apex.git {BUILD}/src'" in result.commands
    assert any("4bdecd06b3c4b2c0a8fb6603829a8f9f05a42b49" in c for c in result.commands)
    # issue 13: the build says where its log is (kept by root after) and how long it took
    assert "apex build took" in build and f"{BUILD}/build.log" in build
    assert "start=$(date +%s)" in build and "/var/log/p40fleet/apex-build-K.log" in build
    assert any(f"log on this host at {BUILD}/build.log" in line for line in result.logs)


def test_build_finds_the_locks_ninja_on_path_in_its_env_snapshot():
    """Without ``ninja`` on PATH torch's BuildExtension compiles serially (MAX_JOBS unused):
    the build's PATH leads with the bin/ of the snapshot whose python runs the build, and the
    log's first line says whether that bin/ has the ninja the torch lock installs."""
    build = next(c for c in _build_op().commands if " wheel " in c)
    (path,) = re.findall(r"env -i PATH=(\S+) ", build)
    python = re.search(r" (\S+/python) -I -m pip ", build).group(1)
    entries = path.split(":")
    assert entries[0] == posixpath.dirname(python) == f"{BUILD}/env/bin"
    assert entries[1] == "/usr/local/cuda-11.8/bin" and "/usr/bin" in entries
    assert f"if [ -x {BUILD}/env/bin/ninja ]; then echo" in build
    assert "ninja from the env, MAX_JOBS=6 parallel jobs" in build
    assert "torch compiles serially, MAX_JOBS unused" in build
    # the check writes the log's first line; pip appends to it
    assert build.index(f"> {BUILD}/build.log") < build.index(f"./ >> {BUILD}/build.log 2>&1")


def test_build_wheel_cpu_torch_has_no_cuda_ext():
    assert "--cuda_ext" not in " ".join(_build_op(cuda_ext=False).commands)


def test_build_runs_as_a_fresh_build_account_from_a_snapshot_and_root_takes_the_sum():
    """S8: the training user (a .pth in its env, a Ray job) can no longer plant the wheel or
    its sum: the build is the build account's, from a copy of the env taken at its start,
    and the sum is root's, of root's copy, taken after the account is gone."""
    commands = _build_op().commands
    prepare, snapshot, *steps = [c for c in commands if not c.startswith("function ")]
    # a system account with no login shell, created afresh (a leftover killed and removed)
    assert prepare.index("kill -KILL $_p") < prepare.index(f"userdel -f {ACCOUNT}")
    assert "pkill" not in prepare  # only this system's processes (its mount namespace)
    assert prepare.index(f"userdel -f {ACCOUNT}") < prepare.index(f"rm -rf {BUILD} ")
    assert (
        f"useradd --system --user-group --no-create-home --home-dir {BUILD} "
        f"--shell /usr/sbin/nologin {ACCOUNT}" in prepare
    )
    assert prepare.endswith(f"install -d -m 700 -o {ACCOUNT} -g {ACCOUNT} {BUILD}")
    assert not BUILD.startswith("/home/")
    # the training user's one command: its env streamed into the build account's own copy
    assert snapshot.startswith(f"su -s /bin/sh verl -c 'tar -C {ENV} -cf - .' </dev/null | ")
    assert f"| {AS_ACCOUNT}'mkdir {BUILD}/env && tar -C {BUILD}/env --no-same-owner -xf -" in (
        snapshot
    )
    assert all("/home/verl" not in c for c in steps)  # nothing else reads the user's files
    # clone, checkout, commit check and the build as the account; its snapshot's python, -I
    build, collect = steps[-1].split("; rc=$?; ", 1)
    assert all(c.startswith(AS_ACCOUNT) for c in [*steps[:-1], build]), steps
    assert f"env -i PATH={BUILD}/env/bin:/usr/local/cuda-11.8/bin:" in build
    assert f"HOME={BUILD} TMPDIR={BUILD}/tmp PIP_CONFIG_FILE=/dev/null PYTHONNOUSERSITE=1" in build
    assert f" {BUILD}/env/bin/python -I -m pip --disable-pip-version-check wheel " in build
    assert "sha256sum" not in build  # the account writes no sum any more
    # root, after the build: account gone, then its own copy and its own sum of that copy
    staged = apex_build.built_tar(STAGE_DIR, "K")
    assert not collect.startswith("su ") and "su -s" not in collect
    assert collect.index(f"userdel -f {ACCOUNT}") < collect.index(f"cp -- {BUILD}/apex-wheel.tar")
    assert f"cp -- {BUILD}/apex-wheel.tar {staged} && sha256sum {staged} | cut -c1-64 >" in collect
    assert collect.endswith(f"rm -rf {BUILD} || exit 1; exit $rc")


def test_collect_script_for_real_copies_a_regular_tar_and_refuses_a_link(tmp_path):
    """Root's part after the build, run here (an account that does not exist: nothing to kill):
    its copy and its sum; a link at the tar's place (to a root file) is never copied."""
    home, staged = tmp_path / "build", tmp_path / "stage" / "apex-K.tar"
    kept = tmp_path / "log" / "apex-build-K.log"
    account = "p40fleet-no-such-account"

    def collect() -> subprocess.CompletedProcess:
        script = apex.collect_script(account, str(home), str(staged), str(kept))
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True)

    home.mkdir()
    (home / "build.log").write_text("p40lab-apex-build: apex ... user=x\n")
    _wheel_tar(str(home / "apex-wheel.tar"))
    want = apex_build.sha256_of(str(home / "apex-wheel.tar"))
    ok = collect()
    assert ok.returncode == 0, ok.stderr
    assert apex_build.sha256_of(str(staged)) == want
    assert apex_build.recorded_sum(f"{staged}.sha256") == want
    assert not home.exists()  # the build's home is gone with it
    assert "p40lab-apex-build: apex" in kept.read_text()
    victim = tmp_path / "shadow"
    victim.write_text("root:$6$secret\n")
    home.mkdir()
    (home / "apex-wheel.tar").symlink_to(victim)
    bad = collect()
    assert bad.returncode == 1 and "no apex-wheel.tar (a regular file)" in bad.stderr
    assert not staged.exists() and not home.exists()
    assert kept.read_text().count("=== apex build") == 1  # no log this time: nothing appended


def _wheel_tar(path, payload=b"compiled"):
    """A tar of one apex-*.whl (a real zip), like the build's."""
    import io
    import tarfile
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("apex/__init__.py", payload)
    data = buf.getvalue()
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("apex-0.1-cp310-cp310-linux_x86_64.whl")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


LOG_HOST = SimpleNamespace(name="lab1", log_styled=lambda *a, **k: None)


def _fetch(tmp_path):
    local = str(tmp_path / "ctl" / "apex-wheel.tar")
    result = run_op(
        apex.fetch_wheel,
        remote_tar="/w/apex-wheel.tar",
        local_tar=local,
        facts={},
        default_facts=True,
    )
    return local, result


def test_fetch_wheel_records_the_sum_only_after_a_complete_copy(tmp_path):
    local, result = _fetch(tmp_path)
    assert result.commands[-1] == "function _record"
    assert not any(c.endswith(f"{local}") and "download" in c for c in result.commands)
    record, run = result.functions[-1].function, State()  # pyinfra passes the run's State
    os.makedirs(os.path.dirname(local), exist_ok=True)  # files.get may have made it
    part = apex_cache.part_of(local)  # this controller process's temporary name
    # the copy was cut short: the builder's sum does not match, nothing is recorded
    _wheel_tar(part)
    full = apex_build.sha256_of(part)
    with open(part, "r+b") as handle:
        handle.truncate(1000)
    open(part + ".sha256", "w").write(full + "\n")
    assert record(run, LOG_HOST) is False
    assert not os.path.exists(local) and not os.path.exists(local + ".sha256")
    assert not os.path.exists(part)  # removed: no re-run reuses this process's name
    # a complete copy: renamed into place, its sum recorded next to it
    _wheel_tar(part)
    open(part + ".sha256", "w").write(full + "\n")
    assert record(run, LOG_HOST) is True
    assert apex_build.controller_wheel_ok(local) == (
        True,
        f"{local} matches its recorded sha256 {full}",
    )


def test_fetch_wheel_takes_roots_copy_and_roots_sum_never_the_users(tmp_path):
    """S8: before, the training user's ``cat`` streamed the tar and the sum it wrote."""
    staged = apex_build.built_tar(STAGE_DIR, "K")
    local = str(tmp_path / "ctl" / "apex-wheel.tar")
    result = run_op(
        apex.fetch_wheel, remote_tar=staged, local_tar=local, facts={}, default_facts=True
    )
    assert not any("su -s" in c or "/home/verl" in c for c in result.commands), result.commands
    assert result.commands == [
        f"FileDownloadCommand({staged}, {apex_cache.part_of(local)})",
        f"FileDownloadCommand({staged}.sha256, {apex_cache.part_of(local)}.sha256)",
        f"rm -f {staged} {staged}.sha256",
        "function _record",
    ]


def test_controller_tar_whose_recorded_sum_does_not_match_is_refused(tmp_path):
    """S8: the controller's copy swapped (or cut) after its sum was recorded."""
    local = _wheel_tar(str(tmp_path / "apex-wheel.tar"))
    open(local + ".sha256", "w").write(apex_build.sha256_of(local) + "  apex-wheel.tar\n")
    assert apex_build.controller_wheel_ok(local)[0]
    _wheel_tar(local, payload=b"someone else's code")
    ok, why = apex_build.controller_wheel_ok(local)
    assert not ok and "recorded sum" in why
    result = _put(local)
    assert result.commands[0] == "function _refuse"
    assert result.functions[0].function(None, LOG_HOST) is False
    os.unlink(local + ".sha256")  # a tar with no recorded sum is not trusted either
    assert not apex_build.controller_wheel_ok(local)[0]


def test_host_checks_the_tar_against_the_controllers_sum_before_pip_install(tmp_path):
    result = _install("OLD", {"apex": Dist("0.1")})
    check = result.commands[0]
    assert check.index("sha256sum /w/apex-wheel.tar") < check.index("tar -xf")
    assert "pip" not in check and "pip" in result.commands[1]
    # run it: the host's tar against the controller's sum (paths moved under tmp_path)
    tar, record = str(tmp_path / "apex-wheel.tar"), str(tmp_path / "apex-K.sha256")
    cmd = check.replace("/var/cache/p40fleet/apex-K.sha256", record).replace("/w/", f"{tmp_path}/")
    _wheel_tar(tar)
    open(record, "w").write(apex_build.sha256_of(tar) + "  apex-wheel.tar\n")
    ok = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert os.listdir(tar + ".d") == ["apex-0.1-cp310-cp310-linux_x86_64.whl"]
    with open(tar, "r+b") as handle:  # cut short on the way
        handle.truncate(1000)
    bad = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True)
    assert bad.returncode == 1 and not os.path.exists(tar)  # refused; re-uploaded next run
    assert "host lab1: apex install:" in bad.stderr
    assert "cut short or swapped, refused" in bad.stderr and "fix: re-run" in bad.stderr


def test_put_sum_uploads_the_controllers_record():
    result = run_op(
        apex.put_sum,
        local_tar="/ctl/apex-wheel.tar",
        remote_sum="/var/cache/p40fleet/apex-K.sha256",
        facts={},
        default_facts=True,
    )
    assert "upload /var/cache/p40fleet/apex-K.sha256" in result.commands


def _install(recorded, dists, **kw):
    return run_op(
        apex.install,
        python=PY,
        wheel_tar="/w/apex-wheel.tar",
        key="K",
        env_dir=ENV,
        sha256_file="/var/cache/p40fleet/apex-K.sha256",
        facts={MarkerText: recorded, EnvDistributions: dists},
        **kw,
    )


def test_apex_key_matches_is_noop():
    assert not _install("K", {"apex": Dist("0.1")}).changed


def test_apex_install_no_deps_and_records_key():
    result = _install("OLD", {"apex": Dist("0.1")})
    assert (
        "install --no-deps --force-reinstall /w/apex-wheel.tar.d/apex-*.whl" in result.commands[1]
    )
    assert result.commands[-1].startswith("printf '%s\\n' K | (")
    assert f'mv -fT "$t" {ENV}/.p40fleet-apex-key;' in result.commands[-1]
    assert _install("K", {"apex": Dist("0.1")}, fresh_env=True).changed


def test_apex_key_is_renamed_into_place_never_written_through_the_old_file(tmp_path):
    """The recorded key is a new file: another hard link of the old one (a lab clone's seed
    shares the env's inodes) keeps the old key, and no temporary file is left."""
    env = tmp_path / "env"
    env.mkdir()
    key_file = env / ".p40fleet-apex-key"
    key_file.write_text("OLD\n")
    os.link(key_file, tmp_path / "seed-key")
    result = run_op(
        apex.install, python=PY, wheel_tar="/w/apex-wheel.tar", key="K", env_dir=str(env),
        sha256_file="/var/cache/p40fleet/apex-K.sha256",
        facts={MarkerText: "OLD", EnvDistributions: {"apex": Dist("0.1")}},
    )  # fmt: skip
    proc = subprocess.run(["sh", "-c", result.commands[-1]], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert key_file.read_text() == "K\n" and (tmp_path / "seed-key").read_text() == "OLD\n"
    assert os.listdir(env) == [".p40fleet-apex-key"]


def _put(local):
    return run_op(
        apex.put_wheel,
        local_tar=local,
        remote_tar="/w/apex-wheel.tar",
        user="verl",
        builder="lab1",
        facts={File: None, Directory: None},
        default_facts=True,
    )


def test_put_wheel_fails_clearly_without_controller_copy(tmp_path):
    missing = str(tmp_path / "none.tar")
    result = run_op(
        apex.put_wheel,
        local_tar=missing,
        remote_tar="/w/apex-wheel.tar",
        user="verl",
        builder="lab1",
        facts={File: None, Directory: None},
        default_facts=True,
    )
    assert result.commands[0] == "function _refuse"
    # N1: uploaded into root's stage dir, copied in by the user (never root's upload to /w/...)
    assert not any(c.startswith("upload /w/") for c in result.commands), result.commands
    assert any(c.startswith(f"upload {STAGE_DIR}/") for c in result.commands)
    assert any(
        c.startswith("su -s /bin/sh verl -c ") and "/w/apex-wheel.tar" in c and STAGE_DIR in c
        for c in result.commands
    )
    assert result.functions[0].function(None, LOG_HOST) is False


def _can_unshare() -> bool:
    if os.getuid() != 0 or not all(
        os.path.exists(p) for p in ("/usr/sbin/useradd", "/usr/bin/unshare")
    ):
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root, unshare -m and useradd")
def test_build_for_real_as_the_build_account_ignores_what_the_user_plants_after_it_started():
    """S8 end to end on this machine, in a private mount namespace whose /etc is a copy (the
    account is created there, never on this machine): the build account builds from its
    snapshot; a .pth the training user (here: nobody) plants in its env after the snapshot never
    runs in the build; root's copy and sum remain, the account, its group and home do not."""
    import shutil
    import tempfile
    import textwrap
    from pathlib import Path

    tmp_path = Path(tempfile.mkdtemp(prefix="p40fleet-s8-"))  # pytest's tmp is root's 0700
    try:
        tmp_path.chmod(0o755)
        _build_for_real(tmp_path, textwrap)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _build_for_real(tmp_path, textwrap):
    env = tmp_path / "env"  # the training user's env
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", "--without-pip",
                    str(env)], check=True)  # fmt: skip
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "setup.py").write_text(textwrap.dedent("""\
        import os, pwd, sys
        from setuptools import setup
        import shutil
        print("built-as", pwd.getpwuid(os.getuid()).pw_name, "isolated", sys.flags.isolated)
        print("ninja-at", shutil.which("ninja"))
        open("LEFTOVER", "w").write("left in /tmp by the build account")
        setup(name="apex", version="0.1", py_modules=["apexmod"])
        """))  # fmt: skip
    leftover = f"/tmp/{tmp_path.name}-leftover"  # the account's own file in the shared /tmp
    setup = pkg / "setup.py"
    setup.write_text(setup.read_text().replace("LEFTOVER", leftover))
    (pkg / "apexmod.py").write_text("x = 1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "i"], ["tag", "25.09"]):
        subprocess.run([*git, *args], cwd=pkg, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=pkg, capture_output=True,
                            text=True, check=True).stdout.strip()  # fmt: skip
    repo = tmp_path / "apex.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(pkg), str(repo)], check=True)
    (env / "bin" / "ninja").write_text("#!/bin/sh\necho 1.13.2\n")  # as the lock's wheel puts it
    (env / "bin" / "ninja").chmod(0o755)
    subprocess.run(["chown", "-R", "nobody:nogroup", str(env)], check=True)
    site = next(env.glob("lib/python3*/site-packages"))
    home, stage, logs = tmp_path / "b" / "apex-build", tmp_path / "stage", tmp_path / "log"
    result = run_op(
        apex.build_wheel, python=f"{env}/bin/python", env_dir=str(env), remote=str(repo),
        ref="25.09", commit=commit, key="K", cuda_home="/nonexistent", arch_list="",
        max_jobs=1, cuda_ext=False, user="nobody", home=str(home), facts={},
    )  # fmt: skip
    cmds = [c.replace(STAGE_DIR, str(stage)).replace(apex_build.BUILD_LOG_DIR, str(logs))
            for c in result.commands if not c.startswith("function ")]  # fmt: skip
    (tmp_path / "zz.pth").write_text("import sys; print('PLANTED')\n")
    plant = f"su -s /bin/sh nobody -c 'cp {tmp_path}/zz.pth {site}/zz.pth'"
    # a local bare repo must be the cloner's own (git's safe.directory): given to it once made
    own = f"chown -R {ACCOUNT} {repo}"
    script = "set -e\n" + "\n".join([cmds[0], own, cmds[1], plant, *cmds[2:]]) + "\n"
    (tmp_path / "build.sh").write_text(script)
    subprocess.run(["cp", "-a", "/etc", str(tmp_path / "etc")], check=True)
    inner = (f"mount --bind {tmp_path}/etc /etc && sh {tmp_path}/build.sh; rc=$?; "
             f"getent passwd {ACCOUNT}; getent group {ACCOUNT}; exit $rc")  # fmt: skip
    # its own pid namespace too: the build's clean-up never sees another process of the uid
    out = subprocess.run(["unshare", "-m", "--pid", "--fork", "--mount-proc", "sh", "-c", inner],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert ACCOUNT not in out.stdout  # account and group removed after the build
    assert "PLANTED" in subprocess.run([f"{env}/bin/python", "-c", ""], capture_output=True,
                                       text=True).stdout  # fmt: skip  # the plant is real
    log = (logs / "apex-build-K.log").read_text()
    assert f"built-as {ACCOUNT} isolated 0" in log and "PLANTED" not in log, log
    # torch's BuildExtension would find ninja: the snapshot's, not the training user's env's
    assert f"ninja-at {home}/env/bin/ninja\n" in log and "ninja from the env, MAX_JOBS=1" in log
    assert not home.exists() and not os.path.exists(leftover)
    tar = stage / "apex-K.tar"
    assert apex_build.recorded_sum(f"{tar}.sha256") == apex_build.sha256_of(str(tar))
    assert apex_build.complete_wheel_tar(str(tar)) is None
    assert os.stat(tar).st_uid == 0 and os.stat(f"{tar}.sha256").st_uid == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root, unshare -m and useradd")
def test_the_build_accounts_clean_up_kills_only_this_systems_processes(tmp_path):
    """A process of the build account's uid in another mount namespace (a container's user of
    the same number, a lab host) is left alone; this system's are killed. Run in a private pid
    and mount namespace with a copy of /etc: nothing outside the test is seen or touched."""
    subprocess.run(["cp", "-a", "/etc", str(tmp_path / "etc")], check=True)
    gone = apex._account_gone(ACCOUNT)
    inner = (
        f"mount --bind {tmp_path}/etc /etc && useradd --system --no-create-home {ACCOUNT} && "
        f"n=$(id -u {ACCOUNT}) && "
        f"(unshare -m runuser -u {ACCOUNT} -- sleep 300 &) && "
        f"(runuser -u {ACCOUNT} -- sleep 301 &) && sleep 0.5 && {gone}; "
        f'echo left:; pgrep -u "$n" -a; getent passwd {ACCOUNT}; pkill -u "$n"; true'
    )
    out = subprocess.run(["unshare", "-m", "--pid", "--fork", "--mount-proc", "sh", "-c", inner],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    left = out.stdout.split("left:", 1)[-1]
    assert "sleep 300" in left and "sleep 301" not in left, out.stdout + out.stderr
    # pkill -u (before) took the other namespace's process too, and userdel then refused
    assert f"{ACCOUNT}:" not in left  # the account removed


# --- verify's apex checks (p40fleet/verification/checks/apex.py) ------------------------------


def test_apex_cuda_ext_missing_and_key_mismatch():
    answer = {m: "ok" for m in ("torch", "apex", "apex_C")}
    answer |= {
        "amp_C": "ModuleNotFoundError: No module named 'amp_C'",
        "fused_layer_norm_cuda": "ok",
    }
    checks = checks_for(
        sections(
            apex=["@@json " + json.dumps(answer), "@@rc 0"], **{"apex-key": ["key=x", "@@rc 0"]}
        )
    )
    assert only_failures(checks) == {"apex cuda ext", "apex build key"}
    assert "amp_C" in checks["apex cuda ext"].detail
