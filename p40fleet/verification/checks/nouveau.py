"""The nouveau check: the open driver must not hold the GPUs."""

from __future__ import annotations

from p40fleet.verification.check import FAIL, PASS, Check, no_answer
from p40fleet.verification.checks._common import SYSTEM
from p40fleet.verification.probe import CheckContext


def nouveau(ctx: CheckContext) -> Check:
    host = ctx.answers.section("host")
    state = host.get("nouveau") if host else None
    remedy = (
        f"{SYSTEM} with stack.policy.allow_reboot=True (blacklist, initramfs, reboot), "
        "or reboot the host after it"
    )
    if state == "absent":
        return Check("nouveau", PASS, "nouveau not loaded")
    if state == "loaded":
        return Check("nouveau", FAIL, "nouveau is loaded (/sys/module/nouveau)", remedy)
    return no_answer("nouveau", "/sys/module/nouveau", remedy)
