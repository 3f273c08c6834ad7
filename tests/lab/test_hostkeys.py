"""S17 on the lab: a host whose key is not checked gets no connection and no command from any
entry point, and pyinfra learns no key for it.

A from-scratch inventory (a host list, no ``ssh_strict_host_key_checking``) with an empty
known_hosts: before, pyinfra connected with ``accept-new``, stored the key and ran the survey.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.lab


@pytest.mark.parametrize("deploy", ["deploy/facts.py", "deploy/verify.py", "deploy/full.py"])
def test_unchecked_host_key_gets_no_command_and_its_key_is_not_learned(lab, tmp_path, deploy):
    st, ip = lab.state, lab.host("lab1")["ip"]
    known = tmp_path / "known_hosts"
    known.write_text("")
    proc = lab.pyinfra(
        ip, deploy, "--data", "ssh_user=root", "--data", f"ssh_key={st['ssh_key']}",
        "--data", f"ssh_known_hosts_file={known}", "--data", "ssh_allow_agent=false",
        "--data", "ssh_look_for_keys=false", timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert known.read_text() == "", out  # no key learned: no connection was made
    assert "ssh_strict_host_key_checking = " in out and "expected 'yes'" in out, out[-3000:]
    assert "nothing was sent" in out and "Connected" not in out, out[-3000:]
    assert proc.returncode != 0, out[-3000:]
