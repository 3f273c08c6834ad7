"""Root never runs or reads the training user's files as root (security review S1, S12, S19, S20,
S22): facts in, commands out, and the privilege drop run for real where this machine allows."""

from __future__ import annotations

import ast
import glob
import importlib
import inspect
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from pyinfra.api import FactBase
from pyinfra.facts.files import Directory
from pyinfra.facts.server import Users

from facts.collective import CollectiveRunFact, CollectiveTargets
from facts.conda import EnvPython
from facts.smoke import SmokeStep, SmokeTargets
from facts.verify import VerifyProbe, render_probe
from operations import apex, conda, torch, training, training_user, verl
from p40fleet.privdrop import AS_USER_FN
from p40fleet.spec import load_spec
from p40fleet.verification.probe import ProbeTargets
from tests.opharness import run_op

SPEC = load_spec("lab1", {})
HOME = SPEC.user.home
USER = SPEC.user.name
PY = f"{SPEC.env.conda_prefix}/envs/{SPEC.env.name}/bin/python"
REPO = Path(__file__).resolve().parent.parent
FACT_MODULES = [f"facts.{p.stem}" for p in (REPO / "facts").glob("*.py") if p.stem != "__init__"]


def _project_facts() -> list[type[FactBase]]:
    found = {}
    for name in FACT_MODULES:
        for obj in vars(importlib.import_module(name)).values():
            if isinstance(obj, type) and issubclass(obj, FactBase) and obj.__module__ == name:
                found[obj.__name__] = obj
    found.pop("Survey", None)  # facts.survey: runs the other facts' commands, checked here each
    return sorted(found.values(), key=lambda c: c.__name__)


def _text(command) -> str:
    return command if isinstance(command, str) else command.get_raw_value()


def _wrapped(command: str) -> bool:
    """Every mention of the home is inside the argument of a ``p40fleet_as USER`` call."""
    text = _text(command).replace(AS_USER_FN, "")
    first = text.find(f"p40fleet_as {USER} ")
    return first >= 0 and HOME not in text[:first]


def _under_home_args(cls: type[FactBase]) -> dict:
    """Arguments for ``cls().command``: every path under the home, ``user`` the training user."""
    values = {
        "user": USER,
        "address": "10.0.0.1:6379",
        "temp_dir": "/tmp/ray",
        "env_name": SPEC.env.name,
        "verl_ref": "v0.5.0",
        "overrides": (),
        "packages": ("dkms", "build-essential"),
    }
    args = {name: values.get(name, f"{HOME}/{name}") for name in _command_params(cls)}
    if cls is VerifyProbe:  # its one argument is the targets: every path under the home
        return {"targets": ProbeTargets(**args)}
    if cls is SmokeStep:  # the same, plus its two numbers
        return {"targets": SmokeTargets(**dict(args, gpus=1, timeout_s=600))}
    if cls is CollectiveRunFact:  # the env's python under the home, plus the cluster
        return {"targets": CollectiveTargets(**dict(args, store_host="10.0.0.1", port=29500,
                                                    members=(("a", "10.0.0.2"),),
                                                    timeout_s=180))}  # fmt: skip
    return args


def _command_params(cls: type[FactBase]) -> set[str]:
    """The names ``cls().command`` takes (the probe's: its targets' fields)."""
    if cls is VerifyProbe:
        return set(ProbeTargets._fields)
    if cls is SmokeStep:
        return set(SmokeTargets._fields) - {"gpus", "timeout_s"}
    if cls is CollectiveRunFact:
        return set(CollectiveTargets._fields) - {"store_host", "port", "members", "timeout_s"}
    return set(inspect.signature(cls.command).parameters) - {"self"}


