"""p40fleet.mirror's conda part: every file of the env's explicit lock, checked against the
lock line's sum (sha256, or md5 where that is all the line has), under ``DIR/conda/SUBDIR/FILE``,
which is where ``condalock.render`` moves the lock's URLs when ``conda_channel`` is
``BASE/conda`` (issue 27).

"Upstream" is a conda channel of the lab's package files (``p40lab.sim_stack``) on a local HTTP
server that logs each request: anaconda.org is not reachable from here. The proof that matters
is the last test: the Miniconda double's ``conda create --file`` of the rendered lock, with the
upstream shut down, gets every file from the mirror and checks it as conda does.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
import urllib.request
from functools import partial
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from p40fleet import condalock, preflight
from p40fleet.mirror.build import (
    MirrorError,
    Need,
    build,
    conda_needs,
    merge,
    needs_for,
    stack_block,
)
from p40fleet.mirror.manifest import verify
from p40fleet.mirror.serve import RangeFileHandler
from p40fleet.spec.load import load_spec
from p40fleet.spec.pins import StackSpec
from p40lab.sim_stack import build_conda_channel, conda_lock_text

PY = "3.11.2"  # the lab lock's python; the spec below pins it
PYTHON = f"linux-64/python-{PY}-h0_0_cpython.tar.bz2"
TZDATA = "noarch/tzdata-2024a-p40lab_0.tar.bz2"


def _gets(log: Path, under: str = "/") -> list[str]:
    """The GETs of ``under`` in an access log, once it stops growing: the server logs a
    request after its response, so a client can be done before its line is written."""
    seen, stable = None, 0
    while stable < 3:
        time.sleep(0.05)
        now = log.read_text().splitlines() if log.exists() else []
        stable = stable + 1 if now == seen else 0
        seen = now
    return [line for line in seen if f" GET {under}" in line]


def _serve(root: Path, log: Path | None = None):
    handler = type("H", (RangeFileHandler,), {"access_log": log})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def upstream(tmp_path):
    """The lab's conda channel at ``BASE/conda-forge`` and a lock naming its files there."""
    root = tmp_path / "upstream"
    build_conda_channel(root / "conda-forge", PY)
    log = tmp_path / "access.log"
    server, base = _serve(root, log)

    channel = f"{base}/conda-forge"
    yield {"server": server, "channel": channel, "root": root / "conda-forge",
           "gets": partial(_gets, log),
           "lock": conda_lock_text(PY, channel)}  # fmt: skip
    server.shutdown()


@pytest.fixture
def spec(tmp_path, upstream, monkeypatch):
    """A spec pinning the lab lock's python, whose conda lock is ``tmp_path/lock.txt``."""
    lock = tmp_path / "lock.txt"
    lock.write_text(upstream["lock"])
    monkeypatch.setattr(preflight, "conda_lock_path", lambda spec: lock)
    return load_spec("h", {"python_version": PY})


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_default_specs_conda_needs_are_its_lock_files_by_their_sha256():
    """The real default: every line of files/conda-env-v0.5.0.txt (python 3.10.12 and its
    closure, conda-forge's URLs), each with the line's sha256; --conda-upstream moves only
    where they are fetched from."""
    spec = StackSpec()
    lock = condalock.parse(preflight.conda_lock_path(spec).read_text())
    needs = [n for n in needs_for(spec) if n.kind == "conda"]
    assert len(needs) == len(lock) == 24
    assert [(n.name, n.url, n.hashes, n.md5) for n in needs] == [
        (f"{p.subdir}/{p.filename}", p.url, (p.sha256,), None) for p in lock
    ]
    assert "linux-64/python-3.10.12-hd12c33a_0_cpython.conda" in {n.name for n in needs}
    assert needs[0].url.startswith("https://conda.anaconda.org/conda-forge/linux-64/")
    moved = conda_needs(spec, "http://forge.lan/cf/")
    assert moved[0].url == f"http://forge.lan/cf/linux-64/{lock[0].filename}"
    assert [n.hashes for n in moved] == [n.hashes for n in needs]


