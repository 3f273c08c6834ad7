"""End to end on the simulated lab: converge, re-run, dry run, pin bump, reinstall, faults.

One fresh lab for the module (lab1 4xP40, lab2 8xP40, lab3 1xP100, lab4 2xH200), provisioned
with ``deploy/full.py`` once; the tests then run in order, each leaving the fleet converged.
Every run of this module connects as the lab's non-root ``admin`` and reaches root through
sudo (a NOPASSWD rule), as ``inventories/lab.py`` does on a real lab.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from p40fleet import condalock
from p40fleet.apex_build import BUILD_ACCOUNT, BUILD_HOME
from p40fleet.operations.mirror import source_line
from p40lab import httpd, mirror, runs

pytestmark = pytest.mark.lab

PROVISIONED = ("lab1", "lab2", "lab3")
REPO = Path(__file__).resolve().parents[2]
LAB_CONDA_LOCK = Path(__file__).resolve().parents[2] / "files" / "conda-env-lab.txt"
ENV_PYTHON = "/home/verl/miniconda3/envs/verl-p40/bin/python"
CUDNN_TAR = "cudnn-linux-x86_64-8.9.7.29_cuda11-archive.tar.xz"
TRAINING_CHECKS = ("trainer modules", "launch overrides", "model files", "data files")
SYSTEM_ARTIFACTS = ("NVIDIA-Linux-x86_64-525.147.05.run", "cuda_11.8.0_520.61.05_linux.run",
                    CUDNN_TAR)  # fmt: skip
TRAINING_ARCHIVES = "/artifacts/p40lab-"  # p40lab.training_data's archives on the mirror
LAUNCH_SCRIPT = "deploy/training.py | PPO launch script ~verl/launch-ppo.sh"


CONTROLLER_CACHE: dict[str, str] = {}  # P40FLEET_CACHE for this module's runs (Apex wheels)
AS_ADMIN = {"P40LAB_SSH_USER": "admin"}  # inventories/sim.py: ssh_user admin, _sudo


def full(*args: str, stack_host: dict | None = None, report: Path | None = None,
         deploy: str = "deploy/full.py") -> runs.RunResult:  # fmt: skip
    env = dict(CONTROLLER_CACHE, **AS_ADMIN)
    if stack_host:
        env["P40LAB_STACK_HOST"] = json.dumps(stack_host)
    if report is not None:
        env["P40FLEET_REPORT"] = str(report)
    return runs.run(deploy, *args, env=env)


def checks_of(report: Path, host: str) -> dict[str, dict]:
    """The verify report's checks of ``host``: name -> {status, detail, remedy}."""
    entry = json.loads(report.read_text())["hosts"][host]
    return {c["name"]: c for c in entry["checks"]}


def training_bytes(since: float) -> int:
    """Bytes of the training model/data archives the mirror sent since ``since``."""
    return httpd.bytes_served(since=since, path_prefix=TRAINING_ARCHIVES)


def assert_converged(result: runs.RunResult, hosts=PROVISIONED) -> None:
    for name in hosts:
        assert name in result.connected, result.output[-3000:]
        assert not result.errors[name], result.host_output(name)
        assert f"[{name}] verify: PASS" in result.output, result.host_output(name)


def upper(lab, name: str) -> Path:
    return lab.root(name).parent / "upper"


def snapshot(lab, name: str) -> dict[str, tuple[int, int]]:
    """Every file the host wrote (its overlay upper layer): path -> (size, mtime_ns)."""
    root = upper(lab, name)
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            rel = str(p.relative_to(root))
            if rel.startswith(("var/log/", "root/.cache/")):
                continue  # sshd's login records, pip's cache of a dry run: not the deploy's
            st = p.lstat()
            out[rel] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    """A fresh lab (new disks) and an empty controller cache, provisioned once."""
    CONTROLLER_CACHE["P40FLEET_CACHE"] = str(tmp_path_factory.mktemp("controller-cache"))
    lab.down()
    lab.up()
    for name in lab.hosts:  # the admin is not root; sudo makes it root without a password
        ids = lab.ssh(name, "id -u; sudo -n id -u", user="admin", check=True).stdout.split()
        assert ids == ["1500", "0"], (name, ids)
    reports = tmp_path_factory.mktemp("reports")
    since = time.time()
    first = full(report=reports / "first.json")
    first_training_bytes = training_bytes(since)
    if not first.errors["lab1"] and not first.errors["lab3"]:  # seeds for the faults and Ray
        seconds = lab.save_seed("lab1", "p40x4") + lab.save_seed("lab3", "p100x1")
        print(f"\nseeds: lab1 (4xP40) and lab3 (1xP100) kept in {seconds:.1f} s")
    yield {"lab": lab, "first": first, "reports": reports, "since": since,
           "first_training_bytes": first_training_bytes}  # fmt: skip
    lab.release()


def test_fresh_fleet_converges_and_verifies(fleet):
    lab, first = fleet["lab"], fleet["first"]
    assert_converged(first)
    for name in PROVISIONED:
        version = lab.ssh(name, f"{ENV_PYTHON} -c 'import verl; print(verl.__version__)'")
        assert version.stdout.strip() == "0.5.0", version.stderr
        assert lab.ssh(name, "modinfo -F version nvidia").stdout.strip() == "525.147.05"
        assert lab.ssh(name, "test -e /sys/module/nouveau").returncode == 1  # gone after reboot
        nvcc = lab.ssh(name, "/usr/local/cuda/bin/nvcc --version").stdout
        assert "release 11.8, V11.8.89" in nvcc


#: What a host downloads to use (not an index it may read again): the mirror sends each once.
PAYLOAD = (".run", ".sh", ".tar.xz", ".tgz", ".whl", ".deb", ".conda", ".tar.bz2", ".tar.gz",
           ".zip", ".pack")  # fmt: skip


