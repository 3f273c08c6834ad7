"""Verification of a provisioned host: the probe's arguments, the checks, and the run after
the last operation of ``deploy/full.py``.

pyinfra gathers facts while it prepares, before any operation runs, so a check made then sees
the hosts as they were. ``verify_after_run()`` therefore registers a state callback that probes
every host that is still up once the last operation has ended (read-only: nothing is changed,
no operation is added), prints the fleet table, writes the JSON report when
``$P40FLEET_REPORT`` names a file, and marks hosts with a FAIL as failed (pyinfra exits 1).
"""

from __future__ import annotations

import os
from typing import Any

import gevent
from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.state import BaseStateCallback

from p40fleet import apex_build, report
from p40fleet.facts.env import env_dir, env_python
from p40fleet.facts.gpu import PciGpus
from p40fleet.facts.survey import ask
from p40fleet.facts.verify import VerifyProbe
from p40fleet.operations import artifacts, cudnn, run_lock, training
from p40fleet.operations.refuse import host_refusals
from p40fleet.run_record import run_record
from p40fleet.runtime import sshguard
from p40fleet.runtime.connector_args import host_connector_arguments
from p40fleet.spec import SpecError, StackSpec, spec_for_host
from p40fleet.training import TrainingTarget
from p40fleet.verification import TABLE_ENV
from p40fleet.verification.check import FAIL, Check, host_verdict, simulated_in_inventory
from p40fleet.verification.probe import ProbeTargets
from p40fleet.verification.run import run_checks
from p40fleet.verl_patches import RECORD_NAME


def probe_targets(spec: StackSpec, target: TrainingTarget) -> ProbeTargets:
    """What the verify probe looks at on a host with this spec and this launch plan."""
    env = spec.env
    return ProbeTargets(
        model_path=target.model_path,
        train_file=target.train_file,
        val_file=target.val_file,
        launch_script=training.script_path(spec.user.home),
        cuda_dir=spec.paths.cuda_dir,
        cudnn_tree=cudnn.extracted_dir(
            spec.paths.cudnn_extract_dir, artifacts.artifact_path(spec, "cudnn")
        ),
        python=env_python(env.conda_prefix, env.name),
        apex_key_file=f"{env_dir(env.conda_prefix, env.name)}/{apex_build.KEY_FILE}",
        verl_checkout=env.verl_checkout,
        verl_ref=spec.verl.ref,
        patch_record=f"{env.verl_checkout.rstrip('/')}/{RECORD_NAME}",
        user=spec.user.name,
    )


def expected_apex_key(spec: StackSpec, gpus: list) -> str | None:
    """The Apex build key deploy/python.py installs on a host with these GPUs."""
    if not any(g.model for g in gpus):
        return None
    return spec.apex_build(gpus).key


def checks_for(
    spec: StackSpec,
    gpus: list,
    answers: Any,
    problem: str | None = None,
    target: TrainingTarget | None = None,
    simulated: bool = False,
) -> list[Check]:
    """Every check for one host from its probe answers (None: the probe could not run).
    ``simulated``: its inventory marks it a simulated lab's (``simulated_in_inventory``)."""
    checks = run_checks(
        answers if answers is not None else VerifyProbe.default(),
        spec,
        gpus,
        apex_key=expected_apex_key(spec, gpus),
        training=target,
        simulated=simulated,
    )
    if answers is None:
        checks = [
            Check(
                "probe",
                FAIL,
                f"the verify probe could not run: {problem}",
                "run `pyinfra INVENTORY deploy/verify.py --debug` to see why",
            )  # fmt: skip
            if c.name == "probe"
            else c
            for c in checks
        ]
    return checks


def summary_line(name: str, entry: list[Check] | dict[str, Any]) -> str:
    """``[host] verify: VERDICT (...)`` from a host's checks or its report entry."""
    if isinstance(entry, dict):
        if entry["verdict"] == report.REFUSED:
            why = "; ".join(f"{c['name']}: {c['detail']}" for c in entry["checks"])
            return f"[{name}] verify: {report.REFUSED} ({why})"
        entry = [Check.from_dict(c) for c in entry["checks"]]
    counts = {s: sum(c.status == s for c in entry) for s in ("PASS", "FAIL", "SKIP")}
    return (
        f"[{name}] verify: {host_verdict(entry)} "
        f"({counts['PASS']} pass, {counts['FAIL']} fail, {counts['SKIP']} skip)"
    )


def _with_details(target, entry: dict[str, Any]) -> dict[str, Any]:
    """The entry with the host's GPU summary and the pins its spec sets (when both are known)."""
    if "gpus" in entry:
        return entry
    try:
        spec = spec_for_host(target)
        gpus = list(ask(target, PciGpus))
    except SpecError:
        return entry  # its only check says why the spec is refused
    except Exception:  # noqa: BLE001 - a host lost since its checks keeps them, without details
        return entry
    return {**entry, "gpus": report.gpu_summary(gpus, spec), "pins": report.spec_pins(spec)}


def finish(entries: dict[str, Any]) -> dict[str, Any]:
    """Add hosts that were never reached and each host's GPUs and pins, print the table, write
    the JSON report (with its provenance: time, inventory, p40fleet version)."""
    entries = dict(entries)
    for other in state.inventory:
        if state.is_host_in_limit(other) and other not in state.activated_hosts:
            failure = sshguard.connect_failure(other) or (None, None)
            entries.setdefault(other.name, report.connect_entry(other.name, *failure))
        elif other.name in entries:
            entries[other.name] = _with_details(other, entries[other.name])
    fleet = report.build_report(entries, provenance=report.provenance())
    path = os.environ.get(report.REPORT_ENV)
    if path:  # before the table: a table that cannot print must not cost the report
        report.write_report(fleet, path)
    if os.environ.get(TABLE_ENV, "1") != "0":
        report.print_report(fleet)
    return fleet


