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

from p40fleet.facts.collective import CollectiveRunFact, CollectiveTargets
from p40fleet.facts.env import EnvPython
from p40fleet.facts.smoke import ClusterSmokeStep, ClusterSmokeTargets, SmokeStep, SmokeTargets
from p40fleet.facts.verify import VerifyProbe, render_probe
from p40fleet.operations import apex, conda, torch, training, training_user, verl
from p40fleet.privdrop import AS_USER_FN, as_user_script
from p40fleet.spec import load_spec
from p40fleet.verification.probe import ProbeTargets
from tests.opharness import run_op

SPEC = load_spec("lab1", {})
HOME = SPEC.user.home
USER = SPEC.user.name
PY = f"{SPEC.env.conda_prefix}/envs/{SPEC.env.name}/bin/python"
REPO = Path(__file__).resolve().parent.parent
FACT_MODULES = [
    f"p40fleet.facts.{p.stem}" for p in (REPO / "facts").glob("*.py") if p.stem != "__init__"
]


def _project_facts() -> list[type[FactBase]]:
    found = {}
    for name in FACT_MODULES:
        for obj in vars(importlib.import_module(name)).values():
            if not (isinstance(obj, type) and issubclass(obj, FactBase)):
                continue
            if obj.__module__ == name and not vars(obj).get("abstract"):  # a base is not asked
                found[obj.__name__] = obj
    found.pop("Survey", None)  # facts.survey: runs the other facts' commands, checked here each
    return sorted(found.values(), key=lambda c: c.__name__)


def _text(command) -> str:
    return command if isinstance(command, str) else command.get_raw_value()


def _wrapped(command: str) -> bool:
    """Every mention of the home is inside the argument of a ``p40fleet_ask [-m] N USER`` call
    (the bounded drop: a bare ``p40fleet_as`` in a fact is refused by the test below)."""
    text = _text(command).replace(AS_USER_FN, "")
    first = re.search(rf"p40fleet_ask (?:-m )?\d+ {USER} ", text)
    return first is not None and HOME not in text[: first.start()]


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
    if cls is ClusterSmokeStep:  # the smoke step's paths, plus the cluster
        return {"targets": ClusterSmokeTargets(**dict(args, head_host="10.0.0.1",
                                                      members=(("a", "10.0.0.1"),
                                                               ("b", "10.0.0.2")),
                                                      gpus_per_node=1, timeout_s=600))}  # fmt: skip
    return args


def _command_params(cls: type[FactBase]) -> set[str]:
    """The names ``cls().command`` takes (the probe's: its targets' fields)."""
    if cls is VerifyProbe:
        return set(ProbeTargets._fields)
    if cls is SmokeStep:
        return set(SmokeTargets._fields) - {"gpus", "timeout_s"}
    if cls is CollectiveRunFact:
        return set(CollectiveTargets._fields) - {"store_host", "port", "members", "timeout_s"}
    if cls is ClusterSmokeStep:
        return set(ClusterSmokeTargets._fields) - {"head_host", "members", "gpus_per_node",
                                                    "timeout_s"}  # fmt: skip
    return set(inspect.signature(cls.command).parameters) - {"self"}


def test_every_fact_that_takes_a_home_path_runs_as_the_training_user():
    """S1, walking every fact of facts/: one that reads or runs a path (its command takes a
    path argument) has a ``user`` argument, and with paths under the home its command touches
    them only through the privilege drop."""
    # stat, df and bounded reads of root's own files (artifact cache, /etc, the CUDA dir)
    # UnsafeParent: stat of root's dirs and their parents (the spec refuses them inside a home)
    root_side = {"ArtifactState", "CudnnHeaderVersion", "FileStampFact", "FreeSpace", "PathDevice",
                 "RunLock", "UnsafeParent"}  # fmt: skip
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
            "CollectiveRunFact", "ClusterSmokeStep"} <= set(checked)  # fmt: skip


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
        (conda.env, {"prefix": SPEC.env.conda_prefix, "env_name": "e", "python_version": "3.10.12",
                     "lock": str(REPO / "files" / "conda-env-v0.5.0.txt"),
                     "lock_dest": "/c/conda-env.txt"}),
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
    assert '| asum $T "$PY" - "$@"' in probe
    assert "g() { asu git -C" in probe
    assert 'out=$(asum $T "$P" - "$CO" "$RECORD"' in probe
    assert re.search(r'p40fleet_ask \$_am "\$_as" "\$TU" ', probe)  # asu and asum: bounded
    for line in probe.splitlines():
        code = line.split("#", 1)[0]
        if '"$PY"' in code and "[ " not in code:
            assert re.search(r"\basum? ", code), line
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
    from p40fleet.facts.env import MarkerText

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
    tree = ast.parse((REPO / "p40fleet" / "deploys" / "steps" / "python.py").read_text())
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
    """S1 for real: the whole probe on a fake host (tests/test_verify.py) as root with the
    training user ``nobody``: the env's python answers, and its .pth ran as nobody only."""
    from p40fleet.verification.probe import parse_probe
    from tests.test_verify import _fake_host

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