def test_each_host_fetches_each_file_from_the_mirror_once(fleet):
    """Issue 27, bytes once per fleet: in the first run every file a host downloaded (artifacts,
    wheels, .debs, conda packages, git packs, training archives) left the mirror once for that
    host, in full or less (a resumed fetch), never twice; the four artifacts reached each host
    whole. The mirror is p40fleet.mirror's build from the lab's upstream: each of those files
    came from upstream, which no host asked and which the runs did not touch. The numbers per
    host are printed (``pytest -s``)."""
    from p40lab import state as st

    lab, stack = fleet["lab"], fleet["lab"].state["stack"]
    manifest = {e["path"]: e for e in json.loads((st.MIRROR_DIR / "manifest.json").read_text())
                ["files"]}  # fmt: skip
    for name in PROVISIONED:
        got = fetched_by(lab, name, fleet["since"])
        payload = {p: n for p, n in got.items() if p.split("?")[0].endswith(PAYLOAD)}
        twice = {}
        for path, sent in payload.items():
            local = st.MIRROR_DIR / path.split("?")[0].lstrip("/")
            if local.is_file() and sent > local.stat().st_size:
                twice[path] = (sent, local.stat().st_size)
        assert not twice, (name, twice)  # path: (bytes sent, file size)
        for key in ("driver", "cuda", "cudnn", "miniconda"):
            path = f"/artifacts/{stack[key]['filename']}"
            assert got.get(path) == (st.MIRROR_DIR / path.lstrip("/")).stat().st_size, (name, path)
        print(f"\nmirror -> {name}: {len(payload)} files, {sum(payload.values())} bytes once each; "
              f"{len(got) - len(payload)} index/metadata paths")  # fmt: skip
        # each of them is a file p40fleet.mirror fetched from upstream into the mirror
        for path in payload:
            entry = manifest.get(path.split("?")[0].lstrip("/"))
            if entry is not None:  # git's dumb-HTTP objects are not listed one by one
                assert entry["url"].startswith(mirror.UPSTREAM_URL + "/"), (path, entry)
        assert any(path.lstrip("/") in manifest for path in payload), (name, sorted(payload)[:5])
    # upstream: never asked by a host; during the runs not at all; before them (the build of
    # the mirror since this lab came up), each file left it once at most
    entries = httpd.access_entries()  # the instance's log: earlier sessions' lines too
    upstream = [e for e in entries if e["path"].startswith(f"/{mirror.UPSTREAM}/")
                and e["time"] >= lab.state["up_since"]]  # fmt: skip
    ips = {lab.host(name)["ip"] for name in lab.hosts}
    assert not [e for e in upstream if e["client"] in ips], [e for e in upstream][:5]
    assert not [e for e in upstream if e["time"] >= fleet["since"]]
    built = Counter(e["path"] for e in upstream if e["method"] == "GET" and e["status"] == 200
                    and e["time"] < fleet["since"])  # fmt: skip
    assert not {path: n for path, n in built.items() if n > 1 and not path.endswith("/")}, built
    print(f"upstream -> mirror since the lab came up: {len(built)} paths")


def test_fresh_fleet_passes_the_training_path_for_real(fleet):
    """verl's trainer modules import, the host's own launch overrides compose with its verl,
    and the lab's model and data, staged from the mirror, are where the script says."""
    lab = fleet["lab"]
    stack = lab.state["stack"]["training"]
    for name in PROVISIONED:
        checks = checks_of(fleet["reports"] / "first.json", name)
        for check in TRAINING_CHECKS:
            assert checks[check]["status"] == "PASS", (name, checks[check])
        script = lab.ssh(name, "cat /home/verl/launch-ppo.sh", check=True).stdout
        model = f"/home/verl/models/{stack['model']['name']}"
        assert f"MODEL_PATH={model}" in script
        assert f"TRAIN_FILE=/home/verl/data/{stack['data']['name']}/train.parquet" in script
        owner = lab.ssh(name, f"stat -c %U {model}/config.json", check=True).stdout.strip()
        assert owner == "verl"
    # each host fetched both archives once
    sizes = stack["model"]["archive"]["size"] + stack["data"]["archive"]["size"]
    assert fleet["first_training_bytes"] == len(PROVISIONED) * sizes
    # the model the lab serves loads with transformers in the lab env, and generates
    load = (
        f"{ENV_PYTHON} -c 'import sys, torch; from transformers import AutoTokenizer, "
        "AutoModelForCausalLM as M; p = sys.argv[1]; t = AutoTokenizer.from_pretrained(p); "
        'm = M.from_pretrained(p); ids = t.apply_chat_template([{"role": "user", '
        '"content": "1+1?"}], add_generation_prompt=True, return_tensors="pt"); '
        "print(m.generate(ids, max_new_tokens=4).shape[1] > ids.shape[1])' " + model
    )
    out = lab.ssh("lab1", load, timeout=300)
    assert out.stdout.strip().endswith("True"), out.stdout + out.stderr


