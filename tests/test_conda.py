"""Conda: facts/conda.py (commands never fail the host; outputs parse into states) and
operations/conda.py (facts in, commands out, tests/opharness.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.facts.files import Directory, File

from p40fleet import condalock
from p40fleet.facts.conda import CondaInstall, CondaState, CondaTos, CondaTosState
from p40fleet.facts.env import (
    EnvDistributions,
    EnvPython,
    EnvPythonState,
    MarkerText,
    env_python,
    normalize_name,
)
from p40fleet.operations import conda
from p40fleet.operations.util.as_user import replace_text
from tests.opharness import at, run_op
from tests.pylayer import ME, PREFIX
from tests.pylayer import sh as _sh

# -- facts ---------------------------------------------------------------------------------


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


def test_env_python_path():
    assert env_python("/home/verl/miniconda3/", "verl-p40") == (
        "/home/verl/miniconda3/envs/verl-p40/bin/python"
    )


# -- miniconda / ToS / env -----------------------------------------------------------------


def test_miniconda_fresh_broken_healthy():
    inst = "/var/cache/p40fleet/Miniconda3.sh"
    fresh = run_op(
        conda.miniconda, installer=inst, prefix=PREFIX, facts={CondaInstall: CondaState("missing")}
    )
    assert fresh.commands == [f"bash {inst} -b -p {PREFIX}"]
    broken = run_op(
        conda.miniconda, installer=inst, prefix=PREFIX, facts={CondaInstall: CondaState("broken")}
    )
    assert broken.commands == [f"bash {inst} -b -u -p {PREFIX}"]
    ok = run_op(
        conda.miniconda,
        installer=inst,
        prefix=PREFIX,
        facts={CondaInstall: CondaState("healthy", "24.11.1")},
    )
    assert not ok.changed and ok.noops


ACCEPT = [
    f"{PREFIX}/bin/conda tos accept --override-channels --channel https://repo.anaconda.com/pkgs/main",
    f"{PREFIX}/bin/conda tos accept --override-channels --channel https://repo.anaconda.com/pkgs/r",
]
# the ToS record: a new file renamed into place (replace_text, run for real in test_apex and
# below for the .condarc)
RECORD = replace_text(
    f"{PREFIX}/.p40fleet-conda-tos",
    "https://repo.anaconda.com/pkgs/main", "https://repo.anaconda.com/pkgs/r",
).get_raw_value()  # fmt: skip


HEALTHY_25 = CondaState("healthy", "25.5.1")


def _tos(tos, marker=None, conda_state=HEALTHY_25, **kw):
    facts = {CondaInstall: conda_state, CondaTos: tos, MarkerText: marker}
    return run_op(conda.conda_tos, prefix=PREFIX, policy="accept", facts=facts, **kw)


def test_tos_accept_once_where_conda_has_the_plugin():
    todo = _tos(CondaTosState("plugin"))
    assert todo.commands == [*ACCEPT, RECORD]
    done = _tos(CondaTosState("plugin"), marker="\n".join(conda.TOS_CHANNELS))
    assert not done.changed and "already accepted" in done.noops[0]
    half = _tos(CondaTosState("plugin"), marker=conda.TOS_CHANNELS[0])
    assert half.commands == [*ACCEPT, RECORD]


def test_tos_nothing_to_accept_on_the_pinned_24_11_1():
    # Miniconda py310_24.11.1-0 predates conda-anaconda-tos: `conda tos` is an invalid choice,
    # so running `conda tos accept` would fail the host; nothing runs.
    result = _tos(CondaTosState("no-plugin"), conda_state=CondaState("healthy", "24.11.1"))
    assert not result.changed
    assert result.noops == [
        f"conda 24.11.1 at {PREFIX} has no ToS plugin (conda-anaconda-tos): "
        "the default channels need no acceptance"
    ]


def test_tos_decided_on_the_host_before_conda_is_installed():
    result = _tos(CondaTosState("no-conda"), conda_state=CondaState("missing"))
    (command,) = result.commands
    assert command == (
        f"if {PREFIX}/bin/conda tos --help >/dev/null 2>&1; then "
        f"{ACCEPT[0]} && {ACCEPT[1]} && {RECORD} ; fi"
    )
    assert any("missing" in line for line in result.logs)
    as_verl = _tos(CondaTosState("no-conda"), conda_state=CondaState("missing"), user="verl")
    assert as_verl.commands[0].startswith("su -s /bin/sh verl -c 'if ")


def test_tos_odd_failure_accepts_so_conda_says_why():
    result = _tos(CondaTosState("unknown", "conda tos --help failed (rc=1): Traceback"))
    assert result.commands == [*ACCEPT, RECORD]
    assert any("Traceback" in line for line in result.logs)


def test_tos_conda_forge_policy_needs_nothing():
    forge = run_op(conda.conda_tos, prefix=PREFIX, policy="conda-forge")
    assert not forge.changed and "conda-forge" in forge.noops[0]
    default = run_op(conda.conda_tos, prefix=PREFIX)  # the default policy is conda-forge
    assert not default.changed


REPO = Path(__file__).resolve().parent.parent
LOCK = str(REPO / "files" / "conda-env-v0.5.0.txt")
LOCK_DEST = "/var/cache/p40fleet/conda-env-v0.5.0.txt"
MARKER = f"{PREFIX}/envs/verl-p40/{conda.LOCK_MARKER}"
PYTHON_LINE = (
    "linux-64/python-3.10.12-hd12c33a_0_cpython.conda"
    "#sha256:05e2a7ce916d259f11979634f770f31027d0a5d18463b094e64a30500f900699"
)


def _lock_sum(channel=None):
    text, problems = conda.env_lock(LOCK, "3.10.12", channel)
    assert problems == []
    return condalock.digest(text)


def _env(state, marker=None, lock=LOCK, **kw):
    return run_op(
        conda.env,
        prefix=PREFIX,
        env_name="verl-p40",
        python_version="3.10.12",
        lock=lock,
        lock_dest=LOCK_DEST,
        facts={
            EnvPython: state,
            MarkerText: lambda path, user: marker if path == MARKER else None,
            # files.put's own facts: the root-owned cache is there, the lock is not yet
            at(Directory, path="/var/cache/p40fleet"): {"mode": 755},
            at(File, path=LOCK_DEST): None,
        },
        default_facts=True,
        **kw,
    )


CREATE = f"{PREFIX}/bin/conda create -n verl-p40 --file {LOCK_DEST} -y"


def _record(digest):
    return replace_text(MARKER, digest).get_raw_value()


def test_healthy_env_made_from_the_lock_kept():
    result = _env(EnvPythonState("ok", "3.10.12"), marker=_lock_sum())
    assert not result.changed and "healthy" in result.noops[0] and "lock" in result.noops[0]


def test_env_missing_created_from_the_lock_with_channels():
    result = _env(EnvPythonState("missing"), channels=conda.channel_args("conda-forge"))
    assert result.commands == [
        f"upload {LOCK_DEST}",
        f"{CREATE} --override-channels -c conda-forge",
        _record(_lock_sum()),
    ]
    uploaded = result.uploads[LOCK_DEST]
    assert "@EXPLICIT\n" in uploaded and "python=" not in result.commands[1]
    assert f"https://conda.anaconda.org/conda-forge/{PYTHON_LINE}\n" in uploaded
    # every package line carries a sha256 (24 files: python, pip and their closure)
    packages = condalock.parse(uploaded)
    assert len(packages) == 24 and all(p.sha256 for p in packages)


def test_mirror_channel_serves_the_same_files_with_the_same_sums():
    mirror = "https://mirror.example/conda"
    result = _env(EnvPythonState("missing"), lock_channel=mirror)
    uploaded = result.uploads[LOCK_DEST]
    assert f"{mirror}/{PYTHON_LINE}\n" in uploaded
    assert all(p.channel == mirror for p in condalock.parse(uploaded))
    assert result.commands[-1] == _record(_lock_sum(mirror))


def test_env_not_made_from_the_lock_is_recreated_saying_why():
    # made by version only (before the lock) or from another lock: removed and made again
    for marker, why in ((None, "records no conda lock"), ("ab" * 32, "another conda lock")):
        result = _env(EnvPythonState("ok", "3.10.12"), marker=marker)
        assert result.commands[0] == f"{PREFIX}/bin/conda env remove -n verl-p40 -y"
        assert result.commands[-2] == CREATE and why in result.logs[0]


def test_lock_without_sums_or_other_python_refused(tmp_path):
    text = open(LOCK).read()
    unsummed = tmp_path / "nosum.txt"
    unsummed.write_text(re.sub(r"(_cpython\.conda)#sha256:[0-9a-f]{64}", r"\1", text))
    result = _env(EnvPythonState("missing"), lock=str(unsummed))
    assert result.commands == ["function _fail"]
    assert "python-3.10.12-hd12c33a_0_cpython.conda has no sum" in result.failures[0]
    assert "conda list -n lock --explicit --sha256" in result.failures[0]
    result = run_op(conda.env, prefix=PREFIX, env_name="verl-p40", python_version="3.11.2",
                    lock=LOCK, lock_dest=LOCK_DEST, facts={})  # fmt: skip
    assert "the lock has python 3.10.12, the spec pins python 3.11.2" in result.failures[0]
    missing = run_op(conda.env, prefix=PREFIX, env_name="verl-p40", python_version="3.10.12",
                     lock=str(tmp_path / "none.txt"), lock_dest=LOCK_DEST, facts={})  # fmt: skip
    assert "cannot read it" in missing.failures[0]


def test_deleted_env_python_removes_and_recreates_saying_why():
    result = _env(EnvPythonState("broken", detail="No such file or directory"))
    assert result.commands[0] == f"{PREFIX}/bin/conda env remove -n verl-p40 -y"
    assert result.commands[-2] == CREATE
    assert "broken" in result.logs[0]


def test_wrong_python_version_recreates():
    result = _env(EnvPythonState("ok", "3.11.2"), marker=_lock_sum())
    assert "env remove" in result.commands[0] and "3.11.2" in result.logs[0]


def test_env_fresh_follows_the_lock():
    def fresh(marker):
        answers = {EnvPython: EnvPythonState("ok", "3.10.12"), MarkerText: marker}
        host = SimpleNamespace(get_fact=lambda cls, **_: answers[cls])
        return conda.env_fresh(PREFIX, "verl-p40", "3.10.12", "verl", target=host,
                               lock_sum=_lock_sum())  # fmt: skip

    assert not fresh(_lock_sum())
    assert fresh("ab" * 32) and fresh(None)  # another lock, or made by version only


def test_commands_run_as_training_user_through_su():
    result = _env(EnvPythonState("missing"), user="verl")
    assert result.commands == [
        f"upload {LOCK_DEST}",
        f"su -s /bin/sh verl -c '{CREATE}'",
        f"su -s /bin/sh verl -c {shlex.quote(_record(_lock_sum()))}",
    ]


# -- conda from the mirror channel ----------------------------------------------------------

CHANNEL = "http://10.231.0.1:8111/conda"


def test_mirror_channel_overrides_every_other_channel():
    assert conda.channel_args("conda-forge", CHANNEL) == ["--override-channels", "-c", CHANNEL]
    assert conda.channel_args("accept", CHANNEL) == ["--override-channels", "-c", CHANNEL]
    assert conda.channel_args("accept") == []


def test_condarc_written_once_as_the_user():
    rc = f"{PREFIX}/.condarc"
    result = run_op(conda.condarc, prefix=PREFIX, channel=CHANNEL, user="verl",
                    facts={at(MarkerText, path=rc, user="verl"): None})  # fmt: skip
    (command,) = result.commands
    assert command.startswith("su -s /bin/sh verl -c ") and rc in command
    text = conda.condarc_text(CHANNEL)
    assert [line.strip() for line in text.splitlines()[1:]] == [
        "channels:", f"- {CHANNEL}", "default_channels:", f"- {CHANNEL}"
    ]  # fmt: skip
    again = run_op(conda.condarc, prefix=PREFIX, channel=CHANNEL, user="verl",
                   facts={at(MarkerText, path=rc, user="verl"): text.strip()})  # fmt: skip
    assert not again.changed


def test_condarc_is_a_new_file_never_written_through_a_hard_link(tmp_path):
    """The .condarc is renamed into place: a hard link of the old one (a lab clone's seed
    shares its inodes) keeps the old text; the new one holds condarc_text exactly."""
    rc = tmp_path / ".condarc"
    rc.write_text("channels:\n  - old\n")
    os.link(rc, tmp_path / "seed-condarc")
    old = {at(MarkerText, path=str(rc), user=None): "channels:\n  - old"}
    result = run_op(conda.condarc, prefix=str(tmp_path), channel=CHANNEL, facts=old)
    (command,) = result.commands
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert rc.read_text() == conda.condarc_text(CHANNEL)
    assert (tmp_path / "seed-condarc").read_text() == "channels:\n  - old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".condarc", "seed-condarc"]


@pytest.mark.parametrize("policy", ["accept", "conda-forge"])
def test_no_tos_step_with_a_mirror_channel(policy):
    result = run_op(conda.conda_tos, prefix=PREFIX, policy=policy, mirror_channel=CHANNEL)
    assert not result.changed and CHANNEL in result.noops[0]