# -- S19/N6/N4: what the user's programs print is bounded, framed, and cannot hold the pipe ---


def test_no_fact_runs_a_user_program_without_the_bounds():
    """S19/N6: every fact that drops to the training user does it through ``p40fleet_ask``
    (root's timeout, a byte bound, output through a file of root's), never a bare
    ``p40fleet_as``, whose output was the caller's pipe, unbounded."""
    dropped = []
    for cls in _project_facts():
        command = _text(cls().command(**_under_home_args(cls)))
        if AS_USER_FN not in command and "p40fleet_as" not in command:
            continue
        code = command.replace(AS_USER_FN, "")
        assert not re.search(r"\bp40fleet_as\s", code), f"{cls.__name__}: an unbounded drop"
        assert "p40fleet_ask" in code, cls.__name__
        dropped.append(cls.__name__)
    assert {"EnvPython", "EnvDistributions", "GitCheckout", "RayStatus", "SmokeStep",
            "ClusterSmokeStep", "VerifyProbe", "UserFile"} <= set(dropped)  # fmt: skip


#: An executable the training user controls (a conda, a python, a ray) that prints 50 MB and
#: leaves a child holding its stdout and stderr: before the bounds, the fact's output was
#: unbounded and the caller waited for the child.
_FLOOD = "#!/bin/sh\ntouch {ran}\n(sleep 25 &)\nhead -c 50000000 /dev/zero | tr '\\0' x\necho\n"


def _flooders(base: Path, cls: type[FactBase]) -> dict:
    """``cls``'s arguments under ``base``, with a flooding program at every program path."""
    args = {k: (v.replace(HOME, str(base)) if isinstance(v, str) else v)
            for k, v in _under_home_args(cls).items()}  # fmt: skip
    args["user"] = "nobody"
    programs = []
    if "python" in args:
        programs.append(args["python"])
    if "ray" in args:
        programs.append(args["ray"])
    if "prefix" in args:
        programs.append(f"{args['prefix']}/bin/conda")
        if "env_name" in args:
            programs.append(f"{args['prefix']}/envs/{args['env_name']}/bin/python")
    for name in ("script", "rules"):
        if name in args:
            Path(args[name]).parent.mkdir(parents=True, exist_ok=True)
            Path(args[name]).write_text("x\n")
    if "checkout" in args:
        Path(args["checkout"]).mkdir(parents=True, exist_ok=True)
    for program in programs:
        Path(program).parent.mkdir(parents=True, exist_ok=True)
        Path(program).write_text(_FLOOD.format(ran=base / "ran"))
        Path(program).chmod(0o755)
    return args if programs else {}


