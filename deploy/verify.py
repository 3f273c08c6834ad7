"""Verify the stack on every host — changes nothing.

    pyinfra -y inventories/sim.py deploy/verify.py          # table; exit != 0 if a host fails
    python -m p40fleet.verify inventories/sim.py --json r.json   # same, exit 0 / 1 / 2

One read-only probe per host (``facts.verify.VerifyProbe``) answers everything; the checks
(``p40fleet.checks``) compare the answers with the stack spec and the host's PCI GPU facts.
After the last host: one fleet table (``P40FLEET_VERIFY_TABLE=0`` turns it off) and, when
``$P40FLEET_REPORT`` names a file, the JSON report there.

A host with a FAIL gets one operation that fails it without changing anything
(``operations.preflight.refuse``), so pyinfra's own exit status is non-zero. A host where every
check passes or is skipped gets no operation at all: 0 changes, and ``--dry`` works.
"""

from __future__ import annotations

import os

from pyinfra import host, state

from facts.gpu import PciGpus
from facts.python_env import env_dir, env_python
from facts.verify import VerifyProbe
from operations import apex, artifacts, cudnn
from operations.preflight import refuse, validated_spec
from p40fleet import report
from p40fleet.checks import FAIL, Check, host_verdict, run_checks, spec_failure
from p40fleet.spec import SpecError, StackSpec, spec_for_host
from p40fleet.verl_patches import RECORD_NAME

_RESULTS_ATTR = "p40fleet_verify_results"
_PRINTED_ATTR = "p40fleet_verify_printed"
TABLE_ENV = "P40FLEET_VERIFY_TABLE"


def expected_apex_key(spec: StackSpec, gpus: list) -> str | None:
    """The Apex build key deploy/python.py installs on this host (same inputs as there)."""
    capabilities = [g.model.compute_capability for g in gpus if g.model]
    if not capabilities:
        return None
    cuda_ext = getattr(spec.apex, "cuda_ext", None)
    if cuda_ext is None:
        cuda_ext = apex.cuda_ext_default(spec.torch.version)
    return apex.ApexBuild(
        ref=spec.apex.ref,
        commit=spec.apex.commit,
        torch=spec.torch.version,
        cuda=spec.cuda.version if cuda_ext else None,
        arch_list=apex.arch_list(capabilities),
        python=".".join(spec.python_version.split(".")[:2]),
        cuda_ext=cuda_ext,
    ).key


def verify_host(spec: StackSpec) -> list[Check]:
    """Probe this host once and run every check."""
    gpus = list(host.get_fact(PciGpus))
    env = spec.env
    try:
        answers = host.get_fact(
            VerifyProbe,
            cuda_dir=spec.paths.cuda_dir,
            cudnn_tree=cudnn.extracted_dir(
                spec.paths.cudnn_extract_dir, artifacts.artifact_path(spec, "cudnn")
            ),
            python=env_python(env.conda_prefix, env.name),
            apex_key_file=f"{env_dir(env.conda_prefix, env.name)}/{apex.KEY_FILE}",
            verl_checkout=env.verl_checkout,
            verl_ref=spec.verl.ref,
            patch_record=f"{env.verl_checkout.rstrip('/')}/{RECORD_NAME}",
        )
    except Exception as exc:  # a probe that cannot run is a FAIL of this host, not of the run
        answers = None
        problem = f"{type(exc).__name__}: {exc}"
    checks = run_checks(
        answers if answers is not None else VerifyProbe.default(),
        spec,
        gpus,
        apex_key=expected_apex_key(spec, gpus),
    )
    if answers is None:
        checks = [
            Check(
                "probe",
                FAIL,
                f"the verify probe could not run: {problem}",
                "run `pyinfra INVENTORY deploy/verify.py --debug` to see why",
            )
            if c.name == "probe"
            else c
            for c in checks
        ]
    return checks


def _checks_for_this_host() -> list[Check]:
    try:
        spec = spec_for_host(host)
    except SpecError as exc:
        validated_spec()  # queues the refusal (fails the host at execution, changes nothing)
        return spec_failure(line.removeprefix(f"host {exc.host}: ") for line in exc.lines())
    checks = verify_host(spec)
    failed = [c for c in checks if c.status == FAIL]
    if failed:
        refuse(
            name=f"Verify: {len(failed)} check(s) failed",
            step="verify",
            reason="\n".join(f"{c.name}: {c.detail} (fix: {c.remedy})" for c in failed),
            remedy="fix the failed checks above, then verify again",
        )
    return checks


def _finish(results: dict) -> None:
    """After the last host: add the unreachable ones, print the table, write the JSON."""
    entries = dict(results)
    for other in state.inventory:
        if state.is_host_in_limit(other) and other not in state.activated_hosts:
            entries.setdefault(other.name, report.unreachable_entry())
    fleet = report.build_report(entries)
    if os.environ.get(TABLE_ENV, "1") != "0":
        report.print_report(fleet)
    path = os.environ.get(report.REPORT_ENV)
    if path:
        report.write_report(fleet, path)


checks = _checks_for_this_host()
verdict = host_verdict(checks)
counts = {s: sum(c.status == s for c in checks) for s in ("PASS", "FAIL", "SKIP")}
print(
    f"[{host.name}] verify: {verdict} "
    f"({counts['PASS']} pass, {counts['FAIL']} fail, {counts['SKIP']} skip)",
    flush=True,
)

# This file runs once per host (in parallel greenlets); the table waits for the last one.
results: dict = getattr(state, _RESULTS_ATTR, None) or {}
results[host.name] = report.host_entry(checks)
setattr(state, _RESULTS_ATTR, results)
active = {h.name for h in state.inventory.get_active_hosts()}
if active <= set(results) and not getattr(state, _PRINTED_ATTR, False):
    setattr(state, _PRINTED_ATTR, True)
    _finish(results)
