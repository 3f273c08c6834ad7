"""The smoke step's script: ``files/verify-smoke.sh.j2`` rendered for one host (no pyinfra).

``facts.smoke.SmokeStep`` runs it on a host as the training user; a GPU harness can run the same
text by hand (``sh JOB no``), so the device run and verify share one code path.
"""

from __future__ import annotations

import shlex
from typing import NamedTuple

from p40fleet.shell_template import shell_template
from p40fleet.verification import smoke
from p40fleet.verl_patches import APPLIER_PATH, VerlPatchError, lab_cpu_ruleset_json

__all__ = ["RAY_PORT", "SMOKE_TEMPLATE", "SmokeTargets", "render_job"]

SMOKE_TEMPLATE = APPLIER_PATH.parent / "verify-smoke.sh.j2"
#: The GCS port of the Ray head a simulated host's CPU step starts (not Ray's 6379: a Ray
#: cluster of the fleet may hold that one).
RAY_PORT = 26379
#: Lines of the trainer's log the script sends back (the check keeps the last ones).
SCRIPT_LOG_LINES = 60


class SmokeTargets(NamedTuple):
    """What one smoke step runs: the training user, the env's python, the launch script, the
    verl checkout (whose package a CPU step copies), the verl ref (its lab-cpu rules), the
    host's GPUs per node (its launch plan), the bound in seconds and whether the inventory
    marks the host simulated (only then may the lab's marker make it a CPU step). Hashable: a
    memo key."""

    user: str
    python: str
    launch_script: str
    verl_checkout: str
    verl_ref: str
    gpus: int
    timeout_s: int
    simulated: bool = False


def _words(overrides: list[str]) -> str:
    return " ".join(smoke.shell_word(o) for o in overrides)


def render_job(targets: SmokeTargets) -> str:
    """The script the training user runs (``$1``: ``yes`` on a simulated host: the CPU step)."""
    try:
        rules = lab_cpu_ruleset_json(targets.verl_ref)
    except VerlPatchError:  # no CPU rules for this ref: the applier says so on a simulated host
        rules = '{"format": 1, "ref": "none", "profile": "lab-cpu", "rules": []}'
    return shell_template(SMOKE_TEMPLATE).render(
        python=targets.python,
        launch_script=targets.launch_script,
        verl_checkout=targets.verl_checkout.rstrip("/") or "/",
        timeout_s=int(targets.timeout_s),
        log_lines=SCRIPT_LOG_LINES,
        applier=APPLIER_PATH.read_text().rstrip("\n"),
        rules_json=rules.rstrip("\n"),
        cpu_overrides=_words(smoke.smoke_overrides(simulated=True, gpus=1)),
        gpu_overrides=_words(smoke.smoke_overrides(simulated=False, gpus=targets.gpus)),
        cpu_ray_args=" ".join(shlex.quote(a) for a in smoke.cpu_ray_start_args(RAY_PORT)),
    )
