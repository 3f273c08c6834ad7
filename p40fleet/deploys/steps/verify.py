"""Verify the stack on every host — changes nothing.

    pyinfra -y inventories/sim.py deploy/verify.py          # table; exit != 0 if a host fails
    python -m p40fleet.verify inventories/sim.py --json r.json   # same, exit 0 / 1 / 2

One read-only probe per host (``facts.verify.VerifyProbe``) answers everything; the checks
(``p40fleet.verification``) compare the answers with the stack spec, the host's PCI GPU facts
and its launch plan (the training path: verl's trainer modules import, the overrides of the
host's ~/launch-ppo.sh compose with the host's verl, the model and data files it names are
there).
After the last host: one fleet table (``P40FLEET_VERIFY_TABLE=0`` turns it off) and, when
``$P40FLEET_REPORT`` names a file, the JSON report there.

With ``verify_smoke``, a Ray head of two or more training nodes also runs ONE step with the
cluster's plan over the fleet's Ray cluster (``smoke step (cluster)``, after its own step;
``operations.run.ray_cluster.cluster_smoke_checks``, ``docs/multi-node-step.md``).
With ``verify_collective`` in the host data, the Ray head also runs one all-reduce over the
cluster's training nodes (``operations.run.ray_cluster.collective_checks``).

A host outside the stack (its GPUs, OS, stack spec or verl ref refused, as by
``deploy/preflight.py``) is REFUSED: one verdict with the reason and the fix, nothing probed.
A host with a FAIL or REFUSED gets one operation that fails it without changing anything
(``operations.refuse.refuse``), so pyinfra's own exit status is non-zero. A host where every
check passes or is skipped gets no operation at all: 0 changes, and ``--dry`` works.
"""

from __future__ import annotations

from pyinfra import host, state

from p40fleet import preflight, report
from p40fleet.facts.env import env_python
from p40fleet.facts.gpu import PciGpus
from p40fleet.facts.host import LinuxDistribution, os_label
from p40fleet.facts.smoke import SmokeStep, SmokeTargets
from p40fleet.facts.survey import ask
from p40fleet.facts.verify import VerifyProbe
from p40fleet.host_key import HOST_KEY_REMEDY, HOST_KEY_STEP
from p40fleet.operations import training
from p40fleet.operations.refuse import refuse
from p40fleet.operations.run import ray_cluster
from p40fleet.operations.run import verify as run_verify
from p40fleet.run_record import run_record
from p40fleet.runtime import sshguard
from p40fleet.spec import SpecError, StackSpec, spec_for_host
from p40fleet.verification import collective, smoke
from p40fleet.verification.check import FAIL, Check, simulated_in_inventory, spec_failure


def verify_host(spec: StackSpec) -> list[Check]:
    """Probe this host once (a fact: read-only) and run every check; with ``verify_smoke`` in
    the host data, one PPO step after them (``smoke step``)."""
    gpus = list(ask(host, PciGpus))
    sim = simulated_in_inventory(host.data)  # the inventory's word, never the host's disk
    target = None
    try:
        target = training.training_target(spec)  # the launch plan the script has
        answers = ask(host, VerifyProbe, targets=run_verify.probe_targets(spec, target))
    except Exception as exc:  # noqa: BLE001 - a probe that cannot run FAILs this host only
        problem = f"{type(exc).__name__}: {exc}"
        return run_verify.checks_for(spec, gpus, None, problem, target, sim)
    checks = run_verify.checks_for(spec, gpus, answers, target=target, simulated=sim)
    if smoke.requested(host.data.get(smoke.SMOKE_DATA)):
        checks.append(smoke_step(spec, target, checks))
    return checks


