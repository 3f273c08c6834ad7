"""p40fleet.report: JSON shape, round trip, verdicts, exit status, the rich table."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from p40fleet import report
from p40fleet.checks import FAIL, PASS, SKIP, Check

GOOD = [
    Check("torch version", PASS, "2.6.0+cu118 True (6, 1)"),
    Check("torch cuda", SKIP, "simulated host: no real GPU behind torch.cuda"),
]
BAD = [
    Check("torch version", PASS, "2.6.0+cu118 True (6, 1)"),
    Check("nvcc", FAIL, "nvcc: release 12.1, V12.1.105, expected release 11.8", "reinstall cuda"),
]


def fleet():
    return report.build_report(
        {
            "lab2": report.host_entry(BAD),
            "lab1": report.host_entry(GOOD),
            "lab9": report.unreachable_entry(),
        }
    )


def test_json_shape_and_summary():
    data = fleet()
    assert list(data["hosts"]) == ["lab1", "lab2", "lab9"]
    assert data["hosts"]["lab1"]["verdict"] == PASS
    assert data["hosts"]["lab2"]["verdict"] == FAIL
    assert data["hosts"]["lab9"]["verdict"] == report.UNREACHABLE
    assert data["hosts"]["lab2"]["checks"][1] == {
        "name": "nvcc",
        "status": FAIL,
        "detail": "nvcc: release 12.1, V12.1.105, expected release 11.8",
        "remedy": "reinstall cuda",
    }
    assert data["summary"] == {
        "hosts": 3,
        "pass": 1,
        "fail": 1,
        "unreachable": 1,
        "verdict": FAIL,
        "checks": {PASS: 2, FAIL: 2, SKIP: 1},
    }
    json.dumps(data)  # plain JSON


def test_write_load_round_trip(tmp_path):
    path = tmp_path / "sub" / "report.json"
    report.write_report(fleet(), path)
    loaded = report.load_report(path)
    assert loaded == fleet()
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]  # no temp file left


def test_exit_codes():
    assert report.exit_code(fleet()) == 1
    assert report.exit_code(report.build_report({"lab1": report.host_entry(GOOD)})) == 0
    assert report.exit_code(report.build_report({"lab2": report.host_entry(BAD)})) == 1
    only_unreachable = report.build_report({"lab9": report.unreachable_entry()})
    assert report.exit_code(only_unreachable) == 1
    assert report.exit_code(report.build_report({})) == 1  # nothing verified is no pass


@pytest.mark.parametrize(
    "content",
    ["not json", "[]", '{"hosts": {"a": {"verdict": "MAYBE", "checks": []}}}', '{"x": 1}'],
)
def test_load_rejects_bad_reports(tmp_path, content):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(report.ReportError):
        report.load_report(path)
    with pytest.raises(report.ReportError):
        report.load_report(tmp_path / "missing.json")


def _render(data, verbose=False) -> str:
    console = Console(width=160, record=True, color_system=None)
    report.print_report(data, verbose=verbose, console=console)
    return console.export_text()


def test_table_lists_failures_with_fixes_and_skips():
    text = _render(fleet())
    assert "p40fleet verify: 1/3 hosts pass, 1 fail, 1 unreachable" in text
    assert "lab1" in text and "lab2" in text and "lab9" in text
    assert "UNREACHABLE" in text
    assert "FAIL nvcc: nvcc: release 12.1" in text and "fix: reinstall cuda" in text
    assert "SKIP torch cuda: simulated host" in text
    assert "1/1/0" in text  # lab2's pass/fail/skip counts


def test_verbose_table_has_every_check():
    text = _render(fleet(), verbose=True)
    assert text.count("torch version") == 2
    assert "2.6.0+cu118 True (6, 1)" in text


def test_all_pass_table():
    text = _render(report.build_report({"lab1": report.host_entry([GOOD[0]])}))
    assert "1/1 hosts pass" in text and "all checks pass" in text