def test_smoke_step_trains_on_every_converged_host_and_fails_a_broken_launch_script(
    fleet, tmp_path
):
    """``verify --smoke`` runs one PPO step (CPU on the lab) on each host, once: lab1 and lab3
    PASS through their own ~/launch-ppo.sh; lab2's script, broken on purpose with an override
    that composes but that verl rejects at run time, FAILs with the trainer's error and a fix.
    Nothing of the user's is touched: no ~/outputs, no datasets cache, no scratch dir or Ray
    left, ~/verl as it was."""
    lab = fleet["lab"]
    script = lab.root("lab2") / "home/verl/launch-ppo.sh"
    text = script.read_text()
    broken = "actor_rollout_ref.rollout.name=no_such_rollout"
    script.write_text(text.replace('    "$@"\n', f'    {broken} \\\n    "$@"\n'))
    # the user's outputs and caches, and the patch record of ~/verl, as they were before
    users = ("sha256sum /home/verl/verl/.p40fleet-patches.json; ls -d /home/verl/outputs "
             "/home/verl/.cache/huggingface /home/verl/checkpoints 2>/dev/null; true")  # fmt: skip
    before = {n: lab.ssh(n, users, check=True).stdout for n in PROVISIONED}
    report = tmp_path / "smoke.json"
    # three CPU steps at once on the 2-core machine, cold: more than the default bound
    argv = [sys.executable, "-m", "p40fleet.verify", "inventories/sim.py", "--smoke", "-q",
            "--smoke-timeout", "900", "--json", str(report)]  # fmt: skip
    t0 = time.monotonic()
    try:
        out = subprocess.run(
            argv, cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=1800,
            env={**os.environ, **AS_ADMIN}, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        script.write_text(text)
    print(f"verify --smoke on {len(PROVISIONED)} hosts: {time.monotonic() - t0:.0f} s")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    for name in ("lab1", "lab3"):
        check = checks_of(report, name)["smoke step"]
        print(f"{name}: {check['detail']}")
        assert check["status"] == "PASS", (name, check)
        assert check["detail"].startswith("CPU (simulated host): 1 PPO step in ")
        assert "lengths 64+16" in check["detail"]
    lab2 = checks_of(report, "lab2")
    assert lab2["launch overrides"]["status"] == "PASS"  # it composes: only a step finds it
    assert lab2["smoke step"]["status"] == "FAIL", lab2["smoke step"]
    assert "no_such_rollout" in lab2["smoke step"]["detail"], lab2["smoke step"]
    assert "launch-ppo.sh" in lab2["smoke step"]["remedy"]
    for name in PROVISIONED:
        left = lab.ssh(
            name,
            "ls -d /tmp/p40fleet-smoke.* 2>/dev/null; pgrep -u verl -f ray:: ; "
            "pgrep -u verl -f gcs_server; true",
        ).stdout.split()
        assert left == [], (name, left)  # no scratch dir, no Ray left
        assert lab.ssh(name, users, check=True).stdout == before[name], name


def test_unsupported_gpu_refused_before_any_change(fleet):
    lab, first = fleet["lab"], fleet["first"]
    assert first.errors["lab4"] == 1 and not first.changed["lab4"]
    assert "driver R525 does not support H200" in first.output
    written = snapshot(lab, "lab4")
    touched = ("var/cache/p40fleet", "usr/local/cuda", "home/verl")
    assert not any(p.startswith(touched) for p in written)
    assert "etc/modprobe.d/blacklist-nouveau.conf" not in written


def test_apex_built_once_per_build_key(fleet):
    lab = fleet["lab"]
    lines = {name: runs.apex_builds(lab.root(name)) for name in PROVISIONED}
    builds = {name: len(found) for name, found in lines.items()}
    # lab1 and lab2 share a key (sm 6.1): lab1 builds, lab2 installs lab1's wheel; lab3's P100
    # (sm 6.0) is another key and builds its own.
    assert builds == {"lab1": 1, "lab2": 0, "lab3": 1}
    # S8: compiled as the build account, which is gone afterwards with its home; nothing of
    # the build is in the training user's home; root's copy of the tar was fetched and removed
    for name in ("lab1", "lab3"):
        assert all(line.endswith(f"user={BUILD_ACCOUNT} pid=" + line.rsplit("pid=", 1)[1])
                   for line in lines[name]), lines[name]  # fmt: skip
        gone = lab.ssh(name, f"id -u {BUILD_ACCOUNT}; getent group {BUILD_ACCOUNT}; "
                       f"ls -d {BUILD_HOME} /var/lib/p40fleet/stage/apex-*.tar; true")  # fmt: skip
        assert gone.stdout == "", (name, gone.stdout)
        assert not (lab.root(name) / "home/verl/.p40lab-apex-builds.log").exists(), name


def test_second_run_changes_nothing_and_downloads_nothing(fleet):
    second = full()
    assert_converged(second)
    for name in PROVISIONED:
        assert second.changed_operations(name) == [], name
    assert second.bytes_served == 0  # the model and data archives included


NAMED_ONE_BY_ONE = ("deploy/preflight.py", "deploy/system.py", "deploy/python.py",
                    "deploy/training.py")  # fmt: skip
_COMMAND = re.compile(r"Running command on (?P<host>\S+):")  # pyinfra --debug, per command


def test_no_op_runs_send_at_most_three_commands_per_host(fleet):
    """facts.survey: one fact command per host, plus the run lock's take and release (the
    release rides on the verify probe in deploy/full.py): as deploy/full.py and as the four
    deploys named in one call."""
    seen, cpu = {}, {}
    for deploys in (("deploy/full.py",), NAMED_ONE_BY_ONE):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = full(*deploys[1:], "--debug", deploy=deploys[0])
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        cpu[" ".join(deploys)] = round(spent / len(result.connected), 3)  # --debug included
        counts = Counter(m["host"] for m in _COMMAND.finditer(result.output))
        seen[" ".join(deploys)] = dict(sorted(counts.items()))
        for name in PROVISIONED:
            assert name in result.connected and not result.errors[name], result.output[-5000:]
            assert result.changed_operations(name) == [], name
    print(f"remote commands per host on a no-op run: {seen}; controller CPU s/host: {cpu}")
    for deploys, counts in seen.items():
        for name in PROVISIONED:
            assert 1 <= counts.get(name, 0) <= 3, (deploys, counts)


def test_another_repo_runs_the_installed_packaged_full_deploy_as_a_no_op(fleet, tmp_path):
    """#28: an admin's own repo (its inventory, a deploy file calling
    ``p40fleet.deploys.full()``) with p40fleet installed from its wheel, not this checkout:
    the converged fleet stays converged, each operation under the deploy's name, and a no-op
    run still sends at most three commands per host."""
    import runpy

    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", ".pytest_cache", "*.egg-info", "build"))  # fmt: skip
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(src)], check=True, timeout=300)  # fmt: skip
    (whl,) = wheels.glob("p40fleet-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(whl)],
                   check=True, timeout=300)  # fmt: skip
    repo = tmp_path / "their-repo"
    repo.mkdir()
    old = os.environ.get("P40LAB_SSH_USER")
    os.environ.update(AS_ADMIN)
    try:  # their inventory: the lab's hosts and data, written out as plain data
        groups = runpy.run_path(str(REPO / "inventories" / "sim.py"))
    finally:
        os.environ.pop("P40LAB_SSH_USER") if old is None else os.environ.update(
            P40LAB_SSH_USER=old)  # fmt: skip
    # the same groups: the Ray head's group decides the cluster plan of the launch scripts
    (repo / "hosts.json").write_text(json.dumps({"sim": groups["sim"],
                                                 "ray_head": groups["ray_head"]}))  # fmt: skip
    (repo / "inventory.py").write_text(
        "import json\n_groups = json.load(open('hosts.json'))\n"
        "sim = [tuple(h) for h in _groups['sim']]\nray_head = _groups['ray_head']\n"
    )
    (repo / "deploy.py").write_text(
        "import sys\nimport p40fleet.deploys\nfrom p40fleet.deploys import full\n"
        "print('FROM', p40fleet.deploys.__file__, file=sys.stderr)\nfull()\n"
    )
    env = {**os.environ, **CONTROLLER_CACHE, "PYTHONPATH": str(site)}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "inventory.py", "deploy.py", "--debug"],
        cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=1800,
    )  # fmt: skip
    seconds = time.monotonic() - t0
    out = proc.stdout
    (where,) = [line.split()[1] for line in out.splitlines() if line.startswith("FROM ")][:1]
    assert where.startswith(str(site)), where
    connected, _changed, _unchanged, errors = runs.parse(out)
    operations = runs.parse_operations(out)
    counts = Counter(m["host"] for m in _COMMAND.finditer(out))
    print(
        f"another repo's full(): {seconds:.1f} s, {len(operations)} operations, "
        f"commands per host {dict(sorted(counts.items()))}"
    )
    for name in PROVISIONED:
        assert name in connected and not errors[name], out[-5000:]
        assert [op for op, by in operations.items() if by.get(name) == "Success"] == [], name
        assert f"[{name}] verify: PASS" in out, out[-5000:]
        assert 1 <= counts.get(name, 0) <= 3, counts
    assert operations and all(op.startswith("p40fleet full | ") for op in operations), operations