def smoke_step(spec: StackSpec, target, checks: list[Check]) -> Check:
    """One PPO step through the host's own ~/launch-ppo.sh, as the training user (a fact)."""
    skipped = smoke.smoke_skip(checks)
    if skipped is not None:
        return skipped
    try:
        timeout_s = smoke.timeout_from_data(host.data.get(smoke.SMOKE_TIMEOUT_DATA))
    except ValueError as exc:
        return Check(smoke.CHECK, FAIL, str(exc), "set it to whole seconds (or leave it out)")
    gpus = smoke.gpus_per_node(target.overrides)
    targets = SmokeTargets(
        user=spec.user.name,
        python=env_python(spec.env.conda_prefix, spec.env.name),
        launch_script=training.script_path(spec.user.home),
        verl_checkout=spec.env.verl_checkout,
        verl_ref=spec.verl.ref,
        gpus=gpus,
        timeout_s=timeout_s,
        simulated=simulated_in_inventory(host.data),
    )
    run = ask(host, SmokeStep, targets=targets)
    return smoke.smoke_check(
        run,
        model=spec.training.model.name,
        overrides=smoke.smoke_overrides(simulated=run.values.get("sim") == "yes", gpus=gpus),
        timeout_s=timeout_s,
    )


def _refused(spec: StackSpec) -> list[preflight.Refusal]:
    """The preflight's refusals that put this host outside the stack (GPU, verl ref, OS)."""
    summary = spec.gpu_summary(ask(host, PciGpus))
    distribution = os_label(ask(host, LinuxDistribution))
    return preflight.outside_the_stack(summary, spec.verl.ref, distribution)


def _refuse(refusals: list[tuple[str, str, str]]) -> dict:
    """One REFUSED verdict (and one failing operation) instead of a cascade of FAILs."""
    refuse(
        name="Verify: refused",
        step="verify",
        reason="outside this stack: "
        + "; ".join(f"{step}: {reason} (fix: {fix})" for step, reason, fix in refusals),
        remedy="take the host out of the inventory or serve it with another stack",
    )
    return report.refused_entry(refusals)


def _entry_for_this_host() -> dict:
    unchecked = sshguard.host_key_refusal(host)  # S17: before any command
    if unchecked is not None:
        reason = unchecked.removeprefix(f"host {host.name}: ")
        return _refuse([(HOST_KEY_STEP, reason, HOST_KEY_REMEDY)])  # as deploy/full.py says
    try:
        spec = spec_for_host(host)
    except SpecError as exc:
        lines = [line.removeprefix(f"host {exc.host}: ") for line in exc.lines()]
        (check,) = spec_failure(lines)
        return _refuse([(check.name, check.detail, check.remedy)])
    refusals = _refused(spec)
    if refusals:
        return _refuse([(r.step, r.reason, r.remedy) for r in refusals])
    checks = verify_host(spec) + ray_cluster.verify_checks(spec)
    if smoke.requested(host.data.get(smoke.SMOKE_DATA)):
        checks += ray_cluster.cluster_smoke_checks(spec, checks)  # the head: one cluster step
    if collective.requested(host.data.get(collective.COLLECTIVE_DATA)):
        checks += ray_cluster.collective_checks(spec)  # on the head: one per node + the group
    failed = [c for c in checks if c.status == FAIL]
    if failed:
        refuse(
            name=f"Verify: {len(failed)} check(s) failed",
            step="verify",
            reason="\n".join(f"{c.name}: {c.detail} (fix: {c.remedy})" for c in failed),
            remedy="fix the failed checks above, then verify again",
        )
    return report.host_entry(checks)


def run() -> None:
    """The deploy's steps for the current host (``deploy/verify.py`` calls it)."""
    sshguard.install()  # no command to a host whose key is not checked (config.py did it first)
    entry = _entry_for_this_host()
    # stdout is pyinfra's JSON under --json: the human line goes to stderr then
    print(run_verify.summary_line(host.name, entry), file=report.human_stream(), flush=True)

    # This file runs once per host (in parallel greenlets); the table waits for the last one.
    record = run_record(state)
    results = record.verify_results
    results[host.name] = entry
    active = {h.name for h in state.inventory.get_active_hosts()}
    if active <= set(results) and not record.verify_printed:
        record.verify_printed = True
        run_verify.finish(results)