def test_a_user_program_that_floods_and_holds_the_pipe_is_cut_and_ended(open_tmp, monkeypatch):
    """S19/N6 for real, walking every fact that runs a user program: its 50 MB come back cut
    to ``ASK_LIMIT`` bytes, and the child it leaves holding stdout does not hold the fact."""
    from p40fleet import privdrop
    from p40fleet.facts.ray import RayStatus
    from p40fleet.ray import UNIT_PATH

    _needs_root_and_nobody()
    monkeypatch.setattr(privdrop, "FACT_TIMEOUT_S", 3, raising=False)
    limit = getattr(privdrop, "ASK_LIMIT", 262144)
    err_limit = getattr(privdrop, "ASK_STDERR_LIMIT", 4096)
    unit = open_tmp / "unit"
    unit.write_text("[Unit]\n")
    walked = []
    for cls in _project_facts():
        if cls.__name__ in ("VerifyProbe", "SmokeStep", "ClusterSmokeStep"):
            continue  # their own tests below and in tests/test_smoke.py
        base = open_tmp / cls.__name__
        args = _flooders(base, cls)
        if not args:
            continue
        for path in [base, *base.rglob("*")]:
            os.chown(path, 65534, 65534, follow_symlinks=False)
        command = _text(cls().command(**args)).replace(UNIT_PATH, str(unit))
        if cls is RayStatus:  # its own bound: ray status's 20 s, not the facts'
            command = command.replace("timeout 20 ", "timeout 2 ").replace("ask 30 ", "ask 3 ")
        try:
            out = subprocess.run(["sh", "-c", command], capture_output=True, timeout=20, cwd="/")
        except subprocess.TimeoutExpired:
            pytest.fail(f"{cls.__name__}: no answer after 20 s (a child holds its pipe)")
        assert len(out.stdout) <= limit + 4096, (cls.__name__, len(out.stdout))
        assert len(out.stderr) <= err_limit + 4096, (cls.__name__, len(out.stderr))
        cls().process(out.stdout.decode(errors="replace").splitlines())  # parses, no raise
        assert (base / "ran").exists(), f"{cls.__name__}: the flooding program never ran"
        walked.append(cls.__name__)
    assert {"CondaInstall", "CondaTos", "EnvPython", "EnvDistributions", "RayStatus",
            "VerlPatchCheck"} <= set(walked), walked  # fmt: skip


def _pth_env(base: Path, code: str) -> str:
    """A venv under ``base`` (the training user's) whose .pth runs ``code``; its prefix."""
    prefix = base / "miniconda3"
    env = prefix / "envs" / "e"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = glob.glob(f"{env}/lib/python3*/site-packages")[0]
    Path(site, "zz.pth").write_text(code + "\n")
    return str(prefix)


def test_a_pth_cannot_forge_root_parts_flood_or_hang_the_survey(open_tmp, monkeypatch):
    """N4 + S19/N6 in one survey on @local: the env's .pth prints root part 0's marker (with
    the survey's secret, read from its command line), 50 MB, and forks a child that holds
    stdout. Part 0 keeps root's answer; EnvPython answers (broken: ended) within the bound."""
    import time

    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.state import StateStage

    from p40fleet import privdrop
    from p40fleet.facts import survey as sv
    from p40fleet.facts.host import MemTotal

    _needs_root_and_nobody()
    monkeypatch.setattr(privdrop, "FACT_TIMEOUT_S", 4, raising=False)  # the child: 20 s
    steal = (
        "import os, re, sys; cmd = open('/proc/%d/cmdline' % os.getppid(), 'rb').read()"
        "; t = (re.findall(rb'-v t=([0-9a-f]+)', cmd) or [b'0' * 32])[0].decode()"
        "; sys.stdout.write('MemTotal: 1 kB\\n@@p40fleet-survey %s 0 0\\n' % t)"
        "; sys.stdout.write('x' * 50_000_000 + '\\n'); sys.stdout.flush()"
        "; (os.fork() == 0) and (__import__('time').sleep(20), os._exit(0))"
    )
    prefix = _pth_env(open_tmp, steal)
    subprocess.run(["chown", "-R", "65534:65534", str(open_tmp)], check=True)
    inventory = Inventory(([("@local", {})], {}))
    state = State(inventory, Config())
    connect_all(state)
    state.set_stage(StateStage.Prepare)
    target = inventory.get_host("@local")
    sv.install(state)
    parts = [sv.part(MemTotal), sv.part(EnvPython, prefix=prefix, env_name="e", user="nobody")]
    start = time.monotonic()
    assert sv.survey(target, parts) == 2
    took = time.monotonic() - start
    assert took < 4 + 5 + 5, took  # the bound, runuser's and timeout's grace
    assert sv.ask(target, MemTotal) > 1024  # root's /proc/meminfo, not the forged "1 kB"
    assert sv.answered(target, EnvPython, prefix=prefix, env_name="e", user="nobody")
    env = sv.ask(target, EnvPython, prefix=prefix, env_name="e", user="nobody")
    assert env.state == "broken", env


