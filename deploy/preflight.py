"""Preflight: every refusal decided before any host changes.

    pyinfra INVENTORY deploy/preflight.py   (deploy/full.py runs it first)

Spec errors, unsupported GPUs or OS, a verl ref that cannot serve the host's GPUs, too
little space, artifacts missing from the mirror:
a refused host fails here with the step, the cause and the fix; the others go on.
"""

from __future__ import annotations

from pyinfra import host

from facts.artifacts import ArtifactState
from facts.cuda import CudaToolkit
from facts.gpu import PciGpus
from facts.host import FreeSpace, LinuxDistribution, os_label
from facts.mirror import UrlHead
from operations.artifacts import artifact_path
from operations.refuse import refuse_host, validated_spec
from p40fleet import preflight
from p40fleet.spec import ARTIFACTS, cuda_release_of

spec = validated_spec()

if spec is not None:
    summary = spec.gpu_summary(host.get_fact(PciGpus))
    verified = {
        item: host.get_fact(ArtifactState, path=artifact_path(spec, item)).verified(
            spec.artifact(item).sha256
        )
        for item in ARTIFACTS
    }
    cuda = host.get_fact(CudaToolkit, cuda_dir=spec.paths.cuda_dir)
    cuda_installed = bool(
        cuda.nvcc and cuda.version and cuda_release_of(cuda.version) == spec.cuda_release
    )
    cache = spec.paths.artifact_cache
    space = host.get_fact(FreeSpace, path=cache)
    answers = [
        (item, url, answer.status if answer else 0, answer.error if answer else "no answer")
        for item in ARTIFACTS
        if not verified[item]
        for url in [spec.artifact_url(item)]
        for answer in [host.get_fact(UrlHead, url=url)]
    ]

    refusals = [
        preflight.gpu_refusal(summary),
        preflight.verl_refusal(spec.verl.ref, summary),
        preflight.os_refusal(os_label(host.get_fact(LinuxDistribution))),
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
        )
