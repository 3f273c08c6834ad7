"""Artifact downloads through a mirror WITHOUT Range support (security N5), on a lab host.

``python3 -m http.server`` answers every resume with ``200`` and the whole file: a ``.part``
left by an earlier run (cut halfway, or longer than the file) must still converge, in one run,
and the next run must change nothing. The mirror runs in its no-Range mode
(``p40lab.httpd``'s ``ranges=False``) for these tests, then in its normal mode again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from p40lab import httpd, mirror, runs

pytestmark = pytest.mark.lab

CACHE = "/var/cache/p40fleet"
HOST = "lab1"

_DEPLOY = """\
from p40fleet.operations.artifacts import fetch

fetch(name="Fetch {name}", url={url!r}, sha256={sha!r}, dest_dir={cache!r}, filename={name!r},
      size={size})
"""


def _smallest_artifact() -> Path:
    files = [p for p in (mirror.MIRROR_DIR / "artifacts").iterdir() if p.is_file()]
    return min((p for p in files if p.stat().st_size >= 64 * 1024), key=lambda p: p.stat().st_size)


@pytest.fixture
def no_range_mirror(lab):
    httpd.start_server(ranges=False)
    try:
        yield
    finally:
        httpd.start_server()


@pytest.mark.parametrize("kind", ["cut halfway", "longer than the file"])
def test_part_converges_through_a_mirror_without_range(lab, no_range_mirror, tmp_path, kind):
    art = _smallest_artifact()
    data = art.read_bytes()
    size, sha = len(data), hashlib.sha256(data).hexdigest()
    url = f"{mirror.BASE_URL}/artifacts/{art.name}"
    deploy = tmp_path / "fetch_one.py"
    deploy.write_text(_DEPLOY.format(name=art.name, url=url, sha=sha, cache=CACHE, size=size))
    target = f"{CACHE}/{art.name}"
    part_size = size // 2 if kind == "cut halfway" else size + 4096
    lab.ssh(HOST, f"mkdir -p -m 0755 {CACHE} && rm -f {target} {target}.verified && "
            f"head -c {part_size} /dev/zero > {target}.part", check=True)  # fmt: skip

    # the no-Range mode itself: a Range request gets the whole file, 200, no Accept-Ranges
    probe = lab.ssh(HOST, f"curl -s -o /dev/null -D - -r 100- {url}", check=True).stdout
    assert probe.startswith("HTTP/1.0 200") and "Accept-Ranges" not in probe, probe

    first = runs.run(str(deploy), "--limit", HOST)
    out = first.output
    assert first.returncode == 0 and not first.errors[HOST], out[-3000:]
    assert first.changed[HOST] == 1, out[-3000:]
    assert "fetching it whole" in out and "sha256 verified" in out, out[-3000:]
    got = lab.ssh(HOST, f"sha256sum {target}", check=True).stdout.split()[0]
    assert got == sha
    assert lab.ssh(HOST, f"test -e {target}.part").returncode == 1  # nothing left behind
    second = runs.run(str(deploy), "--limit", HOST)
    assert second.returncode == 0 and not second.errors[HOST], second.output[-3000:]
    assert not second.changed[HOST] and second.bytes_served == 0, second.output[-3000:]
    print(f"N5 {kind}: {art.name} ({size} bytes), .part {part_size} bytes -> converged in one "
          f"run ({first.seconds:.1f} s, {first.bytes_served} bytes served); "
          f"second run {second.seconds:.1f} s, 0 changes")  # fmt: skip
