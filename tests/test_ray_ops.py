"""operations/ray.py: facts in, commands out (tests/opharness.py)."""

from __future__ import annotations

import hashlib

from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.facts.server import TmpDir
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from facts.ray import HasSystemd
from operations import ray
from p40fleet.ray import UNIT_NAME, UNIT_PATH, plan_ray
from p40fleet.spec import load_spec
from tests.opharness import run_op

PLAN = plan_ray(load_spec("lab2", {}), "lab2", "lab1", "10.231.0.11")
RAY = PLAN.argv[0]
UNIT_FILE = {"mode": 644, "user": "root", "group": "root"}


def rendered() -> str:
    fresh = run_op(ray.ray_member, plan=PLAN, facts=facts(unit=None))
    return fresh.uploads[UNIT_PATH]


def facts(unit=UNIT_FILE, sha1=None, running=True, enabled=True, systemd=True, cli=True):
    def file(path):
        if path == RAY:
            return {"mode": 755} if cli else None
        return unit

    return {
        HasSystemd: systemd,
        File: file,
        Directory: lambda path: None if path == UNIT_PATH else {"mode": 755},
        Sha1File: sha1,
        TmpDir: "/tmp",
        SystemdStatus: {UNIT_NAME: running},
        SystemdEnabled: {UNIT_NAME: enabled},
    }


def test_fresh_host_gets_unit_reload_start_enable():
    result = run_op(ray.ray_member, plan=PLAN, facts=facts(unit=None, running=False,
                                                           enabled=False))  # fmt: skip
    assert result.commands[-3:] == [
        "systemctl daemon-reload",
        f"systemctl start {UNIT_NAME}",
        f"systemctl enable {UNIT_NAME}",
    ]
    text = result.uploads[UNIT_PATH]
    assert f"ExecStart={RAY} start --address=10.231.0.11:6379 --disable-usage-stats --block" in text
    assert "User=verl" in text and "Restart=always" in text and "WantedBy=multi-user.target" in text


def test_running_member_of_this_cluster_is_left_alone():
    sha1 = hashlib.sha1(rendered().encode()).hexdigest()
    result = run_op(ray.ray_member, plan=PLAN, facts=facts(sha1=sha1))
    assert result.commands == [] and not result.changed
    assert any("is running" in n for n in result.noops)


def test_other_cluster_unit_is_rewritten_and_the_member_restarted():
    result = run_op(ray.ray_member, plan=PLAN, facts=facts(sha1="0" * 40))
    assert f"upload {UNIT_PATH}" in result.commands
    assert result.commands[-2:] == ["systemctl daemon-reload", f"systemctl restart {UNIT_NAME}"]
    assert not any(c.endswith(f"start {UNIT_NAME}") and "restart" not in c
                   for c in result.commands)  # fmt: skip


def test_stopped_or_disabled_member_is_started_or_enabled_only():
    sha1 = hashlib.sha1(rendered().encode()).hexdigest()
    stopped = run_op(ray.ray_member, plan=PLAN, facts=facts(sha1=sha1, running=False))
    assert stopped.commands == [f"systemctl start {UNIT_NAME}"]
    disabled = run_op(ray.ray_member, plan=PLAN, facts=facts(sha1=sha1, enabled=False))
    assert disabled.commands == [f"systemctl enable {UNIT_NAME}"]


def test_refusals_change_nothing():
    no_systemd = run_op(ray.ray_member, plan=PLAN, facts=facts(systemd=False))
    assert no_systemd.commands == ["function _fail"]
    assert "/run/systemd/system is missing" in no_systemd.failures[0]
    assert "host lab1: ray cluster:" in no_systemd.failures[0]
    no_cli = run_op(ray.ray_member, plan=PLAN, facts=facts(cli=False))
    assert no_cli.commands == ["function _fail"]
    assert f"{RAY} is missing" in no_cli.failures[0] and "deploy/python.py" in no_cli.failures[0]


class _Member:
    """An inventory host as ray_cluster.shape_of reads it: a name, host data, its PCI fact."""

    def __init__(self, name: str, devices: list[int]):
        from facts.gpu import PciGpu
        from p40fleet.gpu_catalog import lookup

        self.name = name
        self.data = {}
        self.asked: list[type] = []
        self._gpus = [
            PciGpu(f"0000:0{i}:00.0", 0x10DE, d, 0x030200, 0x10DE, 0x11D9, lookup(d))
            for i, d in enumerate(devices, 1)
        ]

    def get_fact(self, cls, **kwargs):
        from facts.gpu import PciGpus

        assert cls is PciGpus, cls
        self.asked.append(cls)
        return self._gpus


def test_a_member_its_own_spec_refuses_is_not_in_the_cluster_before_its_preflight_ran():
    """The demo's 2xH200 host (R525 refuses it) prepared after a P100 host: it must not size the
    P100's launch plan, whether or not its own preflight has refused it yet (CI, 2026-12-01)."""
    from operations import ray_cluster

    p40, p100, h200 = 0x1B38, 0x15F8, 0x2335
    members = [_Member("lab1", [p40] * 4), _Member("lab3", [p100]), _Member("lab4", [h200] * 2)]
    shape = ray_cluster.shape_of(members)
    assert dict(shape.node_gpus) == {"lab1": 4, "lab3": 1}
    assert all(g.device_id != h200 for g in shape.gpus)
    assert members[2].asked  # decided from its own facts, not from the order hosts ran in
