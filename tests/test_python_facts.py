"""facts/conda.py and facts/verl.py: commands never fail the host; outputs parse into states."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys

import pytest

from facts.conda import (
    CondaInstall,
    CondaState,
    EnvDistributions,
    EnvPython,
    MarkerText,
    env_python,
    normalize_name,
)
from facts.verl import GitCheckout, VerlPatchCheck

#: The tests' own user: the facts' privilege drop runs without runuser then.
ME = getpass.getuser()


def _sh(command) -> tuple[int, list[str]]:
    text = command if isinstance(command, str) else command.get_raw_value()
    proc = subprocess.run(["sh", "-c", text], capture_output=True, text=True)
    return proc.returncode, proc.stdout.splitlines()


def test_conda_states_parse():
    fact = CondaInstall()
    assert fact.process(["##p40fleet missing"]) == CondaState("missing")
    assert fact.process(["##p40fleet broken"]) == CondaState("broken")
    assert fact.process(["##p40fleet healthy conda 24.11.1"]) == CondaState("healthy", "24.11.1")
    assert fact.process([]).state == "broken"


def test_conda_fact_on_real_paths(tmp_path):
    rc, out = _sh(CondaInstall().command(user=ME, prefix=str(tmp_path / "none")))
    assert rc == 0 and CondaInstall().process(out).state == "missing"
    (tmp_path / "p").mkdir()
    rc, out = _sh(CondaInstall().command(user=ME, prefix=str(tmp_path / "p")))
    assert rc == 0 and CondaInstall().process(out).state == "broken"
    conda = tmp_path / "p" / "bin" / "conda"
    conda.parent.mkdir()
    conda.write_text("#!/bin/sh\necho conda 24.11.1\n")
    conda.chmod(0o755)
    rc, out = _sh(CondaInstall().command(user=ME, prefix=str(tmp_path / "p")))
    assert CondaInstall().process(out) == CondaState("healthy", "24.11.1")


def test_env_python_missing_broken_ok(tmp_path):
    prefix = str(tmp_path)
    fact = EnvPython()
    rc, out = _sh(fact.command(user=ME, prefix=prefix, env_name="e"))
    assert rc == 0 and fact.process(out).state == "missing"
    bindir = tmp_path / "envs" / "e" / "bin"
    bindir.mkdir(parents=True)
    rc, out = _sh(fact.command(user=ME, prefix=prefix, env_name="e"))  # python deleted
    state = fact.process(out)
    assert rc == 0 and state.state == "broken" and state.detail
    (bindir / "python").symlink_to(subprocess.check_output(["which", "python3"], text=True).strip())
    rc, out = _sh(fact.command(user=ME, prefix=prefix, env_name="e"))
    state = fact.process(out)
    assert state.state == "ok" and state.version.count(".") == 2


def test_env_distributions_real_interpreter():
    python = sys.executable  # a real interpreter (a pyenv shim needs its environment)
    rc, out = _sh(EnvDistributions().command(user=ME, python=python))
    dists = EnvDistributions().process(out)
    assert rc == 0 and "pyinfra" in dists and dists["pyinfra"].version


def test_env_distributions_missing_python_and_editable():
    rc, out = _sh(EnvDistributions().command(user=ME, python="/nonexistent/python"))
    assert rc == 0 and EnvDistributions().process(out) == {}
    line = json.dumps({"Verl": ["0.5.0", "/home/verl/verl"], "torch": ["2.6.0+cu118", None]})
    dists = EnvDistributions().process([line])
    assert dists["verl"].editable == "/home/verl/verl" and dists["torch"].editable is None
    assert normalize_name("Torch_Audio.x") == "torch-audio-x"


def test_marker_text(tmp_path):
    fact = MarkerText()
    rc, out = _sh(fact.command(user=ME, path=str(tmp_path / "k")))
    assert rc == 0 and fact.process(out) is None
    (tmp_path / "k").write_text("abc\n")
    rc, out = _sh(fact.command(user=ME, path=str(tmp_path / "k")))
    assert fact.process(out) == "abc"


def test_git_checkout(tmp_path):
    fact = GitCheckout()
    rc, out = _sh(fact.command(user=ME, path=str(tmp_path / "none")))
    assert rc == 0 and fact.process(out).exists is False
    rc, out = _sh(fact.command(user=ME, path=str(tmp_path)))
    assert rc == 0 and fact.process(out).is_repo is False
    repo = tmp_path / "r"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.py").write_text("x\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    subprocess.run([*git, "remote", "add", "origin", "http://m/git/verl.git"], check=True)
    (repo / "a.py").write_text("y\n")
    rc, out = _sh(fact.command(user=ME, path=str(repo)))
    state = fact.process(out)
    assert state.is_repo and len(state.head) == 40
    assert state.origin == "http://m/git/verl.git" and state.modified == ("a.py",)


@pytest.mark.parametrize("present", [False, True])
def test_verl_patch_check_exit_code(tmp_path, present):
    python = subprocess.check_output(["which", "python3"], text=True).strip()
    script, rules = tmp_path / "s.py", tmp_path / "r.json"
    if present:
        script.write_text("import sys; sys.exit(100)\n")
        rules.write_text("{}")
    fact = VerlPatchCheck()
    rc, out = _sh(
        fact.command(
            user=ME, python=python, script=str(script), rules=str(rules), checkout=str(tmp_path)
        )
    )
    assert rc == 0 and fact.process(out) == ("100" if present else None)


def test_env_python_path():
    assert env_python("/home/verl/miniconda3/", "verl-p40") == (
        "/home/verl/miniconda3/envs/verl-p40/bin/python"
    )