def test_air_gapped_hosts_use_the_mirror_only_and_restore_its_apt_source(fleet):
    """The image names only the unreachable archive and its conda has no channel it can reach:
    the fleet converged because the deploy pointed apt and conda at the mirror, and only it."""
    lab = fleet["lab"]
    base = mirror.BASE_URL
    listed = (
        "cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list "
        "/etc/apt/sources.list.d/*.sources 2>/dev/null | grep -E '^(deb|URIs)' || true"
    )
    rc = "/home/verl/miniconda3/.condarc"
    # the mirror p40fleet.mirror built from the lab's upstream: signed by the build's key
    apt = lab.state["stack"]["mirror"]["apt"]
    assert apt["signed_by"] and not apt.get("trusted"), apt
    line = source_line(apt["url"], apt["suite"], apt["components"], key_file=apt["signed_by"])
    for name in PROVISIONED:
        assert lab.ssh(name, listed).stdout.splitlines() == [line]
        aside = lab.ssh(name, "cat /etc/apt/p40fleet-aside/sources.list", check=True).stdout
        assert "deb.debian.org" in aside  # moved aside, not deleted
        condarc = lab.ssh(name, f"cat {rc}", check=True).stdout
        urls = [line.strip("- ").strip() for line in condarc.splitlines() if "://" in line]
        assert urls == [f"{base}/conda", f"{base}/conda"], condarc  # channels, default_channels
        # N7: the env came from the lab lock's files on the mirror, each checked against its
        # sha256 (the double fails the create otherwise), and records the lock it was made from
        env = "/home/verl/miniconda3/envs/verl-p40"
        record = json.loads(lab.ssh(name, f"cat {env}/conda-meta/python-*.json",
                                    check=True).stdout)  # fmt: skip
        assert record["url"].startswith(f"{base}/conda/linux-64/python-"), record
        # the lock names the default instance's channel; the deploy moved it onto this mirror
        tail = record["url"].removeprefix(f"{base}/conda")
        assert f"/conda{tail}#sha256:{record['sha256']}\n" in LAB_CONDA_LOCK.read_text()
        marker = lab.ssh(name, f"cat {env}/.p40fleet-conda-lock", check=True).stdout.strip()
        channel = lab.state["stack"]["mirror"]["conda_channel"]
        rendered = condalock.render(LAB_CONDA_LOCK.read_text(), channel)
        assert marker == condalock.digest(rendered), marker
    # without a channel it can reach, this conda fails as a real one does
    r = lab.ssh("lab1", "su verl -c '/home/verl/miniconda3/bin/conda create -n x python=3 -y "
                "--override-channels -c conda-forge'")  # fmt: skip
    assert r.returncode == 1 and "CondaHTTPError: HTTP 000 CONNECTION FAILED" in r.stderr
    lab.ssh("lab1", "rm /etc/apt/sources.list.d/p40fleet-mirror.list", check=True)
    t0 = time.monotonic()
    restored = full("--limit", "lab1", deploy="deploy/system.py")
    assert restored.returncode == 0, restored.output[-3000:]
    assert restored.changed_operations("lab1") == [
        f"apt source: the mirror {base}/apt {apt['suite']}"
    ], restored.output[-3000:]  # fmt: skip
    assert lab.ssh("lab1", listed).stdout.splitlines() == [line]
    print(f"deploy/system.py --limit lab1 (apt source restored): {time.monotonic() - t0:.1f} s")


def test_removed_data_file_or_edited_launch_script_fails_verify_then_is_restored(fleet):
    """lab1 loses a data file; lab2's ~/launch-ppo.sh gets an override verl lacks (verify reads
    the script users run, not the plan it came from). One run of deploy/full.py repairs both."""
    lab, reports = fleet["lab"], fleet["reports"]
    data = f"/home/verl/data/{lab.state['stack']['training']['data']['name']}"
    lab.ssh("lab1", f"rm {data}/test.parquet", check=True)
    script = lab.root("lab2") / "home/verl/launch-ppo.sh"
    text = script.read_text()
    assert text.count('    "$@"\n') == 1
    script.write_text(
        text.replace('    "$@"\n', '    actor_rollout_ref.no_such_key=1 \\\n    "$@"\n')
    )
    verify = full(report=reports / "fault.json", deploy="deploy/verify.py")
    assert verify.returncode != 0
    print(f"deploy/verify.py (one probe per host, training path included): {verify.seconds:.1f} s")
    check = checks_of(reports / "fault.json", "lab1")["data files"]
    assert check["status"] == "FAIL" and check["detail"] == f"missing: {data}/test.parquet"
    assert "deploy/training.py" in check["remedy"]
    lab2 = checks_of(reports / "fault.json", "lab2")
    assert lab2["data files"]["status"] == "PASS"
    assert lab2["launch overrides"]["status"] == "FAIL", lab2["launch overrides"]
    assert lab2["launch overrides"]["detail"].startswith("actor_rollout_ref.no_such_key=1: ")
    assert checks_of(reports / "fault.json", "lab1")["launch overrides"]["status"] == "PASS"
    since = time.time()
    result = full()
    assert_converged(result)
    assert (
        result.changed_operations("lab1")
        == [op for op in result.changed_operations("lab1") if "Training data" in op]
        != []
    )
    assert (
        result.changed_operations("lab2")
        == [op for op in result.changed_operations("lab2") if "PPO launch script" in op]
        != []
    )
    assert script.read_text() == text
    assert training_bytes(since) == 0  # unpacked again from the verified cache
    assert lab.ssh("lab1", f"test -s {data}/test.parquet").returncode == 0


