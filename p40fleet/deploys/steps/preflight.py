"""Preflight: every refusal decided before any host changes.

    pyinfra INVENTORY deploy/preflight.py   (deploy/full.py runs it first)

Spec errors, unsupported GPUs or OS, a verl ref that cannot serve the host's GPUs, a torch
lock that cannot install the spec's pins (a line without a sum, a pin it does not hold), no
verl requirements lock, too little space, artifacts missing from the mirror:
a refused host fails here with the step, the cause and the fix; the others go on.

First, for the whole run (idempotent, so every deploy can include this file): the guard for
lost connections (``p40fleet.runtime.sshguard``), the fact memo (``facts.survey``), the deploy
files' module entries that keep pyinfra's per-operation stack walk cheap
(``p40fleet.runtime.deploy_frames``), an SSH transport that wakes once a second while it waits,
after a reboot's reconnect too (``p40fleet.runtime.ssh_poll``), and one survey per host
answering the facts of every layer (``operations.run.survey``).
"""

from __future__ import annotations

from pyinfra import host, state

from p40fleet import preflight
from p40fleet.facts.artifacts import ArtifactState
from p40fleet.facts.cuda import CudaToolkit
from p40fleet.facts.gpu import PciGpus
from p40fleet.facts.host import FreeSpace, LinuxDistribution, os_label
from p40fleet.facts.mirror import UrlHead
from p40fleet.facts.survey import ask
from p40fleet.facts.survey import install as keep_facts
from p40fleet.operations import proxy
from p40fleet.operations.artifacts import artifact_path
from p40fleet.operations.refuse import refuse_host
from p40fleet.operations.run.spec import validated_spec
from p40fleet.operations.run.survey import survey_host
from p40fleet.proxy import UNCHECKED, shell_prefix
from p40fleet.runtime import deploy_frames, ssh_poll, sshguard
from p40fleet.spec import ARTIFACTS, SpecError, cuda_release_of, spec_for_host


def run() -> None:
    """The deploy's steps for the current host (``deploy/preflight.py`` calls it)."""
    sshguard.install()
    keep_facts(state)
    deploy_frames.install_for(state)
    ssh_poll.install(state, host)  # now, and again on every reconnect (server.reboot)
    try:
        # No survey (the first root command) to a host whose key is not checked (security S17):
        # validated_spec refuses it just below, before any command.
        if sshguard.host_key_refusal(host) is None:
            survey_host(host, spec_for_host(host))  # before the run lock's fact: same command
    except SpecError:
        pass  # refused just below, nothing to survey
    spec = validated_spec()

    if spec is None:
        return

    summary = spec.gpu_summary(ask(host, PciGpus))
    verified = {
        item: ask(host, ArtifactState, path=artifact_path(spec, item)).verified(
            spec.artifact(item).sha256
        )
        for item in ARTIFACTS
    }
    cuda = ask(host, CudaToolkit, cuda_dir=spec.paths.cuda_dir)
    cuda_installed = bool(
        cuda.nvcc and cuda.version and cuda_release_of(cuda.version) == spec.cuda_release
    )
    cache = spec.paths.artifact_cache
    space = ask(host, FreeSpace, path=cache)
    answers = [
        (item, url, answer.status if answer else 0, answer.error if answer else "no answer")
        for item in preflight.heads_to_ask(spec, verified)
        for url in [spec.artifact_url(item)]
        for answer in [ask(host, UrlHead, url=url, proxy=shell_prefix(spec.proxy, UNCHECKED))]
    ]

    refusals = [
        preflight.gpu_refusal(summary),
        *preflight.python_layer_refusals(spec, summary),  # verl ref, torch lock, verl lock
        preflight.os_refusal(os_label(ask(host, LinuxDistribution))),
        preflight.space_refusal(
            cache,
            space.available_bytes if space else None,
            preflight.space_needed(spec, verified, cuda_installed),
        ),
        *preflight.mirror_refusals(answers),
    ]
    refusals = [r for r in refusals if r is not None]
    if refusals:
        # One failing operation names every cause at once: fix them all before the next run.
        refuse_host(
            name="Refuse: preflight",
            step="preflight",
            reason=f"{len(refusals)} problem(s), nothing was changed:\n"
            + "\n".join(f"  - {r.step}: {r.reason} (fix: {r.remedy})" for r in refusals),
            remedy="fix each problem above, then re-run",
            refusals=[(r.step, r.reason, r.remedy) for r in refusals],  # the report's checks
        )

    # After the refusals, before the first fetch: a proxy password lives in a 0600 file
    # (once per host and run: every deploy of deploy/full.py includes this file).
    if proxy.first_time(state, host.name):
        proxy.credentials(name="Proxy credentials for the fetching steps", proxy=spec.proxy)
