"""p40fleet.runtime.deploy_frames: an exec'd deploy file's frame resolves from inspect's cache."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

from p40fleet.runtime import deploy_frames

REPO = Path(__file__).resolve().parent.parent

_BODY = "import sys\n\ndef here():\n    return sys._getframe()\n"


def _frame_of_exec(path: Path):
    """A frame of ``path`` run as pyinfra runs a deploy file: compiled and exec'd, no module."""
    namespace = {"__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102
    return namespace["here"]()


def test_a_deploy_file_frame_resolves_to_its_entry_only_after_install(tmp_path, monkeypatch):
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    for name in ("one.py", "two.py"):
        (deploy / name).write_text(_BODY)
    (deploy / "notes.txt").write_text("not a deploy file")
    monkeypatch.setattr(deploy_frames, "PREFIX", f"p40fleet.runtime.deploy_frames.t{id(tmp_path)}.")
    frame = _frame_of_exec(deploy / "one.py")
    assert inspect.getmodule(frame) is None  # what makes inspect scan sys.modules every time

    added = deploy_frames.install(deploy)
    try:
        assert added == [deploy_frames.PREFIX + "one", deploy_frames.PREFIX + "two"]
        module = inspect.getmodule(frame)
        assert module is sys.modules[deploy_frames.PREFIX + "one"]
        assert module.__file__ == str((deploy / "one.py").resolve())
        assert inspect.getframeinfo(frame).filename == str(deploy / "one.py")
        assert deploy_frames.install(deploy) == []  # idempotent
    finally:
        for name in added:
            sys.modules.pop(name, None)


def test_the_repo_deploy_files_each_get_an_entry_and_importing_adds_none():
    script = """
import sys
from pathlib import Path
from p40fleet.runtime import deploy_frames
import p40fleet.operations, p40fleet.facts.survey
assert not [n for n in sys.modules if n.startswith(deploy_frames.PREFIX)], "added on import"
added = deploy_frames.install(Path("deploy"))
print(" ".join(sorted(n.removeprefix(deploy_frames.PREFIX) for n in added)))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    expected = sorted(p.stem for p in (REPO / "deploy").glob("*.py"))
    assert result.stdout.split() == expected
    assert {"full", "preflight", "system", "python", "training", "verify"} <= set(expected)


def test_preflight_installs_the_entries_before_it_surveys_the_host():
    text = (REPO / "p40fleet" / "deploys" / "steps" / "preflight.py").read_text()
    install = text.index("deploy_frames.install_for(state)")
    assert install < text.index("survey_host(")