def test_every_fact_that_takes_a_home_path_runs_as_the_training_user():
    """S1, walking every fact of facts/: one that reads or runs a path (its command takes a
    path argument) has a ``user`` argument, and with paths under the home its command touches
    them only through the privilege drop."""
    # stat, df and bounded reads of root's own files (artifact cache, /etc, the CUDA dir)
    root_side = {"ArtifactState", "CudnnHeaderVersion", "FileStampFact", "FreeSpace", "PathDevice",
                 "RunLock"}  # fmt: skip
    checked = []
    for cls in _project_facts():
        params = _command_params(cls)
        if "user" not in params:
            # root's own files (cache, CUDA dir, /etc): never under the training user's home
            assert cls.__name__ in root_side or not params & {
                "path", "prefix", "python", "checkout", "ray", "script"
            }, f"{cls.__name__} reads a path but has no user argument"  # fmt: skip
            continue
        command = cls().command(**_under_home_args(cls))
        if cls.__name__ == "VerifyProbe":
            continue  # mixes root's sections with the user's: see the probe tests below
        assert _wrapped(command), f"{cls.__name__} touches {HOME} outside the privilege drop"
        checked.append(cls.__name__)
    assert {"CondaInstall", "EnvPython", "GitCheckout", "RayStatus", "ModelConfig",
            "CollectiveRunFact"} <= set(checked)  # fmt: skip


def test_no_fact_runs_without_a_user():
    with pytest.raises(ValueError, match="no training user"):
        EnvPython().command(prefix=f"{HOME}/miniconda3", env_name="e", user="")


def test_operations_ask_their_home_facts_with_the_training_user():
    """The operations that read the env, the checkout and the staged inputs pass ``user``, so
    the facts they ask are wrapped (a missing ``user`` raises TypeError in the fact)."""
    asked = []

    def record(cls):
        def answer(**kwargs):
            asked.append((cls, kwargs))
            return cls().default() if hasattr(cls, "default") else None

        return answer

    facts = {cls: record(cls) for cls in _project_facts()}
    ops = [
        (conda.miniconda, {"installer": "/var/cache/m.sh", "prefix": SPEC.env.conda_prefix}),
        (conda.conda_tos, {"prefix": SPEC.env.conda_prefix, "policy": "accept"}),
        (conda.env, {"prefix": SPEC.env.conda_prefix, "env_name": "e", "python_version": "3"}),
        (conda.condarc, {"prefix": SPEC.env.conda_prefix, "channel": "http://m/conda"}),
        (torch.torch, {"python": PY, "version": "2.13.0+cpu", "lock_dest": "/c/torch.txt",
                       "lock": str(REPO / "files" / "torch-requirements-lab.txt")}),
        (verl.checkout, {"path": f"{HOME}/verl", "remote": "http://m/v.git", "ref": "v",
                         "commit": "0" * 40}),
        (verl.install, {"python": PY, "checkout": f"{HOME}/verl", "version": "0.5.0"}),
    ]  # fmt: skip
    for op, kwargs in ops:
        run_op(op, user=USER, facts=facts, default_facts=True, **kwargs)
    run_op(training.stage, which="model", spec=SPEC, facts=facts, default_facts=True)
    assert asked
    for cls, kwargs in asked:
        assert kwargs.get("user") == USER, f"{cls.__name__} asked without the user: {kwargs}"
        assert _wrapped(cls().command(**kwargs)), cls.__name__


def test_verify_probe_runs_the_env_and_git_only_as_the_training_user():
    probe = render_probe(_under_home_args(VerifyProbe)["targets"])
    assert "safe.directory=" not in probe and "-c safe" not in probe
    # the env's python, git and every read under the home go through asu (p40fleet_as)
    assert '| asu $T "$PY" - "$@"' in probe
    assert "g() { asu git -C" in probe
    assert 'out=$(asu $T "$P" - "$CO" "$RECORD"' in probe
    for line in probe.splitlines():
        code = line.split("#", 1)[0]
        if '"$PY"' in code and "[ " not in code:
            assert "asu" in code, line
        assert not code.lstrip().startswith("git "), line


@pytest.fixture
def open_tmp():
    """A scratch dir another user can enter (pytest's tmp_path is root's, mode 0700)."""
    path = tempfile.mkdtemp(prefix="p40fleet-privdrop-")
    os.chmod(path, 0o755)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _needs_root_and_nobody():
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("the privilege drop itself needs root and runuser")
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user nobody to drop to")


