"""The verify probe: ONE read-only shell script per host, its raw answers parsed into sections.

The script is ``files/verify-probe.sh.j2`` rendered with the host's paths (every value
shell-quoted). It changes nothing on the host (no bytecode written, git without optional locks)
and always exits 0, so the fact never fails a host: what went wrong is in the answers, which
``p40fleet.verification`` turns into PASS/FAIL/SKIP checks. Output format: see the template's
header or :func:`p40fleet.verification.probe.parse_probe`.
"""

from __future__ import annotations

from pyinfra.api import FactBase
from typing_extensions import override

from p40fleet.facts.survey import one_write
from p40fleet.paths import FILES
from p40fleet.privdrop import AS_USER_FN, FACT_TIMEOUT_S
from p40fleet.shell_template import shell_template
from p40fleet.verification.probe import ProbeAnswers, ProbeTargets, parse_probe

__all__ = [
    "PROBE_TEMPLATE",
    "SMI_FIELDS",
    "SMI_FIELDS_R470",
    "VerifyProbe",
    "render_probe",
]

PROBE_TEMPLATE = FILES / "verify-probe.sh.j2"
#: nvidia-smi --query-gpu fields the probe asks for (R470 has no compute_cap: asked without it).
SMI_FIELDS = "index,name,pci.bus_id,pci.device_id,compute_cap,driver_version"
SMI_FIELDS_R470 = "index,name,pci.bus_id,pci.device_id,driver_version"
#: Limit for each Python snippet (``import verl`` loads torch, ray, transformers; the trainer
#: modules, Hydra's compose and the tokenizer share that interpreter).
PYTHON_TIMEOUT_S = 300
#: A shell test that holds on a host of the simulated lab (p40lab), whose GPU answers are doubles.
#: Its answer (``sim=yes``) counts only on a host the inventory marks simulated
#: (``p40fleet.verification.check.simulated_in_inventory``); elsewhere it is a FAIL.
SIMULATED_HOST_TEST = "[ -d /etc/p40lab-sim ] || [ -d /var/lib/p40lab-sim ]"


def render_probe(targets: ProbeTargets) -> str:
    """The probe script for these targets (a POSIX sh script); what lies under the home is read
    and run as the training user ``targets.user``."""
    if not targets.user:
        raise ValueError("no training user given: the probe never runs its files as root")
    paths = {  # directories the probe joins names to: without their trailing slash
        name: getattr(targets, name).rstrip("/") or "/"
        for name in ("cuda_dir", "cudnn_tree", "verl_checkout")
    }
    return shell_template(PROBE_TEMPLATE).render(
        **{**targets._asdict(), **paths},
        as_user_fn=AS_USER_FN,
        smi_fields=SMI_FIELDS,
        smi_fields_r470=SMI_FIELDS_R470,
        python_timeout=PYTHON_TIMEOUT_S,
        fact_timeout=FACT_TIMEOUT_S,
        simulated_host_test=SIMULATED_HOST_TEST,
        noise_lines=6,
    )


class VerifyProbe(FactBase[ProbeAnswers]):
    """
    Returns the raw answers of the verify probe (``ProbeAnswers``: sections of key=value lines,
    JSON answers and exit codes). Read-only; never fails the host.
    """

    @staticmethod
    @override
    def default() -> ProbeAnswers:
        return ProbeAnswers()

    @override
    def command(self, targets: ProbeTargets) -> str:
        # a plain tuple when the fact batch replays a stored request: rebuilt by position
        # one write for all its sections: a few SSH packets, not hundreds (see one_write)
        return one_write(render_probe(ProbeTargets(*targets))).get_raw_value()

    @override
    def process(self, output: list[str]) -> ProbeAnswers:
        return parse_probe(output)
