"""operations.artifacts: facts in, commands out; the download script run for real (file://)."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from p40fleet.facts.artifacts import ArtifactFile, ArtifactState
from p40fleet.facts.host import FreeSpace, FreeSpaceInfo
from p40fleet.operations import artifacts
from p40fleet.spec import load_spec
from tests.opharness import MissingFact, at, run_op

CACHE = "/var/cache/p40fleet"
MIRROR = "http://10.231.0.1:8111/artifacts"
SUM = "a" * 64


def space(free: int) -> FreeSpaceInfo:
    return FreeSpaceInfo(CACHE, "/var", "/", 10**12, free)


def sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def fact_on_this_machine(fact_cls, **kwargs):
    fact = fact_cls()
    out = sh(fact.command(**kwargs))
    return fact.process(out.stdout.splitlines())


def test_verified_artifact_is_a_noop():
    state = ArtifactFile(size=10, mtime=5, marker_size=10, marker_mtime=5, marker_sha256=SUM)
    r = run_op(
        artifacts.fetch,
        url="http://x/y.run",
        sha256=SUM,
        dest_dir=CACHE,
        facts={ArtifactState: state},
    )
    assert r.commands == []
    assert r.noops and "verified" in r.noops[0]
    assert r.facts_asked == [f"ArtifactState(path='{CACHE}/y.run')"]  # no FreeSpace, no hashing


def script(result, index: int = 0) -> str:
    """The shell command inside the ``index``-th streamed step (``function _stream``)."""
    streams = [f for f in result.functions if f.function.__name__ == "_stream"]
    return streams[index].args[0].get_raw_value()


def test_absent_downloads_in_one_command_that_resumes_verifies_renames_and_marks():
    spec = load_spec("lab1", {"mirror": {"artifacts_url": MIRROR}})
    r = run_op(
        artifacts.artifact,
        item="cuda",
        spec=spec,
        facts={ArtifactState: ArtifactFile(), FreeSpace: space(10**11)},
    )
    f = f"{CACHE}/cuda_11.8.0_520.61.05_linux.run"
    # S10: one step, so no other run can slip between download, check, rename and marker
    assert r.commands == ["function _stream"]
    cmd = script(r)
    assert cmd.startswith("sh -c ") and f"f={f};" in cmd
    assert f"{MIRROR}/cuda_11.8.0_520.61.05_linux.run" in cmd and spec.cuda.sha256 in cmd
    assert "flock -n 9" in cmd and "curl -fsSL --retry 3 $c" in cmd and 'c="-C -"' in cmd
    assert cmd.index("flock -n 9") < cmd.index("curl") < cmd.index('mv -f "$p" "$f"')
    assert cmd.index('mv -f "$p" "$f"') < cmd.index('> "$m.tmp"')
    assert f"size={spec.cuda.size};" in cmd  # progress in % of the known size
    assert "| sh" not in cmd


def test_no_mirror_means_upstream_url():
    spec = load_spec("lab1", {})
    r = run_op(
        artifacts.artifact,
        item="driver",
        spec=spec,
        facts={ArtifactState: ArtifactFile(), FreeSpace: space(10**11)},
    )
    assert spec.driver.url in script(r)


def test_not_enough_space_refuses_and_says_how_much_is_missing():
    spec = load_spec("lab1", {})
    r = run_op(
        artifacts.artifact,
        item="cuda",
        spec=spec,
        facts={ArtifactState: ArtifactFile(), at(FreeSpace, path=CACHE): space(1_000_000_000)},
    )
    assert r.commands == ["function _fail"]
    (message,) = r.failures
    assert "needs 4.34 GB (4336730777 bytes)" in message
    assert "3.34 GB (3336730777 bytes) missing" in message
    assert "artifact_cache" in message


def test_present_without_valid_marker_is_hashed_once_not_blindly_downloaded():
    touched = ArtifactFile(size=10, mtime=9, marker_size=10, marker_mtime=5, marker_sha256=SUM)
    r = run_op(
        artifacts.fetch,
        url="http://x/y.run",
        sha256=SUM,
        dest_dir=CACHE,
        size=10,
        facts={ArtifactState: touched},
    )
    assert r.commands == ["function _stream"]
    assert 'if [ -f "$f" ] && [ "$(sum "$f")" = "$want" ]' in script(r)  # hashed, kept if good
    assert "no valid verified marker" in r.logs[0]


@pytest.fixture
def payload(tmp_path):
    src = tmp_path / "mirror" / "thing.run"
    src.parent.mkdir()
    src.write_bytes(b"#!/bin/sh\necho payload\n" * 100)
    return src, hashlib.sha256(src.read_bytes()).hexdigest()


def _run_all(result) -> subprocess.CompletedProcess:
    assert result.commands == ["function _stream"], result.commands
    return sh(script(result))


@pytest.mark.skipif(
    sh("command -v curl && command -v sha256sum").returncode != 0, reason="needs curl"
)
def test_download_script_for_real_then_fact_says_verified(tmp_path, payload):
    src, digest = payload
    cache = str(tmp_path / "cache")
    r = run_op(
        artifacts.fetch,
        url=f"file://{src}",
        sha256=digest,
        dest_dir=cache,
        facts={ArtifactState: ArtifactFile()},
    )
    assert _run_all(r).returncode == 0
    assert sorted(os.listdir(cache)) == ["thing.run", "thing.run.lock", "thing.run.verified"]
    state = fact_on_this_machine(ArtifactState, path=f"{cache}/thing.run")
    assert state.verified(digest)
    # second run: the real fact feeds the op -> nothing to do
    r2 = run_op(
        artifacts.fetch,
        url=f"file://{src}",
        sha256=digest,
        dest_dir=cache,
        facts={ArtifactState: state},
    )
    assert r2.commands == []
    # touching the file invalidates the marker (size+mtime), no hashing needed to notice
    os.utime(f"{cache}/thing.run", (1, 1))
    assert not fact_on_this_machine(ArtifactState, path=f"{cache}/thing.run").verified(digest)


@pytest.mark.skipif(sh("command -v curl").returncode != 0, reason="needs curl")
def test_sum_mismatch_deletes_the_part_and_names_file_sums_and_remedy(tmp_path, payload):
    src, digest = payload
    cache = str(tmp_path / "cache")
    r = run_op(
        artifacts.fetch,
        url=f"file://{src}",
        sha256=SUM,
        dest_dir=cache,
        facts={ArtifactState: ArtifactFile()},
    )
    out = _run_all(r)
    assert out.returncode != 0
    assert os.listdir(cache) == ["thing.run.lock"]  # the .part is gone
    assert "sha256 mismatch for thing.run" in out.stderr
    assert f"expected {SUM}, got {digest}" in out.stderr
    assert "Remedy:" in out.stderr


# --- the harness itself (tests/opharness.py) -------------------------------------------------


def test_harness_missing_fact_is_named():
    with pytest.raises(MissingFact, match=r"ArtifactState\(path='/c/y.run'\)"):
        run_op(artifacts.fetch, url="http://x/y.run", sha256=SUM, dest_dir="/c")


def test_harness_specific_key_wins_and_callables_get_arguments():
    seen = []

    def state(path):
        seen.append(path)
        return ArtifactFile()

    r = run_op(
        artifacts.fetch,
        url="http://x/y.run",
        sha256=SUM,
        dest_dir="/c",
        size=100,
        facts={
            ArtifactState: state,
            FreeSpace: space(10**9),
            at(FreeSpace, path="/c"): space(10),
        },
    )
    assert seen == ["/c/y.run"]
    assert r.commands == ["function _fail"] and r.changed


# --- resume, verify, lock, progress: the command run with sh against the lab mirror's server --


@pytest.fixture
def range_server(tmp_path):
    """p40lab's mirror HTTP server (ranges, access log) on 127.0.0.1, serving tmp_path/srv."""
    import threading
    from http.server import ThreadingHTTPServer

    from p40lab import httpd

    root, log = tmp_path / "srv", tmp_path / "access.log"
    root.mkdir()
    handler = type("H", (httpd._Handler,), {"access_log": log, "rate": 0})
    srv = ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **kw: handler(*a, directory=str(root), **kw)
    )
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    info = {
        "url": f"http://127.0.0.1:{srv.server_address[1]}",
        "root": root,
        "log": log,
        "handler": handler,
    }
    yield info
    srv.shutdown()
    srv.server_close()


