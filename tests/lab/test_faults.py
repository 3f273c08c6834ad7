"""Faults and bad input, each on the lab: a clear error (host, step, cause, fix), the other hosts
finish, a re-run converges once the cause is gone, nothing under /home is lost.

Lab for this module: lab1 4xP40 (a healthy neighbour), lab2 4xP40 (where faults are injected),
lab3 no GPU, lab4 1x K80 (Kepler: R525 does not support it), lab5 4xP40 on Debian 12.
Cases covered in test_flows.py instead: corrupted artifact, CUDA runfile killed halfway, nouveau
loaded with allow_reboot off, local edits in the verl checkout, conda env python deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p40lab import httpd, mirror, runs
from p40lab.util import sha256_file

pytestmark = pytest.mark.lab

HOME_MARKER = "/home/verl/data/keep-me.txt"
CUDNN_TAR = "cudnn-linux-x86_64-8.9.7.29_cuda11-archive.tar.xz"
CONTROLLER_CACHE: dict[str, str] = {}


def full(*args: str, stack_host: dict | None = None, host_data: dict | None = None,
         env: dict | None = None):  # fmt: skip
    env = dict(CONTROLLER_CACHE, **(env or {}))
    if stack_host:
        env["P40LAB_STACK_HOST"] = json.dumps(stack_host)
    if host_data:
        env["P40LAB_HOST_DATA"] = json.dumps(host_data)
    return runs.run("deploy/full.py", *args, env=env)


def converged(result, *hosts: str) -> None:
    for name in hosts:
        assert name in result.connected, result.output[-3000:]
        assert not result.errors[name], result.host_output(name)
        assert f"[{name}] verify: PASS" in result.output, result.host_output(name)


def home_intact(lab) -> None:
    for name in ("lab1", "lab2"):
        assert lab.ssh(name, f"cat {HOME_MARKER}").stdout.strip() == f"data of {name}"


def error_lines(result, name: str) -> str:
    return "\n".join(line for line in result.output.splitlines() if f"[{name}]" in line)


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    CONTROLLER_CACHE["P40FLEET_CACHE"] = str(tmp_path_factory.mktemp("controller-cache"))
    lab.down()
    # lab1 and lab2 start from test_flows' converged 4xP40 disk when it ran first (conftest)
    lab.up("4xP40,4xP40,0,1xK80,4xP40", os_opts=["lab5=debian12"],
           seed={"lab1": "p40x4", "lab2": "p40x4"})  # fmt: skip
    builds_before = {n: len(runs.apex_builds(lab.root(n))) for n in ("lab1", "lab2")}
    first = full()
    for name in ("lab1", "lab2"):
        data = Path(HOME_MARKER).parent
        lab.ssh(name, f"mkdir -p {data} && echo 'data of {name}' > {HOME_MARKER} "
                f"&& chown -R verl: {data}", check=True)  # fmt: skip
    yield {"lab": lab, "first": first, "builds_before": builds_before, "seeded": lab.seeded}
    lab.release()


def test_refusals_before_any_change_name_host_step_cause_fix(fleet):
    lab, first = fleet["lab"], fleet["first"]
    converged(first, "lab1", "lab2")
    # two hosts of one build key (4x P40): Apex compiled once, on one of them, in this run;
    # on disks seeded with a converged host's, not at all (its wheel is installed already)
    built = sum(len(runs.apex_builds(lab.root(n))) - fleet["builds_before"][n]
                for n in ("lab1", "lab2"))  # fmt: skip
    assert built == (0 if fleet["seeded"] else 1), (built, fleet["seeded"])
    expected = {
        "lab3": "no NVIDIA GPU found",
        "lab4": "K80",
        "lab5": "Debian 12 is not supported",
    }
    for name, cause in expected.items():
        lines = error_lines(first, name)
        assert first.errors[name] == 1 and not first.changed[name], lines
        assert f"host {name}: preflight" in lines and cause in lines and "fix:" in lines, lines
        assert lab.ssh(name, "test -e /var/cache/p40fleet").returncode == 1  # untouched
        assert lab.ssh(name, "test -e /etc/modprobe.d/blacklist-nouveau.conf").returncode == 1


def test_system_deploy_alone_refuses_debian_12_before_any_command(fleet):
    """S21: deploy/system.py run on its own (not through deploy/full.py) refuses lab5's
    Debian 12 in its preflight: no operation before the refusal, nothing on the host."""
    lab = fleet["lab"]
    started = time.monotonic()
    result = runs.run("deploy/system.py", "--limit", "lab5", env=dict(CONTROLLER_CACHE))
    seconds = time.monotonic() - started
    lines = error_lines(result, "lab5")
    assert "Traceback" not in result.output, result.output[-3000:]
    assert result.errors["lab5"] == 1, lines
    # Nothing ran before the refusal but the run lock's own step (if the preflight takes one).
    ran = [op for op, hosts in result.operations.items() if "lab5" in hosts]
    assert ran[-1].endswith("Refuse: preflight"), ran  # "deploy/preflight.py | Refuse: ..."
    assert all("lock" in op.lower() for op in ran[:-1]), ran
    assert "host lab5: preflight" in lines and "Debian 12 is not supported" in lines, lines
    assert lab.ssh("lab5", "test -e /var/cache/p40fleet").returncode == 1
    assert lab.ssh("lab5", "test -e /etc/modprobe.d/blacklist-nouveau.conf").returncode == 1
    print(f"deploy/system.py --limit lab5 refused in {seconds:.1f} s")
    assert seconds < 90


def test_bad_group_data_stops_that_host_only(fleet):
    lab = fleet["lab"]
    bad = {
        "lab2": {
            "surprise": 1,
            "cuda": {"sha256": "a" * 63},
            "paths": {"artifact_cache": "var/cache/p40fleet"},
            "python_version": "three.ten",
        }
    }
    result = full(stack_host=bad)
    lines = error_lines(result, "lab2")
    assert result.errors["lab2"] == 1 and not result.changed["lab2"]
    for field in ("surprise", "stack.cuda.sha256", "stack.paths.artifact_cache", "python_version"):
        assert field in lines, (field, lines)
    assert "a" * 63 in lines and "fix:" in lines
    converged(result, "lab1")
    converged(full(), "lab1", "lab2")
    home_intact(lab)


def test_unsupported_verl_ref_refuses_that_host_only(fleet):
    """Issue 16 item 5: the blog's verl pin (no HF rollout) on a P40 is that host's refusal,
    from deploy/full.py and from deploy/python.py run alone, never a traceback for the run."""
    lab = fleet["lab"]
    seed = "62549582a71881fe861b09f8375e3aea80ac6754"
    blog_pin = {"verl": {"ref": seed, "commit": seed, "version": "0.5.0.dev0"}}
    env = dict(CONTROLLER_CACHE, P40LAB_STACK_HOST=json.dumps({"lab2": blog_pin}))
    for deploy in ("deploy/full.py", "deploy/python.py"):
        result = runs.run(deploy, env=env)
        lines = error_lines(result, "lab2")
        assert "Traceback" not in result.output, result.output[-3000:]
        assert result.errors["lab2"] == 1 and not result.changed["lab2"], lines
        assert f"verl ref {seed} is unsupported for profile pascal" in lines, lines
        assert "v0.5.0" in lines, lines
        assert not result.errors["lab1"], result.output[-3000:]
    home_intact(lab)


def test_torch_lock_without_a_sum_refuses_that_host_in_the_preflight(fleet):
    """Issue 24 section 1: a spec whose torch lock cannot install its pins is refused in the
    preflight, before any change on that host, and the other host converges. lab2 asks the
    real stack's torchvision (the real locks: verl.requirements v0.5.0), whose line in
    files/torch-requirements-v0.5.0.txt has no sum; then (the lab's own lock,
    files/torch-requirements-lab.txt) a torchvision it has no line for."""
    lab = fleet["lab"]
    real = {"torch": {"version": "2.6.0+cu118", "torchvision": "0.21.0+cu118"},
            "verl": {"requirements": "v0.5.0"}}  # fmt: skip
    cases = [
        (real, (), [
            "torch-requirements-v0.5.0.txt",
            "torchvision==0.21.0+cu118 has no --hash=sha256:",
            "stack.torch.sha256",
        ]),
        ({"torch": {"torchvision": "0.28.0+cpu"}}, ("--limit", "lab2"), [
            "torch-requirements-lab.txt",
            "the lock has no torchvision line, the spec pins torchvision==0.28.0+cpu",
        ]),
    ]  # fmt: skip
    for override, args, causes in cases:
        result = full(*args, stack_host={"lab2": override})
        lines = error_lines(result, "lab2")
        assert "Traceback" not in result.output, result.output[-3000:]
        assert result.errors["lab2"] == 1 and not result.changed["lab2"], lines
        # the preflight's refusal is lab2's first operation (after the run lock's own step)
        ran = [op for op, hosts in result.operations.items() if "lab2" in hosts]
        assert ran[-1].endswith("Refuse: preflight"), ran
        assert all("lock" in op.lower() for op in ran[:-1]), ran
        assert "host lab2: preflight" in lines and "torch lock: " in lines, lines
        assert all(cause in lines for cause in causes) and "fix:" in lines, lines
        if not args:
            converged(result, "lab1")
    home_intact(lab)


def test_artifact_missing_from_the_mirror_then_restored(fleet):
    lab = fleet["lab"]
    lab.reinstall("lab2")  # its artifact cache is gone: it must download again
    served = mirror.MIRROR_DIR / "artifacts" / CUDNN_TAR
    hidden = served.with_name(CUDNN_TAR + ".hidden")
    served.rename(hidden)
    try:
        result = full()
        lines = error_lines(result, "lab2")
        assert result.errors["lab2"] == 1 and not result.changed["lab2"], lines
        assert "HTTP 404" in lines and CUDNN_TAR in lines, lines
        converged(result, "lab1")
    finally:
        hidden.rename(served)
    converged(full(), "lab1", "lab2")
    home_intact(lab)


def test_mirror_not_answering_then_back(fleet):
    lab = fleet["lab"]
    lab.reinstall("lab2")
    httpd.stop_server()
    try:
        result = full()
        lines = error_lines(result, "lab2")
        assert result.errors["lab2"] == 1 and not result.changed["lab2"], lines
        assert "did not answer" in lines and "start the mirror" in lines, lines
        converged(result, "lab1")  # converged already: needs nothing from the mirror
    finally:
        httpd.start_server()
    converged(full(), "lab1", "lab2")
    home_intact(lab)


SYSTEM_ARTIFACTS = ("NVIDIA-Linux-x86_64-525.147.05.run", "cuda_11.8.0_520.61.05_linux.run",
                    CUDNN_TAR)  # fmt: skip
PUSHED = {"*": {"mirror": {"push_from_controller": True}}}


def _pushed_ok(lab, name: str, files: tuple[str, ...]) -> None:
    """``name``'s copies of ``files`` are the mirror's bytes, marked verified by the host's own
    check, and root's staging dir is empty."""
    cache = "/var/cache/p40fleet"
    for file in files:
        want = sha256_file(mirror.MIRROR_DIR / "artifacts" / file)
        marker = lab.ssh(name, f"cat {cache}/{file}.verified", check=True).stdout.split()
        got = lab.ssh(name, f"sha256sum {cache}/{file}", check=True).stdout.split()[0]
        assert marker[2] == got == want, (name, file, marker, got)
    staging = lab.ssh(name, f"stat -c '%u %a' {cache}/.p40fleet-push && ls -A "
                      f"{cache}/.p40fleet-push", check=True).stdout.split()  # fmt: skip
    assert staging == ["0", "700"], staging