def test_dry_run_with_a_verl_bump_changes_nothing_and_names_the_verl_steps(fleet):
    lab = fleet["lab"]
    bump = lab.state["stack"]["verl"]
    tags = lab.ssh("lab1", f"git ls-remote --tags {mirror.BASE_URL}/git/verl.git").stdout
    refs = dict(reversed(line.split()) for line in tags.splitlines())
    # an annotated tag: the commit is the peeled ref
    bump_commit = refs.get("refs/tags/v0.5.0-lab1^{}") or refs["refs/tags/v0.5.0-lab1"]
    pin = {"ref": "v0.5.0-lab1", "commit": bump_commit, "version": bump["version"]}
    override = {"*": {"verl": pin}}
    before = {name: snapshot(lab, name) for name in PROVISIONED}
    dry = full("--dry", stack_host=override)
    assert dry.returncode == 0, dry.output[-3000:]
    assert "verl checkout at v0.5.0-lab1" in dry.output
    for name in PROVISIONED:
        assert snapshot(lab, name) == before[name], f"--dry changed files on {name}"
    fleet["verl_bump"] = override


def test_verl_ref_bump_reruns_only_the_verl_steps(fleet):
    bumped = full(stack_host=fleet["verl_bump"])
    assert_converged(bumped)
    for name in PROVISIONED:
        changed = bumped.changed_operations(name)
        assert changed, name
        assert all("verl" in op for op in changed), (name, changed)
    back = full()
    assert_converged(back)
    for name in PROVISIONED:
        assert all("verl" in op for op in back.changed_operations(name)), name


def fetched_by(lab, name: str, since: float) -> dict[str, int]:
    """Mirror path -> body bytes sent to host ``name`` since ``since`` (its access log)."""
    ip, out = lab.host(name)["ip"], {}
    for e in httpd.access_entries():
        if e["client"] == ip and e["time"] >= since and e["bytes"]:
            out[e["path"]] = out.get(e["path"], 0) + e["bytes"]
    return out


def test_reinstall_keeps_home_and_reconverges(fleet):
    """docs/runbook.md "After an OS reinstall", end to end: the new host key is refused,
    re-keyed with the console's fingerprint, and the next run reconverges from what /home kept."""
    lab = fleet["lab"]
    env_python = lab.root("lab2") / "home/verl/miniconda3/envs/verl-p40/pyvenv.cfg"
    inode = env_python.stat().st_ino
    lab.reinstall("lab2", keep_host_key=False)  # a real reinstall: a new ssh host key
    before, rekeyed = snapshot(lab, "lab2"), None
    try:
        refused = full()
        assert "lab2" not in refused.connected, refused.output[-3000:]
        assert "SSH host key error" in refused.output, refused.output[-3000:]
        assert snapshot(lab, "lab2") == before  # refused before login: nothing ran or was sent
        assert_converged(refused, hosts=("lab1", "lab3"))
        # the cluster plan never shrinks to the hosts this run reached: lab2 (unreachable) is
        # sized from the controller's record of the first full run, so the others' scripts
        # stay as they are (they used to describe a 2-host cluster, then get lab2 back)
        for name in ("lab1", "lab3"):
            assert refused.changed_operations(name) == [], name
        assert "lab2 not in this run: sized from the last full run" in refused.output
        rekeyed = lab.rekey("lab2", "--expect", lab.host_key_fingerprint("lab2"))
        assert rekeyed.returncode == 0, rekeyed.stdout + rekeyed.stderr
    finally:
        if rekeyed is None or rekeyed.returncode:
            lab.rekey("lab2", "--yes")  # the module's later tests need lab2 reachable
    assert lab.ssh("lab2", "test -e /sys/module/nouveau").returncode == 0  # a fresh OS
    assert lab.ssh("lab2", "test -e /usr/local/cuda-11.8").returncode == 1
    since = time.time()
    result = full()
    assert_converged(result)
    assert env_python.stat().st_ino == inode  # the env under /home was kept, not rebuilt
    changed = result.changed_operations("lab2")
    assert not any("Conda env" in op or "Build the Apex" in op for op in changed), changed
    for name in ("lab1", "lab3"):
        assert result.changed_operations(name) == [], name
    # Fetched again: only what the reinstall wiped from lab2's system disk, each once: the four
    # pinned artifacts of the host cache (/var/cache/p40fleet; the Miniconda installer too, the
    # cache keeps every pin although conda itself survived under /home), the mirror's apt
    # index (the apt source under /etc/apt is written again) and the driver's build packages
    # (a fresh OS has no dkms or compiler: their .debs). Not the Apex wheel (controller
    # cache), pip wheels, verl's git or the training archives (their products are under /home).
    fetched = fetched_by(lab, "lab2", since)
    wiped = (*SYSTEM_ARTIFACTS, lab.state["stack"]["miniconda"]["filename"])
    sizes = {f"/artifacts/{n}": (mirror.MIRROR_DIR / "artifacts" / n).stat().st_size
             for n in wiped}  # fmt: skip
    apt_paths = {path for path in fetched if path.startswith("/apt/")}
    apt_debs = {path for path in apt_paths if path.endswith(".deb")}
    apt_index = apt_paths - apt_debs
    assert apt_index and all(path.startswith("/apt/dists/") for path in apt_index), fetched
    assert any("/dkms_" in path for path in apt_debs), fetched  # the deploy brought dkms back
    assert {p: n for p, n in fetched.items() if p not in apt_paths} == sizes, fetched
    assert fetched_by(lab, "lab1", since) == {} and fetched_by(lab, "lab3", since) == {}