def _probe_now(target, spec: StackSpec) -> list[Check]:
    """Run the probe on ``target`` now (not from the fact memo) and check the answers; this
    run's lock on it is released by the same command (``run_lock.defer_release``)."""
    fact = VerifyProbe()
    gpus = list(ask(target, PciGpus))  # live after a change in this run, else its survey's
    sim = simulated_in_inventory(target.data)
    plan = None
    release = run_lock.release_for(target)
    # as the facts run: with the host's connector arguments (_sudo, _sudo_password...)
    connect = host_connector_arguments(target)
    try:
        # the plan as the launch script has it now (the model config staged by this run)
        plan = training.training_target(spec, target)
        command = StringCommand(fact.command(probe_targets(spec, plan)))
        if release:
            command = StringCommand("(", command, "\n); rc=$?; {", release, "; } >/dev/null 2>&1")
            command = StringCommand(command, "; exit $rc")
            release = None
        ok, output = target.run_shell_command(command, print_output=False, **connect)
    except Exception as exc:  # noqa: BLE001 - a host that cannot be probed FAILs, the run goes on
        if release:  # the probe never ran: release on its own
            try:
                target.run_shell_command(StringCommand(release), print_output=False, **connect)
            except Exception as lost:  # noqa: BLE001 - the lock is stale: the next run takes it
                logger.warning(f"{target.print_prefix}run lock not released: {lost}")
        return checks_for(spec, gpus, None, f"{type(exc).__name__}: {exc}", plan, sim)
    if not ok:
        why = "; ".join(output.stderr_lines[-3:]) or "no output"
        return checks_for(spec, gpus, None, why, plan, sim)
    return checks_for(spec, gpus, fact.process(output.stdout_lines), target=plan, simulated=sim)


def _unprobed_entry(target, specs: dict) -> dict[str, Any] | None:
    """The entry of a host that gets no probe (refused, failed, or the run stopped), else None."""
    refusals = host_refusals(target)
    if refusals and target in target.state.failed_hosts:
        # refused (preflight, spec, run lock): the verdict deploy/verify.py gives it
        return report.refused_entry(refusals)
    if specs.get(target.name) is not None and target not in target.state.failed_hosts:
        return None
    why = (
        "an earlier step failed on this host: not verified"
        if target in target.state.failed_hosts
        else "the run stopped before the verification: not verified"
    )
    return report.host_entry(
        [Check("provisioning", FAIL, why, "see the error above, fix it, then re-run")]
    )


class _VerifyAfterLastOperation(BaseStateCallback):
    @staticmethod
    def operation_end(state, op_hash) -> None:  # noqa: ARG004 - pyinfra's callback signature
        order = state.get_op_order()
        if not order or op_hash != order[-1]:
            return
        record = run_record(state)
        record.verify_finished = True
        specs = record.verify_specs
        entries: dict[str, Any] = {}
        failed = set()
        probes = {}
        for target in state.inventory:
            if target.name not in specs or target not in state.activated_hosts:
                continue
            entry = _unprobed_entry(target, specs)
            if entry is not None:
                entries[target.name] = entry
                continue
            # every host's probe at once, as pyinfra runs operations: the fleet waits for the
            # slowest host, not for the sum of them
            probes[target] = state.pool.spawn(_probe_now, target, specs[target.name])
        gevent.joinall(list(probes.values()))
        for target, probe in probes.items():
            checks = probe.get()
            logger.info(summary_line(target.name, checks))
            entries[target.name] = report.host_entry(checks)
            if host_verdict(checks) == FAIL:
                failed.add(target)
                for check in checks:
                    if check.status == FAIL:
                        logger.error(f"[{target.name}] verify: {check.name}: {check.detail} "
                                     f"(fix: {check.remedy})")  # fmt: skip
        finish(entries)
        if failed:
            state.failed_hosts.update(failed)  # pyinfra exits 1; no operation is left to skip

    @staticmethod
    def host_disconnect(state, host) -> None:  # noqa: ARG004 - pyinfra's callback signature
        """The run ended before its last operation (every host failed or was refused: pyinfra
        stops with "No hosts remaining!"): the report still says each host's verdict."""
        record = run_record(state)
        if record.verify_finished or not state.is_executing:
            return  # reported already, or nothing ran (--dry, or pyinfra stopped before)
        if any(target not in state.failed_hosts for target in state.activated_hosts):
            return  # a host that goes on (one the deploy reboots disconnects, then comes back)
        record.verify_finished = True
        specs = record.verify_specs
        entries = {
            target.name: _unprobed_entry(target, specs) or _unprobed_entry(target, {})
            for target in state.inventory
            if target.name in specs and target in state.activated_hosts
        }
        finish(entries)


def verify_after_run(spec: StackSpec | None) -> None:
    """Verify this host once the last operation of the run has ended (see module doc); a host
    without a valid spec (None) is reported REFUSED with the reasons it was refused for."""
    record = run_record(state)
    if not record.verify_registered:
        record.verify_registered = True
        state.add_callback_handler(_VerifyAfterLastOperation())
    record.verify_specs[host.name] = spec
    if spec is not None:
        run_lock.defer_release()  # released with the probe: one command, not two
