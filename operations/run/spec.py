"""The current host's spec, checked once per run, with this run's lock queued first.

Use at the top of every deploy::

    from p40fleet.operations.run.spec import validated_spec

    spec = validated_spec()
    if spec is not None:
        ...  # add this host's operations

A host whose spec is invalid, whose host key would not be checked, or that another run holds
is refused on its own (``operations.refuse``): the other hosts carry on.
"""

from __future__ import annotations

import logging

from pyinfra import host, state
from pyinfra.api.exceptions import PyinfraError

from p40fleet.host_key import HOST_KEY_REMEDY, HOST_KEY_STEP
from p40fleet.operations import run_lock
from p40fleet.operations.refuse import refuse_host, refused_hosts
from p40fleet.run_mode import NO_WAIT_REMEDY, NO_WAIT_STEP, no_wait_refusal
from p40fleet.run_record import run_record
from p40fleet.runtime import sshguard
from p40fleet.spec import SpecError, StackSpec, spec_for_host, trust_anchor_overrides
from p40fleet.verification.check import spec_failure

__all__ = ["validated_spec"]

logger = logging.getLogger("pyinfra")

_SPEC_REMEDY = (
    "correct the value in the inventory (stack_host) or inventories/group_data/all.py (stack); "
    "the defaults in p40fleet/spec/pins.py are the real pins"
)


def _specs() -> dict[str, StackSpec]:
    return run_record(state).specs


def validated_spec(*, lock: bool = True) -> StackSpec | None:
    """The current host's StackSpec, or None after queueing a refusal if the spec is invalid.

    Call at the top of every deploy; add no operations for the host when it returns None
    (also when an earlier deploy of this run refused the host). With ``lock`` (deploys that
    change hosts) this run's lock on the host is queued first, taken before the run's first
    operation (``operations.run_lock``); a host another run holds is refused.
    """
    unchecked = sshguard.host_key_refusal(host)
    if unchecked is not None and host.name not in refused_hosts():
        # S17: before the run lock's fact (a root command); sshguard refuses any command too.
        refuse_host(
            step=HOST_KEY_STEP,
            reason=unchecked.removeprefix(f"host {host.name}: "),
            remedy=HOST_KEY_REMEDY,
            name="Refuse: ssh host key",
        )
    if unchecked is not None:
        return None
    mode = no_wait_refusal() if lock else None
    if mode is not None:  # the whole run's mode, not one host's: refused before any host
        raise PyinfraError(f"{NO_WAIT_STEP}: {mode}; fix: {NO_WAIT_REMEDY}")
    if lock and not run_lock.hold():
        refused_hosts().add(host.name)
        return None
    if host.name in refused_hosts():
        return None
    specs = _specs()
    if host.name in specs:
        return specs[host.name]  # once per host and run (every deploy asks at its top)
    try:
        spec = spec_for_host(host)
        specs[host.name] = spec
        # Allowed, but said once: a per-host override of what the host trusts (security N13).
        if anchors := trust_anchor_overrides(host.data.get("stack"), host.data.get("stack_host")):
            host.log_styled(
                f"stack_host replaces trust anchor(s) of stack: {', '.join(anchors)} "
                "(this host only; check the inventory if that is not meant)",
                fg="yellow",
                log_func=logger.warning,
            )
        return spec
    except SpecError as exc:
        # SpecError lines are "host X: FIELD = VALUE: EXPECTED"; refusal adds "host X: step:".
        prefix = f"host {exc.host}: "
        reason = "\n".join(line.removeprefix(prefix) for line in exc.lines())
        # Also say it while preparing: every field (a dry run prints each problem in full).
        fields = list(dict.fromkeys(field for field, _, _ in exc.problems))
        count = f"{len(exc.problems)} problem{'s' if len(exc.problems) != 1 else ''}"
        host.log_styled(
            f"stack spec invalid ({count}: {', '.join(fields)}): this host will be refused",
            fg="yellow",
            log_func=logger.warning,
        )
        (check,) = spec_failure(line.removeprefix(prefix) for line in exc.lines())
        refuse_host(
            step="stack spec",
            reason=reason,
            remedy=_SPEC_REMEDY,
            name="Refuse: stack spec",
            refusals=[(check.name, check.detail, check.remedy)],  # as deploy/verify.py says it
        )
        return None
