"""stack.mirror.push_from_controller: artifacts uploaded from the controller's cache over SSH.

Facts in, commands out (tests/opharness.py) for the operation; the controller's fetch-once and
its sum check run for real (file:// URLs, ``$P40FLEET_CACHE`` in tmp); the host's staging and
check commands run for real in a tmp dir (the upload itself is pyinfra's: a copy here).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pyinfra.facts.files import Directory, File
from pyinfra.facts.server import TmpDir

from p40fleet import artifact_push
from p40fleet.artifact_push import PushError, controller_artifact, controller_copy
from p40fleet.facts.artifacts import ArtifactFile, ArtifactState
from p40fleet.facts.host import FreeSpace, FreeSpaceInfo
from p40fleet.mirror import fetch as mirror_fetch
from p40fleet.operations import artifacts
from p40fleet.spec import load_spec
from tests.opharness import at, make_host, run_op

CACHE = "/var/cache/p40fleet"
MIRROR = "http://10.231.0.1:8111/artifacts"
PUSHED = {"mirror": {"artifacts_url": MIRROR, "push_from_controller": True}}
SUM = "a" * 64


def space(free: int) -> FreeSpaceInfo:
    return FreeSpaceInfo(CACHE, "/var", "/", 10**12, free)


def staged(filename: str, cache: str = CACHE) -> str:
    return f"{cache}/.p40fleet-push/{filename}"


def absent_facts(filename: str, cache: str = CACHE) -> dict:
    """A host whose cache lacks ``filename`` (files.put asks for its staging path)."""
    return {
        ArtifactState: ArtifactFile(),
        FreeSpace: space(10**11),
        at(File, path=staged(filename, cache)): None,
        at(Directory, path=staged(filename, cache)): None,
        TmpDir: "/tmp",  # pyinfra's temp name for the upload (sudo: copied from there)
    }


def raw(result, index: int) -> str:
    return result.raw[index].get_raw_value()


@pytest.fixture
def controller(tmp_path, monkeypatch):
    """An empty controller cache; every download counted (and refused unless a test allows)."""
    monkeypatch.setenv("P40FLEET_CACHE", str(tmp_path / "controller"))
    calls: list[str] = []

    def counted(url, dest, sha256, **kwargs):
        calls.append(url)
        return mirror_fetch.fetch(url, dest, sha256, progress=False, **kwargs)

    monkeypatch.setattr(artifact_push, "fetch", counted)
    return calls


@pytest.fixture
def payload(tmp_path):
    src = tmp_path / "upstream" / "thing.run"
    src.parent.mkdir()
    src.write_bytes(b"#!/bin/sh\necho payload\n" * 1000)
    return src, hashlib.sha256(src.read_bytes()).hexdigest()


# --- the operation: facts in, commands out ---------------------------------------------------


def test_off_by_default_the_host_downloads_and_nothing_is_uploaded():
    spec = load_spec("lab1", {"mirror": {"artifacts_url": MIRROR}})
    assert spec.mirror.push_from_controller is False
    r = run_op(
        artifacts.artifact,
        item="cudnn",
        spec=spec,
        facts={ArtifactState: ArtifactFile(), FreeSpace: space(10**11)},
    )
    assert r.commands == ["function _stream"]
    assert not r.uploads and not any("upload" in c for c in r.commands)


def test_on_uploads_the_controllers_copy_to_roots_staging_dir_then_the_host_checks_and_renames():
    spec = load_spec("lab1", PUSHED)
    name = spec.cudnn.filename
    r = run_op(artifacts.artifact, item="cudnn", spec=spec, facts=absent_facts(name))
    assert r.commands == [
        "function _controller_copy",  # the controller's verified copy (once per run)
        raw(r, 1),
        f"upload {staged(name)}",
        raw(r, 3),
    ]
    prepare, install = raw(r, 1), raw(r, 3)
    # nothing downloaded by the host, from anywhere
    assert "curl" not in prepare + install and "wget" not in prepare + install
    assert "_stream" not in " ".join(r.commands)
    # the upload is the controller cache's file, into root's 0700 dir inside the cache
    upload = r.raw[2]
    assert upload.src == str(controller_artifact(name))
    assert f"s={CACHE}/.p40fleet-push;" in prepare and 'mkdir -p -m 0700 "$s"' in prepare
    assert 'if [ -L "$s" ]' in prepare  # a link standing there is removed, never followed
    # the host's own check: under the lock, the pinned sum, then rename and marker
    assert f"want={spec.cudnn.sha256};" in install and f"t={staged(name)};" in install
    assert install.index("flock -n 9") < install.index("sha256sum") < install.index('mv -f "$t"')
    assert install.index('mv -f "$t" "$f"') < install.index('> "$m.tmp"')


def test_on_and_already_there_is_a_noop_nothing_fetched_or_uploaded(controller, monkeypatch):
    spec = load_spec("lab1", PUSHED)
    good = ArtifactFile(size=10, mtime=5, marker_size=10, marker_mtime=5,
                        marker_sha256=spec.cuda.sha256)  # fmt: skip
    monkeypatch.setattr(artifacts, "controller_copy_once", _never)
    r = run_op(artifacts.artifact, item="cuda", spec=spec, facts={ArtifactState: good})
    assert r.commands == [] and r.raw == []
    assert "verified" in r.noops[0] and "not pushed" in r.noops[0]
    path = f"{CACHE}/{spec.cuda.filename}"
    assert r.facts_asked == [f"ArtifactState(path='{path}')"]  # the survey's one fact
    assert controller == []


def _never(*args, **kwargs):
    raise AssertionError("the controller was asked for a copy")


def test_planning_and_dry_run_never_download(controller, monkeypatch):
    """The body runs at planning (and --dry) and again at execution: only the executed
    FunctionCommand fetches."""
    spec = load_spec("lab1", PUSHED)
    monkeypatch.setattr(artifacts, "controller_copy_once", _never)
    for _ in range(2):
        r = run_op(artifacts.artifact, item="driver", spec=spec,
                   facts=absent_facts(spec.driver.filename))  # fmt: skip
        assert r.commands[0] == "function _controller_copy"
    assert controller == []


def test_unsafe_cache_and_too_little_room_refuse_before_any_fetch(controller):
    spec = load_spec("lab1", PUSHED)
    bad = ArtifactFile(dir_uid=1000)
    r = run_op(artifacts.artifact, item="cuda", spec=spec, facts={ArtifactState: bad})
    assert r.commands == ["function _fail"] and "owned by uid 1000" in r.failures[0]
    r = run_op(artifacts.artifact, item="cuda", spec=spec,
               facts={ArtifactState: ArtifactFile(), FreeSpace: space(1000)})  # fmt: skip
    assert r.commands == ["function _fail"] and "not enough free space" in r.failures[0]


def _guarded(op, state: ArtifactFile, free: int = 10**11):
    """``op`` (fetch or push) of ``thing.run`` on a host whose cache holds ``state``."""
    facts = absent_facts("thing.run") | {ArtifactState: state, FreeSpace: space(free)}
    kw = {"url": f"{MIRROR}/thing.run", "sha256": SUM, "dest_dir": CACHE, "filename": "thing.run"}
    return run_op(op, facts=facts, size=1000, **kw)


def test_fetch_and_push_make_the_same_checks_first_each_in_its_own_words(controller):
    """Unsafe cache, too little room: the same refusal; verified: a noop; there but untrusted:
    a log line saying what the operation does about it."""
    fetch, push = artifacts.fetch, artifacts.push
    for state, free, why in (
        (ArtifactFile(dir_uid=1000), 10**11, "is owned by uid 1000, not root"),
        (
            ArtifactFile(parent_problem="/var is group-writable"),
            10**11,
            "which root then runs (S7)",
        ),
        (ArtifactFile(), 10, "not enough free space for thing.run"),
    ):
        f, p = _guarded(fetch, state, free), _guarded(push, state, free)
        assert f.commands == p.commands == ["function _fail"] and f.failures == p.failures
        assert f.failures[0].startswith("host lab1: download thing.run: ")
        assert why in f.failures[0]
    good = ArtifactFile(size=10, mtime=5, marker_size=10, marker_mtime=5, marker_sha256=SUM)
    verified = f"thing.run is in {CACHE}, verified (sha256 {SUM[:12]}…)"
    assert _guarded(fetch, good).noops == [verified]
    assert _guarded(push, good).noops == [verified + ": not pushed"]
    assert controller == []
    hand_copied = ArtifactFile(size=1000, mtime=5)  # no marker
    untrusted = "thing.run: no valid verified marker: "
    assert _guarded(fetch, hand_copied).logs == [untrusted + "checking its sha256 once"]
    assert _guarded(push, hand_copied).logs == [
        untrusted + "replaced by the controller's verified copy"
    ]


# --- the controller's copy: fetched once per run, sha256-checked before any upload ------------


def _execute(result, state, host) -> bool:
    (fn,) = [f for f in result.functions if f.function.__name__ == "_controller_copy"]
    return fn.function(state, host)


def test_controller_fetches_once_for_n_hosts_and_checks_the_sum(controller, payload, monkeypatch):
    src, digest = payload
    url = f"file://{src}"
    slow = artifact_push.fetch

    def slower(*args, **kwargs):  # hosts run in parallel: the others wait for this one
        time.sleep(0.2)
        return slow(*args, **kwargs)

    monkeypatch.setattr(artifact_push, "fetch", slower)
    hashed: list[object] = []
    real_sum = artifact_push.sha256_file
    monkeypatch.setattr(artifact_push, "sha256_file", lambda p: hashed.append(p) or real_sum(p))
    hosts = ["lab1", "lab2", "lab3"]
    results = {
        name: run_op(artifacts.push, url=url, sha256=digest, dest_dir=CACHE,
                     filename="thing.run", facts=absent_facts("thing.run"), host_name=name)
        for name in hosts
    }  # fmt: skip
    state, _ = make_host()
    oks: dict[str, bool] = {}
    threads = [
        threading.Thread(target=lambda n=n: oks.__setitem__(n, _execute(results[n], state,
                                                                        make_host(name=n)[1])))
        for n in hosts
    ]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert oks == dict.fromkeys(hosts, True)
    assert controller == [url]  # one fetch for the three hosts
    assert len(hashed) == 1  # and one check of the controller's copy, not one per host
    copy = controller_artifact("thing.run")
    assert copy.read_bytes() == src.read_bytes()
    # the next run: the controller's copy is there (hashed again, not fetched)
    next_run, host = make_host()
    assert _execute(results["lab1"], next_run, host) is True
    assert controller == [url] and len(hashed) == 2


def test_wrong_sum_fetched_by_the_controller_is_refused_naming_file_sums_and_fix(
    controller, payload
):
    src, digest = payload
    with pytest.raises(PushError) as exc:
        controller_copy(f"file://{src}", SUM, "thing.run")
    text = str(exc.value)
    assert "thing.run" in text and f"sha256 {digest}, expected {SUM}" in text
    assert "fix:" in text and "correct the sha256" in text
    assert not controller_artifact("thing.run").exists()  # never kept, so never uploaded
    assert not Path(f"{controller_artifact('thing.run')}.part").exists()


def test_wrong_sum_of_a_copy_already_on_the_controller_fails_the_step_not_uploaded(
    controller, payload
):
    src, digest = payload
    copy = controller_artifact("thing.run")
    copy.parent.mkdir(parents=True)
    copy.write_bytes(b"not the file")
    got = hashlib.sha256(b"not the file").hexdigest()
    r = run_op(artifacts.push, url=f"file://{src}", sha256=digest, dest_dir=CACHE,
               filename="thing.run", facts=absent_facts("thing.run"))  # fmt: skip
    state, host = make_host()
    logs: list[str] = []
    host.log_styled = lambda message, **_: logs.append(message)
    assert _execute(r, state, host) is False  # pyinfra: the host fails here, before the upload
    (line,) = logs
    assert line.startswith("host lab1: push thing.run: ") and str(copy) in line
    assert f"has sha256 {got}, expected {digest}" in line and "fix: delete" in line
    assert controller == []  # a file put there by hand is never overwritten silently
    assert copy.read_bytes() == b"not the file"


def test_a_copy_put_on_the_controller_by_hand_is_used_without_any_fetch(controller, payload):
    src, digest = payload
    copy = controller_artifact("thing.run")
    copy.parent.mkdir(parents=True)
    shutil.copyfile(src, copy)
    assert controller_copy("http://nowhere.invalid/thing.run", digest, "thing.run") == copy
    assert controller == []


def test_controller_cannot_fetch_names_url_and_fix(controller, tmp_path):
    with pytest.raises(PushError) as exc:
        controller_copy(f"file://{tmp_path}/missing.run", SUM, "missing.run")
    text = str(exc.value)
    assert "missing.run: the controller could not fetch it" in text
    assert "fix: make file://" in text and f"put the file (sha256 {SUM}) at " in text


# --- the host's side, run for real -----------------------------------------------------------


def sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the cache must be root's")


def _host_side(
    tmp_path: Path, content: bytes, digest: str
) -> tuple[str, subprocess.CompletedProcess]:
    cache = str(tmp_path / "hostcache")
    r = run_op(artifacts.push, url="http://x/thing.run", sha256=digest, dest_dir=cache,
               filename="thing.run", facts=absent_facts("thing.run", cache))  # fmt: skip
    prepared = sh(raw(r, 1))
    assert prepared.returncode == 0, prepared.stderr
    assert oct(os.stat(f"{cache}/.p40fleet-push").st_mode & 0o777) == "0o700"
    Path(r.raw[2].dest).write_bytes(content)  # what pyinfra's upload does
    return cache, sh(raw(r, 3))


@needs_root
def test_host_checks_the_upload_renames_it_and_marks_it_verified(tmp_path, payload):
    src, digest = payload
    cache, out = _host_side(tmp_path, src.read_bytes(), digest)
    assert out.returncode == 0, out.stderr
    assert "sha256 verified on this host" in out.stdout
    assert os.listdir(f"{cache}/.p40fleet-push") == []
    fact = ArtifactState()
    state = fact.process(sh(fact.command(f"{cache}/thing.run")).stdout.splitlines())
    assert state.verified(digest)  # the next run is a no-op


@needs_root
def test_host_refuses_an_upload_with_the_wrong_sum_and_deletes_it(tmp_path, payload):
    src, digest = payload
    cache, out = _host_side(tmp_path, b"cut short", digest)
    got = hashlib.sha256(b"cut short").hexdigest()
    assert out.returncode == 1
    assert f"sha256 mismatch for thing.run uploaded from the controller: expected {digest}, " \
           f"got {got}" in out.stderr and "Remedy:" in out.stderr  # fmt: skip
    assert not os.path.exists(f"{cache}/thing.run")
    assert os.listdir(f"{cache}/.p40fleet-push") == []


@needs_root
def test_staging_never_writes_through_a_link(tmp_path):
    cache = tmp_path / "hostcache"
    cache.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (cache / ".p40fleet-push").symlink_to(target)
    out = sh(artifacts.staging_command(str(cache)).get_raw_value())
    assert out.returncode == 0, out.stderr
    assert not (cache / ".p40fleet-push").is_symlink() and (cache / ".p40fleet-push").is_dir()
    assert target.is_dir()  # the link was removed, its target untouched


def test_the_deploy_steps_do_not_load_the_mirror_builder():
    """Every run imports the four steps; the push needs ``p40fleet.mirror.fetch`` only, and the
    builder (with its apt repository code) is ~10 ms of controller CPU a run does not use."""
    steps = ", ".join(
        f"p40fleet.deploys.steps.{name}" for name in ("preflight", "system", "python", "training")
    )
    probe = (
        f"import sys, {steps}\n"
        "print(sorted(m for m in sys.modules if m.startswith('p40fleet.mirror')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert "p40fleet.mirror.fetch" in loaded
    assert "p40fleet.mirror.build" not in loaded and "p40fleet.mirror.apt" not in loaded, loaded
