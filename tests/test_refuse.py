"""operations.refuse (and operations.run.spec.validated_spec): a bad spec refuses its host only, at
execution, and changes nothing.

End to end: each test writes a tiny inventory + deploy into tmp and runs the real ``pyinfra``
CLI on the local machine. The deploy calls ``validated_spec()`` and then touches a marker file
per host; a refused host must not get its marker.

Two hosts without SSH: ``@local`` plus ``@chroot//`` (the chroot connector pointed at ``/``,
so it runs on this machine too). That needs root and chroot(8); without them only the one-host
tests run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from p40fleet.operations.refuse import refusal_message

REPO = Path(__file__).resolve().parent.parent

DEPLOY = """
from pyinfra import host
from pyinfra.operations import files

from p40fleet.operations.run.spec import validated_spec

spec = validated_spec()
if spec is not None:
    files.file(
        name="touch marker",
        path="{marker_dir}/marker-" + host.name.replace("/", "_") + "-" + spec.driver_branch,
    )
"""


def run_pyinfra(tmp_path: Path, hosts: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()
    # each host its own run lock (@local and @chroot// are one machine), not /var/lib here
    (tmp_path / "inventory.py").write_text(
        f"hosts = [(n, {{'p40fleet_run_lock': {str(tmp_path)!r} + f'/lock-{{i}}', **d}})"
        f" for i, (n, d) in enumerate({hosts})]\n"
    )
    (tmp_path / "deploy.py").write_text(DEPLOY.format(marker_dir=marker_dir))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyinfra",
            "-y",
            str(tmp_path / "inventory.py"),
            str(tmp_path / "deploy.py"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, sorted(p.name for p in marker_dir.iterdir())


def test_refusal_message_format():
    assert refusal_message("lab1", "driver install", "nouveau is loaded", "reboot") == (
        "host lab1: driver install: nouveau is loaded — fix: reboot"
    )
    # one grep-able line per reason line, the fix after the last
    assert refusal_message("lab1", "stack spec", "a = 1: x\nb = 2: y", "edit it").splitlines() == [
        "host lab1: stack spec: a = 1: x",
        "host lab1: stack spec: b = 2: y — fix: edit it",
    ]


def test_good_spec_runs_the_deploy(tmp_path):
    proc, markers = run_pyinfra(tmp_path, '[("@local", {"stack": {}})]')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert markers == ["marker-@local-525"]
    assert "Refuse" not in proc.stdout + proc.stderr


def test_bad_spec_refuses_the_host_and_changes_nothing(tmp_path):
    proc, markers = run_pyinfra(
        tmp_path,
        '[("@local", {"stack": {"cuda": {"sha256": "abc"}}, "stack_host": {"user": {"uid": 7}}})]',
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert markers == []  # the operation after the refusal did not run
    assert (
        "host @local: stack spec: stack.cuda.sha256 = 'abc': "
        "expected 64 hex characters (the sha256sum of the file)" in out
    ), out
    assert "host @local: stack spec: stack.user.uid = 7: expected a uid from 1000 to 60000" in out
    assert "— fix: correct the value in the inventory" in out
    # announced while preparing too (so `--dry` shows it)
    assert (
        "stack spec invalid (2 problems: stack.cuda.sha256, stack.user.uid): this host will be "
        "refused" in out
    ), out
    assert "Traceback" not in out


def test_a_stack_host_that_replaces_a_trust_anchor_is_said_once(tmp_path):
    """Security N13: allowed (this host only), but one line of the run's output names it."""
    sums = '{"torch": {"sha256": {"torchvision": "b" * 64}}}'
    proc, markers = run_pyinfra(tmp_path, f'[("@local", {{"stack": {{}}, "stack_host": {sums}}})]')
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert markers == ["marker-@local-525"]
    line = "stack_host replaces trust anchor(s) of stack: torch.sha256 (this host only"
    assert out.count(line) == 1, out


