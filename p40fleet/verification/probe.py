"""The probe's wire format: the twin of ``files/verify-probe.sh.j2``, parsed into sections.

The probe (run by the fact ``facts.verify.VerifyProbe``) prints its answers in sections;
:func:`parse_probe` reads them into :class:`ProbeAnswers`. Probe output (one line each)::

    @@p40fleet-verify 1          first line
    @@section NAME               a section starts
    key=value                    an answer
    @@json {...}                 an answer of a Python snippet (one JSON object)
    ! text                       noise kept for details (stderr tail)
    anything else                raw output of the section's command (nvidia-smi rows, ...)
    @@rc N                       exit status of the section's command
    @@end                        the probe ran to its end
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from p40fleet.jsonable import ToJson
from p40fleet.spec import StackSpec
from p40fleet.training import TrainingTarget

__all__ = ["CheckContext", "ProbeAnswers", "ProbeTargets", "Section", "parse_probe"]


class ProbeTargets(NamedTuple):
    """What the probe looks at on one host: the stack's paths there, the pinned verl ref, the
    launch plan's model and data, the launch script whose overrides it composes, and the
    training user the home is read as.

    Frozen and hashable (a tuple of plain values): the fact that takes it is one memo key in
    ``facts.survey``, and ``ProbeTargets(*value)`` rebuilds one from a plain tuple.
    """

    cuda_dir: str
    cudnn_tree: str
    python: str
    apex_key_file: str
    verl_checkout: str
    verl_ref: str
    patch_record: str
    model_path: str
    train_file: str
    val_file: str
    user: str
    launch_script: str


_KV = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


@dataclass(frozen=True)
class Section(ToJson):
    """The lines one probe section printed, and its command's exit status."""

    rc: int | None = None
    lines: tuple[str, ...] = ()

    def values(self, key: str) -> list[str]:
        """Every value of ``key=...`` lines, in order."""
        out = []
        for line in self.lines:
            match = _KV.match(line)
            if match and match.group(1) == key:
                out.append(match.group(2))
        return out

    def get(self, key: str, default: str | None = None) -> str | None:
        """The last value of ``key=...``, or ``default``."""
        values = self.values(key)
        return values[-1] if values else default

    @property
    def answer(self) -> dict[str, Any] | None:
        """The JSON object of the ``@@json`` line (None: no answer, or not JSON)."""
        for line in reversed(self.lines):
            if line.startswith("@@json "):
                try:
                    data = json.loads(line[len("@@json ") :])
                except ValueError:
                    return None
                return data if isinstance(data, dict) else None
        return None

    @property
    def noise(self) -> list[str]:
        """Lines the probe kept as noise (stderr tail), without their ``! `` prefix."""
        return [line[2:] for line in self.lines if line.startswith("! ")]

    @property
    def raw(self) -> list[str]:
        """Raw command output: lines that are neither key=value, JSON nor noise."""
        return [
            line
            for line in self.lines
            if not _KV.match(line) and not line.startswith(("@@json ", "! ")) and line.strip()
        ]


@dataclass(frozen=True)
class ProbeAnswers(ToJson):
    """Parsed probe output: sections by name; ``started``/``complete`` say it ran to its end."""

    sections: Mapping[str, Section] = field(default_factory=dict)
    started: bool = False
    complete: bool = False

    def section(self, name: str) -> Section | None:
        return self.sections.get(name)


def parse_probe(output: Iterable[str]) -> ProbeAnswers:
    """Read the probe's stdout lines into :class:`ProbeAnswers` (never raises)."""
    sections: dict[str, tuple[list[str], list[int | None]]] = {}
    current: str | None = None
    started = complete = False
    for raw in output:
        line = raw.rstrip("\r\n")
        if line.startswith("@@p40fleet-verify"):
            started = True
            continue
        if line.startswith("@@section "):
            current = line[len("@@section ") :].strip()
            sections[current] = ([], [None])
            continue
        if line.strip() == "@@end":
            complete = True
            current = None
            continue
        if current is None:
            continue
        if line.startswith("@@rc "):
            text = line[len("@@rc ") :].strip()
            sections[current][1][0] = int(text) if re.fullmatch(r"-?\d+", text) else None
            continue
        sections[current][0].append(line)
    return ProbeAnswers(
        sections={name: Section(rc[0], tuple(lines)) for name, (lines, rc) in sections.items()},
        started=started,
        complete=complete,
    )


@dataclass(frozen=True)
class CheckContext:
    """What a check reads: the probe's answers and what the spec, the PCI GPUs (their lowest
    capability and profile) and the launch plan say they must be."""

    spec: StackSpec
    answers: ProbeAnswers
    pci: tuple[Any, ...]
    sim: bool
    lowest: tuple[int, int] | None
    profile: str | None
    apex_key: str | None
    training: TrainingTarget | None = None
