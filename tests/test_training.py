"""operations.training: staging decided from facts, the unpack script run for real, and the
launch script planned from the model config read when the operation executes;
operations.training_user: the training user."""

from __future__ import annotations

import getpass
import hashlib
import os
import subprocess
from dataclasses import replace

import pytest
from pyinfra.facts.files import Directory, File
from pyinfra.facts.server import Groups, Os, Users, Which

from p40fleet.facts.artifacts import ArtifactFile, ArtifactState
from p40fleet.facts.host import FreeSpace, FreeSpaceInfo
from p40fleet.facts.training import ModelConfig, StagedDir, StagedDirState
from p40fleet.launch import LaunchError, plan_launch
from p40fleet.operations import training, training_user
from p40fleet.spec import load_spec
from p40fleet.training import MARKER, TrainingTarget
from p40fleet.verification.check import FAIL, SKIP
from p40lab import training_data
from tests.opharness import at, run_op
from tests.probe_answers import (
    LAUNCH,
    MODEL,
    TARGET,
    TRAIN,
    VAL,
    checks_for,
    compose_json,
    model_json,
    only_failures,
    sections,
    trainer_json,
)

#: The tests' own user: the facts' privilege drop runs without runuser then.
ME = getpass.getuser()

ARCHIVES = training_data.archives()
MODEL_SUM = hashlib.sha256(ARCHIVES[training_data.MODEL_ARCHIVE]).hexdigest()
DATA_SUM = hashlib.sha256(ARCHIVES[training_data.DATA_ARCHIVE]).hexdigest()
MIRROR = "http://10.231.0.1:8111/artifacts"
STACK = {
    "mirror": {"artifacts_url": MIRROR},
    "training": {
        "model": {"name": "tiny-qwen2", "archive": {
            "filename": training_data.MODEL_ARCHIVE, "sha256": MODEL_SUM}},
        "data": {"name": "gsm8k-lab", "archive": {
            "filename": training_data.DATA_ARCHIVE, "sha256": DATA_SUM}},
    },
}  # fmt: skip
SPEC = load_spec("lab1", STACK)
MODEL_DIR, DATA_DIR = "/home/verl/models/tiny-qwen2", "/home/verl/data/gsm8k-lab"
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
DATA_FILES = ("test.parquet", "train.parquet")
CACHE = "/var/cache/p40fleet"
USER_FACTS = {Os: "Linux", Which: "/usr/sbin/useradd", Groups: [], File: None}


def sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def staged(which: str, marker: str | None = None, files=None) -> StagedDirState:
    files = files if files is not None else (MODEL_FILES if which == "model" else DATA_FILES)
    return StagedDirState(exists=True, marker=marker, files=tuple(files))


def stage(which: str, state: StagedDirState, spec=SPEC, cached: bool = False):
    path = f"{CACHE}/{getattr(spec.training, which).archive.filename}" if cached else None
    sha = MODEL_SUM if which == "model" else DATA_SUM
    artifact = ArtifactFile(1, 2, 1, 2, sha) if cached else ArtifactFile()
    return run_op(
        training.stage,
        which=which,
        spec=spec,
        facts={
            StagedDir: state,
            (at(ArtifactState, path=path) if path else ArtifactState): artifact,
            FreeSpace: FreeSpaceInfo(CACHE, "/var", "/", 10**12, 10**11),
        },
    )


def test_staged_copy_with_the_pinned_sum_changes_nothing():
    for which, sha in (("model", MODEL_SUM), ("data", DATA_SUM)):
        r = stage(which, staged(which, sha))
        assert not r.changed, r.commands
        assert "is staged from" in r.noops[0]


def test_not_staged_downloads_from_the_mirror_then_unpacks():
    r = stage("model", StagedDirState())
    (download,) = [
        f.args[0].get_raw_value() for f in r.functions if f.function.__name__ == "_stream"
    ]
    assert f"{MIRROR}/{training_data.MODEL_ARCHIVE}" in download, r.commands
    assert MODEL_SUM in download  # the sum is checked before the rename
    # N2: the user's tar reads root's checked copy on stdin; nothing of it runs as root
    unpack = r.commands[-1]
    assert unpack.startswith("su -s /bin/sh verl -c ") and "tar -xf - -z" in unpack
    assert unpack.endswith(f"< {CACHE}/{training_data.MODEL_ARCHIVE}")
    assert not any(line.startswith(("chown", "install")) for line in unpack.splitlines())


