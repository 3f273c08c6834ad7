"""p40fleet.report: JSON shape, round trip, verdicts, exit status, the rich table."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from p40fleet import report
from p40fleet.verification.check import FAIL, PASS, SKIP, Check

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
        "refused": 0,
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


H200 = ("GPU check", "GPUs 2× H200: driver R525 does not support H200", "another stack")


def test_refused_host_is_one_verdict_with_its_own_exit_code(tmp_path):
    passing = {"lab1": report.host_entry(GOOD), "lab4": report.refused_entry([H200])}
    data = report.build_report(passing)
    assert data["hosts"]["lab4"]["verdict"] == report.REFUSED
    assert data["summary"]["refused"] == 1 and data["summary"]["verdict"] == FAIL
    assert report.exit_code(data) == report.EXIT_REFUSED == 3
    report.write_report(data, tmp_path / "r.json")
    assert report.load_report(tmp_path / "r.json")["hosts"]["lab4"]["verdict"] == "REFUSED"
    # a failing or unreachable host still makes it 1
    assert report.exit_code(report.build_report({**passing, "lab2": report.host_entry(BAD)})) == 1
    assert report.exit_code(report.build_report({"lab4": report.refused_entry([H200])})) == 3
    text = _render(data)
    assert "1/2 hosts pass, 1 refused" in text
    (row,) = [line for line in text.splitlines() if "lab4" in line]
    assert "REFUSED" in row and "FAIL" not in row  # one verdict, not a cascade of FAILs
    assert "outside this stack" in text and "driver R525 does not support H200" in text
    assert "fix: another stack" in text
    assert 'type="REFUSED"' in report.junit_xml(data)


def test_the_demos_h200_host_is_one_refused_line():
    """The demo's lab4 (2× H200): what deploy/verify.py computes for it, as the table shows it."""
    from p40fleet.preflight import outside_the_stack
    from p40fleet.profile import summarize_host

    summary = summarize_host([0x2335, 0x2335], branch="R525")
    refusals = outside_the_stack(summary, "v0.5.0", "Ubuntu 20.04")
    assert [r.step for r in refusals] == ["GPU check"]
    entry = report.refused_entry([(r.step, r.reason, r.remedy) for r in refusals])
    text = _render(report.build_report({"lab1": report.host_entry(GOOD), "lab4": entry}))
    lab4 = text[text.index("lab4") :]
    assert "REFUSED" in lab4 and "does not support H200" in lab4 and "FAIL" not in lab4


MARKUP = [
    Check("cudnn [bold]", FAIL, "cannot open [/usr/local/cuda/lib64] [/x]", "fix [bold]it[/bold]"),
    Check("ld [/x]", PASS, "[bold]not bold[/bold] [/x]"),
]


@pytest.mark.parametrize("verbose", [False, True])
def test_host_output_is_never_markup(verbose):
    """S16: details with "[/x]" and "[bold]" render literally (verbose rows too)."""
    data = report.build_report({"lab[/x]": report.host_entry(MARKUP)})
    text = _render(data, verbose=verbose)  # raised rich.errors.MarkupError before
    for literal in ("[/usr/local/cuda/lib64] [/x]", "fix [bold]it[/bold]", "cudnn [bold]",
                    "lab[/x]"):  # fmt: skip
        assert literal in text, (literal, text)
    if verbose:
        assert "[bold]not bold[/bold] [/x]" in text and "ld [/x]" in text


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


# -- provenance, pins, GPUs --------------------------------------------------------------------


def _p40(bus: str, device: int = 0x1B38, name: str | None = None):
    from p40fleet.facts.gpu import PciGpu
    from p40fleet.gpu_catalog import resolve

    return PciGpu(bus, 0x10DE, device, 0x030200, 0x10DE, 0x11D9, resolve(device, name), name)


def test_provenance_is_utc_with_inventory_and_version(monkeypatch):
    from datetime import datetime, timedelta, timezone

    monkeypatch.delenv(report.INVENTORY_ENV, raising=False)
    cest = timezone(timedelta(hours=2))
    prov = report.provenance("/srv/inv/lab.py", now=datetime(2026, 5, 1, 12, 0, 5, tzinfo=cest))
    assert prov["generated_at"] == "2026-05-01T10:00:05Z"
    assert prov["inventory"] == "/srv/inv/lab.py"
    assert prov["p40fleet_version"] == "0.1.0"
    assert prov["controller"]
    monkeypatch.setenv(report.INVENTORY_ENV, "/from/env.py")
    assert report.provenance()["inventory"] == "/from/env.py"
    assert report.provenance()["generated_at"].endswith("Z")


def test_inventory_from_pyinfra_argv(tmp_path):
    inv = tmp_path / "lab.py"
    inv.write_text("hosts = []\n")
    argv = ["pyinfra", "-y", "--limit", "lab1", "--data", "x=1", str(inv), "deploy/verify.py"]
    assert report.inventory_from_argv(argv) == str(inv)
    assert report.inventory_from_argv(["pyinfra", "-y", "@local", "deploy/verify.py"]) == "@local"
    assert report.inventory_from_argv(["pyinfra", "-y"]) is None


