"""Verification checks: raw probe answers + stack spec + GPU facts -> PASS / FAIL / SKIP.

Pure functions, no pyinfra: :mod:`.probe` reads the probe's answers, :func:`run_checks` runs
every check of :mod:`.checks` (one module per component), in :data:`CHECK_NAMES` order, on
them and on what the spec and the host's PCI GPU facts say they must be. The statuses and the
verdict are in :mod:`.check`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from p40fleet.spec import StackSpec
from p40fleet.training import TrainingTarget
from p40fleet.verification.check import FAIL, SIM_DATA, SIM_MARKERS, Check
from p40fleet.verification.checks import (
    apex,
    conda,
    cuda,
    cudnn,
    driver,
    gpu,
    nouveau,
    torch,
    training,
    verl,
)
from p40fleet.verification.probe import CheckContext, ProbeAnswers

__all__ = ["CHECK_NAMES", "LAB_MARKER", "PROBE", "REGISTRY", "run_checks"]

#: The check reported between ``gpus`` and the rest only when the probe broke (no function).
PROBE = "probe"
#: The check reported after ``gpus`` only when a host its inventory does not mark simulated
#: has the simulated lab's marker (no function).
LAB_MARKER = "lab marker"

#: Every check in the order :func:`run_checks` reports it, by the name it reports.
REGISTRY: tuple[tuple[str, Callable[[CheckContext], Check] | None], ...] = (
    ("gpus", gpu.gpus),
    (PROBE, None),
    (LAB_MARKER, None),
    ("nouveau", nouveau.nouveau),
    ("driver installed", driver.driver_installed),
    ("dkms", driver.dkms),
    ("nvidia-smi gpus", driver.smi_gpus),
    ("nvidia-smi driver", driver.smi_driver),
    ("nvcc", cuda.nvcc),
    ("cudnn version", cudnn.cudnn_version),
    ("cudnn hard links", cudnn.cudnn_links),
    ("python version", conda.python_version),
    ("torch version", torch.torch_version),
    ("torch cuda", torch.torch_cuda),
    ("torch capability", torch.torch_capability),
    ("apex", apex.apex),
    ("apex cuda ext", apex.apex_cuda),
    ("apex build key", apex.apex_key),
    ("verl version", verl.verl_version),
    ("verl checkout", verl.verl_checkout),
    ("verl patches", verl.verl_patches),
    ("trainer modules", training.trainer_modules),
    ("launch overrides", training.launch_overrides),
    ("model files", training.model_files),
    ("data files", training.data_files),
)

#: Names of the checks :func:`run_checks` returns, in order (``probe`` only when it broke).
CHECK_NAMES = tuple(name for name, _ in REGISTRY)

_AFTER_THE_PROBE = tuple(
    check for _, check in REGISTRY[CHECK_NAMES.index(LAB_MARKER) + 1 :] if check
)


def run_checks(
    answers: ProbeAnswers,
    spec: StackSpec,
    pci_gpus: Iterable[Any],
    *,
    apex_key: str | None = None,
    training: TrainingTarget | None = None,
    simulated: bool = False,
) -> list[Check]:
    """Every check for one host, in :data:`CHECK_NAMES` order.

    ``simulated``: the inventory marks the host a simulated lab's (host data ``p40lab_sim``,
    ``check.simulated_in_inventory``); only then do the GPU checks SKIP, and only where the
    host has the lab's marker too. The marker on a host the inventory does not mark is a FAIL
    (``lab marker``), and its checks run as on real hardware.

    ``pci_gpus``: the host's ``facts.gpu.PciGpu`` list (anything with ``bus_id`` and
    ``device_id``). ``apex_key``: the Apex build key the spec needs on this host (None: SKIP).
    ``training``: the host's launch plan (overrides, model and data paths) the training-path
    checks compare the probe's answers with (None: those SKIP).
    """
    pci = tuple(pci_gpus)
    summary = spec.gpu_summary(pci)
    host = answers.section("host")
    marker = bool(host and host.get("sim") == "yes")
    ctx = CheckContext(
        spec=spec,
        answers=answers,
        pci=pci,
        sim=simulated and marker,
        lowest=summary.lowest_capability,
        profile=summary.profile,
        apex_key=apex_key,
        training=training,
    )
    checks = [gpu.gpus(ctx)]
    if not answers.started:
        checks.append(
            Check(
                PROBE,
                FAIL,
                "the verify probe gave no answer (no output)",
                "run `pyinfra INVENTORY deploy/verify.py --debug` to see why",
            )
        )
        return checks
    if not answers.complete:
        last = list(answers.sections)[-1] if answers.sections else "start"
        checks.append(
            Check(
                PROBE,
                FAIL,
                f"the verify probe stopped early (last section: {last})",
                "run `pyinfra INVENTORY deploy/verify.py --debug` to see why",
            )
        )
    if marker and not simulated:
        checks.append(
            Check(
                LAB_MARKER,
                FAIL,
                f"the simulated lab's marker ({' or '.join(SIM_MARKERS)}) is on this host, but "
                f"its inventory does not mark it simulated (host data {SIM_DATA}): it is "
                "checked as real hardware, nothing skipped",
                f"on a real host remove it (rm -rf {' '.join(SIM_MARKERS)}); a p40lab host "
                "belongs in inventories/sim.py",
            )
        )
    checks += [check(ctx) for check in _AFTER_THE_PROBE]
    return checks
