"""p40lab.runs reads pyinfra's output: per-host outcomes, and what a failing lab test prints."""

from __future__ import annotations

from p40lab.runs import RunResult, parse_operations

OUTPUT = """\
--> Loading config...
    [lab1] Connected
    [lab3] Connected
--> Starting operation: Install the NVIDIA driver
    [lab1] No changes
    [lab3] Error: reboot did not come back in 300 s
    [lab3] sshd on 10.0.0.3:22 refused the connection
--> Starting operation: Verify
    [lab1] Success
""" + "".join(f"    [lab1] line {i}\n" for i in range(200))


def result() -> RunResult:
    return RunResult(argv=[], returncode=1, seconds=1.0, output=OUTPUT,
                     operations=parse_operations(OUTPUT))  # fmt: skip


def test_host_output_names_the_failed_operation_and_keeps_the_hosts_own_lines():
    """The lab tests printed the output's last 5000 characters: another host's table, not why
    lab3 failed (test_allow_reboot_off_..., CI at c8ce7bb)."""
    text = result().host_output("lab3")
    assert "failed operations: Install the NVIDIA driver" in text
    assert "reboot did not come back in 300 s" in text and "refused the connection" in text
    assert "[lab1]" not in text
    assert "failed operations: none by name" in result().host_output("lab1")


def test_host_output_keeps_the_last_lines_of_a_long_output():
    lines = result().host_output("lab1", last=10).splitlines()
    assert len(lines) == 11 and lines[-1].endswith("line 199") and lines[1].endswith("line 190")