def test_the_probe_keeps_root_sections_and_answers_over_a_fifo(open_tmp):
    """N4 (probe) + N6: a .pth printing a forged ``@@section nvidia-smi`` (and nvcc) and leaving
    a child on stdout leaves root's sections as root saw them, and the probe does not wait for
    the child; a FIFO at the launch script answers, no hang."""
    from p40fleet.verification.probe import parse_probe
    from tests.test_verify import _fake_host

    _needs_root_and_nobody()
    params = {**_fake_host(open_tmp), "user": "nobody"}
    fake = (
        "@@section nvidia-smi\\nfields=index,name,pci.bus_id,pci.device_id,compute_cap,"
        "driver_version\\n0, Tesla P40, 00000000:3B:00.0, 0x1B3810DE, 6.1, 525.147.05\\n"
        "@@rc 0\\n@@section nvcc\\nCuda compilation tools, release 12.9\\n@@rc 0\\n"
    )
    site = glob.glob(str(Path(params["python"]).parents[1] / "lib/python3*/site-packages"))[0]
    hold = "(os.fork() == 0) and (time.sleep(60), os._exit(0))"  # a child that holds stdout
    Path(site, "zz.pth").write_text(
        f"import os, sys, time; sys.stdout.write('{fake}'); sys.stdout.flush(); {hold}\n"
    )
    launch = Path(params["launch_script"])
    launch.unlink(missing_ok=True)
    os.mkfifo(launch)
    for path in [open_tmp, *open_tmp.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o055)
    try:
        proc = subprocess.run(["sh", "-c", render_probe(ProbeTargets(**params))],
                              capture_output=True, text=True, timeout=50)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the probe waits for the .pth's child or the FIFO at the launch script")
    answers = parse_probe(proc.stdout.splitlines())
    smi = answers.section("nvidia-smi")
    if shutil.which("nvidia-smi") is None:
        assert smi is not None and smi.get("missing") == "nvidia-smi", smi
    assert not any("Tesla P40" in line for line in smi.lines), smi
    nvcc = answers.section("nvcc")
    assert nvcc is not None and "release 11.8" in " ".join(nvcc.lines), nvcc  # the fake host's
    assert answers.section("python") and answers.section("python").answer, proc.stdout[-2000:]
    assert answers.complete  # to its end: nothing waited on the FIFO


def test_ray_status_over_a_fifo_log_answers_at_once(open_tmp):
    """N6: Ray's temp dir is 0777; a FIFO planted as raylet.out is not read (as the user, a
    regular file only): the fact answers without a node id, at once."""
    from p40fleet.facts.ray import RayStatus
    from p40fleet.ray import UNIT_PATH

    _needs_root_and_nobody()
    logs = open_tmp / "ray" / "session_latest" / "logs"
    logs.mkdir(parents=True)
    os.mkfifo(logs / "raylet.out")
    unit = open_tmp / "unit"
    unit.write_text("[Unit]\n")
    for path in [open_tmp, *open_tmp.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o055)
    command = RayStatus().command(ray="/nowhere/ray", address="h:1",
                                  temp_dir=str(open_tmp / "ray"), user="nobody")  # fmt: skip
    try:
        out = subprocess.run(["sh", "-c", command.replace(UNIT_PATH, str(unit))],
                             capture_output=True, text=True, timeout=15, cwd="/")  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("RayStatus hangs on a FIFO at raylet.out")
    probe = RayStatus().process(out.stdout.splitlines())
    assert probe.unit and probe.node_id == "" and probe.status_rc == 127, out.stdout


def test_ray_status_takes_roots_keys_from_root_only():
    """What the user's part of RayStatus prints cannot set root's keys (unit, sim, active)."""
    from p40fleet.ray import parse_probe as ray_probe

    user = ["unit=yes", "sim=yes", "active=active", "node_id=ab", "node_id=cd"]
    probe = ray_probe(["unit=no", "sim=no", "@@ray-user", *user, "@@ray-status", "@@rc=0"])
    assert (probe.unit, probe.simulated, probe.active, probe.node_id) == (False, False, "", "ab")


@pytest.mark.uid0_guard
def test_p40fleet_as_refuses_a_uid_0_user_and_runs_nothing(tmp_path):
    """Security N13: the spec refuses system accounts; the drop itself never runs as root
    either (as root, the caller's uid matched and the command ran directly)."""
    mark = tmp_path / "ran"
    out = subprocess.run(
        ["sh", "-c", f"{AS_USER_FN}\np40fleet_as root touch {mark}"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 126, out
    assert "root has uid 0: refusing" in out.stderr and not mark.exists()
    script = as_user_script("root", f"touch {mark}")
    assert subprocess.run(["sh", "-c", script], capture_output=True).returncode == 0  # ; true
    assert not mark.exists()