def test_a_lost_file_is_unpacked_again_from_the_verified_cache():
    r = stage("data", staged("data", DATA_SUM, files=["test.parquet"]), cached=True)
    assert r.changed and not any("curl" in c for c in r.commands), r.commands
    assert "lost train.parquet" in r.text


def test_a_directory_the_admin_made_is_refused_not_overwritten():
    r = stage("model", staged("model", None))
    assert r.failures and not any("tar" in c for c in r.commands)
    assert MODEL_DIR in r.failures[0] and "move" in r.failures[0]


def test_a_new_archive_sum_replaces_the_staged_copy():
    r = stage("model", staged("model", "b" * 64))
    assert any("tar -xf" in c for c in r.commands)


def test_no_archive_only_checks_presence():
    spec = load_spec("lab1", {})
    r = stage("data", StagedDirState(), spec=spec)
    assert not r.changed and "has no archive" in r.text
    r = stage("data", staged("data", None), spec=spec)
    assert not r.changed and "no archive to stage" in r.noops[0]


@pytest.mark.parametrize("which", ["model", "data"])
def test_unpack_script_for_real_then_the_fact_says_staged(tmp_path, which):
    """The unpack script against a real archive (paths moved into tmp, owner root)."""
    archive = getattr(SPEC.training, which).archive
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / archive.filename).write_bytes(ARCHIVES[archive.filename])
    script = training._unpack_script(which, SPEC, MODEL_DIR if which == "model" else DATA_DIR)
    home = tmp_path / "home"
    script = script.replace("/home/verl", str(home))
    (home / "models").mkdir(parents=True)
    dest = home / ("models/tiny-qwen2" if which == "model" else "data/gsm8k-lab")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.mkdir()  # an earlier copy (from an older archive): replaced whole
    (dest / MARKER).write_text("b" * 64 + "\n")
    (dest / "stale.txt").write_text("old")
    with open(cache / archive.filename, "rb") as stdin:  # the archive on stdin, as root gives it
        proc = subprocess.run(["sh", "-c", script], stdin=stdin, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    state = StagedDir().process(
        sh(StagedDir().command(user=ME, path=str(dest))).stdout.splitlines()
    )
    sha = MODEL_SUM if which == "model" else DATA_SUM
    assert state.marker == sha and "stale.txt" not in state.files
    assert not training.missing(SPEC, which, state), state
    assert sorted(p.name for p in dest.parent.iterdir() if p.name.startswith(".")) == []
    if which == "model":
        config = ModelConfig().process(
            sh(ModelConfig().command(user=ME, path=str(dest))).stdout.splitlines()
        )
        assert config["model_type"] == "qwen2" and config["vocab_size"] == 512


def test_unpack_script_refuses_an_archive_without_the_data_files(tmp_path):
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:  # as the spec's .tar.gz says
        info = tarfile.TarInfo("gsm8k-lab/other.parquet")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"PAR1"))
    (tmp_path / "d.tar").write_bytes(raw.getvalue())
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    script = training._unpack_script("data", SPEC, DATA_DIR)
    script = script.replace("/home/verl", str(home))
    with open(tmp_path / "d.tar", "rb") as stdin:
        proc = subprocess.run(["sh", "-c", script], stdin=stdin, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "does not hold the data files" in proc.stderr and "train.parquet" in proc.stderr
    assert not (home / "data" / "gsm8k-lab").exists()
    assert list((home / "data").iterdir()) == []  # the staging dir is gone too


# --- the launch script ---------------------------------------------------------------------

# the lab's tiny-qwen2 (p40lab/training_data.py): what the plan sizes the model from
CONFIG = {
    "model_type": "qwen2",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}


def launch(config, model_queued: bool, make_plan=None):
    seen = []

    def plan(model_config):
        seen.append(model_config)
        if make_plan is not None:
            return make_plan(model_config)
        return plan_launch(SPEC, [0x1B38] * 4, model_config=model_config)

    r = run_op(
        training.launch_script,
        spec=SPEC,
        make_plan=plan,
        user_queued=True,
        model_queued=model_queued,
        facts={at(ModelConfig, path=MODEL_DIR, user="verl"): config},
        default_facts=True,  # the script file is not there yet
    )
    return r, seen


def test_launch_script_is_planned_from_the_staged_config():
    r, seen = launch(CONFIG, model_queued=False)
    assert seen == [CONFIG]
    [script] = [v.decode() for d, v in r.uploads.items() if d.endswith("-launch-ppo.sh")]
    assert f"MODEL_PATH={MODEL_DIR}" in script
    assert "TRAIN_FILE=/home/verl/data/gsm8k-lab/train.parquet" in script


def test_before_staging_ran_the_script_waits_for_the_config():
    """pyinfra's first pass: the model is staged later in this run; the body runs again then."""
    r, seen = launch(None, model_queued=True)
    assert seen == [] and len(r.commands) == 1
    assert r.commands[0].startswith(f"test -s {MODEL_DIR}/config.json ||")
    # on a host where config.json stays missing, the command stops it with the reason
    proc = sh(r.commands[0].replace(MODEL_DIR, "/nonexistent"))
    assert proc.returncode == 1 and "after staging the model" in proc.stderr


def test_a_host_without_a_plan_is_refused():
    def no_plan(config):
        raise LaunchError("memory size of device 0x1234 unknown")

    r, _ = launch(CONFIG, model_queued=False, make_plan=no_plan)
    assert r.failures and "0x1234" in r.failures[0]


def test_the_hosts_plan_is_made_from_its_own_facts():
    """``host_plan`` / ``training_target`` with pyinfra's ``host`` (a context proxy)."""
    from p40fleet.facts.gpu import PciGpus
    from tests.probe_answers import p40

    targets = []

    def op():
        targets.append(training.training_target(SPEC))
        yield from ()

    run_op(
        op,
        facts={PciGpus: [p40("0000:00:06.0"), p40("0000:00:07.0")], ModelConfig: CONFIG},
        default_facts=True,  # nvidia-smi: no answer, the catalog's size
    )
    (target,) = targets
    assert target.problem is None and target.model_path == MODEL_DIR
    assert "trainer.n_gpus_per_node=2" in target.overrides
    assert target.train_file == f"{DATA_DIR}/train.parquet"


# -- training user (operations/training_user.py) --------------------------------------------------


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
    assert result.commands[0].startswith("if [ -e /home/verl ] && o=$(stat -c %u")  # S3 guard
    assert result.commands[1] == "groupadd verl --gid 2001"
    useradd = result.commands[2]
    assert useradd.startswith("useradd ") and useradd.endswith(" verl")
    assert "--uid 2001" in useradd and "-s /bin/bash" in useradd and "-m" in useradd.split()


def test_user_after_reinstall_reuses_existing_home():
    result = _user({Users: {}, Directory: {"user": 2001, "group": 2001, "mode": 755}})
    useradd = next(c for c in result.commands if c.startswith("useradd"))
    assert "-M" in useradd.split() and "-m" not in useradd.split()
    assert not any("rm " in c for c in result.commands)


def test_an_existing_home_of_another_user_is_refused_naming_its_owner():
    """S3: /home/alice (alice's) as stack.user.home is never taken over."""
    result = run_op(
        training_user.training_user, user="verl", uid=2001, home="/home/alice",
        facts={**USER_FACTS, Users: {},
               Directory: {"user": "alice", "group": "alice", "mode": 700}},
    )  # fmt: skip
    assert result.commands == ["function _fail"], result.commands
    assert "/home/alice" in result.failures[0] and "belongs to alice" in result.failures[0]
    assert "stack.user.home" in result.failures[0]
    # a home of root (an admin's mkdir) likewise; a home already verl's or uid 2001's is kept
    for owner, refused in (("root", True), ("verl", False), (2001, False)):
        facts = {Users: {}, Directory: {"user": owner, "group": owner, "mode": 750}}
        assert bool(_user(facts).failures) is refused, owner


def test_a_kept_home_after_a_reinstall_is_reused_and_left_to_the_uid_guard():
    """After an OS reinstall /home/verl is uid 2001's with no passwd entry: GNU stat's %U says
    UNKNOWN. Not a refusal: the guard before useradd compares the numeric uid."""
    facts = {Users: {}, Directory: {"user": "UNKNOWN", "group": "UNKNOWN", "mode": 750}}
    result = _user(facts)
    assert not result.failures, result.failures
    assert result.commands[0].startswith("if [ -e /home/verl ] && o=$(stat -c %u")
    assert any("useradd" in c for c in result.commands)


def test_the_home_owner_is_checked_again_when_the_user_is_created(tmp_path):
    """S3 at run time: the guard command refuses a home another uid owns, naming it."""
    guard = _user({Users: {}, Directory: None}).commands[0]
    home = tmp_path / "alice"
    home.mkdir()
    proc = sh(guard.replace("/home/verl", str(home)).replace("2001", str(os.getuid() + 1)))
    assert proc.returncode == 1 and "belongs to uid" in proc.stderr, proc.stderr
    assert f"{os.getuid()} (" in proc.stderr
    assert (
        sh(guard.replace("/home/verl", str(home)).replace("2001", str(os.getuid()))).returncode == 0
    )


def test_user_with_other_uid_is_refused():
    users = {"verl": {"uid": 1500, "home": "/home/verl", "shell": "/bin/bash", "group": "verl"}}
    result = _user({Users: users, Directory: None})
    assert result.commands == ["function _fail"] and "uid 1500" in result.failures[0]


# --- verify's training checks (p40fleet/verification/checks/training.py) ----------------------


def test_training_path_pass_names_what_it_saw():
    checks = checks_for(sections())
    assert "verl.trainer.main_ppo" in checks["trainer modules"].detail
    assert "2 overrides" in checks["launch overrides"].detail
    assert MODEL in checks["model files"].detail and "qwen2" in checks["model files"].detail
    assert TRAIN in checks["data files"].detail and VAL in checks["data files"].detail


def test_missing_trainer_module_is_named_with_the_fix():
    err = {"ok": False, "missing": "torchdata",
           "error": "ModuleNotFoundError: No module named 'torchdata'"}  # fmt: skip
    checks = checks_for(sections(trainer=trainer_json(**{"verl.trainer.main_ppo": err})))
    assert only_failures(checks) == {"trainer modules"}
    bad = checks["trainer modules"]
    assert "verl.trainer.main_ppo" in bad.detail and "torchdata" in bad.detail
    assert "verl.workers.fsdp_workers" not in bad.detail  # only the failing one
    assert "torchdata" in bad.remedy and "files/verl-requirements-" in bad.remedy


def test_trainer_import_that_kills_the_interpreter_fails():
    checks = checks_for(sections(trainer=["! Segmentation fault", "@@rc 139"]))
    assert checks["trainer modules"].status == FAIL
    assert "exit 139" in checks["trainer modules"].detail


def test_override_verl_refuses_is_named():
    bad = {"+actor_rollout_ref.ref.fsdp_config.model_dtype=fp32": "ConfigCompositionException: "
           "Could not append to config. An item is already at 'model_dtype'"}  # fmt: skip
    compose = compose_json(ok=False, error="ConfigCompositionException: ...", base_error=None,
                           bad=bad)  # fmt: skip
    checks = checks_for(sections(compose=compose))
    assert only_failures(checks) == {"launch overrides"}
    check = checks["launch overrides"]
    assert "+actor_rollout_ref.ref.fsdp_config.model_dtype=fp32" in check.detail
    assert "p40fleet/launch.py" in check.remedy


def test_a_launch_script_that_runs_other_inputs_than_the_plan_fails():
    """The checks of the model and data look at the plan's paths: a script that reads other
    ones (edited by hand, or left from an older plan) is not what verify looked at."""
    other = "/home/verl/models/other"
    checks = checks_for(sections(compose=compose_json(model_path=other)))
    assert only_failures(checks) == {"launch overrides"}
    check = checks["launch overrides"]
    assert f"MODEL_PATH {other!r}" in check.detail and repr(MODEL) in check.detail
    assert "deploy/training.py" in check.remedy and LAUNCH in check.remedy
    target = replace(TARGET, python="/opt/env/bin/python")  # the plan's interpreter differs
    check = checks_for(sections(), training=target)["launch overrides"]
    assert (
        check.status == FAIL and "PYTHON" in check.detail and "/opt/env/bin/python" in check.detail
    )
    moved = checks_for(sections(compose=compose_json(entry_point="verl.other")))
    assert "python -m 'verl.other'" in moved["launch overrides"].detail


def test_a_missing_or_foreign_launch_script_fails_with_the_training_fix():
    gone = checks_for(sections(compose=compose_json(absent=True, ok=None)))["launch overrides"]
    assert gone.status == FAIL and gone.detail == f"no launch script {LAUNCH}"
    assert "deploy/training.py" in gone.remedy
    odd = compose_json(unreadable="0 `exec \"$PYTHON\" -m` lines, not 1: not the script "
                       "p40fleet writes", ok=None)  # fmt: skip
    check = checks_for(sections(compose=odd))["launch overrides"]
    assert check.status == FAIL and "not the script p40fleet writes" in check.detail
    assert "deploy/training.py" in check.remedy


def test_no_launch_plan_fails_with_the_reason():
    target = TrainingTarget(MODEL, TRAIN, VAL, problem="memory size of device 0x1234 unknown")
    checks = checks_for(sections(), training=target)
    assert checks["launch overrides"].status == FAIL
    assert "memory size of device 0x1234 unknown" in checks["launch overrides"].detail


def test_model_dir_missing_or_incomplete_names_the_path():
    gone = checks_for(sections(model=model_json(exists=False)))["model files"]
    assert gone.status == FAIL and MODEL in gone.detail
    assert "save the Hugging Face model into " + MODEL in gone.remedy  # no archive in the spec
    lacking = checks_for(sections(model=model_json(files=["config.json", "tokenizer.json"])))
    assert lacking["model files"].status == FAIL and "weights" in lacking["model files"].detail
    tok = checks_for(sections(model=model_json(tokenizer_error="OSError: bad tokenizer.json")))
    assert tok["model files"].status == FAIL and "bad tokenizer.json" in tok["model files"].detail


def test_model_remedy_names_the_archive_when_the_spec_has_one():
    archive = {"filename": "m.tar", "sha256": "a" * 64, "url": "https://example.org/m.tar"}
    spec = load_spec("lab1", {"training": {"model": {"archive": archive}}})
    check = checks_for(sections(model=model_json(exists=False)), spec=spec)["model files"]
    assert "deploy/training.py" in check.remedy and "m.tar" in check.remedy


def test_data_file_missing_empty_or_not_parquet_is_named():
    data = [f"found 3977 PAR1_ {TRAIN}", f"missing={VAL}", "@@rc 0"]
    check = checks_for(sections(**{"training-data": data}))["data files"]
    assert check.status == FAIL and VAL in check.detail and TRAIN not in check.detail
    assert "gsm8k.py --local_dir /home/verl/data/gsm8k" in check.remedy
    data = [f"found 0 _ {TRAIN}", f"found 12 abcd_ {VAL}", "@@rc 0"]
    check = checks_for(sections(**{"training-data": data}))["data files"]
    assert f"{TRAIN} is empty" in check.detail and f"{VAL} is not a parquet" in check.detail


def test_without_a_plan_the_training_checks_skip():
    checks = checks_for(sections(), training=None)
    for name in ("launch overrides", "model files", "data files"):
        assert checks[name].status == SKIP