def test_allow_reboot_off_stops_that_host_and_the_others_finish(fleet):
    lab = fleet["lab"]
    lab.reinstall("lab3")
    stopped = full(stack_host={"lab3": {"policy": {"allow_reboot": False}}})
    assert stopped.errors["lab3"] == 1
    assert "reboot required" in stopped.output
    assert_converged(stopped, hosts=("lab1", "lab2"))
    assert lab.ssh("lab3", "test -e /sys/module/nouveau").returncode == 0
    assert_converged(full())


def test_corrupted_artifact_is_refused_then_converges(fleet):
    lab = fleet["lab"]
    lab.reinstall("lab3")
    mirror.corrupt_artifact(CUDNN_TAR)
    try:
        bad = full()
        assert bad.errors["lab3"] == 1
        assert CUDNN_TAR in bad.output and "sha256" in bad.output
        assert lab.ssh("lab3", "ls /usr/local/cuda-11.8/include/cudnn.h").returncode != 0
        assert lab.ssh("lab3", f"ls /var/cache/p40fleet/{CUDNN_TAR}").returncode != 0
    finally:
        mirror.restore_artifact(CUDNN_TAR)
    assert_converged(full())


def test_mirror_wheel_with_one_byte_flipped_fails_the_python_deploy(fleet):
    """S4: the mirror serves a wheel whose bytes differ from the lock (its index consistent with
    the new bytes, as a hostile mirror's would be): --require-hashes refuses it on that host."""
    lab = fleet["lab"]
    served = sorted((mirror.MIRROR_DIR / "simple/six").glob("six-*.whl"))
    assert len(served) == 1, served
    wheel, pristine = served[0], served[0].read_bytes()
    page = wheel.parent / "index.html"  # p40fleet.mirror's PEP 503 page, #sha256= per file
    pristine_page = page.read_text()
    env_dir = ENV_PYTHON.rsplit("/bin/", 1)[0]
    lab.ssh("lab1", f"{ENV_PYTHON} -m pip uninstall -y -q six && rm -rf /home/verl/.cache/pip "
            f"{env_dir}/.p40fleet-verl-requirements.sha256", check=True)  # fmt: skip
    data = bytearray(pristine)
    # The first member's mod time in its local header: still a valid zip that pip would install
    # without --require-hashes (a flip in compressed data would trip the zip CRC anyway).
    assert data[:4] == b"PK\x03\x04"
    data[10] ^= 0x01
    try:
        wheel.write_bytes(bytes(data))
        old, new = (hashlib.sha256(b).hexdigest() for b in (pristine, bytes(data)))
        assert old in pristine_page
        page.write_text(pristine_page.replace(old, new))
        bad = full("--limit", "lab1", deploy="deploy/python.py")
        assert bad.errors["lab1"], bad.output[-3000:]
        assert "DO NOT MATCH THE HASHES" in bad.output, bad.output[-3000:]
        assert lab.ssh("lab1", f"{ENV_PYTHON} -c 'import six'").returncode != 0
    finally:
        wheel.write_bytes(pristine)
        page.write_text(pristine_page)
    good = full("--limit", "lab1", deploy="deploy/python.py")
    assert not good.errors["lab1"], good.output[-3000:]
    assert lab.ssh("lab1", f"{ENV_PYTHON} -c 'import six'").returncode == 0


def test_cuda_install_killed_midway_then_reconverges(fleet):
    lab = fleet["lab"]
    run = "/var/cache/p40fleet/cuda_11.8.0_520.61.05_linux.run"
    killed = lab.ssh(
        "lab1",
        "rm -rf /usr/local/cuda-11.8 && timeout -s TERM 1 sh "
        + run
        + " --silent --toolkit --installpath=/usr/local/cuda-11.8 --override"
        " --tmpdir=/var/cache/p40fleet; echo rc=$?",
    )
    assert "rc=124" in killed.stdout, killed.stdout + killed.stderr
    assert lab.ssh("lab1", "test -e /usr/local/cuda-11.8/version.json").returncode == 1
    result = full()
    assert_converged(result)
    assert any("CUDA" in op for op in result.changed_operations("lab1"))


def test_deleted_env_python_rebuilds_the_env(fleet):
    lab = fleet["lab"]
    lab.ssh("lab1", f"rm -f {ENV_PYTHON}", check=True)  # the env's link, not the host's python
    result = full()
    assert_converged(result)
    assert any("Conda env" in op for op in result.changed_operations("lab1"))


def test_local_edit_in_verl_checkout_is_reported_and_kept(fleet):
    lab = fleet["lab"]
    edited = "/home/verl/verl/verl/utils/model.py"
    lab.ssh("lab1", f"cp {edited} /root/model.py.orig && echo '# my local edit' >> {edited}",
            check=True)  # fmt: skip
    try:
        result = full()
        assert result.errors["lab1"] == 1
        assert "verl/utils/model.py" in result.output
        assert "# my local edit" in lab.ssh("lab1", f"tail -1 {edited}").stdout
        assert_converged(result, hosts=("lab2", "lab3"))
    finally:
        lab.ssh("lab1", f"cp /root/model.py.orig {edited}", check=True)
    assert_converged(full())


