"""python -m p40fleet.verify: exit 0 / 1 / 2, and deploy/verify.py under plain pyinfra.

This machine has no NVIDIA GPU, so ``@local`` verifies as FAIL (exit 1). The all-PASS path (exit
0) runs the CLI with a fake pyinfra that writes a passing report where ``$P40FLEET_REPORT``
says. An unreachable host is an SSH host on a closed local port.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from p40fleet import report
from p40fleet.cli import verify as verify_cli
from p40fleet.verification.check import PASS, SKIP, Check

REPO = Path(__file__).resolve().parent.parent
# strict host keys: a host whose key would not be checked is REFUSED (tests/test_verdicts.py)
DEAD = (
    '("deadhost", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, '
    '"ssh_strict_host_key_checking": "yes"})'
)


def run_cli(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "p40fleet.verify", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- 2: usage / environment errors -----------------------------------------------------------


def test_missing_inventory_file_is_2(tmp_path):
    proc = run_cli(str(tmp_path / "nope.py"))
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr


def test_bad_args_are_2():
    assert run_cli().returncode == 2  # no inventory
    proc = run_cli("@local", "--bogus")
    assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr
    assert run_cli("@local", "--json").returncode == 2  # option without its value


def test_json_into_missing_dir_is_2(tmp_path):
    proc = run_cli("@local", "--json", str(tmp_path / "no" / "such" / "r.json"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_junit_into_missing_dir_or_dir_is_2(tmp_path):
    proc = run_cli("@local", "--junit", str(tmp_path / "no" / "such" / "j.xml"))
    assert proc.returncode == 2 and "--junit" in proc.stderr and "does not exist" in proc.stderr
    proc = run_cli("@local", "--junit", str(tmp_path))
    assert proc.returncode == 2 and "is a directory" in proc.stderr


def test_pyinfra_failing_before_verifying_is_2(tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text("this is not python\n")
    proc = run_cli(str(inventory), "-q")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "before the verification wrote its report" in proc.stderr


# --- 1: a host fails / is unreachable ---------------------------------------------------------


def test_local_without_gpu_is_refused_3_with_report(tmp_path):
    out = tmp_path / "report.json"
    junit = tmp_path / "junit.xml"
    proc = run_cli("@local", "--json", str(out), "--junit", str(junit))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    prov = data["provenance"]
    assert prov["inventory"] == "@local" and prov["p40fleet_version"] == "0.1.0"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", prov["generated_at"])
    assert data["pins"]["driver"] == "525.147.05" and data["pins"]["cuda"] == "11.8.0"
    host = data["hosts"]["@local"]
    assert host["gpus"]["count"] == 0 and host["gpus"]["verdict"].startswith("refused")
    assert host["pins"] == data["pins"]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("name") == "@local" and int(suite.get("failures")) >= 1
    assert f"junit: {junit}" in proc.stdout
    # one verdict with the preflight's reason and fix, not a cascade of FAILs
    assert host["verdict"] == "REFUSED"
    assert [c["name"] for c in host["checks"]] in (["GPU check"], ["GPU check", "OS check"])
    gpus = host["checks"][0]
    assert "no NVIDIA GPU" in gpus["detail"] and "another stack" in gpus["remedy"]
    assert data["summary"]["refused"] == 1 and data["summary"]["fail"] == 0
    assert suite.find("testcase/failure").get("type") == "REFUSED"
    assert "p40fleet verify: 0/1 hosts pass, 1 refused" in proc.stdout  # the CLI's table
    assert "REFUSED" in proc.stdout and "outside this stack" in proc.stdout
    assert proc.stdout.count("p40fleet verify:") == 1  # printed once (not also by the deploy)


def test_refused_spec_is_3(tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text('hosts = [("@local", {"stack": {"cuda": {"sha256": "abc"}}})]\n')
    out = tmp_path / "r.json"
    proc = run_cli(str(inventory), "-q", "--json", str(out))
    assert proc.returncode == 3
    host = json.loads(out.read_text())["hosts"]["@local"]
    assert host["verdict"] == "REFUSED"
    (check,) = host["checks"]
    assert check["name"] == "stack spec" and "stack.cuda.sha256" in check["detail"]


def test_unreachable_host_is_1(tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f'hosts = ["@local", {DEAD}]\n')
    out = tmp_path / "r.json"
    proc = run_cli(str(inventory), "-q", "--json", str(out))
    assert proc.returncode == 1
    data = json.loads(out.read_text())
    assert data["hosts"]["deadhost"]["verdict"] == "UNREACHABLE"  # 1 beats a refused @local
    assert data["summary"]["unreachable"] == 1
    assert "UNREACHABLE" in proc.stdout


def test_no_host_reachable_is_1(tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"hosts = [{DEAD}]\n")
    out, junit = tmp_path / "r.json", tmp_path / "r.xml"
    proc = run_cli(str(inventory), "-q", "--json", str(out), "--junit", str(junit))
    assert proc.returncode == 1
    assert "no host could be reached" in proc.stderr
    # the artifacts CI needs most exactly when every host is down
    assert json.loads(out.read_text())["hosts"]["deadhost"]["verdict"] == "UNREACHABLE"
    assert ET.parse(junit).getroot().find("testsuite").get("name") == "deadhost"


# --- 0: every host passes (fake pyinfra) ------------------------------------------------------

FAKE_PYINFRA = """
import json, os, sys
from p40fleet import report
from p40fleet.verification.check import Check
checks = [Check("torch version", "PASS", "2.6.0+cu118 True (6, 1)"),
          Check("torch cuda", "SKIP", "simulated host: no real GPU behind torch.cuda")]
