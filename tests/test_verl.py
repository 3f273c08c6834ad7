"""verl: facts/verl.py (commands never fail the host; outputs parse into states) and
operations/verl.py (facts in, commands out, tests/opharness.py)."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import shlex
import subprocess
from types import SimpleNamespace

import pytest
from pyinfra.facts.files import File

from p40fleet import verl_patches
from p40fleet.facts.env import Dist, EnvDistributions, MarkerText
from p40fleet.facts.verl import GitCheckout, GitState, VerlPatchCheck
from p40fleet.operations import apex, verl
from p40fleet.verification.check import FAIL
from tests.opharness import run_op
from tests.probe_answers import PASCAL_RULES, PATCHED, SHA, checks_for, only_failures, sections
from tests.pylayer import ENV, ME, PY
from tests.pylayer import sh as _sh

COMMIT = "8fdc4d3f202f41461f4de9f42a637228e342668b"

# -- facts ---------------------------------------------------------------------------------


def test_git_checkout(tmp_path):
    fact = GitCheckout()
    rc, out = _sh(fact.command(user=ME, path=str(tmp_path / "none")))
    assert rc == 0 and fact.process(out).exists is False
    rc, out = _sh(fact.command(user=ME, path=str(tmp_path)))
    assert rc == 0 and fact.process(out).is_repo is False
    repo, git = _committed_repo(tmp_path)
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


# -- verl ----------------------------------------------------------------------------------

REMOTE = "http://m/git/verl.git"


def _checkout(state):
    return run_op(
        verl.checkout,
        path="/home/verl/verl",
        remote=REMOTE,
        ref="v0.5.0",
        commit=COMMIT,
        facts={GitCheckout: state},
    )


def test_verl_checkout_at_ref_is_noop():
    assert not _checkout(GitState(True, True, COMMIT, REMOTE)).changed


def test_verl_fresh_clone_and_verify():
    result = _checkout(GitState(False))
    assert result.commands[0] == f"git clone --quiet {REMOTE} /home/verl/verl"
    assert "checkout --quiet 'v0.5.0^{commit}' ||" in result.commands[1]  # never -f (S15)
    assert COMMIT in result.commands[2]


def test_verl_ref_change_guards_local_edits():
    state = GitState(True, True, "0" * 40, REMOTE, ("verl/workers/actor/dp_actor.py",))
    result = _checkout(state)
    assert "fetch --quiet --tags --force origin" in result.commands[0]
    # the guard is the applier's own --guard mode, its text run as the program (not uploaded yet)
    guard = shlex.split(result.commands[1])
    assert guard[:2] == ["python3", "-c"] and guard[2] == verl_patches.APPLIER_PATH.read_text()
    assert guard[3:] == ["--checkout", "/home/verl/verl", "--guard", "v0.5.0^{commit}"]
    assert "checkout --quiet 'v0.5.0^{commit}'" in result.commands[2]
    assert " -f" not in result.commands[2]


def _git_pin_move(tmp_path, plant):
    """A clone at v1 of an upstream whose v2 adds notes.md and changes code.py; ``plant(co)``
    changes the clone; then the operation's commands moving it to v2 run for real (sh)."""
    src, up, co = tmp_path / "src", tmp_path / "up.git", tmp_path / "home" / "verl"

    def git(*args, cwd=src):
        return subprocess.run(
            ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
        ).stdout.strip()

    commit = ["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q"]
    git("init", "-q", str(src), cwd=tmp_path)
    (src / "code.py").write_text("v1\n")
    git("add", "code.py")
    git(*commit, "-m", "v1")
    git("tag", "v1")
    (src / "notes.md").write_text("upstream\n")
    (src / "code.py").write_text("v2\n")
    git("add", "notes.md", "code.py")
    git(*commit, "-m", "v2")
    git("tag", "v2")
    new = git("rev-parse", "HEAD")
    git("clone", "-q", "--bare", str(src), str(up), cwd=tmp_path)
    git("clone", "-q", str(up), str(co), cwd=tmp_path)
    git("checkout", "-q", "v1", cwd=co)
    plant(co)
    fact = GitCheckout()
    out = subprocess.run(
        ["sh", "-c", fact.command(path=str(co), user=getpass.getuser())],
        capture_output=True,
        text=True,
    ).stdout
    result = run_op(
        verl.checkout, path=str(co), remote=str(up), ref="v2", commit=new,
        facts={GitCheckout: fact.process(out.splitlines())},
    )  # fmt: skip
    for command in result.commands:
        proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        if proc.returncode != 0:
            return co, proc
    return co, None


