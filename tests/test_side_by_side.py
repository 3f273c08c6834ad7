"""tests/side_by_side.py (``make test``'s runner) with stand-in sessions: small python
scripts in place of the two pytest sessions, a callable in place of the lab-base build."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from tests import side_by_side

#: A session's stand-in: ``ROLE OTHER RC DIR``. It marks ROLE started and waits for OTHER's
#: mark: run one after the other, the first would wait in vain and exit 99. The unit one prints
#: before it marks itself started, so its line is written before the lab one prints its own.
STANDIN = """
import os, sys, time
role, other, rc, d = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if role == "unit":
    print("UNIT OUTPUT instance=" + os.environ.get("P40LAB_TEST_INSTANCE", ""), flush=True)
open(os.path.join(d, role + ".started"), "w").close()
deadline = time.monotonic() + 10
while not os.path.exists(os.path.join(d, other + ".started")):
    if time.monotonic() > deadline:
        print(role + ": the other session never started", flush=True)
        sys.exit(99)
    time.sleep(0.02)
if role == "lab":
    print("LAB OUTPUT", flush=True)
time.sleep(0.5)
sys.exit(rc)
"""

LAST = re.compile(
    r"side by side: lab tests exit (\d+) \((\d+) s\), unit tests exit (\d+) \((\d+) s\); "
    r"wall (\d+) s"
)


@pytest.mark.parametrize(
    ("lab_rc", "unit_rc", "expected"),
    [(3, 0, 1), (0, 4, 1), (0, 0, 0)],
    ids=["lab fails", "unit fails", "both pass"],
)
def test_side_by_side_runs_both_at_once_and_reports_both(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], lab_rc: int, unit_rc: int, expected: int
):
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    built: list[list[str]] = []

    def build() -> None:  # before either session starts
        built.append(sorted(p.name for p in tmp_path.glob("*.started")))

    def cmd(role: str, other: str, rc: int) -> list[str]:
        return [sys.executable, str(script), role, other, str(rc), str(tmp_path)]

    t0 = time.monotonic()
    rc = side_by_side.side_by_side(cmd("lab", "unit", lab_rc), cmd("unit", "lab", unit_rc), build)
    elapsed = time.monotonic() - t0
    out = capfd.readouterr().out
    assert built == [[]]
    assert "never started" not in out, out  # both ran at once
    assert rc == expected
    # the unit session's line, written first, is printed after the lab's, under its header
    lab_at, unit_at = out.index("LAB OUTPUT\n"), out.index("UNIT OUTPUT instance=unit\n")
    assert lab_at < out.index("unit tests (-m 'not lab')") < unit_at
    last = out.rstrip("\n").splitlines()[-1]
    m = LAST.fullmatch(last)
    assert m, last
    assert (int(m[1]), int(m[3])) == (lab_rc, unit_rc)
    assert abs(int(m[5]) - elapsed) <= 1 and int(m[5]) >= max(int(m[2]), int(m[4]))