if "verify_smoke=yes" in sys.argv:
    checks.append(Check("smoke step", "PASS", "CPU (simulated host): 1 PPO step in 0.27 s"))
    checks.append(Check("smoke step (cluster)", "SKIP", "not run on simulated hosts: why"))
report.write_report(report.build_report({"lab1": report.host_entry(checks)}),
                    os.environ["P40FLEET_REPORT"])
print("fake pyinfra args:", " ".join(sys.argv[1:]))
print("fake pyinfra inventory env:", os.environ.get("P40FLEET_INVENTORY"))
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


@pytest.fixture
def fake_pyinfra(tmp_path, monkeypatch):
    script = tmp_path / "fake_pyinfra.py"
    script.write_text(FAKE_PYINFRA)

    def command(inventory, limits=(), smoke=False, smoke_timeout=None, collective=False,
                collective_timeout=None):  # fmt: skip
        args = [sys.executable, str(script), inventory]
        for limit in limits:
            args += ["--limit", limit]
        args += ["--data", "verify_collective=yes"] if collective else []
        return args + (["--data", "verify_smoke=yes"] if smoke else [])

    monkeypatch.setattr(verify_cli, "pyinfra_command", command)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    return script


def test_all_pass_is_0(fake_pyinfra, tmp_path, capsys):
    out = tmp_path / "r.json"
    code = verify_cli.main(["@local", "--limit", "lab1", "--limit", "lab2", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "fake pyinfra args: @local --limit lab1 --limit lab2" in printed
    assert "1/1 hosts pass" in printed
    assert "fake pyinfra inventory env: @local" in printed  # for the report's provenance
    assert report.load_report(out)["summary"]["verdict"] == PASS


def test_smoke_prints_each_hosts_step_even_without_verbose(fake_pyinfra, capsys):
    assert verify_cli.main(["@local", "-q", "--smoke"]) == 0
    printed = capsys.readouterr().out
    assert "smoke step lab1: PASS CPU (simulated host): 1 PPO step in 0.27 s" in printed
    assert "smoke step (cluster) lab1: SKIP not run on simulated hosts: why" in printed
    assert verify_cli.main(["@local", "-q"]) == 0
    assert "smoke step" not in capsys.readouterr().out


def test_all_pass_junit(fake_pyinfra, tmp_path, capsys):
    inventory = tmp_path / "inv.py"
    inventory.write_text("hosts = []\n")
    junit = tmp_path / "j.xml"
    assert verify_cli.main([str(inventory), "--junit", str(junit)]) == 0
    assert f"fake pyinfra inventory env: {inventory}" in capsys.readouterr().out
    root = ET.parse(junit).getroot()
    (suite,) = root.findall("testsuite")
    assert (suite.get("name"), suite.get("tests"), suite.get("failures")) == ("lab1", "2", "0")
    assert suite.find("testcase[@name='torch cuda']/skipped") is not None


def test_pass_report_but_pyinfra_failed_is_1(fake_pyinfra, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RC", "1")
    assert verify_cli.main(["@local", "-q"]) == 1
    assert "pyinfra exited 1" in capsys.readouterr().err


def test_a_host_list_is_checked_strictly_too():
    """S17: pyinfra's default for hosts without data is accept-new (trust the first key)."""
    command = verify_cli.pyinfra_command("p40-01,p40-02")
    assert command[-2:] == ["--data", "ssh_strict_host_key_checking=yes"]
    assert "--data" not in verify_cli.pyinfra_command(str(REPO / "inventories" / "sim.py"))
    assert "--data" not in verify_cli.pyinfra_command("@local")


def test_pyinfra_command_line(tmp_path):
    inventory = tmp_path / "inv.py"
    inventory.write_text("hosts = []\n")
    command = verify_cli.pyinfra_command(str(inventory), ["lab1", "lab2"])
    assert command[:4] == [sys.executable, "-m", "pyinfra", "-y"]
    assert command[4:6] == ["--config", str(REPO / "config.py")]  # S17: sshguard at connect
    assert (REPO / "config.py").is_file()
    assert command[6:] == [
        str(inventory),
        str(REPO / "deploy" / "verify.py"),
        "--limit",
        "lab1",
        "--limit",
        "lab2",
    ]


def test_skip_only_host_passes():
    entry = report.host_entry([Check("torch cuda", SKIP, "simulated host")])
    assert entry["verdict"] == PASS


# --- deploy/verify.py under plain pyinfra ------------------------------------------------------


def run_pyinfra(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != report.REPORT_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_plain_pyinfra_prints_table_and_fails_the_host(tmp_path):
    out = tmp_path / "r.json"
    proc = run_pyinfra("@local", "deploy/verify.py", env_extra={report.REPORT_ENV: str(out)})
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert text.count("p40fleet verify: 0/1 hosts pass, 1 refused") == 1, text
    assert "Verify: refused" in text and "check(s) failed" not in text
    assert "host @local: verify: outside this stack: GPU check: GPUs " in text
    assert "no NVIDIA GPU found" in text and "[@local] verify: REFUSED (GPU check:" in text
    assert "Traceback" not in text
    assert json.loads(out.read_text())["hosts"]["@local"]["verdict"] == "REFUSED"


def test_plain_pyinfra_dry_changes_nothing():
    proc = run_pyinfra("@local", "deploy/verify.py", "--dry")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "p40fleet verify:" in text and "Traceback" not in text