def test_a_lock_conda_would_not_take_stops_the_build_naming_it(tmp_path, monkeypatch):
    lock = tmp_path / "lock.txt"
    lock.write_text("@EXPLICIT\nhttps://c.org/cf/linux-64/python-3.10.12-h_0.conda\n")
    monkeypatch.setattr(preflight, "conda_lock_path", lambda spec: lock)
    with pytest.raises(MirrorError, match="lock.txt: python-3.10.12-h_0.conda has no sum"):
        conda_needs(StackSpec())


def test_two_locks_naming_one_file_with_other_md5s_are_refused():
    """One mirror path, two sums (md5-only lines: no sha256 to tell them apart)."""
    url = "https://conda.anaconda.org/cf/linux-64/x-1-h_0.conda"
    a = Need("conda", "linux-64/x-1-h_0.conda", url, md5="a" * 32)
    with pytest.raises(MirrorError, match="conda linux-64/x-1-h_0.conda: pinned as"):
        merge([a, Need("conda", a.name, url, md5="b" * 32)])
    assert merge([a, Need("conda", a.name, url, md5="a" * 32)]) == [a]


def test_build_fetches_the_lock_into_the_channel_layout_once(tmp_path, upstream, spec):
    mirror = tmp_path / "mirror"
    needs = conda_needs(spec)
    first = build(mirror, needs, progress=False)
    files = {name: (upstream["root"] / name).read_bytes() for name in (PYTHON, TZDATA)}
    assert first.fetched["conda"] == (2, sum(len(d) for d in files.values()))
    assert len(upstream["gets"]()) == 2
    entries = {e["path"]: e for e in json.loads((mirror / "manifest.json").read_text())["files"]}
    for name, data in files.items():
        entry = entries[f"conda/{name}"]
        assert (entry["kind"], entry["name"]) == ("conda", name.split("/")[1])
        assert (entry["sha256"], entry["size"]) == (_sha(data), len(data))
        assert entry["url"] == f"{upstream['channel']}/{name}"
        assert (mirror / "conda" / name).read_bytes() == data
    assert verify(mirror) == ([], 2)
    # a second build: every file hashed again, nothing fetched
    second = build(mirror, needs, progress=False)
    assert "conda" not in second.fetched and len(upstream["gets"]()) == 2
    assert stack_block("http://10.0.0.5:8111/", conda=True)["conda_channel"] == (
        "http://10.0.0.5:8111/conda"
    )


def test_a_corrupt_download_is_refused_naming_the_file_and_the_rest_is_fetched(
    tmp_path, upstream, spec
):
    tz = upstream["root"] / TZDATA
    good = tz.read_bytes()
    tz.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # upstream serves another file
    mirror = tmp_path / "mirror"
    with pytest.raises(MirrorError) as caught:
        build(mirror, conda_needs(spec), progress=False)
    message = str(caught.value)
    assert f"conda {TZDATA}: " in message
    assert f"sha256 {_sha(tz.read_bytes())} is not the pinned {_sha(good)}: not kept" in message
    assert not (mirror / "conda" / TZDATA).exists()
    assert not list((mirror / "conda/noarch").glob("*.part"))
    assert (mirror / "conda" / PYTHON).is_file()
    assert [e.path for e in caught.value.result.manifest.entries.values()] == [f"conda/{PYTHON}"]
    # fixed upstream: the next build fetches only what is missing
    tz.write_bytes(good)
    again = build(mirror, conda_needs(spec), progress=False)
    assert again.fetched["conda"] == (1, len(good))


def test_an_md5_only_line_is_checked_by_its_md5(tmp_path, upstream, spec):
    """A lock of ``conda list --explicit --md5``: the line's md5 decides; the manifest still
    records the file's sha256 (what verify hashes)."""
    data = (upstream["root"] / PYTHON).read_bytes()
    lock = preflight.conda_lock_path(spec)
    lock.write_text(upstream["lock"].replace(f"#sha256:{_sha(data)}",
                                             f"#{hashlib.md5(data).hexdigest()}"))  # fmt: skip
    mirror = tmp_path / "mirror"
    result = build(mirror, conda_needs(spec), progress=False)
    assert result.manifest.entries[f"conda/{PYTHON}"].sha256 == _sha(data)
    assert build(mirror, conda_needs(spec), progress=False).fetched == {}
    wrong = "f" * 32
    lock.write_text(upstream["lock"].replace(f"#sha256:{_sha(data)}", f"#{wrong}"))
    (mirror / "conda" / PYTHON).unlink()
    with pytest.raises(MirrorError, match=f"conda {PYTHON}: .* md5 [0-9a-f]{{32}} is not the "
                                          f"pinned {wrong}"):  # fmt: skip
        build(mirror, conda_needs(spec), progress=False)
    assert not (mirror / "conda" / PYTHON).exists()