def test_spec_pins_and_gpu_summary():
    from p40fleet.spec import load_spec

    spec = load_spec("lab1", {})
    pins = report.spec_pins(spec)
    assert pins["driver"] == "525.147.05" and len(pins["driver.sha256"]) == 64
    assert pins["cuda"] == "11.8.0" and pins["python"] == "3.10.12"
    assert pins["torch"] == "2.6.0+cu118" and pins["verl"] == "v0.5.0"
    assert len(pins["verl.commit"]) == 40 and pins["apex"] == "25.09"
    gpus = report.gpu_summary(
        [_p40("0000:04:00.0"), _p40("0000:05:00.0", 0x1B39, "GP102GL [Tesla P10]")], spec
    )
    assert gpus == {
        "count": 2,
        "models": ["1× Tesla P40", "1× Tesla P10 (cc from chip family GP102 in pci.ids name)"],
        "device_ids": ["10de:1b38", "10de:1b39"],
        "lowest_cc": "6.1",
        "profile": "pascal",
        "driver_branch": "525",
        "verdict": "ready",
    }
    assert report.gpu_summary([], spec)["verdict"] == "refused: no NVIDIA GPU found"


def _fleet_with_provenance():
    from p40fleet.spec import load_spec

    pins = report.spec_pins(load_spec("lab1", {}))
    other = {**pins, "driver": "525.125.06"}
    gpus = {"count": 4, "models": ["4× Tesla P40"], "lowest_cc": "6.1", "profile": "pascal"}
    return report.build_report(
        {
            "lab1": report.host_entry(GOOD, gpus=gpus, pins=pins),
            "lab2": report.host_entry(BAD, gpus=gpus, pins=other),
            "lab9": report.unreachable_entry(),
        },
        provenance={"generated_at": "2026-11-30T19:40:02Z", "inventory": "/x/lab.py"},
    )


def test_report_carries_provenance_pins_and_gpus(tmp_path):
    data = _fleet_with_provenance()
    assert data["provenance"]["inventory"] == "/x/lab.py"
    assert "driver" not in data["pins"]  # the hosts differ: each host's own pins say which
    assert data["pins"]["cuda"] == "11.8.0"
    assert data["hosts"]["lab2"]["pins"]["driver"] == "525.125.06"
    assert data["hosts"]["lab1"]["gpus"]["models"] == ["4× Tesla P40"]
    assert "gpus" not in data["hosts"]["lab9"]
    path = tmp_path / "r.json"
    report.write_report(data, path)
    assert report.load_report(path) == data
    assert "provenance" not in fleet()  # a report without it stays valid


def test_junit_xml_parses_with_a_suite_per_host(tmp_path):
    import xml.etree.ElementTree as ET

    path = tmp_path / "ci" / "verify.xml"
    report.write_junit(_fleet_with_provenance(), path)
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("5", "2", "1")
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == ["lab1", "lab2", "lab9"]
    lab1, lab2, lab9 = suites["lab1"], suites["lab2"], suites["lab9"]
    assert (lab1.get("tests"), lab1.get("failures"), lab1.get("skipped")) == ("2", "0", "1")
    assert lab1.get("timestamp") == "2026-11-30T19:40:02"
    props = {p.get("name"): p.get("value") for p in lab1.find("properties")}
    assert props["verdict"] == "PASS"
    assert props["gpus"] == "4× Tesla P40 (cc 6.1, profile pascal)"
    assert props["provenance.inventory"] == "/x/lab.py"
    assert props["pin.driver"] == "525.147.05"
    cases = {c.get("name"): c for c in lab1.findall("testcase")}
    assert cases["torch version"].find("failure") is None
    assert cases["torch cuda"].find("skipped").get("message").startswith("simulated host")
    (nvcc,) = [c for c in lab2.findall("testcase") if c.get("name") == "nvcc"]
    failure = nvcc.find("failure")
    assert failure.get("message") == "nvcc: release 12.1, V12.1.105, expected release 11.8"
    assert failure.text.endswith("fix: reinstall cuda")
    (connect,) = lab9.findall("testcase")
    assert connect.get("name") == "connect" and connect.find("failure") is not None
    assert nvcc.get("classname") == "p40fleet.verify.lab2"


def test_junit_escapes_what_hosts_print():
    import xml.etree.ElementTree as ET

    odd = [Check("probe", FAIL, 'bad <tag> & "quote"\x1b', "fix <it> & retry")]
    xml = report.junit_xml(report.build_report({"h&<1>": report.host_entry(odd)}))
    case = ET.fromstring(xml.encode()).find("testsuite/testcase")
    message = case.find("failure").get("message")
    assert message == 'bad <tag> & "quote"\\x1b'