def _env_with_pth(base: Path) -> tuple[str, Path]:
    """A venv whose site-packages holds a .pth writing ``ran-as-uid-N`` into ``base/marks``."""
    prefix = base / "miniconda3"
    env = prefix / "envs" / "e"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    marks = base / "marks"
    marks.mkdir(mode=0o777)
    marks.chmod(0o777)
    site = glob.glob(f"{env}/lib/python3*/site-packages")[0]
    Path(site, "zz.pth").write_text(
        f"import os; open({str(marks)!r} + '/ran-as-uid-%d' % os.getuid(), 'w')\n"
    )
    return str(prefix), marks


def test_a_pth_in_the_env_runs_as_the_training_user_never_root(open_tmp):
    """S1 for real: EnvPython runs the env's python, whose .pth files the user controls."""
    nobody = _needs_root_and_nobody()
    prefix, marks = _env_with_pth(open_tmp)
    command = EnvPython().command(prefix=prefix, env_name="e", user="nobody")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert sorted(os.listdir(marks)) == [f"ran-as-uid-{nobody}"], out.stdout + out.stderr


def test_facts_of_a_user_that_does_not_exist_say_missing_and_run_nothing(open_tmp):
    if os.geteuid() != 0:
        pytest.skip("as non-root, runuser cannot run anyway")
    prefix, marks = _env_with_pth(open_tmp)
    fact = EnvPython()
    out = subprocess.run(
        ["sh", "-c", fact.command(prefix=prefix, env_name="e", user="p40fleet-no-such-user")],
        capture_output=True,
        text=True,
    )
    assert fact.process(out.stdout.splitlines()).state == "missing"
    assert os.listdir(marks) == []


# -- S12: uploads into the home ------------------------------------------------------------


def test_uploads_into_the_home_create_their_directories_as_the_training_user(tmp_path):
    """S12: the first command touching <home>/.cache/p40fleet runs as the training user (su),
    and files.put is told not to create the parents as root."""
    cache = f"{HOME}/.cache/p40fleet"
    tar = tmp_path / "apex-wheel.tar"
    tar.write_bytes(b"x")
    req = tmp_path / "req.txt"
    req.write_text("six==1.16.0\n")
    script = tmp_path / "verl_patch.py"
    script.write_text("print()\n")
    results = [
        run_op(apex.put_wheel, local_tar=str(tar), remote_tar=f"{cache}/apex/K/apex-wheel.tar",
               user=USER, facts={Directory: None}, default_facts=True),
        run_op(verl.requirements, python=PY, src=str(req), dest=f"{cache}/verl-req.txt",
               env_dir=f"{HOME}/miniconda3/envs/e", user=USER, facts={Directory: None},
               default_facts=True),
        run_op(verl.patch, python=PY, checkout=f"{HOME}/verl", script_src=str(script),
               rules_json="{}", work_dir=f"{cache}/verl-patch", user=USER,
               facts={Directory: None}, default_facts=True),
    ]  # fmt: skip
    for result in results:
        first = next(c for c in result.commands if cache in c)
        assert first.startswith(f"su -s /bin/sh {USER} -c 'mkdir -p {cache}"), first
        assert not any(c.startswith("mkdir -p") for c in result.commands), result.commands
    # the requirements file is the user's too (it was root's): written by the user (N1)
    assert not any(c.startswith(("chown", "chmod")) for c in results[1].commands)
    assert any(
        c.startswith(f"su -s /bin/sh {USER} -c") and f"{cache}/verl-req.txt" in c
        for c in results[1].commands
    )


# -- S19: bounded reads --------------------------------------------------------------------