def test_root_never_runs_the_training_users_env_or_git_config(fleet, tmp_path):
    """S1: a .pth in lab1's env and a core.fsmonitor in its verl checkout (both the training
    user's to write) each leave a marker named with the uid that ran them; after deploy/full.py
    and ``python -m p40fleet.verify`` every marker is the training user's, none is root's."""
    import shlex
    import subprocess
    import sys

    lab = fleet["lab"]
    marks, checkout = "/tmp/p40fleet-s1-marks", "/home/verl/verl"
    site = lab.ssh("lab1", f"{ENV_PYTHON} -c 'import site; print(site.getsitepackages()[0])'",
                   check=True).stdout.strip()  # fmt: skip
    pth = f"{site}/zz-p40fleet-s1.pth"
    line = f"import os; open('{marks}/pth-%d' % os.getuid(), 'a')"
    hook = f"touch {marks}/fsmonitor-$(id -u); false"

    def as_verl(command: str) -> str:
        return f"su -s /bin/sh verl -c {shlex.quote(command)}"

    plant = " && ".join([
        f"mkdir -p {marks}", f"chmod 1777 {marks}",
        as_verl(f"printf '%s\\n' {shlex.quote(line)} > {pth}"),
        as_verl(f"git -C {checkout} config core.fsmonitor {shlex.quote(hook)}"),
    ])  # fmt: skip
    lab.ssh("lab1", plant, check=True)
    t0 = time.monotonic()
    try:
        assert lab.ssh("lab1", f"ls {marks}").stdout.split() == []  # planted, not yet run
        result = full("--limit", "lab1")
        assert_converged(result, hosts=("lab1",))
        verify = subprocess.run(
            [sys.executable, "-m", "p40fleet.verify", runs.SIM_INVENTORY, "--limit", "lab1",
             "--json", str(tmp_path / "verify.json")],
            cwd=runs.REPO, capture_output=True, text=True, timeout=900,
            env={**os.environ, **CONTROLLER_CACHE},
        )  # fmt: skip
        assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-2000:]
        found = lab.ssh("lab1", f"cd {marks} && stat -c '%n %u' *", check=True).stdout.split("\n")
        uid = lab.ssh("lab1", "id -u verl", check=True).stdout.strip()
        rows = [row.split() for row in found if row.strip()]
        # the facts and the probe ran both plants (as verl): the markers exist, none is root's
        assert {name.split("-")[0] for name, _ in rows} == {"pth", "fsmonitor"}, rows
        for name, owner in rows:
            assert name.rsplit("-", 1)[1] == uid and owner == uid, rows
    finally:
        unset = as_verl(f"git -C {checkout} config --unset core.fsmonitor")
        lab.ssh("lab1", f"rm -f {pth}; rm -rf {marks}; {unset}")
    print(f"S1 plants, deploy/full.py --limit lab1 + verify: {time.monotonic() - t0:.1f} s")


def test_a_fifo_at_the_launch_script_hangs_neither_verify_nor_the_deploy(fleet, tmp_path):
    """S19/N6 on a converged host: the training user makes ~/launch-ppo.sh a FIFO (root's
    sha1sum of it in the survey used to block forever; the probe's python opened it). verify
    finishes and FAILs the launch script, naming it; deploy/full.py finishes, the user's
    command replaces the FIFO with the script, and the host verifies PASS."""
    import shlex

    lab = fleet["lab"]
    script = "/home/verl/launch-ppo.sh"

    def as_verl(command: str) -> str:
        return f"su -s /bin/sh verl -c {shlex.quote(command)}"

    lab.ssh("lab1", as_verl(f"mv {script} {script}.kept && mkfifo {script}"), check=True)
    try:
        t0 = time.monotonic()
        report = tmp_path / "verify.json"
        verify = subprocess.run(
            [sys.executable, "-m", "p40fleet.verify", runs.SIM_INVENTORY, "--limit", "lab1",
             "--json", str(report)],
            cwd=runs.REPO, capture_output=True, text=True, timeout=600,
            env={**os.environ, **CONTROLLER_CACHE},
        )  # fmt: skip
        took = time.monotonic() - t0
        print(f"N6 FIFO at {script}: verify --limit lab1 {took:.1f} s, rc {verify.returncode}")
        assert verify.returncode != 0, verify.stdout[-3000:]
        launch = checks_of(report, "lab1")["launch overrides"]
        assert launch["status"] == "FAIL" and script in launch["detail"], launch
        t0 = time.monotonic()
        result = full("--limit", "lab1")
        print(f"N6 FIFO at {script}: deploy/full.py --limit lab1 {time.monotonic() - t0:.1f} s")
        assert_converged(result, hosts=("lab1",))
        kind = lab.ssh("lab1", f"stat -c '%F %U' {script}", check=True).stdout.strip()
        assert kind == "regular file verl", kind
    finally:
        lab.ssh("lab1", as_verl(f"if [ -p {script} ]; then mv -f {script}.kept {script}; "
                                f"else rm -f {script}.kept; fi"))  # fmt: skip


