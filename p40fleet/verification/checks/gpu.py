"""The GPU check: the host's PCI GPUs, as the stack spec takes them."""

from __future__ import annotations

from p40fleet.verification.check import FAIL, PASS, Check
from p40fleet.verification.probe import CheckContext


def gpus(ctx: CheckContext) -> Check:
    # each PCI fact carries its model (catalog or chip family): no bare ids
    summary = ctx.spec.gpu_summary(ctx.pci)
    if not summary.gpu_count:
        return Check(
            "gpus",
            FAIL,
            "no NVIDIA GPU found on the PCI bus (sysfs): nothing to verify the stack on",
            "run deploy/facts.py; check the GPUs are seated and visible "
            "(ls /sys/bus/pci/devices, lspci -nn | grep -i nvidia)",
        )
    label = f"{summary.gpus_str} (cc {summary.capability_str}, profile {summary.profile or '-'})"
    if not summary.ok:
        return Check(
            "gpus",
            FAIL,
            f"{label}: {summary.refused}",
            "this host cannot run the stack as specified: run deploy/facts.py and fix what it "
            "reports (or take the host out of the inventory)",
        )
    return Check("gpus", PASS, label)
