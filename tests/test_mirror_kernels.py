"""Which kernels' headers ``mirror build`` puts in the apt part: ``--kernel`` and the releases
the inventory's hosts report (``--facts FILE``: ``pyinfra INVENTORY fact server.KernelVersion
--json``; deploy/facts.py prints the release in its table and keeps nothing on the controller),
and, for a host whose release is not known, a line naming it and how to add it (issue 27).

The build itself is replaced by a recorder of the apt plan it gets: tests/test_mirror_apt.py
proves what a plan builds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from p40fleet.mirror import __main__ as cli
from p40fleet.mirror.build import BuildResult
from p40fleet.mirror.manifest import Manifest
from p40fleet.spec.errors import SpecError

REPO = Path(__file__).resolve().parent.parent
K150, K169 = "5.4.0-150-generic", "5.4.0-169-generic"


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "fleet.py"
    path.write_text('fleet = ["gpu1", "gpu2", ("gpu3", {"ssh_port": 2222})]\n')
    return path


@pytest.fixture
def plans(monkeypatch):
    """The apt plans ``mirror build`` hands to :func:`build` (no fetching; no conda, wheels)."""
    got = []

    def fake_build(mirror, needs, *, indexes, progress, apt):
        got.append(apt)
        return BuildResult(Manifest())

    monkeypatch.setattr(cli, "build", fake_build)
    monkeypatch.setattr(cli, "needs_for", lambda spec, git, conda: [])
    return got


def _facts(tmp_path: Path, facts: dict) -> Path:
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps({cli.KERNEL_FACT: facts}))
    return path


def test_pyinfras_own_json_of_the_fact_is_what_facts_reads(tmp_path):
    """The file format is pyinfra's, not a guess: its ``fact server.KernelVersion --json`` of
    @local, read back as that host's ``uname -r``."""
    out = subprocess.run([str(Path(sys.executable).with_name("pyinfra")), "@local", "fact",
                          cli.KERNEL_FACT, "--json"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    path = tmp_path / "kernels.json"
    path.write_text(out.stdout)
    release = subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()
    assert cli.kernels_from_facts(path) == {"@local": release}


def test_a_facts_file_that_is_not_the_facts_output_is_refused_naming_the_command(tmp_path):
    path = tmp_path / "kernels.json"
    bad = (
        ("{", "not JSON"),
        ('{"server.Os": {"a": "Linux"}}', "no 'server.KernelVersion' facts"),
        (json.dumps({cli.KERNEL_FACT: {"a": "../../x"}}), "host a: '../../x' is not a kernel"),
    )
    for text, why in bad:
        path.write_text(text)
        with pytest.raises(SpecError, match=why) as caught:
            cli.kernels_from_facts(path)
        assert f"pyinfra INVENTORY fact server.KernelVersion --json > {path}" in str(caught.value)
    assert cli.kernels_from_facts(_facts(tmp_path, {"a": K150, "b": None})) == {"a": K150}


def test_the_inventorys_hosts_kernels_and_kernel_are_mirrored_together(
    tmp_path, inventory, plans, capsys
):
    facts = _facts(tmp_path, {"gpu1": K150, "gpu2": K150, "gpu3": K169, "other-fleet": "6.1.0"})
    code = cli.main(["build", str(tmp_path / "m"), "--quiet", "--inventory", str(inventory),
                     "--facts", str(facts), "--kernel", "5.4.0-170-generic"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    (plan,) = plans
    headers = [p for p in plan.packages if p.startswith("linux-headers-")]
    assert headers == [f"linux-headers-{k}" for k in (K150, K169, "5.4.0-170-generic")]
    assert "dkms" in plan.packages  # the deploy's own packages come with them
    assert f"  apt: linux-headers-{K150} (gpu1, gpu2)\n" in out
    assert "  apt: linux-headers-5.4.0-170-generic (--kernel)\n" in out
    assert "6.1.0" not in out and "no kernel release" not in out  # not this inventory's host


def test_a_host_the_facts_lack_is_named_with_how_to_add_it(tmp_path, inventory, plans, capsys):
    facts = _facts(tmp_path, {"gpu1": K150, "gpu3": None})  # gpu3 did not answer
    assert cli.main(["build", str(tmp_path / "m"), "--quiet", "--inventory", str(inventory),
                     "--facts", str(facts)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert [p for p in plans[0].packages if p.startswith("linux-headers-")] == [
        f"linux-headers-{K150}"
    ]
    assert (f"  apt: no kernel release for hosts gpu2, gpu3: their linux-headers are not "
            f"fetched: add --kernel RELEASE (uname -r on the host), or --facts FILE from: "
            f"pyinfra {inventory} fact server.KernelVersion --json > FILE\n") in out  # fmt: skip


def test_with_neither_the_build_says_which_headers_it_will_not_fetch(
    tmp_path, inventory, plans, capsys
):
    assert cli.main(["build", str(tmp_path / "m"), "--quiet", "--inventory",
                     str(inventory)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert plans == [None]  # no apt part
    assert ("  apt: not built: no kernel release known for hosts gpu1, gpu2, gpu3, so their "
            "linux-headers-RELEASE are not fetched (nor the deploy's apt packages): add --kernel "
            f"RELEASE (uname -r on the host), or --facts FILE from: pyinfra {inventory} fact "
            "server.KernelVersion --json > FILE\n") in out  # fmt: skip
    # no inventory: the default spec's fleet, unnamed
    assert cli.main(["build", str(tmp_path / "m"), "--quiet"]) == 0
    assert "no kernel release known for the fleet's hosts" in capsys.readouterr().out


def test_an_unreadable_facts_file_is_a_usage_error(tmp_path, inventory, plans, capsys):
    code = cli.main(["build", str(tmp_path / "m"), "--inventory", str(inventory),
                     "--facts", str(tmp_path / "nope.json")])  # fmt: skip
    assert code == 2 and plans == []
    assert "nope.json" in capsys.readouterr().err
