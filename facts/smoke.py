"""The smoke step of ``verify --smoke``: one PPO step through ~/launch-ppo.sh, as a fact.

The script is ``files/verify-smoke.sh.j2`` rendered with the host's paths; all of it runs as the
training user (``p40fleet.privdrop``), root only tests whether the host is simulated. It
changes nothing the user owns (its scratch directory in /tmp is made and removed by the user)
and always exits 0: what happened is in the answer, which ``p40fleet.verification.smoke`` turns
into the ``smoke step`` check. Asked only by ``deploy/verify.py`` with ``verify_smoke`` set.
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import jinja2
from pyinfra.api import FactBase
from typing_extensions import override

from facts.survey import one_write
from facts.verify import SIMULATED_HOST_TEST
from p40fleet.privdrop import AS_USER_FN
from p40fleet.verification import smoke
from p40fleet.verl_patches import APPLIER_PATH, lab_cpu_ruleset_json

__all__ = ["SMOKE_TEMPLATE", "SmokeStep", "SmokeTargets", "render_smoke"]

SMOKE_TEMPLATE = Path(__file__).resolve().parent.parent / "files" / "verify-smoke.sh.j2"
#: The GCS port of the Ray head a simulated host's CPU step starts (not Ray's 6379: a Ray
#: cluster of the fleet may hold that one).
RAY_PORT = 26379


class SmokeTargets(NamedTuple):
    """What one smoke step runs: the training user, the env's python, the launch script, the
    verl checkout (whose package a CPU step copies), the verl ref (its lab-cpu rules), the
    host's GPUs per node (its launch plan) and the bound in seconds. Hashable: a memo key."""

    user: str
    python: str
    launch_script: str
    verl_checkout: str
    verl_ref: str
    gpus: int
    timeout_s: int


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env.from_string(SMOKE_TEMPLATE.read_text())


def _words(overrides: list[str]) -> str:
    return " ".join(smoke.shell_word(o) for o in overrides)


def render_job(targets: SmokeTargets) -> str:
    """The script the training user runs (``$1``: ``yes`` on a simulated host)."""
    try:
        rules = lab_cpu_ruleset_json(targets.verl_ref)
    except ValueError:
        rules = '{"format": 1, "ref": "none", "profile": "lab-cpu", "rules": []}'  # no CPU rules
    return _template().render(
        python=targets.python,
        launch_script=targets.launch_script,
        verl_checkout=targets.verl_checkout.rstrip("/") or "/",
        timeout_s=int(targets.timeout_s),
        log_lines=60,
        applier=APPLIER_PATH.read_text().rstrip("\n"),
        rules_json=rules.rstrip("\n"),
        cpu_overrides=_words(smoke.smoke_overrides(simulated=True, gpus=1)),
        gpu_overrides=_words(smoke.smoke_overrides(simulated=False, gpus=targets.gpus)),
        cpu_ray_args=" ".join(shlex.quote(a) for a in smoke.cpu_ray_start_args(RAY_PORT)),
    )


def render_smoke(targets: SmokeTargets) -> str:
    """The whole command: root tests whether the host is simulated, the training user runs the
    job (never root: the launch script, the env and the checkout are the user's)."""
    if not targets.user:
        raise ValueError("no training user given: the smoke step never runs as root")
    u = shlex.quote(targets.user)
    return (
        f"{AS_USER_FN}\n"
        f"if {SIMULATED_HOST_TEST}; then p40fleet_sim=yes; else p40fleet_sim=no; fi\n"
        f"if id -u {u} >/dev/null 2>&1; then "
        f'p40fleet_as {u} sh -c {shlex.quote(render_job(targets))} sh "$p40fleet_sim"; '
        f"else echo '@@p40fleet-smoke 1'; echo 'launch=absent'; echo '@@end'; fi; true"
    )


class SmokeStep(FactBase[smoke.SmokeRun]):
    """
    Returns what one PPO smoke step through the host's ~/launch-ppo.sh said (``SmokeRun``).
    Runs minutes; never fails the host.
    """

    @staticmethod
    @override
    def default() -> smoke.SmokeRun:
        return smoke.SmokeRun()

    @override
    def command(self, targets: SmokeTargets) -> str:
        return one_write(render_smoke(SmokeTargets(*targets))).get_raw_value()

    @override
    def process(self, output: list[str]) -> smoke.SmokeRun:
        return smoke.parse_smoke(output)
