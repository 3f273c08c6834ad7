"""operations.artifacts: facts in, commands out; the download script run for real (file://)."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from facts.host import FreeSpace, FreeSpaceInfo
from facts.system import ArtifactFile, ArtifactState
from operations import artifacts
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


def test_absent_downloads_from_the_mirror_to_part_then_renames_and_marks():
    spec = load_spec("lab1", {"mirror": {"artifacts_url": MIRROR}})
    r = run_op(
        artifacts.artifact,
        item="cuda",
        spec=spec,
        facts={ArtifactState: ArtifactFile(), FreeSpace: space(10**11)},
    )
    f = f"{CACHE}/cuda_11.8.0_520.61.05_linux.run"
    assert r.commands[0] == f"mkdir -p {CACHE}"
    download = r.commands[1]
    assert f"curl -fsSL --retry 3 -o {f}.part {MIRROR}/cuda_11.8.0_520.61.05_linux.run" in download
    assert f"sha256sum {f}.part" in download and spec.cuda.sha256 in download
    assert "| sh" not in download
    assert r.commands[2] == f"mv -f {f}.part {f}"
    assert f"> {f}.verified.tmp" in r.commands[3] and spec.cuda.sha256 in r.commands[3]


def test_no_mirror_means_upstream_url():
    spec = load_spec("lab1", {})
    r = run_op(
        artifacts.artifact,
        item="driver",
        spec=spec,
        facts={ArtifactState: ArtifactFile(), FreeSpace: space(10**11)},
    )
    assert spec.driver.url in r.commands[1]


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
    assert r.commands[1].startswith(f'if [ "$(sha256sum {CACHE}/y.run')
    assert "curl -fsSL --retry 3" in r.commands[1]
    assert r.commands[-1].endswith(f"{CACHE}/y.run.verified")


@pytest.fixture
def payload(tmp_path):
    src = tmp_path / "mirror" / "thing.run"
    src.parent.mkdir()
    src.write_bytes(b"#!/bin/sh\necho payload\n" * 100)
    return src, hashlib.sha256(src.read_bytes()).hexdigest()


def _run_all(result) -> subprocess.CompletedProcess:
    out = None
    for command in result.commands:
        out = sh(command)
        if out.returncode != 0:
            return out
    return out


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
    assert sorted(os.listdir(cache)) == ["thing.run", "thing.run.verified"]
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
    assert os.listdir(cache) == []
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


@pytest.mark.skipif(sh("command -v curl").returncode != 0, reason="needs curl")
def test_url_and_file_name_are_never_parsed_by_the_shell(tmp_path):
    """S5: a $(...), a backtick or a ; in the URL or the file name runs nothing (mismatch path)."""
    name = "a$(touch X)`touch Y`;touch Z.run"
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "a.run").write_text("not the pinned bytes\n")
    r = run_op(
        artifacts.fetch,
        url=f"file://{tmp_path}/www/a.run?$(touch${{IFS}}U)",  # curl ignores a file:// query
        sha256=SUM,
        dest_dir=str(tmp_path / "cache"),
        filename=name,
        facts={ArtifactState: ArtifactFile()},
    )
    for command in r.commands:  # as pyinfra runs them: up to the first that fails
        out = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True)
        if out.returncode != 0:
            break
    assert out.returncode != 0
    assert f"sha256 mismatch for {name} (from file://" in out.stderr, out.stderr
    assert "a.run?$(touch${IFS}U)" in out.stderr
    assert not [n for n in ("X", "Y", "Z", "U") if (tmp_path / n).exists()]