def test_artifacts_pushed_from_the_controller_fetched_once_then_with_the_mirror_down(fleet):
    """mirror.push_from_controller (issue 27): the controller fetches an artifact two hosts
    need once and uploads it over SSH; with the mirror not answering, lab2's artifacts step
    converges from the controller's cache alone. Each host checks every copy itself."""
    lab = fleet["lab"]
    env = dict(CONTROLLER_CACHE, P40LAB_STACK_HOST=json.dumps(PUSHED))
    lost = " ".join(f"/var/cache/p40fleet/{n} /var/cache/p40fleet/{n}.verified"
                    for n in SYSTEM_ARTIFACTS)  # fmt: skip
    for name in ("lab1", "lab2"):
        lab.ssh(name, f"rm -f /var/cache/p40fleet/{CUDNN_TAR}*", check=True)
    since = time.time()
    first = runs.run("deploy/system.py", "--limit", "lab1", "--limit", "lab2", env=env)
    for name in ("lab1", "lab2"):
        assert not first.errors[name] and name in first.connected, first.output[-3000:]
        _pushed_ok(lab, name, (CUDNN_TAR,))
    size = (mirror.MIRROR_DIR / "artifacts" / CUDNN_TAR).stat().st_size
    served = httpd.bytes_served(since=since, path_prefix=f"/artifacts/{CUDNN_TAR}")
    assert served == size, (served, size)  # once, by the controller: not once per host
    # the controller's cache holds the rest by hand (its files came on a disk); no mirror
    cached = Path(CONTROLLER_CACHE["P40FLEET_CACHE"]) / "artifacts"
    for file in SYSTEM_ARTIFACTS[:2]:
        (cached / file).write_bytes((mirror.MIRROR_DIR / "artifacts" / file).read_bytes())
    lab.ssh("lab2", f"rm -f {lost}", check=True)
    httpd.stop_server()
    try:
        second = runs.run("deploy/system.py", "--limit", "lab2", env=env)
    finally:
        httpd.start_server()
    assert not second.errors["lab2"] and second.changed["lab2"], error_lines(second, "lab2")
    _pushed_ok(lab, "lab2", SYSTEM_ARTIFACTS)
    print(f"push: cudnn {size} bytes served once for 2 hosts; lab2 from the controller's cache "
          f"with the mirror down in {second.seconds:.1f} s")  # fmt: skip


