"""Each layer's facts, as its operations ask them on a host where nothing is to change.

``deploy/preflight.py`` (which every deploy includes first) asks :func:`survey_host` once per
host: one command answers every fact the preflight, system, Python and training layers ask
on a converged host (``facts.survey``), so a no-op run of ``deploy/full.py`` or of the four
deploys named in one call sends one fact command per host. A fact missing here is still
right, only asked on its own (``facts.survey.ask``); a host that changes asks live.

The list is the concatenation of what each operations module declares beside its asks
(``survey_parts(spec)``, :data:`MODULES` in deploy order) and of the deploy files' own asks
(:func:`deploy_parts`); ``tests/test_survey_parts.py`` runs every operation on a converged
host and fails on a fact its module does not declare. The guards for pyinfra's own file
operations (``operations.util.unchanged``) decide "nothing to do" from the same answers.
"""

from __future__ import annotations

from typing import Any

from p40fleet.facts.artifacts import ArtifactState
from p40fleet.facts.cuda import CudaToolkit
from p40fleet.facts.gpu import PciGpus
from p40fleet.facts.host import Cpus, FreeSpace, LinuxDistribution, MemTotal
from p40fleet.facts.survey import Part, part, survey
from p40fleet.operations import (
    apex,
    artifacts,
    conda,
    cuda,
    cudnn,
    driver,
    mirror,
    nouveau,
    proxy,
    run_lock,
    torch,
    training,
    training_user,
    verl,
)
from p40fleet.run_lock import DEFAULT_PATH
from p40fleet.spec import ARTIFACTS, StackSpec

__all__ = ["MODULES", "deploy_parts", "layer_parts", "survey_host"]

#: The operations modules whose ``survey_parts(spec)`` the survey concatenates, in the order
#: the deploys run them (the run lock's part is per host: :func:`layer_parts` adds it).
MODULES = (
    proxy,  # deploy/preflight.py
    artifacts,  # deploy/system.py
    cudnn,
    mirror,
    nouveau,
    driver,
    cuda,
    training_user,  # deploy/python.py
    conda,
    torch,
    apex,
    verl,
    training,  # deploy/training.py
)


def deploy_parts(spec: StackSpec) -> list[Part]:
    """What the deploy files ask themselves, outside any operation: deploy/preflight.py's
    refusals and deploy/python.py's GPUs and Apex build jobs."""
    return [
        part(PciGpus),
        *(part(ArtifactState, path=artifacts.artifact_path(spec, item)) for item in ARTIFACTS),
        part(CudaToolkit, cuda_dir=spec.paths.cuda_dir),
        part(FreeSpace, path=spec.paths.artifact_cache),
        part(LinuxDistribution),
        part(Cpus),
        part(MemTotal),
    ]


#: ``layer_parts`` per (spec, lock): every deploy, the Ray shape and the Apex election ask a
#: host's survey again (a no-op once answered), so the list is built once per spec object.
_PARTS: dict[tuple[int, str | None], tuple[StackSpec, tuple[Part, ...]]] = {}


def layer_parts(spec: StackSpec, lock: str | None = None) -> tuple[Part, ...]:
    """Every layer a run of these deploys uses (see the module doc); ``lock``: the host's run
    lock path (None: no lock part)."""
    cached = _PARTS.get((id(spec), lock))
    if cached is not None and cached[0] is spec:
        return cached[1]
    parts = tuple(
        dict.fromkeys(  # a fact two modules ask (NvidiaSmi, EnvDistributions) once
            [
                *deploy_parts(spec),
                *run_lock.survey_parts(spec, lock),
                *(one for module in MODULES for one in module.survey_parts(spec)),
            ]
        )
    )
    _PARTS[(id(spec), lock)] = (spec, parts)  # the spec kept: its id is not reused
    return parts


def survey_host(target: Any, spec: StackSpec) -> int:
    """Ask ``target``'s survey: once per run (a part already asked is not asked again), also
    for another host than the current one (its lock path from its own data)."""
    lock = str(target.data.get(run_lock.PATH_KEY) or DEFAULT_PATH)
    return survey(target, layer_parts(spec, lock))