def test_verify_names_a_flipped_byte_and_a_missing_conda_file(tmp_path, upstream, spec):
    mirror = tmp_path / "mirror"
    build(mirror, conda_needs(spec), progress=False)
    python = mirror / "conda" / PYTHON
    data = bytearray(python.read_bytes())
    data[100] ^= 0xFF
    python.write_bytes(bytes(data))
    (mirror / "conda" / TZDATA).unlink()
    problems, checked = verify(mirror)
    assert checked == 2
    assert problems[0].startswith(f"conda/{PYTHON}: sha256 ")
    assert problems[1] == f"conda/{TZDATA}: missing (conda {TZDATA.split('/')[1]})"


def test_the_cli_prints_the_conda_channel_to_paste(tmp_path, upstream, spec, monkeypatch, capsys):
    from p40fleet.mirror import __main__ as cli

    monkeypatch.setattr(cli, "fleet_of", lambda inventory: ([], [spec]))
    monkeypatch.setattr(cli, "needs_for", lambda spec, git, conda: conda_needs(spec, conda))
    local = upstream["lock"].replace(upstream["channel"], "https://conda.anaconda.org/cf")
    preflight.conda_lock_path(spec).write_text(local)  # the lock names the real channel
    code = cli.main(["build", str(tmp_path / "m"), "--quiet", "--base-url",
                     "http://10.0.0.5:8111", "--conda-upstream", upstream["channel"]])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "  conda         2 files" in out and "fetched now: 2" in out
    assert "stack.policy.allow_http_conda_channel: True" in out
    block = json.loads(out.split('stack["mirror"] = ', 1)[1])
    assert block["conda_channel"] == "http://10.0.0.5:8111/conda"
    spec = load_spec("h", {"mirror": block, "policy": {"allow_http_conda_channel": True}})
    assert str(spec.mirror.conda_channel).rstrip("/") == "http://10.0.0.5:8111/conda"


def test_conda_creates_the_env_from_the_mirror_alone(tmp_path, upstream, spec):
    """The Miniconda double (conda 24.11.1's explicit install: fetch each URL, check its sum)
    against the built mirror, served by ``mirror serve``'s handler, the upstream shut down:
    the lock rendered onto ``conda_channel`` finds every file, and the env is made."""
    from p40lab.artifacts.miniconda import build_miniconda

    host_py = subprocess.run(["/usr/bin/python3", "-c", "import platform; "
                              "print(platform.python_version())"], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
    if host_py != PY:
        pytest.skip(f"the conda double builds envs of the host python ({host_py}), not {PY}")
    mirror = tmp_path / "mirror"
    build(mirror, conda_needs(spec), progress=False)
    upstream["server"].shutdown()
    installer = tmp_path / "miniconda.sh"
    installer.write_bytes(build_miniconda())
    prefix = tmp_path / "miniconda"
    subprocess.run(["bash", str(installer), "-b", "-p", str(prefix)], check=True,
                   capture_output=True)  # fmt: skip
    log = tmp_path / "mirror.log"
    server, base = _serve(mirror, log)
    try:
        channel = f"{base}/conda"
        lock = tmp_path / "rendered.txt"
        lock.write_text(condalock.render(upstream["lock"], channel))
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        got = subprocess.run([str(prefix / "bin/conda"), "create", "-n", "e", "--override-channels",
                              "-c", channel, "--file", str(lock), "-y"], capture_output=True,
                             text=True, env=env, stdin=subprocess.DEVNULL)  # fmt: skip
        assert got.returncode == 0, got.stdout + got.stderr
        history = (prefix / "envs/e/conda-meta/history").read_text()
        assert f"+python-{PY}-h0_0_cpython\n" in history and "+tzdata-2024a-p40lab_0\n" in history
        served = _gets(log, "/conda/")
        assert len(served) == 2, served
        with urllib.request.urlopen(f"{channel}/{TZDATA}") as response:
            assert response.headers["Content-Type"] == "application/x-bzip2"
    finally:
        server.shutdown()