def test_symlinks_where_root_wrote_leave_root_files_alone(fleet):
    """N1, N2, N3 on a converged host: as the training user, plant a symlink to a root-owned
    0600 file at every path root wrote under the home before (launch script, verl patch applier
    and rules, requirements file), drop a staged data file (the staging runs again) and run
    deploy/full.py: every target is unchanged and still root's 0600, each link is replaced by
    the user's own file, and the host converges. Then ~/data as a symlink to a root-owned dir:
    the host is refused naming ~/data, the dir is unchanged; put back, it converges again."""
    import runpy
    import shlex

    from p40fleet.operations.verl import patch_files
    from p40fleet.spec.load import deep_merge, load_spec
    from p40fleet.verl_patches import ruleset_json

    lab = fleet["lab"]
    home = "/home/verl"
    cache = f"{home}/.cache/p40fleet"
    rules = lab.ssh("lab1", f"ls {cache}/verl-patch/", check=True).stdout.split()
    planted = [f"{home}/launch-ppo.sh", f"{cache}/verl-patch/verl_patch.py",
               *(f"{cache}/verl-patch/{r}" for r in rules if r.startswith("rules-")),
               *lab.ssh("lab1", f"ls -d {cache}/verl-requirements-*.txt",
                        check=True).stdout.split()]  # fmt: skip
    assert len(planted) >= 4, planted
    # earlier tests of the session leave rule sets and requirements of other refs beside the
    # ones this run uses; only those are rewritten (root leaves the stale links alone)
    group = runpy.run_path(str(runs.REPO / "inventories/group_data/all.py"))["stack"]
    spec = load_spec("lab1", deep_merge(group, lab.state["stack"]))
    record = json.loads(lab.ssh("lab1", f"cat {home}/verl/.p40fleet-patches.json",
                                check=True).stdout)  # fmt: skip
    in_use = {f"{home}/launch-ppo.sh", f"{cache}/verl-patch/verl_patch.py",
              patch_files(f"{cache}/verl-patch",
                          ruleset_json(record["ref"], record["profile"]))[1],
              f"{cache}/verl-requirements-{spec.requirements_variant}.txt"}  # fmt: skip
    assert in_use <= set(planted), (in_use, planted)

    def as_verl(command: str) -> str:
        return f"su -s /bin/sh verl -c {shlex.quote(command)}"

    def victims() -> str:  # name owner mode sha1 of every root-owned target
        return lab.ssh("lab1", "cd /root/p40fleet-n1 && for f in *; do "
                       'echo "$f $(stat -c "%u %a" "$f") $(sha1sum < "$f")"; done; '
                       "stat -c '%u %a' /root/p40fleet-n3", check=True).stdout  # fmt: skip

    data = f"/home/verl/data/{lab.state['stack']['training']['data']['name']}"
    setup = ["rm -rf /root/p40fleet-n1 /root/p40fleet-n3", "mkdir -m 700 /root/p40fleet-n1",
             "mkdir -m 700 /root/p40fleet-n3"]  # fmt: skip
    for i, path in enumerate(planted):
        victim = f"/root/p40fleet-n1/v{i}"
        setup += [f"echo 'root secret {i}' > {victim}", f"chmod 600 {victim}",
                  as_verl(f"ln -sfn {victim} {path}")]  # fmt: skip
    setup.append(as_verl(f"rm {data}/train.parquet"))  # staging runs again, as verl
    lab.ssh("lab1", " && ".join(setup), check=True)
    try:
        before = victims()
        t0 = time.monotonic()
        result = full("--limit", "lab1")
        print(f"N1 plants, deploy/full.py --limit lab1: {time.monotonic() - t0:.1f} s")
        assert_converged(result, hosts=("lab1",))
        assert victims() == before  # content, owner 0 and mode 600 of every target
        for path in planted:  # in use: the user's own regular file now; stale: still the link
            kind = lab.ssh("lab1", f"stat -c '%F %U' {path}", check=True).stdout.strip()
            want = "regular file verl" if path in in_use else "symbolic link verl"
            assert kind == want, (path, kind)
        owners = lab.ssh("lab1", f"stat -c %U {data} {data}/*", check=True).stdout.split()
        assert set(owners) == {"verl"}, owners
        again = full("--limit", "lab1")
        assert_converged(again, hosts=("lab1",))
        assert again.changed_operations("lab1") == []

        # N3/N6: ~/data a symlink to a root-owned dir: lab1 refused alone, naming it
        lab.ssh("lab1", as_verl("mv /home/verl/data /home/verl/data.kept && "
                                "ln -s /root/p40fleet-n3 /home/verl/data"), check=True)  # fmt: skip
        refused = full("--limit", "lab1")
        assert refused.errors["lab1"], refused.output[-3000:]
        assert "/home/verl/data exists and is not a directory" in refused.output
        assert "move it away" in refused.output
        assert victims() == before
    finally:
        lab.ssh("lab1", as_verl("if [ -L /home/verl/data ] && [ -d /home/verl/data.kept ]; "
                                "then rm /home/verl/data && mv /home/verl/data.kept "
                                "/home/verl/data; fi"))  # fmt: skip
        lab.ssh("lab1", "rm -rf /root/p40fleet-n1 /root/p40fleet-n3")
    assert_converged(full("--limit", "lab1"), hosts=("lab1",))


def test_uninstall_removes_the_footprint_keeps_the_home_then_converges_again(fleet):
    """deploy/uninstall.py on lab1 (issue 28.6): every path docs/footprint.md says goes is gone,
    the driver through its own uninstaller, the distribution's apt sources are back, the home
    and the account are kept; a second uninstall changes nothing; deploy/full.py --limit lab1
    converges it again and it verifies."""
    import runpy

    from p40fleet import footprint
    from p40fleet.spec.load import deep_merge, load_spec

    lab, name = fleet["lab"], "lab1"
    assert_converged(fleet["first"], hosts=(name,))  # what there is to uninstall
    group = runpy.run_path(str(runs.REPO / "inventories/group_data/all.py"))["stack"]
    spec = load_spec(name, deep_merge(group, lab.state["stack"]))
    gone = [item.path(spec) for kind in ("remove", "cuda_link", "nouveau", "apt_mirror",
                                         "apt_aside", "ray_unit", "driver")
            for item in footprint.items(spec, undo=kind)]  # fmt: skip
    assert "/usr/local/cuda-11.8" in gone and "/etc/apt/p40fleet-aside" in gone
    present = " ".join(f"{p}" for p in gone)
    listed = f"for p in {present}; do if [ -e $p ] || [ -L $p ]; then echo $p; fi; done"
    before = lab.ssh(name, listed, check=True).stdout.split()
    assert "/usr/local/cuda-11.8" in before and "/usr/bin/nvidia-uninstall" in before, before
    t0 = time.monotonic()
    first = full("--limit", name, deploy="deploy/uninstall.py")
    took = time.monotonic() - t0
    assert first.returncode == 0 and not first.errors[name], first.output[-5000:]
    assert lab.ssh(name, listed, check=True).stdout.split() == [], first.output[-3000:]
    assert lab.ssh(name, "modinfo -F version nvidia 2>/dev/null").stdout.strip() == ""
    assert "deb.debian.org" in lab.ssh(name, "cat /etc/apt/sources.list", check=True).stdout
    assert lab.ssh(name, "getent passwd p40fleet-apex").returncode == 2
    assert lab.ssh(name, f"test -x {ENV_PYTHON} && id -u verl", check=True).stdout.strip() == (
        str(spec.user.uid)
    )  # the home (the env in it) and the account are kept by default
    assert lab.ssh(name, "test -e /var/lib/p40fleet/run.lock").returncode == 1  # released
    t1 = time.monotonic()
    again = full("--limit", name, deploy="deploy/uninstall.py")
    took_again = time.monotonic() - t1
    assert again.returncode == 0 and again.changed_operations(name) == [], again.output[-3000:]
    t2 = time.monotonic()
    back = full("--limit", name)
    print(f"uninstall {name}: {took:.1f} s, again: {took_again:.1f} s, "
          f"deploy/full.py --limit {name}: {time.monotonic() - t2:.1f} s")  # fmt: skip
    assert_converged(back, hosts=(name,))
    assert lab.ssh(name, "modinfo -F version nvidia").stdout.strip() == spec.driver.version
