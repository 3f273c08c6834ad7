"""Python-layer operations: facts in, commands out (tests/opharness.py)."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import shlex
import subprocess
from types import SimpleNamespace

from pyinfra.facts.files import Directory, File
from pyinfra.facts.server import Groups, Os, Users, Which

from facts.conda import (
    CondaInstall,
    CondaState,
    CondaTos,
    CondaTosState,
    Dist,
    EnvDistributions,
    EnvPython,
    EnvPythonState,
    MarkerText,
)
from facts.verl import GitCheckout, GitState, VerlPatchCheck
from operations import apex, conda, torch, training_user, verl
from p40fleet import apex_build, verl_patches
from tests.opharness import run_op

PREFIX = "/home/verl/miniconda3"
PY = f"{PREFIX}/envs/verl-p40/bin/python"
ENV = f"{PREFIX}/envs/verl-p40"
COMMIT = "8fdc4d3f202f41461f4de9f42a637228e342668b"
USER_FACTS = {Os: "Linux", Which: "/usr/sbin/useradd", Groups: [], File: None}


# -- training user -------------------------------------------------------------------------


def _user(facts):
    return run_op(
        training_user.training_user,
        user="verl",
        uid=2001,
        home="/home/verl",
        facts={**USER_FACTS, **facts},
    )


def test_user_created_with_fixed_uid_and_home_from_skel():
    result = _user({Users: {}, Directory: None})
    assert result.commands[0] == "groupadd verl --gid 2001"
    useradd = result.commands[1]
    assert useradd.startswith("useradd ") and useradd.endswith(" verl")
    assert "--uid 2001" in useradd and "-s /bin/bash" in useradd and "-m" in useradd.split()


def test_user_after_reinstall_reuses_existing_home():
    result = _user({Users: {}, Directory: {"user": 2001, "group": 2001, "mode": 755}})
    useradd = next(c for c in result.commands if c.startswith("useradd"))
    assert "-M" in useradd.split() and "-m" not in useradd.split()
    assert not any("rm " in c for c in result.commands)


def test_user_with_other_uid_is_refused():
    users = {"verl": {"uid": 1500, "home": "/home/verl", "shell": "/bin/bash", "group": "verl"}}
    result = _user({Users: users, Directory: None})
    assert result.commands == ["function _fail"] and "uid 1500" in result.failures[0]


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
RECORD = (
    "printf '%s\\n' https://repo.anaconda.com/pkgs/main https://repo.anaconda.com/pkgs/r > "
    f"{PREFIX}/.p40fleet-conda-tos"
)


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


def _env(state, **kw):
    return run_op(
        conda.env,
        prefix=PREFIX,
        env_name="verl-p40",
        python_version="3.10.12",
        facts={EnvPython: state},
        **kw,
    )


def test_healthy_env_kept():
    result = _env(EnvPythonState("ok", "3.10.12"))
    assert not result.changed and "healthy" in result.noops[0]


def test_env_missing_created_with_channels():
    result = _env(EnvPythonState("missing"), channels=conda.channel_args("conda-forge"))
    assert result.commands == [
        f"{PREFIX}/bin/conda create -n verl-p40 python=3.10.12 -y "
        "--override-channels -c conda-forge"
    ]


def test_deleted_env_python_removes_and_recreates_saying_why():
    result = _env(EnvPythonState("broken", detail="No such file or directory"))
    assert result.commands[0] == f"{PREFIX}/bin/conda env remove -n verl-p40 -y"
    assert result.commands[-1] == f"{PREFIX}/bin/conda create -n verl-p40 python=3.10.12 -y"
    assert "broken" in result.logs[0]


def test_wrong_python_version_recreates():
    result = _env(EnvPythonState("ok", "3.11.2"))
    assert "env remove" in result.commands[0] and "3.11.2" in result.logs[0]


# -- torch ---------------------------------------------------------------------------------


FILES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "files")
REAL_LOCK = os.path.join(FILES, "torch-requirements-v0.5.0.txt")
LAB_LOCK = os.path.join(FILES, "torch-requirements-lab.txt")
SUM = "ab" * 32


def _torch(dists, lock=REAL_LOCK, **kw):
    return run_op(
        torch.torch,
        python=PY,
        version="2.6.0+cu118",
        torchvision="0.21.0+cu118",
        torchaudio="2.6.0+cu118",
        lock=lock,
        lock_dest="/c/torch.txt",
        index_args=["--index-url", "http://m/simple"],
        facts={EnvDistributions: dists},
        default_facts=True,
        **kw,
    )


def test_torch_at_pin_is_noop():
    dists = {
        "torch": Dist("2.6.0+cu118"),
        "torchvision": Dist("0.21.0+cu118"),
        "torchaudio": Dist("2.6.0+cu118"),
    }
    assert not _torch(dists).changed


def test_torch_without_a_published_sum_is_refused_naming_the_wheels():
    """The real lock has no sum for torchvision/torchaudio +cu118: nothing unhashed runs."""
    result = _torch({"torch": Dist("2.5.1+cu118")})
    assert result.commands == ["function _refuse"], result.commands
    (message,) = result.failures
    assert "torch install" in message and "stack.torch.sha256" in message
    assert "torchvision==0.21.0+cu118 has no --hash" in message
    assert "torchaudio==2.6.0+cu118 has no --hash" in message
    assert "torch==2.6.0+cu118 has no" not in message  # its published sum is in the lock


def test_torch_installs_the_whole_closure_with_require_hashes():
    sums = {"torchvision": SUM, "torchaudio": "cd" * 32}
    result = _torch({"torch": Dist("2.5.1+cu118")}, sha256=sums)
    assert result.commands[-2:] == [
        "upload /c/torch.txt",
        f"{PY} -m pip --disable-pip-version-check install --require-hashes "
        "--index-url http://m/simple -r /c/torch.txt",
    ]
    uploaded = result.uploads["/c/torch.txt"]
    assert f"torchvision==0.21.0+cu118 --hash=sha256:{SUM}" in uploaded
    # torch's own closure is in the same file, every line hashed
    for name in ("sympy==", "networkx==", "jinja2==", "filelock==", "fsspec==", "triton=="):
        assert name in uploaded
    lines = [x for x in uploaded.splitlines() if x and not x.startswith("#")]
    assert len(lines) > 20 and all("--hash=sha256:" in x for x in lines)


def test_torch_lock_at_another_version_than_the_spec_is_refused():
    result = run_op(
        torch.torch,
        python=PY,
        version="2.12.0+cpu",
        lock=LAB_LOCK,
        lock_dest="/c/torch.txt",
        facts={EnvDistributions: {}},
        default_facts=True,
    )
    assert "the lock has torch==2.13.0+cpu, the spec pins torch==2.12.0+cpu" in result.failures[0]


def test_torch_lab_without_vision_audio_and_fresh_env():
    result = run_op(
        torch.torch,
        python=PY,
        version="2.13.0+cpu",
        torchvision=None,
        torchaudio=None,
        lock=LAB_LOCK,
        lock_dest="/c/torch.txt",
        fresh_env=True,
        default_facts=True,
    )
    assert result.commands[-1].endswith("install --require-hashes -r /c/torch.txt")


# -- apex ----------------------------------------------------------------------------------


def _build_op(cuda_ext=True, tar=None):
    return run_op(
        apex.build_wheel,
        python=PY,
        remote="http://m/git/apex.git",
        ref="25.09",
        commit="4bdecd06b3c4b2c0a8fb6603829a8f9f05a42b49",
        work_dir="/w",
        cuda_home="/usr/local/cuda-11.8",
        arch_list="6.0;6.1",
        max_jobs=6,
        cuda_ext=cuda_ext,
        facts={File: tar},
    )


def test_build_wheel_flags():
    result = _build_op()
    build = next(c for c in result.commands if " wheel " in c)
    assert "CUDA_HOME=/usr/local/cuda-11.8" in build
    assert "'TORCH_CUDA_ARCH_LIST=6.0;6.1'" in build and "MAX_JOBS=6" in build
    for flag in ("--no-build-isolation", "--no-deps", "-w /w/wheels"):
        assert flag in build
    assert "--config-settings --build-option=--cpp_ext" in build
    assert "--config-settings --build-option=--cuda_ext" in build
    assert any("git clone --quiet http://m/git/apex.git /w/src" == c for c in result.commands)
    assert any("4bdecd06b3c4b2c0a8fb6603829a8f9f05a42b49" in c for c in result.commands)
    # the tar and its sum from the same command, each renamed into place when complete
    assert (
        "sha256sum /w/apex-wheel.tar.part | cut -c1-64 > /w/apex-wheel.tar.sha256.part"
        in (result.commands[-1])
    )
    assert result.commands[-1].endswith("mv /w/apex-wheel.tar.sha256.part /w/apex-wheel.tar.sha256")
    # issue 13: the build says where its log is and how long it took
    assert "apex build took" in build and "/w/build.log" in build and "start=$(date +%s)" in build
    assert any("log on this host at /w/build.log" in line for line in result.logs)


def test_build_wheel_cpu_torch_has_no_cuda_ext():
    assert "--cuda_ext" not in " ".join(_build_op(cuda_ext=False).commands)


def test_build_wheel_rebuilds_a_tar_this_run_has_no_sum_for():
    """S8: a tar already in ~verl/.cache (the training user's) is not taken as the build."""
    result = _build_op(tar={"size": 1})
    assert any(" wheel " in c for c in result.commands) and not result.noops
    assert result.commands[0].startswith("rm -rf /w/src /w/wheels /w/apex-wheel.tar ")
    assert any("not trusted" in line for line in result.logs)


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
    record = result.functions[-1].function
    os.makedirs(os.path.dirname(local), exist_ok=True)  # files.get may have made it
    # the copy was cut short: the builder's sum does not match, nothing is recorded
    _wheel_tar(local + ".part")
    full = apex_build.sha256_of(local + ".part")
    with open(local + ".part", "r+b") as handle:
        handle.truncate(1000)
    open(local + ".part.sha256", "w").write(full + "\n")
    assert record(None, LOG_HOST) is False
    assert not os.path.exists(local) and not os.path.exists(local + ".sha256")
    # a complete copy: renamed into place, its sum recorded next to it
    _wheel_tar(local + ".part")
    open(local + ".part.sha256", "w").write(full + "\n")
    assert record(None, LOG_HOST) is True
    assert apex_build.controller_wheel_ok(local) == (
        True,
        f"{local} matches its recorded sha256 {full}",
    )


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
    assert result.commands[-1] == f"printf '%s\\n' K > {ENV}/.p40fleet-apex-key"
    assert _install("K", {"apex": Dist("0.1")}, fresh_env=True).changed


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
    assert "upload /w/apex-wheel.tar" in result.commands
    assert result.functions[0].function(None, LOG_HOST) is False


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


def test_commands_run_as_training_user_through_su():
    result = run_op(
        conda.env,
        prefix=PREFIX,
        env_name="verl-p40",
        python_version="3.10.12",
        user="verl",
        facts={EnvPython: EnvPythonState("missing")},
    )
    assert result.commands == [
        f"su -s /bin/sh verl -c '{PREFIX}/bin/conda create -n verl-p40 python=3.10.12 -y'"
    ]


def test_a_ref_starting_with_a_dash_never_reaches_git():
    """S22: a ref that git would read as an option is refused before any git command."""
    ref = "--recurse-submodules"
    r = run_op(verl.checkout, path="/home/verl/verl", remote=REMOTE, ref=ref, commit=COMMIT,
               facts={GitCheckout: GitState(False)})  # fmt: skip
    assert r.commands == ["function _fail"]
    assert f"verl checkout: ref '{ref}' starts with '-'" in r.failures[0]
    r = run_op(apex.build_wheel, python=PY, remote="http://m/git/apex.git", ref=ref,
               commit="4" * 40, work_dir="/w", cuda_home="/usr/local/cuda-11.8",
               arch_list="6.1", max_jobs=1, cuda_ext=True, facts={File: None})  # fmt: skip
    assert r.commands == ["function _fail"]
    assert "stack.apex.ref" in r.failures[0]