def test_verl_pin_move_never_overwrites_an_untracked_user_file(tmp_path):
    """S15: an untracked file where the new pin adds one stops the host; the file survives."""
    co, failed = _git_pin_move(tmp_path, lambda co: (co / "notes.md").write_text("MY NOTES\n"))
    assert failed is not None and "notes.md" in failed.stdout + failed.stderr
    assert (co / "notes.md").read_text() == "MY NOTES\n"


def test_verl_pin_move_restores_only_our_recorded_patch(tmp_path):
    """Our recorded patch is dropped for the move; an untracked file out of the way is kept."""

    def plant(co):
        (co / "code.py").write_text("v1 patched\n")
        digest = hashlib.sha256(b"v1 patched\n").hexdigest()
        (co / ".p40fleet-patches.json").write_text(json.dumps({"files": {"code.py": digest}}))
        (co / "mine.txt").write_text("keep\n")

    co, failed = _git_pin_move(tmp_path, plant)
    assert failed is None
    assert (co / "code.py").read_text() == "v2\n" and (co / "notes.md").read_text() == "upstream\n"
    assert (co / "mine.txt").read_text() == "keep\n"


def test_verl_pin_move_refuses_an_edit_it_did_not_record(tmp_path):
    co, failed = _git_pin_move(tmp_path, lambda co: (co / "code.py").write_text("my edit\n"))
    assert failed is not None and "local edits in: code.py" in failed.stdout
    assert (co / "code.py").read_text() == "my edit\n"


def _patch(check, tmp_path, moving=False):
    script = tmp_path / "verl_patch.py"
    script.write_text("print()\n")
    return run_op(
        verl.patch,
        python=PY,
        checkout="/home/verl/verl",
        script_src=str(script),
        rules_json='{"rules": []}',
        work_dir="/c/verl-patch",
        user="verl",
        checkout_changes=moving,
        facts={VerlPatchCheck: check},
        default_facts=True,
    )


def test_verl_patched_is_noop_and_unpatched_applies(tmp_path):
    done = _patch("100", tmp_path)
    assert not any("--rules" in c for c in done.commands) and "already applied" in done.noops[-1]
    todo = _patch("0", tmp_path)
    apply = todo.commands[-1]
    assert "--rules /c/verl-patch/rules-" in apply and "--checkout /home/verl/verl" in apply
    assert "3) echo" in apply and "local edits" in apply
    assert any("--rules" in c for c in _patch("100", tmp_path, moving=True).commands)


def _install_verl(dists, **kw):
    return run_op(
        verl.install,
        python=PY,
        checkout="/home/verl/verl",
        version="0.5.0",
        facts={EnvDistributions: dists},
        **kw,
    )


def test_verl_installed_editable_is_noop_else_no_deps_editable():
    assert not _install_verl({"verl": Dist("0.5.0", "/home/verl/verl")}).changed
    result = _install_verl({"verl": Dist("0.5.0", None)})
    assert (
        "install --no-deps --no-build-isolation --no-index -e /home/verl/verl" in result.commands[0]
    )
    assert _install_verl({"verl": Dist("0.5.0", "/home/verl/verl")}, checkout_changes=True).changed


def test_verl_requirements_recorded_sha(tmp_path):
    req = tmp_path / "req.txt"
    req.write_text("numpy==1.26.4\n")
    import hashlib

    digest = hashlib.sha256(req.read_bytes()).hexdigest()
    kw = dict(
        python=PY,
        src=str(req),
        dest="/c/req.txt",
        env_dir=ENV,
        index_args=["--index-url", "http://m/simple"],
    )
    done = run_op(verl.requirements, facts={MarkerText: digest}, default_facts=True, **kw)
    assert not any("-r" in c.split() for c in done.commands)
    todo = run_op(verl.requirements, facts={MarkerText: "old"}, default_facts=True, **kw)
    assert (
        "install --require-hashes --no-build-isolation --use-pep517 --index-url http://m/simple "
        "-r /c/req.txt" in todo.commands[-2]
    )
    assert digest in todo.commands[-1]


