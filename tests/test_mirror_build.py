"""p40fleet.mirror: build from an upstream, a second build fetches nothing, verify names what is
wrong, a file with the wrong sum never lands, serve answers ranges (issue 27).

"Upstream" is a local HTTP server (p40fleet's own mirror server on a temp dir, counting
requests in its access log) holding small files whose sha256 the tests pin.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
import urllib.request
from functools import partial
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from p40fleet.mirror.build import MirrorError, Need, build, merge, needs_for, stack_block
from p40fleet.mirror.manifest import verify
from p40fleet.mirror.serve import RangeFileHandler
from p40fleet.spec.pins import StackSpec

REPO = Path(__file__).resolve().parent.parent


def _sum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def upstream(tmp_path):
    """A PEP 503 index and artifact files on a local server; ``requests()`` reads its log."""
    root = tmp_path / "upstream"
    (root / "files").mkdir(parents=True)
    log = tmp_path / "access.log"
    blobs = {
        "driver.run": b"#!/bin/sh\necho driver\n" * 100,
        "demo_pkg-1.0-py3-none-any.whl": b"PK wheel bytes",
        "demo_pkg-2.0-py3-none-any.whl": b"PK another version",
    }
    for name, data in blobs.items():
        (root / "files" / name).write_bytes(data)
    page = root / "simple" / "demo-pkg"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        "".join(
            f'<a href="../../files/{n}#sha256={_sum(blobs[n])}">{n}</a>\n'
            for n in blobs
            if n.endswith(".whl")
        )  # fmt: skip
    )
    handler = type("H", (RangeFileHandler,), {"access_log": log})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def requests() -> list[str]:  # the server logs a request after its response: let it
        seen, stable = None, 0
        while stable < 3:
            time.sleep(0.05)
            now = log.read_text().splitlines() if log.exists() else []
            stable = stable + 1 if now == seen else 0
            seen = now
        return seen

    yield {"base": base, "blobs": blobs, "root": root, "requests": requests}
    server.shutdown()


def _needs(up, repo: Path | None = None) -> list[Need]:
    blobs = up["blobs"]
    needs = [
        Need("artifact", "driver.run", f"{up['base']}/files/driver.run",
             (_sum(blobs["driver.run"]),), len(blobs["driver.run"])),
        Need("wheel", "demo-pkg==1.0", hashes=(_sum(blobs["demo_pkg-1.0-py3-none-any.whl"]),)),
    ]  # fmt: skip
    if repo is not None:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True).stdout.strip()  # fmt: skip
        needs.append(Need("git", "verl", str(repo), commit=commit))
    return needs


@pytest.fixture
def repo(tmp_path):
    path = tmp_path / "verl-upstream"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(path)]
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "setup.py").write_text("# verl\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "v0.5.0"], check=True)
    return path


def test_build_fetches_each_file_once_and_a_second_build_fetches_nothing(tmp_path, upstream, repo):
    mirror = tmp_path / "mirror"
    first = build(mirror, _needs(upstream, repo), indexes=[f"{upstream['base']}/simple"],
                  progress=False)  # fmt: skip
    assert first.fetched["artifact"] == (1, len(upstream["blobs"]["driver.run"]))
    assert first.fetched["wheel"][0] == 1 and first.fetched["git"][0] == 1
    gets = [r for r in upstream["requests"]() if " GET /files/" in r]
    assert len(gets) == 2, gets  # the artifact and the wheel, once each
    manifest = json.loads((mirror / "manifest.json").read_text())
    kinds = sorted((e["kind"], e["path"]) for e in manifest["files"])
    assert kinds == [("artifact", "artifacts/driver.run"), ("git", "git/verl.git"),
                     ("wheel", "simple/demo-pkg/demo_pkg-1.0-py3-none-any.whl")]  # fmt: skip
    wheel = next(e for e in manifest["files"] if e["kind"] == "wheel")
    assert wheel["url"].endswith("/files/demo_pkg-1.0-py3-none-any.whl")
    assert wheel["size"] == len(upstream["blobs"]["demo_pkg-1.0-py3-none-any.whl"])
    # a PEP 503 page pip can read: the file and its sum, nothing the lock does not name
    page = (mirror / "simple/demo-pkg/index.html").read_text()
    assert "demo_pkg-1.0-py3-none-any.whl#sha256=" in page and "2.0" not in page
    assert (mirror / "git/verl.git/info/refs").is_file()  # served as dumb HTTP

    before = len(upstream["requests"]())
    again = build(mirror, _needs(upstream, repo), indexes=[f"{upstream['base']}/simple"],
                  progress=False)  # fmt: skip
    assert again.fetched == {}
    assert len(upstream["requests"]()) == before  # not even an index page
    assert verify(mirror) == ([], 3)


def test_verify_names_a_flipped_byte_and_a_missing_file(tmp_path, upstream, repo):
    mirror = tmp_path / "mirror"
    build(mirror, _needs(upstream, repo), indexes=[f"{upstream['base']}/simple"], progress=False)
    artifact = mirror / "artifacts/driver.run"
    data = bytearray(artifact.read_bytes())
    data[10] ^= 1
    artifact.write_bytes(bytes(data))
    (mirror / "simple/demo-pkg/demo_pkg-1.0-py3-none-any.whl").unlink()
    problems, checked = verify(mirror)
    assert checked == 3
    assert len(problems) == 2, problems
    assert problems[0].startswith("artifacts/driver.run: sha256 ")
    assert "missing (wheel demo-pkg==1.0)" in problems[1]
    cli = subprocess.run([sys.executable, "-m", "p40fleet.mirror", "verify", str(mirror)],
                         capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "FAIL artifacts/driver.run: sha256" in cli.stdout and "2 problem(s)" in cli.stdout
    # a build repairs both (the record no longer matches: fetched again)
    build(mirror, _needs(upstream, repo), indexes=[f"{upstream['base']}/simple"], progress=False)
    assert verify(mirror) == ([], 3)


def test_a_file_with_another_sum_never_lands_and_the_rest_is_still_fetched(tmp_path, upstream):
    mirror = tmp_path / "mirror"
    wrong = Need("artifact", "driver.run", f"{upstream['base']}/files/driver.run", ("0" * 64,))
    unknown = Need("wheel", "demo-pkg==3.0", hashes=("1" * 64,))
    good = _needs(upstream)[1]
    with pytest.raises(MirrorError) as caught:
        build(mirror, [wrong, unknown, good], indexes=[f"{upstream['base']}/simple"],
              progress=False)  # fmt: skip
    message = str(caught.value)
    assert "artifact driver.run:" in message and "is not the pinned " + "0" * 64 in message
    assert "wheel demo-pkg==3.0: no index serves a file with the lock's sha256" in message
    assert not (mirror / "artifacts/driver.run").exists()
    assert not list(mirror.rglob("*.part"))
    assert (mirror / "simple/demo-pkg/demo_pkg-1.0-py3-none-any.whl").is_file()


def test_a_git_mirror_without_the_pinned_commit_is_refused(tmp_path, repo):
    need = Need("git", "verl", str(repo), commit="f" * 40)
    with pytest.raises(MirrorError, match=f"has no commit {'f' * 40}"):
        build(tmp_path / "mirror", [need], progress=False)
    assert not (tmp_path / "mirror/git/verl.git").exists()


def test_an_interrupted_download_resumes_with_a_range(tmp_path, upstream):
    mirror = tmp_path / "mirror"
    need = _needs(upstream)[0]
    data = upstream["blobs"]["driver.run"]
    part = mirror / "artifacts/driver.run.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:1000])
    result = build(mirror, [need], progress=False)
    assert result.fetched["artifact"] == (1, len(data) - 1000)
    assert (mirror / "artifacts/driver.run").read_bytes() == data
    assert any(" 206 " in r for r in upstream["requests"]())


def test_serve_answers_a_range_with_the_right_type(tmp_path, upstream):
    url = f"{upstream['base']}/files/demo_pkg-1.0-py3-none-any.whl"
    request = urllib.request.Request(url, headers={"Range": "bytes=3-"})
    with urllib.request.urlopen(request) as response:
        assert response.status == 206
        assert response.headers["Content-Type"] == "application/zip"
        assert response.read() == upstream["blobs"]["demo_pkg-1.0-py3-none-any.whl"][3:]


def test_needs_of_the_default_spec_are_the_hosts_pins_and_locks():
    """The real default: 4 artifacts by their pins, every torch-lock line the default installs
    (22: no torchvision/torchaudio) and every verl lock line, verl and Apex by commit."""
    spec = StackSpec()
    needs = needs_for(spec)
    kinds = {k: [n for n in needs if n.kind == k] for k in ("artifact", "wheel", "git")}
    assert [n.name for n in kinds["artifact"]] == [
        spec.driver.filename,
        spec.cuda.filename,
        spec.cudnn.filename,
        spec.miniconda.filename,
    ]
    assert kinds["artifact"][0].hashes == (spec.driver.sha256,)
    assert kinds["artifact"][0].url == str(spec.driver.url)  # upstream, not a mirror
    names = {n.name for n in kinds["wheel"]}
    assert "torch==2.6.0+cu118" in names and not any(n.startswith("torchvision") for n in names)
    assert "ray==2.48.0" in names or any(n.startswith("ray==") for n in names)
    assert all(n.hashes for n in kinds["wheel"])
    assert {(n.name, n.commit) for n in kinds["git"]} == {
        ("apex", spec.apex.commit),
        ("verl", spec.verl.commit),
    }
    assert merge(needs + needs) == merge(needs)


def test_two_specs_pinning_one_file_differently_are_refused():
    a = Need("artifact", "x.run", "http://u/x.run", ("a" * 64,))
    b = Need("artifact", "x.run", "http://u/x.run", ("b" * 64,))
    with pytest.raises(MirrorError, match="artifact x.run: pinned as"):
        merge([a, b])


def test_the_stack_block_points_a_fleet_at_the_mirror():
    from p40fleet.spec.load import load_spec

    block = stack_block("http://10.0.0.5:8111/")
    spec = load_spec("h", {"mirror": block})
    assert spec.artifact_url("driver") == f"http://10.0.0.5:8111/artifacts/{spec.driver.filename}"
    assert spec.git_remote("verl") == "http://10.0.0.5:8111/git/verl.git"
