"""Verify the stack on every host — changes nothing.

    pyinfra -y inventories/sim.py deploy/verify.py          # table; exit != 0 if a host fails
    python -m p40fleet.verify inventories/sim.py --json r.json   # same, exit 0 / 1 / 2

One read-only probe per host (``facts.verify.VerifyProbe``) answers everything; the checks
(``p40fleet.checks``) compare the answers with the stack spec, the host's PCI GPU facts and its
launch plan (the training path: verl's trainer modules import, the plan's overrides compose
with the host's verl, the model and data files the script names are there).
After the last host: one fleet table (``P40FLEET_VERIFY_TABLE=0`` turns it off) and, when
``$P40FLEET_REPORT`` names a file, the JSON report there.

A host with a FAIL gets one operation that fails it without changing anything
(``operations.preflight.refuse``), so pyinfra's own exit status is non-zero. A host where every
check passes or is skipped gets no operation at all: 0 changes, and ``--dry`` works.
"""

from __future__ import annotations

from pyinfra import host, state

from facts.gpu import PciGpus
from facts.verify import VerifyProbe
from operations import ray_cluster, training, verification
from operations.preflight import refuse, validated_spec
from p40fleet import report
from p40fleet.checks import FAIL, Check, spec_failure
from p40fleet.spec import SpecError, StackSpec, spec_for_host

_RESULTS_ATTR = "p40fleet_verify_results"
_PRINTED_ATTR = "p40fleet_verify_printed"


def verify_host(spec: StackSpec) -> list[Check]:
    """Probe this host once (a fact: read-only) and run every check."""
    gpus = list(host.get_fact(PciGpus))
    target = None
    try:
        target = training.training_target(spec)  # the launch plan the script has
        answers = host.get_fact(VerifyProbe, **verification.probe_arguments(spec, target))
    except Exception as exc:  # noqa: BLE001 - a probe that cannot run FAILs this host only
        problem = f"{type(exc).__name__}: {exc}"
        return verification.checks_for(spec, gpus, None, problem, target)
    return verification.checks_for(spec, gpus, answers, target=target)


def _checks_for_this_host() -> list[Check]:
    try:
        spec = spec_for_host(host)
    except SpecError as exc:
        # queues the refusal (fails the host at execution, changes nothing); read-only: no lock
        validated_spec(lock=False)
        return spec_failure(line.removeprefix(f"host {exc.host}: ") for line in exc.lines())
    checks = verify_host(spec) + ray_cluster.verify_checks(spec)
    failed = [c for c in checks if c.status == FAIL]
    if failed:
        refuse(
            name=f"Verify: {len(failed)} check(s) failed",
            step="verify",
            reason="\n".join(f"{c.name}: {c.detail} (fix: {c.remedy})" for c in failed),
            remedy="fix the failed checks above, then verify again",
        )
    return checks


checks = _checks_for_this_host()
print(verification.summary_line(host.name, checks), flush=True)

# This file runs once per host (in parallel greenlets); the table waits for the last one.
results: dict = getattr(state, _RESULTS_ATTR, None) or {}
results[host.name] = report.host_entry(checks)
setattr(state, _RESULTS_ATTR, results)
active = {h.name for h in state.inventory.get_active_hosts()}
if active <= set(results) and not getattr(state, _PRINTED_ATTR, False):
    setattr(state, _PRINTED_ATTR, True)
    verification.finish(results)