def test_verl_checkout_moves_when_head_is_not_the_pin(monkeypatch):
    def moves(head):
        answer = GitState(True, True, head, REMOTE)
        monkeypatch.setattr(verl, "host", SimpleNamespace(get_fact=lambda cls, **_: answer))
        return verl.checkout_moves("/home/verl/verl", COMMIT, "verl")

    assert moves("0" * 40) is True and moves(COMMIT) is False
    assert moves(None) is True  # no checkout yet


def test_a_ref_starting_with_a_dash_never_reaches_git():
    """S22: a ref that git would read as an option is refused before any git command."""
    ref = "--recurse-submodules"
    r = run_op(verl.checkout, path="/home/verl/verl", remote=REMOTE, ref=ref, commit=COMMIT,
               facts={GitCheckout: GitState(False)})  # fmt: skip
    assert r.commands == ["function _fail"]
    assert f"verl checkout: ref '{ref}' starts with '-'" in r.failures[0]
    r = run_op(apex.build_wheel, python=PY, env_dir=PY.rsplit("/bin/", 1)[0],
               remote="http://m/git/apex.git", ref=ref, commit="4" * 40, key="K",
               cuda_home="/usr/local/cuda-11.8", arch_list="6.1", max_jobs=1, cuda_ext=True,
               user="verl", facts={File: None})  # fmt: skip
    assert r.commands == ["function _fail"]
    assert "stack.apex.ref" in r.failures[0]


# --- verify's verl checks (p40fleet/verification/checks/verl.py) ------------------------------


def test_verl_version_mismatch():
    verl = ['@@json {"version": "0.4.1", "file": "/x"}', "@@rc 0"]
    checks = checks_for(sections(verl=verl))
    assert only_failures(checks) == {"verl version"}
    assert "0.4.1" in checks["verl version"].detail and "0.5.0" in checks["verl version"].detail


def test_verl_import_error_and_timeout():
    err = ['@@json {"error": "ModuleNotFoundError: No module named \'ray\'"}', "@@rc 0"]
    assert "No module named 'ray'" in checks_for(sections(verl=err))["verl version"].detail
    timeout = ["! still importing", "@@rc 124"]
    assert "timed out" in checks_for(sections(verl=timeout))["verl version"].detail


def test_verl_checkout_and_patches():
    other = "0" * 40
    git = [f"head={other}", f"ref={COMMIT}", "@@rc 0"]
    assert checks_for(sections(**{"verl-git": git}))["verl checkout"].status == FAIL
    drift = dict(SHA)
    drift[PATCHED[0]] = "f" * 64
    rec = {"ref": "v0.5.0", "profile": "pascal", "rule_ids": PASCAL_RULES}
    rec |= {"files": SHA, "found": drift}
    bad = checks_for(sections(**{"verl-patches": ["@@json " + json.dumps(rec), "@@rc 0"]}))
    assert only_failures(bad) == {"verl patches"}
    assert "local edits" in bad["verl patches"].detail and PATCHED[0] in bad["verl patches"].detail
    none = checks_for(sections(**{"verl-patches": ["missing=/home/verl/verl/.p40", "@@rc 0"]}))
    assert none["verl patches"].status == FAIL and "not applied" in none["verl patches"].detail


def test_git_checkout_fact_never_writes_the_index(tmp_path):
    """A fact only reads: ``git status`` refreshes a stale index unless optional locks are off
    (a ``--dry`` run changed ``.git/index`` in the training user's checkout)."""
    fact = GitCheckout()
    repo, git = _committed_repo(tmp_path)
    os.utime(repo / "a.py", (1_000_000_000, 1_000_000_000))  # same bytes, other stat data
    index = repo / ".git" / "index"
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    rc, out = _sh(fact.command(user=ME, path=str(repo)))
    assert rc == 0 and fact.process(out).modified == ()
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before


def _committed_repo(tmp_path):
    """A checkout with one committed file ``a.py`` and the git argv that commits in it."""
    repo = tmp_path / "r"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.py").write_text("x\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    return repo, git
