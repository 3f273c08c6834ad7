"""pyinfra's ``--no-wait`` is refused before any change (issue 28, at scale: the Apex builder
election needs pyinfra to wait for every host at each operation); ``--serial`` and
``--parallel`` keep that order and run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from p40fleet import controller
from p40fleet.run_mode import no_wait_refusal

REPO = Path(__file__).resolve().parent.parent

DEPLOY = """
from pyinfra.operations import server
from p40fleet.operations.run.spec import validated_spec
spec = validated_spec()
if spec is not None:
    server.shell(name="touch marker", commands=["touch {marker}"])
"""


def test_only_no_wait_before_a_double_dash_is_refused():
    assert no_wait_refusal(["inv.py", "deploy/full.py"]) is None
    assert no_wait_refusal(["--serial", "--parallel", "8", "inv.py", "d.py"]) is None
    why = no_wait_refusal(["-y", "--no-wait", "inv.py", "deploy/full.py"])
    assert why is not None and "Apex wheel" in why
    assert no_wait_refusal(["inv.py", "d.py", "--", "--no-wait"]) is None


@pytest.mark.parametrize(("flags", "refused"), [(["--no-wait"], True), (["--serial"], False)])
def test_a_no_wait_run_changes_nothing_and_names_the_fix(tmp_path, flags, refused):
    marker = tmp_path / "marker"
    lock = str(tmp_path / "lock")
    (tmp_path / "inv.py").write_text(
        f"hosts = [('@local', {{'stack': {{}}, 'p40fleet_run_lock': {lock!r}}})]\n"
    )
    (tmp_path / "deploy.py").write_text(DEPLOY.format(marker=marker))
    env = {**os.environ, "PYTHONPATH": str(REPO), controller.CACHE_ENV: str(tmp_path / "ctl")}
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", *flags, str(tmp_path / "inv.py"),
         str(tmp_path / "deploy.py")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    if refused:
        assert proc.returncode != 0 and not marker.exists(), out
        assert "run mode: pyinfra --no-wait" in out and "fix: run without --no-wait" in out, out
        assert not (tmp_path / "lock").exists(), out  # refused before the run lock
    else:
        assert proc.returncode == 0 and marker.exists(), out