def test_download_cut_halfway_resumes_with_a_range_and_verifies_the_whole_file(fleet):
    """Issue 13: the mirror stops halfway through the CUDA runfile; the re-run fetches only
    the rest (HTTP range) and checks the sha256 of the whole file. Progress shows at default
    verbosity."""
    import threading

    lab, name = fleet["lab"], "cuda_11.8.0_520.61.05_linux.run"
    cached = f"/var/cache/p40fleet/{name}"
    part = lab.root("lab2") / f"{cached.lstrip('/')}.part"
    total = (mirror.MIRROR_DIR / "artifacts" / name).stat().st_size
    lab.ssh("lab2", f"rm -f {cached} {cached}.verified {cached}.part", check=True)
    env = dict(CONTROLLER_CACHE)
    httpd.start_server(rate=max(total // 20, 1024))  # ~20 s for the whole file
    try:
        runs_out: list = []
        cut = threading.Thread(
            target=lambda: runs_out.append(runs.run("deploy/system.py", "--limit", "lab2", env=env))
        )
        cut.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and cut.is_alive():
            if part.exists() and part.stat().st_size >= total * 0.3:
                break
            time.sleep(0.2)
        httpd.stop_server()  # the mirror goes away mid-download
        cut.join(timeout=600)
    finally:
        httpd.start_server()
    (first,) = runs_out
    lines = error_lines(first, "lab2")
    assert first.errors["lab2"] == 1, first.output[-3000:]
    assert f"download of {name}" in lines and "the next run resumes it" in lines, lines
    assert f"{name}: " in lines and " % (" in lines, lines  # progress at default verbosity
    kept = part.stat().st_size
    assert 0 < kept < total
    since = time.time()
    second = runs.run("deploy/system.py", "--limit", "lab2", env=env)
    lines = error_lines(second, "lab2")
    assert not second.errors["lab2"], second.output[-3000:]
    assert f"{name}: resuming from byte {kept}" in lines and "sha256 verified" in lines, lines
    fetched = httpd.bytes_served(since=since, path_prefix=f"/artifacts/{name}")
    assert fetched == total - kept, (fetched, total, kept)  # only the rest
    print(f"resume: {kept} of {total} bytes kept, {fetched} fetched on the re-run")
    marker = lab.ssh("lab2", f"cat {cached}.verified", check=True).stdout.split()
    want = lab.ssh("lab2", f"sha256sum {cached}", check=True).stdout.split()[0]
    assert marker[2] == want == sha256_file(mirror.MIRROR_DIR / "artifacts" / name)


def test_too_little_space_for_the_cuda_unpack(fleet):
    lab = fleet["lab"]
    lab.reinstall("lab2")
    lab.ssh("lab2", "mkdir -p /var/cache/p40fleet && "
            "mount -t tmpfs -o size=4m p40-small /var/cache/p40fleet", check=True)  # fmt: skip
    try:
        result = full()
        lines = error_lines(result, "lab2")
        assert result.errors["lab2"] == 1 and not result.changed["lab2"], lines
        assert "free space" in lines and "missing" in lines and "GiB" in lines, lines
        assert lab.ssh("lab2", "test -e /usr/local/cuda-11.8").returncode == 1
        converged(result, "lab1")
    finally:
        lab.ssh("lab2", "umount /var/cache/p40fleet")
    converged(full(), "lab1", "lab2")
    home_intact(lab)


def test_cudnn_extract_dir_on_another_filesystem(fleet):
    lab = fleet["lab"]
    lab.ssh("lab2", "mount -t tmpfs -o size=64m p40-elsewhere /usr/local/src", check=True)
    try:
        result = full()
        lines = error_lines(result, "lab2")
        assert result.errors["lab2"] == 1 and not result.changed["lab2"], lines
        assert "filesystem" in lines and "/usr/local/src" in lines, lines
        converged(result, "lab1")
    finally:
        lab.ssh("lab2", "umount /usr/local/src")
    converged(full(), "lab1", "lab2")


def test_changed_ssh_host_key_is_refused_and_nothing_is_sent(fleet):
    lab = fleet["lab"]
    key = lab.root("lab2") / "etc/ssh/ssh_host_ed25519_key"
    original = {p: p.read_bytes() for p in (key, key.with_suffix(".pub"))}
    key.unlink()
    key.with_suffix(".pub").unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    lab.reboot("lab2")
    marker = time.time()
    try:
        result = full()
        assert "lab2" not in result.connected
        said = result.output.lower()
        assert "lab2" in said and "host key" in said, result.output[-3000:]
        converged(result, "lab1")
        newer = [
            p for p in (lab.root("lab2").parent / "upper").rglob("*")
            if p.is_file() and not str(p).startswith(str(lab.root("lab2").parent / "upper/var/log"))
            and p.lstat().st_mtime > marker
        ]  # fmt: skip
        assert newer == [], newer
    finally:
        for path, data in original.items():
            path.write_bytes(data)
        lab.reboot("lab2")
    converged(full(), "lab1", "lab2")
    home_intact(lab)


def test_host_going_down_mid_run_then_reconverges(fleet):
    lab = fleet["lab"]
    lab.reinstall("lab2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyinfra", "-y", runs.SIM_INVENTORY, "deploy/full.py"],
        cwd=runs.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **CONTROLLER_CACHE},
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # wait until lab2 is into the system layer
            if lab.ssh("lab2", "test -e /var/cache/p40fleet").returncode == 0:
                break
            time.sleep(0.5)
        lab.ssh("lab2", "poweroff")  # sshd (PID 1) ends; the host stays off
        output, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    connected, _changed, _unchanged, errors = runs.parse(output)
    assert errors["lab2"] >= 1 or "lab2" in output.split("Disconnecting")[0], output[-3000:]
    assert "[lab1] verify: PASS" in output, output[-3000:]
    lab.reboot("lab2")  # power on
    converged(full(), "lab1", "lab2")
    home_intact(lab)


# Runs on a host as the training user (any local user): every 2 ms, the cmdline of every
# process; for each one carrying PYINFRA_SUDO_PASSWORD, the sha256 of the value and argv[0].
# Prints only hashes (never the value), as JSON, once /run/p40lab-sampler-stop exists.
CMDLINE_SAMPLER = r"""
import hashlib, json, os, re, time
value = re.compile(rb"PYINFRA_SUDO_PASSWORD='?([^\s'\0]+)")
hits, sweeps = {}, 0
print("ready", flush=True)
while not os.path.exists("/run/p40lab-sampler-stop"):
    sweeps += 1
    for pid in os.listdir("/proc"):
        try:
            raw = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        m = value.search(raw)
        if m:
            key = hashlib.sha256(m.group(1)).hexdigest() + " " + os.path.basename(
                raw.split(b"\0")[0]).decode(errors="replace")
            hits[key] = hits.get(key, 0) + 1
    time.sleep(0.002)
print(json.dumps({"sweeps": sweeps, "hits": hits}), flush=True)
"""


def test_sudo_password_never_appears(fleet):
    """A real sudo password (``admin-pw``'s sudo asks it): the run converges through it, and
    it is in no output, log or file; but pyinfra sends it in the remote command line, which any
    user of the host can read while that command starts (S18: "When it fails" in README)."""
    from p40lab import disks, hosts

    lab = fleet["lab"]
    secret = disks.sudo_password_file().read_text().strip()
    # sudo really asks admin-pw for a password (no NOPASSWD rule, no cached ticket)
    asks = lab.ssh("lab1", "sudo -n true", user="admin-pw")
    assert asks.returncode == 1 and "password is required" in asks.stderr, asks.stderr
    as_admin = {"P40LAB_SSH_USER": "admin-pw", "P40LAB_SUDO_PASSWORD": secret}
    sampler = subprocess.Popen(
        hosts.ssh_argv(lab.host("lab1"), "su -s /bin/sh verl -c '/usr/bin/python3 -'"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        sampler.stdin.write(CMDLINE_SAMPLER)
        sampler.stdin.close()
        sampler.stdin = None  # communicate() below must not flush the closed pipe
        assert sampler.stdout.readline().strip() == "ready", sampler.stderr.read()
        result = full(env=as_admin)
    finally:
        lab.ssh("lab1", "touch /run/p40lab-sampler-stop")
        seen, _err = sampler.communicate(timeout=60)
        lab.ssh("lab1", "rm -f /run/p40lab-sampler-stop")
    converged(result, "lab1", "lab2")
    assert secret not in result.output
    debug = runs.run(
        "deploy/verify.py", "--debug", "--limit", "lab1", env={**CONTROLLER_CACHE, **as_admin}
    )
    assert debug.returncode == 0 and "[lab1] verify: PASS" in debug.output, debug.output[-3000:]
    assert secret not in debug.output
    for name in ("lab1", "lab2"):
        upper = lab.root(name).parent / "upper"
        leaked = subprocess.run(["grep", "-rl", secret, str(upper)], capture_output=True, text=True)
        assert leaked.stdout == "", leaked.stdout
    assert not any(secret in p.read_text(errors="ignore") for p in Path("/tmp").glob("pyinfra*")
                   if p.is_file())  # fmt: skip
    # What the training user saw in /proc/*/cmdline during the run (pyinfra's design, S18):
    # the password itself, in the command line of the user's shell and of `env` before sudo.
    sampled = json.loads(seen.strip().splitlines()[-1])
    digest = hashlib.sha256(secret.encode()).hexdigest()
    print(f"sampler: {sampled['sweeps']} sweeps of /proc, hits {sampled['hits']}")
    assert sampled["sweeps"] > 100
    assert sampled["hits"] and all(k.split()[0] == digest for k in sampled["hits"])


def _pyinfra(*args: str, stdout=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pyinfra", "-y", runs.SIM_INVENTORY, *args],
        cwd=runs.REPO, stdout=stdout, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **CONTROLLER_CACHE},
    )  # fmt: skip


LOCK = "/var/lib/p40fleet/run.lock"


def test_run_lock_refuses_a_second_run_and_takes_over_a_killed_one(fleet, tmp_path):
    """Issue 13 / S10: two runs 2 s apart on one host: the second is refused at once naming
    the first; a run killed (SIGKILL) after taking the lock leaves it, the next run takes it
    over with a message and converges."""
    lab = fleet["lab"]
    # A converged host's run holds the lock for milliseconds: give each run a slow step, an
    # out-of-date initramfs whose rebuild takes 30 s (the lab's tool behind a sleep).
    tool = lab.ssh("lab2", "command -v update-initramfs", check=True).stdout.strip()
    slow = f'#!/bin/sh\nsleep 30\nexec {tool}.real "$@"\n'
    stale_initramfs = "touch /etc/modprobe.d/blacklist-nouveau.conf"
    lab.ssh("lab2", f"mv {tool} {tool}.real && printf '%s' '{slow}' > {tool} && chmod +x {tool} "
            f"&& {stale_initramfs}", check=True)  # fmt: skip
    try:
        log = tmp_path / "first.log"
        with log.open("w") as sink:  # a file, not a pipe: nobody reads it while the second runs
            first = _pyinfra("deploy/system.py", "--limit", "lab2", stdout=sink)
            try:
                time.sleep(2)
                second = runs.run("deploy/system.py", "--limit", "lab2", env=CONTROLLER_CACHE)
                first.wait(timeout=900)
            finally:
                if first.poll() is None:
                    first.kill()
        out_first = log.read_text()
        lines = error_lines(second, "lab2")
        assert second.returncode != 0 and not second.changed["lab2"], second.output[-3000:]
        assert "host lab2: run lock: another p40fleet run holds this host" in lines, lines
        assert f"(pid {first.pid})" in lines and "fix:" in lines, lines
        assert first.returncode == 0, out_first[-3000:]
        assert runs.parse(out_first)[3]["lab2"] == 0, out_first[-3000:]
        assert lab.ssh("lab2", f"test -e {LOCK}").returncode == 1  # released at the end

        lab.ssh("lab2", stale_initramfs, check=True)
        killed = _pyinfra("deploy/system.py", "--limit", "lab2")
        try:
            assert killed.stdout is not None
            seen = []
            for line in killed.stdout:  # pyinfra logs line by line
                seen.append(line)
                if "Starting operation: Rebuild the initramfs" in line:
                    time.sleep(2)
                    killed.kill()  # SIGKILL: no chance to release anything
                    break
            killed.wait(timeout=60)
        finally:
            if killed.poll() is None:
                killed.kill()
    finally:
        lab.ssh("lab2", f"mv -f {tool}.real {tool}")
    holder = lab.ssh("lab2", f"cat {LOCK}/holder").stdout
    assert f"pid={killed.pid}" in holder, ("".join(seen)[-3000:], holder)
    result = runs.run("deploy/system.py", "--limit", "lab2", env=CONTROLLER_CACHE)
    lines = error_lines(result, "lab2")
    assert result.returncode == 0 and not result.errors["lab2"], result.output[-3000:]
    assert "run lock: took over the stale lock" in lines and f"pid {killed.pid}" in lines, lines
    assert lab.ssh("lab2", f"test -e {LOCK}").returncode == 1