def served(log) -> list[tuple[int, int]]:
    """(status, body bytes) per request, from the mirror's access log."""
    from p40lab import httpd

    return [(e["status"], e["bytes"]) for e in httpd.access_entries(log)]


def test_upstream_answers_the_controller_and_an_opened_host_only(range_server, monkeypatch):
    """The lab's stand-in for the world (``/upstream/``) answers a host 403, as the world does
    not answer an air-gapped host; the mirror beside it answers everyone."""
    import urllib.error
    import urllib.request

    from p40lab import httpd

    monkeypatch.setattr(httpd, "UPSTREAM_OPEN", range_server["root"].parent / "upstream-open")
    (range_server["root"] / httpd.UPSTREAM).mkdir()
    (range_server["root"] / httpd.UPSTREAM / "a.run").write_bytes(b"upstream")
    (range_server["root"] / "a.run").write_bytes(b"mirror")

    def get(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"{range_server['url']}/{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""

    assert get("a.run") == (200, b"mirror")
    assert get(f"{httpd.UPSTREAM}/a.run")[0] == 403  # 127.0.0.1 is not the controller
    assert get(f"{httpd.UPSTREAM}/./a.run")[0] == 403  # as the file server maps the path
    httpd.open_upstream("127.0.0.1")
    assert get(f"{httpd.UPSTREAM}/a.run") == (200, b"upstream")
    httpd.open_upstream("127.0.0.1", False)
    assert get(f"{httpd.UPSTREAM}/a.run")[0] == 403
    monkeypatch.setattr(httpd, "BIND", "127.0.0.1")  # the controller's own requests
    assert get(f"{httpd.UPSTREAM}/a.run") == (200, b"upstream")


def blob(size: int) -> bytes:
    return (hashlib.sha256(b"seed").digest() * (size // 32 + 1))[:size]


def _cmd(server, cache, data, name="big.run", with_size=True):
    (server["root"] / name).write_bytes(data)
    return artifacts.download_command(
        f"{server['url']}/{name}",
        hashlib.sha256(data).hexdigest(),
        str(cache),
        name,
        len(data) if with_size else None,
    ).get_raw_value()


needs_tools = pytest.mark.skipif(
    sh("command -v curl && command -v flock && command -v sha256sum").returncode != 0,
    reason="needs curl, flock, sha256sum",
)


@needs_tools
def test_interrupted_part_is_resumed_with_a_range_and_the_whole_file_verified(
    tmp_path, range_server
):
    data, cache = blob(300_000), tmp_path / "cache"
    cmd = _cmd(range_server, cache, data)
    cache.mkdir(mode=0o755)
    (cache / "big.run.part").write_bytes(data[:120_000])  # left by an interrupted run
    out = sh(cmd)
    assert out.returncode == 0, out.stderr
    assert "big.run: resuming from byte 120000" in out.stdout
    assert "sha256 verified" in out.stdout
    assert served(range_server["log"]) == [(206, 180_000)]  # only the rest was fetched
    assert (cache / "big.run").read_bytes() == data
    state = fact_on_this_machine(ArtifactState, path=f"{cache}/big.run")
    assert state.verified(hashlib.sha256(data).hexdigest())
    assert not (cache / "big.run.part").exists()


@needs_tools
def test_resumed_file_with_a_bad_sum_is_fetched_whole_once_more(tmp_path, range_server):
    data, cache = blob(200_000), tmp_path / "cache"
    cmd = _cmd(range_server, cache, data)
    cache.mkdir(mode=0o755)
    (cache / "big.run.part").write_bytes(b"x" * 50_000)  # the start of another file
    out = sh(cmd)
    assert out.returncode == 0, out.stderr
    assert "fetching it whole" in out.stdout
    assert served(range_server["log"]) == [(206, 150_000), (200, 200_000)]
    assert (cache / "big.run").read_bytes() == data


@needs_tools
def test_complete_part_is_verified_without_downloading_again(tmp_path, range_server):
    data, cache = blob(50_000), tmp_path / "cache"
    cmd = _cmd(range_server, cache, data, with_size=False)
    cache.mkdir(mode=0o755)
    (cache / "big.run.part").write_bytes(data)  # cut just before the rename
    out = sh(cmd)
    assert out.returncode == 0, out.stderr
    assert served(range_server["log"]) == [(416, 0)]
    assert (cache / "big.run").read_bytes() == data


@needs_tools
def test_mirror_gone_keeps_the_part_for_the_next_run(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    (cache / "big.run.part").write_bytes(b"y" * 1000)
    cmd = artifacts.download_command("http://127.0.0.1:9/big.run", SUM, str(cache), "big.run")
    out = sh(cmd.get_raw_value())
    assert out.returncode != 0
    assert "stopped" in out.stderr and "the next run resumes it" in out.stderr
    assert "Remedy: check that the mirror answers" in out.stderr
    assert (cache / "big.run.part").read_bytes() == b"y" * 1000


@pytest.fixture
def plain_server(range_server):
    """The same server without Range support, as ``python3 -m http.server`` (security N5)."""
    range_server["handler"].ranges = False
    return range_server


@needs_tools
def test_part_a_mirror_cannot_resume_is_fetched_whole_once_and_converges(tmp_path, plain_server):
    """N5: a mirror without Range answers 200 to a resume (curl exit 33); before, the .part
    was kept and every run failed the same way."""
    data, cache = blob(300_000), tmp_path / "cache"
    cmd = _cmd(plain_server, cache, data)
    cache.mkdir(mode=0o755)
    (cache / "big.run.part").write_bytes(data[:100_000])
    out = sh(cmd)
    assert out.returncode == 0, out.stderr
    assert "did not resume the partial file" in out.stdout and "fetching it whole" in out.stdout
    assert "sha256 verified" in out.stdout
    # the resume asked and was refused (curl stops at the 200), then one whole download
    assert [status for status, _ in served(plain_server["log"])] == [200, 200]
    assert served(plain_server["log"])[-1] == (200, 300_000)
    assert (cache / "big.run").read_bytes() == data
    assert not (cache / "big.run.part").exists()
    again = sh(cmd)  # the second run: already there, nothing fetched
    assert again.returncode == 0 and "already in" in again.stdout, again.stderr
    assert len(served(plain_server["log"])) == 2


@needs_tools
def test_part_longer_than_the_pinned_size_is_never_resumed(tmp_path, range_server):
    data, cache = blob(100_000), tmp_path / "cache"
    cmd = _cmd(range_server, cache, data)
    cache.mkdir(mode=0o755)
    (cache / "big.run.part").write_bytes(b"z" * 150_000)  # longer than the file: a 416
    out = sh(cmd)
    assert out.returncode == 0, out.stderr
    assert "150000 bytes, more than the pinned 100000: fetching it whole" in out.stdout
    assert served(range_server["log"]) == [(200, 100_000)]  # no Range asked at all
    assert (cache / "big.run").read_bytes() == data


@needs_tools
def test_part_longer_than_the_file_converges_without_a_known_size(tmp_path, range_server):
    data, cache = blob(100_000), tmp_path / "cache"
    cmd = _cmd(range_server, cache, data, with_size=False)
    cache.mkdir(mode=0o755)
    (cache / "big.run.part").write_bytes(b"z" * 150_000)
    out = sh(cmd)
    assert out.returncode == 0, out.stderr
    assert served(range_server["log"]) == [(416, 0), (200, 100_000)]
    assert (cache / "big.run").read_bytes() == data


@needs_tools
def test_mirror_sending_more_than_the_pin_is_cut_and_nothing_kept(tmp_path, range_server):
    data, cache = blob(200_000), tmp_path / "cache"
    (range_server["root"] / "big.run").write_bytes(data)
    cmd = artifacts.download_command(
        f"{range_server['url']}/big.run", hashlib.sha256(data[:1000]).hexdigest(), str(cache),
        "big.run", 1000,
    ).get_raw_value()  # fmt: skip
    out = sh(cmd)
    assert out.returncode != 0
    assert "stopped (curl/wget exit 63)" in out.stderr, out.stderr
    assert not (cache / "big.run.part").exists() and not (cache / "big.run").exists()


@needs_tools
def test_wget_fallback_also_converges_through_a_mirror_without_range(tmp_path, plain_server):
    """A host without curl: wget, with its limits (a wrong option would exit 2), against a
    server that ignores Range (wget itself then starts again from the first byte)."""
    import shutil

    if shutil.which("wget") is None:
        pytest.skip("needs wget")
    tools = tmp_path / "bin"  # PATH without curl
    tools.mkdir()
    for tool in ("sh", "stat", "sha256sum", "cut", "flock", "mkdir", "rm", "mv", "date",
                 "sleep", "wget", "cat", "head"):  # fmt: skip
        (tools / tool).symlink_to(shutil.which(tool))
    data, cache = blob(300_000), tmp_path / "cache"
    cmd = _cmd(plain_server, cache, data)
    cache.mkdir(mode=0o755)
    (cache / "big.run.part").write_bytes(data[:100_000])
    out = subprocess.run(
        [str(tools / "sh"), "-c", cmd], capture_output=True, text=True, env={"PATH": str(tools)}
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sha256 verified" in out.stdout
    assert (cache / "big.run").read_bytes() == data
    assert served(plain_server["log"])[-1] == (200, 300_000)


@needs_tools
def test_mirror_sending_more_than_the_pin_without_a_length_is_cut(tmp_path, range_server):
    """No Content-Length (curl 7.68's --max-filesize cannot know): the bytes past the pinned
    size are what stops it, and nothing is kept."""
    handler = range_server["handler"]
    plain_send_header = handler.send_header

    def no_length(self, keyword, value):
        if keyword.lower() != "content-length":
            plain_send_header(self, keyword, value)

    handler.send_header = no_length
    data, cache = blob(200_000), tmp_path / "cache"
    (range_server["root"] / "big.run").write_bytes(data)
    cmd = artifacts.download_command(
        f"{range_server['url']}/big.run", hashlib.sha256(data[:1000]).hexdigest(), str(cache),
        "big.run", 1000,
    ).get_raw_value()  # fmt: skip
    out = sh(cmd)
    assert out.returncode != 0
    assert "the mirror sent more than the pinned 1000 bytes: deleted" in out.stderr, out.stderr
    assert not (cache / "big.run.part").exists() and not (cache / "big.run").exists()


def test_curl_and_wget_get_a_connect_timeout_a_stall_limit_and_the_pinned_size():
    cmd = artifacts.download_command("http://m/x.run", SUM, "/c", "x.run", 4096).get_raw_value()
    curl = next(part for part in cmd.split("& ") if "curl -fsSL" in part)
    wget = next(part for part in cmd.split("& ") if "wget -q" in part)
    for option in ("--connect-timeout 30", "--speed-limit 1024", "--speed-time 120"):
        assert option in curl, curl
    assert "--max-filesize 4096" in curl, curl
    assert "--connect-timeout=30" in wget and "--read-timeout=120" in wget, wget
    unsized = artifacts.download_command("http://m/x.run", SUM, "/c", "x.run").get_raw_value()
    assert "--max-filesize" not in unsized


@needs_tools
def test_a_stalled_mirror_keeps_the_part_to_resume(tmp_path):
    """A mirror that stops answering (curl 7: nothing listens) is not a .part that cannot be
    resumed: it is kept, not fetched whole."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    (cache / "big.run.part").write_bytes(b"y" * 1000)
    cmd = artifacts.download_command("http://127.0.0.1:9/big.run", SUM, str(cache), "big.run")
    out = sh(cmd.get_raw_value())
    assert out.returncode != 0 and "fetching it whole" not in out.stdout
    assert (cache / "big.run.part").read_bytes() == b"y" * 1000


@needs_tools
def test_another_run_holding_the_lock_is_refused_and_its_part_untouched(tmp_path, range_server):
    data, cache = blob(10_000), tmp_path / "cache"
    cmd = _cmd(range_server, cache, data)
    cache.mkdir(mode=0o755)
    (cache / "big.run.part").write_bytes(data[:10])
    holder = subprocess.Popen(["flock", str(cache / "big.run.lock"), "sleep", "30"])
    try:
        for _ in range(50):  # until the holder has it
            if sh(f"flock -n {cache}/big.run.lock true").returncode != 0:
                break
            __import__("time").sleep(0.05)
        out = sh(cmd)
    finally:
        holder.kill()
        holder.wait()
    assert out.returncode != 0
    assert "another p40fleet run is downloading big.run" in out.stderr
    assert served(range_server["log"]) == []
    assert (cache / "big.run.part").read_bytes() == data[:10] and not (cache / "big.run").exists()


@needs_tools
def test_progress_every_ten_percent_while_it_downloads(tmp_path, range_server):
    data, cache = blob(100_000), tmp_path / "cache"
    range_server["handler"].rate = 30_000  # ~3.3 s
    cmd = _cmd(range_server, cache, data)
    out = sh(cmd)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if " % (" in ln]
    percents = [int(ln.split(": ", 1)[1].split(" %")[0]) for ln in lines]
    assert len(percents) >= 3 and percents == sorted(percents), out.stdout
    assert f"of {len(data)} bytes" in lines[0]


@needs_tools
def test_world_writable_cache_dir_is_refused_by_the_command_itself(tmp_path, range_server):
    data, cache = blob(1000), tmp_path / "cache"
    cmd = _cmd(range_server, cache, data)
    cache.mkdir()
    cache.chmod(0o1777)
    out = sh(cmd)
    assert out.returncode != 0
    assert f"{cache} is owned by uid 0 with mode 1777" in out.stderr
    assert "chmod 0755" in out.stderr
    assert served(range_server["log"]) == []


# --- S7: owner and mode of the cache dir, the file and the marker --------------------------


def test_marker_not_owned_by_root_makes_fetch_hash_again():
    forged = ArtifactFile(
        size=10, mtime=5, marker_size=10, marker_mtime=5, marker_sha256=SUM, marker_uid=1000
    )
    assert not forged.verified(SUM)
    r = run_op(
        artifacts.fetch,
        url="http://x/y.run",
        sha256=SUM,
        dest_dir=CACHE,
        facts={ArtifactState: forged},
    )
    assert r.commands == ["function _stream"]
    assert "its marker is owned by uid 1000, not root" in r.logs[0]
    assert 'if [ -f "$f" ] && [ "$(sum "$f")" = "$want" ]' in script(r)


def test_group_writable_file_is_not_trusted_on_its_marker():
    state = ArtifactFile(
        size=10, mtime=5, marker_size=10, marker_mtime=5, marker_sha256=SUM, mode=0o664
    )
    assert not state.verified(SUM) and "mode 0664" in (state.untrusted or "")


def test_world_writable_cache_dir_refuses_the_host_with_cause_and_fix():
    state = ArtifactFile(
        size=10, mtime=5, marker_size=10, marker_mtime=5, marker_sha256=SUM, dir_mode=0o1777
    )
    r = run_op(
        artifacts.fetch,
        url="http://x/y.run",
        sha256=SUM,
        dest_dir="/tmp",
        facts={ArtifactState: state},
    )
    assert r.commands == ["function _fail"]
    (message,) = r.failures
    assert "download y.run" in message and "/tmp is mode 1777" in message
    assert "chown root:root /tmp && chmod 0755 /tmp" in message


def test_fact_reads_owner_and_mode_of_dir_file_and_marker(tmp_path):
    cache = tmp_path / "c"
    cache.mkdir(mode=0o755)
    f = cache / "y.run"
    f.write_bytes(b"x")
    st = f.stat()
    (cache / "y.run.verified").write_text(f"{st.st_size} {int(st.st_mtime)} {SUM}\n")
    state = fact_on_this_machine(ArtifactState, path=str(f))
    assert (state.dir_uid, state.dir_mode, state.uid) == (os.getuid(), 0o755, os.getuid())
    if os.getuid() != 0:
        pytest.skip("the rest needs root (chown)")
    assert state.verified(SUM)
    os.chown(cache / "y.run.verified", 1000, 1000)  # a forged marker of another account
    assert not fact_on_this_machine(ArtifactState, path=str(f)).verified(SUM)
    os.chown(cache / "y.run.verified", 0, 0)
    cache.chmod(0o1777)
    state = fact_on_this_machine(ArtifactState, path=str(f))
    assert not state.verified(SUM) and state.dir_problem == "mode 1777 (writable by others)"


def test_streamed_step_prints_output_and_keeps_the_operations_sudo():
    from pyinfra.api import StringCommand

    from p40fleet.operations.util import progress

    calls, logs = [], []

    class FakeHost:
        current_op_global_arguments = {"_sudo": True, "_sudo_user": None, "_serial": False}

        def run_shell_command(self, command, **kwargs):
            calls.append((command, kwargs))
            return True, []

        def log(self, message):
            logs.append(message)

    step = progress.streamed(StringCommand("echo", "hi"), "download x")
    assert step.execute(None, FakeHost(), {}) is True
    ((command, kwargs),) = calls
    assert command.get_raw_value() == "echo hi"
    assert kwargs == {"print_output": True, "_sudo": True, "_sudo_user": None}
    assert logs and logs[0].startswith("download x: done in ")


@pytest.mark.skipif(sh("command -v curl").returncode != 0, reason="needs curl")
def test_url_and_file_name_are_never_parsed_by_the_shell(tmp_path):
    """S5: a $(...), a backtick or a ; in the URL or the file name runs nothing (mismatch path)."""
    name = "a$(touch X)`touch Y`;touch Z.run"
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "a.run").write_text("not the pinned bytes\n")
    url = f"file://{tmp_path}/www/a.run?$(touch${{IFS}}U)"  # curl ignores a file:// query
    command = artifacts.download_command(url, SUM, str(tmp_path / "cache"), name)
    out = subprocess.run(
        ["sh", "-c", command.get_raw_value()], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode != 0
    assert f"sha256 mismatch for {name} (from file://" in out.stderr, out.stderr
    assert "a.run?$(touch${IFS}U)" in out.stderr
    assert not [n for n in ("X", "Y", "Z", "U") if (tmp_path / n).exists()]


# --- S7: a parent another account could rename ------------------------------------------


def test_cache_whose_parent_another_account_could_rename_refuses_the_host():
    state = ArtifactFile(
        size=10, mtime=5, marker_size=10, marker_mtime=5, marker_sha256=SUM,
        parent_problem="/data is owned by uid 2001, not root",
    )  # fmt: skip
    assert not state.verified(SUM)  # the marker is not believed either
    r = run_op(
        artifacts.fetch,
        url="http://x/y.run",
        sha256=SUM,
        dest_dir="/data/p40fleet-cache",
        facts={ArtifactState: state},
    )
    assert r.commands == ["function _fail"]
    (message,) = r.failures
    assert "download y.run" in message and "/data is owned by uid 2001, not root" in message
    assert "chown root:root /data && chmod go-w /data" in message
    assert "stack.paths.artifact_cache" in message


@pytest.mark.skipif(os.getuid() != 0, reason="needs root (chown to another uid)")
def test_parent_walk_for_real_names_the_parent_another_uid_owns(tmp_path):
    from p40fleet.facts.artifacts import UnsafeParent

    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    cache = data / "p40fleet-cache"
    cache.mkdir(parents=True)
    data.chmod(0o755)
    f = cache / "y.run"
    f.write_bytes(b"x")
    st = f.stat()
    (cache / "y.run.verified").write_text(f"{st.st_size} {int(st.st_mtime)} {SUM}\n")
    assert fact_on_this_machine(UnsafeParent, path=str(cache)) is None
    assert fact_on_this_machine(ArtifactState, path=str(f)).verified(SUM)
    # the review's S7b: root's cache, verified, inside a dir of uid 65534
    os.chown(data, 65534, 65534)
    want = f"{data} is owned by uid 65534, not root"
    assert fact_on_this_machine(UnsafeParent, path=str(cache)) == want
    assert fact_on_this_machine(UnsafeParent, path=str(cache / "not-made-yet")) == want
    state = fact_on_this_machine(ArtifactState, path=str(f))
    assert state.parent_problem == want and not state.verified(SUM)
    os.chown(data, 0, 0)
    # world-writable without the sticky bit: anyone renames; with it (like /tmp): safe
    data.chmod(0o777)
    assert fact_on_this_machine(UnsafeParent, path=str(cache)) == (
        f"{data} is mode 0777 (others can rename its entries)"
    )
    data.chmod(0o1777)
    assert fact_on_this_machine(UnsafeParent, path=str(cache)) is None
    # group-writable by a group other than root's
    data.chmod(0o775)
    os.chown(data, 0, 65534)
    assert "group 65534" in fact_on_this_machine(UnsafeParent, path=str(cache))
    os.chown(data, 0, 0)
    assert fact_on_this_machine(UnsafeParent, path=str(cache)) is None
    # a link on the way: its target's parents count, and a link of another uid is unsafe
    elsewhere = tmp_path / "disk"
    elsewhere.mkdir(mode=0o755)
    os.chown(elsewhere, 65534, 65534)
    (elsewhere / "cache").mkdir(mode=0o755)
    link = tmp_path / "via"
    link.symlink_to(elsewhere)
    assert fact_on_this_machine(UnsafeParent, path=f"{link}/cache") == (
        f"{elsewhere} is owned by uid 65534, not root"
    )
    os.chown(elsewhere, 0, 0)
    assert fact_on_this_machine(UnsafeParent, path=f"{link}/cache") is None
    os.lchown(link, 65534, 65534)
    assert fact_on_this_machine(UnsafeParent, path=f"{link}/cache") == (
        f"{link} is a symbolic link owned by uid 65534, not root"
    )