def test_every_fact_that_reads_a_file_has_a_limit():
    """S19: no fact ``cat``s a file; a ``head`` that reads one is bounded by -c or -n, and git
    status output is cut."""
    for cls in _project_facts():
        command = cls().command(**_under_home_args(cls))
        code = _text(command).replace(AS_USER_FN, "")
        reads = re.findall(r"(?:^|[|;(&]|then|do)\s*(head|tail|cat)\b\s*(\S*)", code, re.M)
        if cls.__name__ in ("PciGpus",):
            continue  # reads sysfs attribute files only (the kernel bounds them)
        for tool, arg in reads:
            # cat only of the kernel's own small files (/sys, /proc) or a here-document
            bounded = arg.startswith(("-c", "-n")) or (
                tool == "cat" and arg.startswith(("/sys/", "/proc/", "<<"))
            )
            assert bounded, f"{cls.__name__}: {tool} {arg} reads without a limit"
        if "status --porcelain" in code:
            assert "head -n" in code.split("status --porcelain", 1)[1][:120], cls.__name__


def test_marker_text_reads_4096_bytes_and_no_symlink(tmp_path):
    from facts.conda import MarkerText

    big = tmp_path / "big"
    with open(big, "wb") as fh:
        fh.truncate(50_000_000)  # sparse: 50 MB of NULs
    link = tmp_path / "link"
    link.symlink_to("/etc/hostname")
    fact = MarkerText()
    me = pwd.getpwuid(os.getuid()).pw_name

    def read(path):
        return subprocess.run(
            ["sh", "-c", fact.command(path=str(path), user=me)], capture_output=True
        ).stdout

    assert len(read(big)) <= 4096 + 64
    assert fact.process(read(link).decode().splitlines()) is None


# -- S20 and S22b: the training user -------------------------------------------------------


def test_home_is_managed_0750_and_data_and_models_are_not_world_readable():
    result = run_op(
        training_user.training_user, user=USER, uid=2001, home=HOME,
        facts={Directory: {"user": USER, "group": USER, "mode": 755}}, default_facts=True,
    )  # fmt: skip
    assert f"chmod 750 {HOME}" in result.commands
    # deploy/python.py's data and model directories
    tree = ast.parse((REPO / "deploy" / "python.py").read_text())
    modes = {}
    directory = ("files.directory", "training_user.directory")  # the latter wraps the former
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and ast.unparse(call.func) in directory:
            kw = {k.arg: ast.unparse(k.value) for k in call.keywords}
            modes[kw.get("path")] = kw.get("mode")
    assert modes["env.data_dir"] == modes["env.model_dir"] == "'750'", modes


def test_system_account_refusal_names_another_user_never_usermod():
    """S22b: an existing system account (uid < 1000) is never to be re-numbered."""
    users = {"root": {"uid": 0, "home": "/root", "shell": "/bin/bash", "group": "root"}}
    result = run_op(
        training_user.training_user, user="root", uid=2001, home="/home/root",
        facts={Users: users}, default_facts=True,
    )  # fmt: skip
    message = result.failures[0]
    assert "usermod" not in message and "stack.user.name" in message, message


def test_the_verify_probe_answers_through_the_drop_and_never_runs_the_env_as_root(open_tmp):
    """S1 for real: the whole probe on a fake host (tests/test_verification.py) as root with the
    training user ``nobody``: the env's python answers, and its .pth ran as nobody only."""
    from p40fleet.verification.probe import parse_probe
    from tests.test_verification import _fake_host

    nobody = _needs_root_and_nobody()
    params = {**_fake_host(open_tmp), "user": "nobody"}
    marks = open_tmp / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    site = glob.glob(str(Path(params["python"]).parents[1] / "lib/python3*/site-packages"))[0]
    Path(site, "zz.pth").write_text(
        f"import os; open({str(marks)!r} + '/ran-as-uid-%d' % os.getuid(), 'w')\n"
    )
    for path in open_tmp.rglob("*"):  # the fake host's files are the user's, readable by it
        path.chmod(path.stat().st_mode | 0o055)
    proc = subprocess.run(
        ["sh", "-c", render_probe(ProbeTargets(**params))], capture_output=True, text=True
    )
    answers = parse_probe(proc.stdout.splitlines())
    python = answers.section("python")
    assert python is not None and python.answer and python.answer.get("version"), proc.stdout
    assert sorted(os.listdir(marks)) == [f"ran-as-uid-{nobody}"]
