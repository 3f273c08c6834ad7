"""#27 end to end: ``python -m p40fleet.mirror build`` -> ``verify`` -> ``serve``, then
``deploy/full.py`` converges a lab host from nothing from that mirror alone.

"Upstream" is the lab's stand-in for the world (``p40lab.mirror``'s ``upstream/``: its installer
doubles as NVIDIA's and Anaconda's downloads, its wheelhouse as the package index, its git
remotes as GitHub, its conda channel, its flat apt repository as the Ubuntu archive), from which
the lab's own mirror is built by the same tool in-process. Here the CLI builds a second one from
it, each file checked against its pin; the lab's server is then stopped, so the host reaches
nothing but the freshly built one (``air_gapped``: apt, conda, pip, git and the artifacts all
from it, the apt repository signed by the key the build made, no ``trusted=yes``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from p40lab import httpd, mirror, runs

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
HOST = "lab1"
PORT = httpd.PORT + 1  # the built mirror, beside the lab's on the same bridge address
AS_ADMIN = {"P40LAB_SSH_USER": "admin"}


def _mirror_cli(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "p40fleet.mirror", *args], cwd=REPO, capture_output=True,
        text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        env={**os.environ, **AS_ADMIN},
    )  # fmt: skip


def _block(stdout: str) -> dict:
    """The ``stack["mirror"] = {...}`` block ``mirror build`` prints last."""
    return json.loads(stdout[stdout.index('stack["mirror"] = ') + len('stack["mirror"] = ') :])


@pytest.fixture(scope="module")
def built(lab, tmp_path_factory):
    """A fresh lab, and a mirror built by the tool from the lab's one, checked, then served."""
    lab.down()
    lab.up()
    work = tmp_path_factory.mktemp("built-mirror")
    kernel = lab.ssh(HOST, "uname -r", check=True).stdout.strip()
    status = work / "dpkg-status"  # what every host has after the OS install
    shutil.copyfile(lab.root(HOST) / "var/lib/dpkg/status", status)
    base = mirror.UPSTREAM_URL  # the controller may reach it; the hosts never do
    served = f"http://{httpd.BIND}:{PORT}"
    t0 = time.monotonic()
    args = [
        "build", str(work / "mirror"), "--inventory", "inventories/sim.py", "--quiet",
        "--index-url", f"{base}/simple", "--git-base-url", f"{base}/git",
        "--conda-upstream", f"{base}/conda", "--base-url", served,
        "--kernel", kernel, "--apt-upstream", f"{base}/apt", "--apt-suite", "./",
        "--allow-unverified-upstream", "--apt-installed", str(status),
    ]  # fmt: skip
    build = _mirror_cli(*args)
    seconds = time.monotonic() - t0
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    print(f"\nmirror build from the lab's mirror: {seconds:.1f} s\n{build.stdout}")
    again = _mirror_cli(*args)  # the same build again
    assert again.returncode == 0, again.stderr[-4000:]
    log = work / "access.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "p40fleet.mirror", "serve", str(work / "mirror"),
         "--bind", f"{httpd.BIND}:{PORT}", "--access-log", str(log)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{served}/manifest.json", timeout=2).read()
                break
            except OSError:
                time.sleep(0.1)
        yield {"lab": lab, "dir": work / "mirror", "block": _block(build.stdout), "log": log,
               "served": served, "build": build, "again": again}  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
        httpd.start_server()  # the lab's mirror, for the modules after this one
        lab.release()


def test_a_second_build_fetches_nothing(built):
    summary = [line for line in built["again"].stdout.splitlines() if "fetched now:" in line]
    assert summary and all("fetched now: 0 (0.0 MB)" in line for line in summary), summary


def test_verify_names_a_flipped_byte_and_a_missing_file(built):
    manifest = json.loads((built["dir"] / "manifest.json").read_text())
    kinds = {entry["kind"]: entry["path"] for entry in manifest["files"]}
    assert {"artifact", "wheel", "git", "conda", "apt"} <= set(kinds), sorted(kinds)
    flipped, missing = built["dir"] / kinds["wheel"], built["dir"] / kinds["conda"]
    keep_flipped, keep_missing = flipped.read_bytes(), missing.read_bytes()
    try:
        flipped.write_bytes(bytes([keep_flipped[0] ^ 1]) + keep_flipped[1:])
        missing.unlink()
        bad = _mirror_cli("verify", str(built["dir"]))
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert (
            kinds["wheel"] in bad.stdout + bad.stderr and kinds["conda"] in bad.stdout + bad.stderr
        )
    finally:
        flipped.write_bytes(keep_flipped)
        missing.write_bytes(keep_missing)
    good = _mirror_cli("verify", str(built["dir"]))
    assert good.returncode == 0, good.stdout + good.stderr


def test_a_host_converges_from_nothing_from_the_built_mirror_alone(built):
    """The lab's mirror stopped: lab1 (fresh disks) converges from the built one, each file it
    downloads leaving that mirror once, and a second run changes nothing."""
    lab = built["lab"]
    block = dict(built["block"], air_gapped=True)
    block["apt"] = dict(block["apt"], trusted=False)  # signed by the build's key instead
    env = {**AS_ADMIN, "P40LAB_STACK_HOST": json.dumps({HOST: {"mirror": block}})}
    httpd.stop_server()
    lab_mirror_down = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-m", "5", f"{mirror.BASE_URL}/"], capture_output=True
    )
    assert lab_mirror_down.returncode != 0  # nothing answers there any more
    first = runs.run("deploy/full.py", "--limit", HOST, env=env)
    assert first.returncode == 0 and not first.errors[HOST], first.output[-6000:]
    assert f"[{HOST}] verify: PASS" in first.output, first.output[-4000:]
    host_ip = lab.host(HOST)["ip"]
    # the fixture's own readiness probe came from the controller (httpd.BIND): not counted
    entries = [e for e in httpd.access_entries(built["log"]) if e["client"] != httpd.BIND]
    assert entries and {e["client"] for e in entries} == {host_ip}, entries[:5]
    files = Counter(e["path"] for e in entries if e["method"] == "GET" and e["status"] == 200
                    and e["path"].split("/")[1] in ("artifacts", "conda", "git", "apt")
                    and e["path"].endswith((".run", ".sh", ".xz", ".bz2", ".conda", ".deb",
                                            ".tar.gz", ".pack")))  # fmt: skip
    kinds = Counter(path.split("/")[1] for path in files)
    twice = {path: n for path, n in files.items() if n > 1}
    print(
        f"\n{HOST} from the built mirror: {first.seconds:.1f} s, {len(entries)} requests, "
        f"{sum(e['bytes'] for e in entries) / 1e6:.1f} MB; files by kind {dict(kinds)}"
    )
    assert {"artifacts", "conda", "apt"} <= set(kinds), kinds
    assert twice == {}, twice  # each file left the mirror once
    again = runs.run("deploy/full.py", "--limit", HOST, env=env)
    assert again.returncode == 0 and again.changed_operations(HOST) == [], again.output[-4000:]