def test_stray_stack_key_is_refused(tmp_path):
    proc, markers = run_pyinfra(tmp_path, '[("@local", {"stacks": {"cuda": {}}})]')
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert markers == []
    assert "host @local: stack spec: stacks = {'cuda': {}}: unknown host-data key 'stacks'" in out
    (tmp_path / "typo").mkdir()
    proc, markers = run_pyinfra(tmp_path / "typo", '[("@local", {"Stack_host": {"cuda": {}}})]')
    assert markers == [] and "unknown host-data key 'Stack_host'" in proc.stdout + proc.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("chroot") is None,
    reason="a second local host needs the chroot connector (root + chroot)",
)
def test_bad_host_is_refused_alone(tmp_path):
    proc, markers = run_pyinfra(
        tmp_path,
        '[("@local", {"stack": {"driver": {"version": "525"}}}), ("@chroot//", {})]',
    )
    out = proc.stdout + proc.stderr
    # pyinfra exits non-zero when any host failed, but the good host ran its operations
    assert proc.returncode != 0, out
    assert markers == ["marker-@chroot__-525"], out
    assert "host @local: stack spec: stack.driver.version = '525': expected an NVIDIA driver" in out
    assert "host @chroot//: stack spec" not in out


@pytest.mark.parametrize("deploy", ["system.py", "python.py", "training.py", "ray.py"])
def test_every_deploy_that_changes_hosts_runs_the_preflight_first(deploy):
    """S21: run alone, each deploy refuses an unsupported OS (GPU, space, mirror) before it adds
    an operation: its steps' ``run()`` runs the preflight's steps before validated_spec()."""
    import ast

    tree = ast.parse((REPO / "p40fleet" / "deploys" / "steps" / deploy).read_text())
    (run,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    order = []
    for node in run.body:
        for call in ast.walk(node):
            if not isinstance(call, ast.Call):
                continue
            if ast.unparse(call) == "preflight_steps.run()":
                order.append("preflight")
            elif ast.unparse(call.func) == "validated_spec":
                order.append("spec")
    assert order[:2] == ["preflight", "spec"], order


# --- --dry says why (issue 28): the refusal's own lines while preparing, nothing changed -------


def dry_full(tmp_path: Path, data: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``pyinfra INV deploy/full.py --dry`` on this machine (@local: no NVIDIA GPU, not Ubuntu)
    with the run lock in tmp: the refused host the lab's GPU-less one stands for."""
    lock = tmp_path / "run.lock"
    (tmp_path / "inventory.py").write_text(
        f"hosts = [('@local', {{'p40fleet_run_lock': {str(lock)!r}, **{data}}})]\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", str(tmp_path / "inventory.py"), "deploy/full.py",
         "--dry"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    return proc, lock


def test_dry_run_prints_each_preflight_refusal_with_its_fix_and_changes_nothing(tmp_path):
    proc, lock = dry_full(tmp_path, "{}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[@local] dry run: a real run refuses this host with:" in out, out
    assert "host @local: preflight: " in out and "problem(s), nothing was changed:" in out, out
    assert (
        "host @local: preflight:   - GPU check: GPUs none: no NVIDIA GPU found (fix: provision "
        "this host with another stack" in out
    ), out
    assert "host @local: preflight:   - OS check: " in out and "is not supported" in out, out
    assert "— fix: fix each problem above, then re-run" in out, out
    assert not lock.exists()  # the run lock (the first changing command) was not taken
    assert "p40fleet verify" not in out  # no verification report: nothing ran
    assert "Traceback" not in out


def test_dry_run_prints_every_spec_problem_in_full(tmp_path):
    data = (
        "{'stack': {'cuda': {'sha256': 'abc', 'verison': 'x'}}, 'stack_host': {'user': {'uid': 7}}}"
    )
    proc, lock = dry_full(tmp_path, data)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert (
        "stack spec invalid (3 problems: stack.cuda.sha256, stack.cuda.verison, stack.user.uid): "
        "this host will be refused" in out
    ), out
    assert "[@local] dry run: a real run refuses this host with:" in out, out
    for line in (
        "host @local: stack spec: stack.cuda.sha256 = 'abc': expected 64 hex characters",
        "host @local: stack spec: stack.cuda.verison = 'x': unknown key 'verison' (allowed: ",
        "host @local: stack spec: stack.user.uid = 7: expected a uid from 1000 to 60000",
        "the defaults in p40fleet/spec/pins.py are the real pins",
    ):
        assert line in out, out
    assert not lock.exists()
