"""``stack.proxy`` end to end: a fresh host that reaches the mirror only through the lab's HTTP
proxy (``p40lab/proxy.py``, with credentials) converges, and the password is never shown.

The mirror is served a second time on the controller's ``127.0.0.1`` (each lab host's
``127.0.0.1`` is its own loopback, so no host can reach it directly); the proxy listens on the
lab bridge and forwards only there. The host's stack points every mirror URL at that address,
so every fetch (apt, curl, pip, conda, git) must go through the proxy to succeed.

    P40LAB_TEST_INSTANCE=proxy P40LAB_TEST_GPUS=4xP40 flock /tmp/p40lab.lock \\
        .venv/bin/python -m pytest -q tests/lab/test_proxied_host.py
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from p40lab import httpd, runs
from p40lab import proxy as lab_proxy

pytestmark = pytest.mark.lab

SECRET = "Zq7-S3cr3t-pw9"  # looks like a password: must appear in no output, log or report
HOST = "lab1"
AS_ADMIN = {"P40LAB_SSH_USER": "admin"}  # through sudo, as on a real lab


def _free_port(bind: str) -> int:
    with socket.socket() as s:
        s.bind((bind, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def proxied(lab, tmp_path_factory):
    from p40lab import state as st

    lab.down()
    lab.up()  # fresh disks
    work = tmp_path_factory.mktemp("proxy")
    mirror_port = _free_port("127.0.0.1")
    proxy_port = _free_port(st.CONTROLLER_IP)
    loopback = f"http://127.0.0.1:{mirror_port}"
    mirror_log, proxy_log = work / "loopback-mirror.log", work / "proxy.log"
    mirror_pid, proxy_pid = work / "loopback-mirror.pid", work / "proxy.pid"
    auth = work / "proxy-auth"
    auth.touch(mode=0o600)
    auth.write_text(f"labuser:{SECRET}\n")
    httpd.start_server(st.MIRROR_DIR, bind="127.0.0.1", port=mirror_port,
                       access_log=mirror_log, pid_file=mirror_pid)  # fmt: skip
    lab_proxy.start_proxy(st.CONTROLLER_IP, proxy_port, {f"127.0.0.1:{mirror_port}"},
                          access_log=proxy_log, pid_file=proxy_pid, auth_file=auth)  # fmt: skip
    # The lab's stack with every mirror URL moved to the loopback copy, plus the proxy.
    stack = json.loads(json.dumps(st.load()["stack"]).replace(st.MIRROR_URL, loopback))
    url = f"http://labuser:{SECRET}@{st.CONTROLLER_IP}:{proxy_port}"
    stack["proxy"] = {"http": url, "https": url, "no_proxy": ["localhost"]}
    try:
        # An admin's first look at the fleet (no --limit): the controller records the Ray
        # cluster's members, so the runs limited to lab1 below plan the same cluster.
        seed = runs.run("deploy/training.py", "--dry", env={
            "P40LAB_SSH_USER": "admin", "P40LAB_STACK_HOST": json.dumps({HOST: stack}),
            "P40FLEET_CACHE": str(work / "controller-cache")})  # fmt: skip
        assert (work / "controller-cache" / "ray-members.json").is_file(), seed.output[-3000:]
        yield {"lab": lab, "stack": stack, "loopback": loopback, "proxy_log": proxy_log,
               "mirror_log": mirror_log, "work": work}  # fmt: skip
    finally:
        lab_proxy.stop_proxy(pid_file=proxy_pid)
        httpd.stop_server(pid_file=mirror_pid)
        lab.release()


def _run(proxied, deploy: str, *args: str) -> runs.RunResult:
    env = dict(AS_ADMIN, P40LAB_STACK_HOST=json.dumps({HOST: proxied["stack"]}),
               P40FLEET_CACHE=str(proxied["work"] / "controller-cache"),
               P40FLEET_REPORT=str(proxied["work"] / "report.json"))  # fmt: skip
    return runs.run(deploy, "--limit", HOST, *args, env=env)


def test_the_host_cannot_reach_the_loopback_mirror_directly(proxied):
    out = proxied["lab"].ssh(
        HOST, f"curl -sS -m 5 -o /dev/null {proxied['loopback']}/artifacts/; echo rc=$?"
    )
    assert "rc=7" in out.stdout, out.stdout + out.stderr  # curl: could not connect


def test_fresh_host_converges_through_the_proxy_and_never_shows_the_password(proxied):
    lab = proxied["lab"]
    since = time.time()
    # -vv: pyinfra prints every command it sends: none may carry the password
    first = _run(proxied, "deploy/full.py", "-vv")
    print(f"deploy/full.py through the proxy: {first.seconds:.1f} s")
    assert first.returncode == 0 and not first.errors[HOST], first.output[-6000:]
    assert f"[{HOST}] verify: PASS" in first.output, first.output[-4000:]
    assert SECRET not in first.output
    assert SECRET not in (proxied["work"] / "report.json").read_text()  # the verify report

    entries = [e for e in lab_proxy.access_entries(proxied["proxy_log"]) if e["time"] >= since]
    lab_ip = lab.host(HOST)["ip"]
    assert entries and {e["client"] for e in entries} == {lab_ip}
    ok = [e for e in entries if e["status"] in (200, 206)]
    assert {e["user"] for e in ok} == {"labuser"}
    paths = [e["target"].split("/", 3)[-1] for e in ok]
    counts = {
        kind: sum(p.startswith(prefix) for p in paths)
        # p40fleet.mirror's layout: pip's pages and wheels both under simple/
        for kind, prefix in (("apt", "apt/"), ("artifacts", "artifacts/"), ("pip", "simple/"),
                             ("git", "git/"), ("conda", "conda/"))
    }  # fmt: skip
    print(f"through the proxy: {len(ok)} requests, {sum(e['bytes'] for e in ok)} bytes, {counts}")
    assert all(counts.values()), counts  # apt, curl, pip, git and conda all went through it
    assert SECRET not in proxied["proxy_log"].read_text()
    # the loopback mirror saw only the proxy (the controller itself), never the host
    assert {e["client"] for e in httpd.access_entries(proxied["mirror_log"])} == {"127.0.0.1"}

    # the credentials: only in the root-only file
    creds = lab.root(HOST) / "etc/p40fleet/proxy.env"
    st = creds.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    assert creds.parent.stat().st_mode & 0o777 == 0o700  # root-only dir: no window at all
    assert SECRET in creds.read_text()
    home = lab.ssh(HOST, f"grep -rl {SECRET} /home /tmp /var/tmp /etc/apt 2>/dev/null; true")
    assert home.stdout.strip() == "", home.stdout

    second = _run(proxied, "deploy/full.py")
    print(f"second run: {second.seconds:.1f} s, changed: {second.changed_operations(HOST)}")
    assert second.returncode == 0 and not second.changed_operations(HOST), second.output[-4000:]
    assert SECRET not in second.output
