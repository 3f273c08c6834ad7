"""Read-only fleet facts table: GPUs, capability, profile, driver, verdict per host.

    pyinfra @local deploy/facts.py -y
    pyinfra inventories/sim.py deploy/facts.py -y

Prints one line per host while facts are gathered, then one table of the
whole fleet after the last host. Changes nothing on any host.
"""

from __future__ import annotations

from pyinfra import host, state
from pyinfra.facts.server import LinuxDistribution
from rich.table import Table

from p40fleet import report
from p40fleet.facts.driver import InstalledDriverVersion, LoadedDriverVersion, NvidiaSmi
from p40fleet.facts.gpu import PciGpus
from p40fleet.facts.host import Cpus, FreeSpace, KernelHeaders, MemTotal, os_label
from p40fleet.facts.nouveau import NouveauLoaded
from p40fleet.facts.survey import ask, install, part, survey
from p40fleet.run_record import run_record
from p40fleet.runtime import sshguard
from p40fleet.spec import SpecError, load_spec, spec_for_host

_COLUMNS = (
    "host",
    "OS",
    "kernel",
    "CPUs/RAM",
    "cache free",
    "GPUs",
    "cc",
    "profile",
    "driver",
    "nouveau",
    "verdict",
)


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**30:.0f} GiB"


def _refused_row(reason: str) -> dict[str, str]:
    """The row of a host that gets no command: every column unknown, the reason as verdict."""
    return dict({c: "?" for c in _COLUMNS}, host=host.name, verdict=f"refused: {reason}")


def _fact_row() -> dict[str, str]:
    """The current host's row of the fleet table, from one survey command (``facts.survey``)."""
    unchecked = sshguard.host_key_refusal(host)  # S17: before the survey, the first command
    if unchecked is not None:
        return _refused_row(unchecked)
    spec_problem = None
    try:
        spec = spec_for_host(host)
    except SpecError as exc:
        spec_problem = str(exc)
        spec = load_spec(host.name, {})

    # one command per host: every fact below from one survey
    install(state)
    survey(
        host,
        [
            part(PciGpus),
            part(NvidiaSmi),
            part(KernelHeaders),
            part(FreeSpace, path=spec.paths.artifact_cache),
            part(InstalledDriverVersion),
            part(LoadedDriverVersion),
            part(LinuxDistribution),
            part(Cpus),
            part(MemTotal),
            part(NouveauLoaded),
        ],
    )
    pci = ask(host, PciGpus)
    smi = ask(host, NvidiaSmi)
    gpus: list = list(pci)
    if not gpus and smi.ok:
        gpus = [g.pci_id for g in smi.gpus if g.pci_id is not None]
    summary = spec.gpu_summary(gpus)

    kernel = ask(host, KernelHeaders)
    space = ask(host, FreeSpace, path=spec.paths.artifact_cache)
    installed = ask(host, InstalledDriverVersion)
    loaded = ask(host, LoadedDriverVersion)
    headers = "yes" if kernel.headers_installed else "no"
    verdict = summary.verdict
    if spec_problem:
        verdict = (
            f"{verdict}; spec: {spec_problem}" if not summary.ok else f"refused: {spec_problem}"
        )

    driver = f"installed {installed or 'no'}, loaded {loaded or 'no'}, nvidia-smi {smi.state}"
    return {
        "host": host.name,
        "OS": os_label(ask(host, LinuxDistribution)),
        "kernel": f"{kernel.release or '?'} (headers {headers})",
        "CPUs/RAM": f"{ask(host, Cpus) or '?'} / {_gib(ask(host, MemTotal))}",
        "cache free": _gib(space.available_bytes if space else None),
        "GPUs": summary.gpus_str if summary.gpu_count else "no NVIDIA GPU found",
        "cc": summary.capability_str,
        "profile": summary.profile or "-",
        "driver": f"R{summary.driver_branch}: {driver}",
        "nouveau": "loaded" if ask(host, NouveauLoaded) else "not loaded",
        "verdict": verdict,
    }


def _print_table(rows: dict[str, dict[str, str]]) -> None:
    table = Table(title="p40fleet: GPU facts", show_lines=True)
    for column in _COLUMNS:
        table.add_column(column, overflow="fold")
    for name in sorted(rows):
        table.add_row(*(rows[name][c] for c in _COLUMNS))
    report.human_console().print(table)  # as wide as the terminal; stderr under --json


def run() -> None:
    """The deploy's steps for the current host (``deploy/facts.py`` calls it)."""
    sshguard.install()  # no command to a host whose key is not checked (config.py did it first)
    row = _fact_row()
    print(
        f"[{row['host']}] {row['OS']} | GPUs: {row['GPUs']} | cc {row['cc']} | "
        f"profile {row['profile']} | driver {row['driver']} | {row['verdict']}",
        file=report.human_stream(),  # stdout is pyinfra's JSON under --json
        flush=True,
    )

    # This file runs once per host (in parallel); the table waits for the last one.
    fleet_rows = run_record(state).fact_rows
    fleet_rows[row["host"]] = row
    if len(fleet_rows) >= len(state.inventory.get_active_hosts()):
        _print_table(fleet_rows)
