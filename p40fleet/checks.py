"""Verification checks: raw probe answers + stack spec + GPU facts -> PASS / FAIL / SKIP.

Pure functions, no pyinfra: the probe (``files/verify-probe.sh.j2``, run by the fact
``facts.verify.VerifyProbe``) prints its answers in sections; :func:`parse_probe` reads them into
:class:`ProbeAnswers`; :func:`run_checks` compares every answer with what the spec and the
host's PCI GPU facts say it must be.

Probe output (one line each)::

    @@p40fleet-verify 1          first line
    @@section NAME               a section starts
    key=value                    an answer
    @@json {...}                 an answer of a Python snippet (one JSON object)
    ! text                       noise kept for details (stderr tail)
    anything else                raw output of the section's command (nvidia-smi rows, ...)
    @@rc N                       exit status of the section's command
    @@end                        the probe ran to its end

Statuses: ``PASS`` (checked, as specified), ``FAIL`` (checked, wrong: ``remedy`` says what to
do), ``SKIP`` (cannot be checked here, with the reason, e.g. ``simulated host``: never a faked
PASS). A host passes when no check FAILs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from p40fleet.gpu_catalog import NVIDIA_VENDOR_ID, lookup, normalize_bus_id, parse_pci_id
from p40fleet.profile import summarize_host
from p40fleet.spec import StackSpec
from p40fleet.training import TrainingTarget, model_dir_problems

__all__ = [
    "FAIL",
    "PASS",
    "SKIP",
    "STATUSES",
    "Check",
    "ProbeAnswers",
    "Section",
    "host_verdict",
    "parse_probe",
    "run_checks",
    "spec_failure",
]

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
STATUSES = (PASS, FAIL, SKIP)

SIMULATED = "simulated host"

_SYSTEM = "run `pyinfra -y INVENTORY deploy/system.py`"
_PYTHON = "run `pyinfra -y INVENTORY deploy/python.py`"


def _force(component: str, deploy: str) -> str:
    return f"put '{component}' in stack.policy.force_reinstall and {deploy}"


@dataclass(frozen=True)
class Check:
    """One verified fact about a host. ``remedy`` is set on FAIL."""

    name: str
    status: str
    detail: str
    remedy: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict[str, str]:
        return {
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            "remedy": self.remedy,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Check:
        return cls(
            name=str(data["name"]),
            status=str(data["status"]),
            detail=str(data.get("detail", "")),
            remedy=str(data.get("remedy", "")),
        )


def host_verdict(checks: Iterable[Check]) -> str:
    """``FAIL`` when any check failed (or there is none), else ``PASS`` (SKIPs pass)."""
    checks = list(checks)
    if not checks or any(c.status == FAIL for c in checks):
        return FAIL
    return PASS


def spec_failure(lines: Iterable[str]) -> list[Check]:
    """The only check of a host whose stack spec does not validate (nothing else is probed)."""
    return [
        Check(
            "stack spec",
            FAIL,
            "; ".join(lines) or "invalid stack spec",
            "correct the value in the inventory (stack_host) or inventories/group_data/all.py "
            "(stack); the defaults in p40fleet/spec.py are the real pins",
        )
    ]


# ------------------------------------------------------------------------------------------
# Probe answers
# ------------------------------------------------------------------------------------------

_KV = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


@dataclass(frozen=True)
class Section:
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
class ProbeAnswers:
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


# ------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------


def _first_line(section: Section | None, limit: int = 200) -> str:
    if section is None:
        return ""
    for line in section.raw + section.noise:
        if line.strip():
            text = line.strip()
            return text if len(text) <= limit else text[: limit - 3] + "..."
    return ""


def _same_version(found: str | None, pinned: str) -> bool:
    if found is None:
        return False
    if found == pinned:
        return True
    try:
        return Version(found) == Version(pinned)
    except InvalidVersion:
        return False


def _cc(cap: tuple[int, int] | list[int] | None) -> str:
    return "?" if not cap else f"{cap[0]}.{cap[1]}"


def _is_cuda_build(torch_version: str) -> bool:
    try:
        local = Version(torch_version).local or ""
    except InvalidVersion:
        return False
    return local.lower().startswith("cu")


def _no_answer(name: str, what: str, remedy: str) -> Check:
    return Check(name, FAIL, f"the probe gave no answer for {what}", remedy)


def _python_missing(section: Section, primary: bool = False) -> str | None:
    """Why there is no answer when the env's interpreter is not there (full text: ``primary``)."""
    missing = section.get("missing")
    if not missing:
        return None
    if primary:
        return f"no python at {missing}: the conda env is missing"
    return "no conda env python (see python version)"


def _py_failure(section: Section, what: str) -> str:
    """Why a Python snippet gave no answer: its exit status and the last noise line."""
    noise = section.noise
    tail = f": {noise[-1]}" if noise else ""
    if section.rc == 124:
        return f"{what} timed out{tail}"
    return f"{what} gave no answer (exit {section.rc}){tail}"


# ------------------------------------------------------------------------------------------
# The checks
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ctx:
    spec: StackSpec
    answers: ProbeAnswers
    pci: tuple[Any, ...]
    sim: bool
    lowest: tuple[int, int] | None
    profile: str | None
    apex_key: str | None
    training: TrainingTarget | None = None


def _gpus(ctx: _Ctx) -> Check:
    summary = summarize_host(
        ctx.pci,  # each PCI fact carries its model (catalog or chip family): no bare ids
        branch=ctx.spec.driver_branch,
        allow_maxwell=ctx.spec.policy.allow_maxwell,
    )
    if not summary.gpu_count:
        return Check(
            "gpus",
            FAIL,
            "no NVIDIA GPU found on the PCI bus (sysfs): nothing to verify the stack on",
            "run deploy/facts.py; check the GPUs are seated and visible "
            "(ls /sys/bus/pci/devices, lspci -nn | grep -i nvidia)",
        )
    label = f"{summary.gpus_str} (cc {summary.capability_str}, profile {summary.profile or '-'})"
    if not summary.ok:
        return Check(
            "gpus",
            FAIL,
            f"{label}: {summary.refused}",
            "this host cannot run the stack as specified: run deploy/facts.py and fix what it "
            "reports (or take the host out of the inventory)",
        )
    return Check("gpus", PASS, label)


def _nouveau(ctx: _Ctx) -> Check:
    host = ctx.answers.section("host")
    state = host.get("nouveau") if host else None
    remedy = (
        f"{_SYSTEM} with stack.policy.allow_reboot=True (blacklist, initramfs, reboot), "
        "or reboot the host after it"
    )
    if state == "absent":
        return Check("nouveau", PASS, "nouveau not loaded")
    if state == "loaded":
        return Check("nouveau", FAIL, "nouveau is loaded (/sys/module/nouveau)", remedy)
    return _no_answer("nouveau", "/sys/module/nouveau", remedy)


_DRIVER_VERSION = re.compile(r"\b(\d{3}\.\d+(?:\.\d+)?)\b")


def _driver_installed(ctx: _Ctx) -> Check:
    pinned = ctx.spec.driver.version
    section = ctx.answers.section("modinfo")
    remedy = f"{_SYSTEM} (installs driver {pinned}); " + _force("driver", "re-run it")
    if section is None:
        return _no_answer("driver installed", "modinfo -F version nvidia", remedy)
    found = next(
        (m.group(1) for line in section.raw if (m := _DRIVER_VERSION.fullmatch(line.strip()))),
        None,
    )
    if section.rc == 0 and found == pinned:
        return Check("driver installed", PASS, f"modinfo: nvidia {found}")
    if found:
        return Check(
            "driver installed",
            FAIL,
            f"modinfo: nvidia {found} installed, expected {pinned}",
            remedy,
        )
    why = _first_line(section) or f"exit {section.rc}"
    return Check("driver installed", FAIL, f"no nvidia kernel module installed ({why})", remedy)


_DKMS_LINE = re.compile(
    r"^(?P<module>[^,/\s]+)(?:/|,\s*)(?P<version>[^,\s]+),\s*(?P<kernel>[^,\s]+),"
    r"\s*(?P<arch>[^:\s]+):\s*(?P<state>[A-Za-z-]+)"
)


def _dkms(ctx: _Ctx) -> Check:
    pinned = ctx.spec.driver.version
    section = ctx.answers.section("dkms")
    host = ctx.answers.section("host")
    kernel = (host.get("kernel") if host else None) or "?"
    remedy = (
        f"install dkms and linux-headers-{kernel}, then {_force('driver', _SYSTEM)} "
        "(the driver registers its DKMS module for the running kernel)"
    )
    if section is None:
        return _no_answer("dkms", "dkms status", remedy)
    if section.get("missing") == "dkms":
        return Check("dkms", FAIL, "dkms is not installed", remedy)
    entries = [m.groupdict() for line in section.raw if (m := _DKMS_LINE.match(line.strip()))]
    nvidia = [e for e in entries if e["module"] == "nvidia"]
    for entry in nvidia:
        if (
            entry["version"] == pinned
            and entry["kernel"] == kernel
            and entry["state"] == "installed"
        ):
            return Check(
                "dkms",
                PASS,
                f"nvidia/{pinned}, {kernel}, {entry['arch']}: installed",
            )
    listed = "; ".join(f"nvidia/{e['version']}, {e['kernel']}: {e['state']}" for e in nvidia) or (
        _first_line(section) or "nothing"
    )
    return Check(
        "dkms",
        FAIL,
        f"dkms status has no nvidia/{pinned} installed for the running kernel {kernel} "
        f"(lists: {listed})",
        remedy,
    )


@dataclass(frozen=True)
class _SmiRow:
    bus_id: str
    device_id: int | None
    name: str
    driver_version: str | None


def _smi_rows(section: Section) -> list[_SmiRow]:
    fields = (section.get("fields") or "").split(",")
    rows = []
    for line in section.raw:
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(fields) or not values[0].isdigit():
            continue
        row = dict(zip(fields, values, strict=True))
        parsed = parse_pci_id(row.get("pci.device_id", ""))
        device = parsed[1] if parsed and parsed[0] == NVIDIA_VENDOR_ID else None
        driver = row.get("driver_version")
        rows.append(
            _SmiRow(
                bus_id=normalize_bus_id(row.get("pci.bus_id", "")),
                device_id=device,
                name=row.get("name", ""),
                driver_version=driver if driver and "N/A" not in driver else None,
            )
        )
    return rows


def _smi_problem(section: Section | None, remedy: str, name: str) -> Check | None:
    """A FAIL when nvidia-smi is missing or did not answer, else None."""
    if section is None:
        return _no_answer(name, "nvidia-smi", remedy)
    if section.get("missing"):
        return Check(name, FAIL, "nvidia-smi not found: no NVIDIA driver installed", remedy)
    if section.rc != 0:
        why = _first_line(section) or "no output"
        return Check(name, FAIL, f"nvidia-smi failed (exit {section.rc}): {why}", remedy)
    return None


def _smi_remedy(pinned: str) -> str:
    return (
        f"the pinned driver {pinned} must be installed and loaded: {_SYSTEM} with "
        "stack.policy.allow_reboot=True (or reboot after it); read /var/log/nvidia-installer.log"
    )


def _pci_label(gpu: Any) -> str:
    model = getattr(gpu, "model", None) or lookup(gpu.device_id)
    name = model.name if model else "unknown"
    return f"{gpu.bus_id} ({name} 10de:{gpu.device_id:04x})"


def _smi_gpus(ctx: _Ctx) -> Check:
    name = "nvidia-smi gpus"
    if ctx.sim:
        return Check(name, SKIP, f"{SIMULATED}: nvidia-smi there is the lab's double")
    if not ctx.pci:
        return Check(name, SKIP, "no NVIDIA GPU in the PCI facts to compare with (see gpus)")
    section = ctx.answers.section("nvidia-smi")
    remedy = _smi_remedy(ctx.spec.driver.version)
    problem = _smi_problem(section, remedy, name)
    if problem is not None:
        return problem
    assert section is not None
    rows = {row.bus_id: row for row in _smi_rows(section)}
    missing, wrong = [], []
    for gpu in ctx.pci:
        row = rows.get(normalize_bus_id(gpu.bus_id))
        if row is None:
            missing.append(_pci_label(gpu))
        elif row.device_id is not None and row.device_id != gpu.device_id:
            wrong.append(f"{gpu.bus_id}: PCI 10de:{gpu.device_id:04x}, nvidia-smi {row.name}")
    pci_bus = {normalize_bus_id(g.bus_id) for g in ctx.pci}
    extra = sorted(bus for bus in rows if bus not in pci_bus)
    if missing or wrong:
        parts = []
        if missing:
            parts.append("not shown: " + ", ".join(missing))
        if wrong:
            parts.append("different device: " + "; ".join(wrong))
        return Check(
            name,
            FAIL,
            f"nvidia-smi shows {len(rows)} of the {len(ctx.pci)} GPUs on the PCI bus; "
            + "; ".join(parts),
            "a GPU the driver does not bind: check `dmesg | grep -i nvrm` (unsupported by the "
            f"driver branch, fallen off the bus, power); {remedy}",
        )
    note = f" (+{len(extra)} not in the PCI facts: {', '.join(extra)})" if extra else ""
    return Check(
        name,
        PASS,
        f"{len(ctx.pci)}/{len(ctx.pci)} GPUs: "
        + ", ".join(f"{g.bus_id} 10de:{g.device_id:04x}" for g in ctx.pci)
        + note,
    )


def _smi_driver(ctx: _Ctx) -> Check:
    name = "nvidia-smi driver"
    pinned = ctx.spec.driver.version
    if ctx.sim:
        return Check(name, SKIP, f"{SIMULATED}: nvidia-smi there is the lab's double")
    section = ctx.answers.section("nvidia-smi")
    remedy = _smi_remedy(pinned)
    problem = _smi_problem(section, remedy, name)
    if problem is not None:
        return problem
    assert section is not None
    versions = sorted({row.driver_version or "?" for row in _smi_rows(section)})
    if not versions:
        why = _first_line(section) or "no GPU rows"
        return Check(name, FAIL, f"nvidia-smi listed no GPU ({why})", remedy)
    if versions == [pinned]:
        return Check(name, PASS, f"driver {pinned} loaded")
    return Check(
        name,
        FAIL,
        f"nvidia-smi reports driver {', '.join(versions)}, expected {pinned}",
        f"{_force('driver', _SYSTEM)}, then reboot so {pinned} is the loaded module",
    )


def _nvcc(ctx: _Ctx) -> Check:
    name = "nvcc"
    version = ctx.spec.cuda.version
    release = ".".join(version.split(".")[:2])
    section = ctx.answers.section("nvcc")
    remedy = _force("cuda", _SYSTEM) + f" (stack.paths.cuda_dir must be the {release} toolkit)"
    if section is None:
        return _no_answer(name, "nvcc --version", remedy)
    missing = section.get("missing")
    if missing:
        return Check(name, FAIL, f"no nvcc at {missing}", f"{_SYSTEM} (installs CUDA {version})")
    found = None
    for line in section.raw:
        if match := re.search(r"release (\d+\.\d+), V(\d+(?:\.\d+)*)", line):
            found = match
            break
    if found is None:
        why = _first_line(section) or f"exit {section.rc}"
        return Check(name, FAIL, f"nvcc --version says no release ({why})", remedy)
    text = f"release {found.group(1)}, V{found.group(2)}"
    if found.group(1) == release:
        return Check(name, PASS, text)
    return Check(name, FAIL, f"nvcc: {text}, expected release {release}", remedy)


def _cudnn_version(ctx: _Ctx) -> Check:
    name = "cudnn version"
    expected = ".".join(ctx.spec.cudnn.version.split(".")[:3])
    section = ctx.answers.section("cudnn-header")
    remedy = _force("cudnn", _SYSTEM)
    if section is None:
        return _no_answer(name, "cudnn_version.h", remedy)
    missing = section.get("missing")
    if missing:
        return Check(name, FAIL, f"no {missing}", f"{_SYSTEM} (installs cuDNN {expected})")
    parts: dict[str, str] = {}
    for line in section.raw:
        if match := re.match(r"#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+(\d+)", line.strip()):
            parts[match.group(1)] = match.group(2)
    if len(parts) != 3:
        return Check(name, FAIL, "cudnn_version.h has no CUDNN_MAJOR/MINOR/PATCHLEVEL", remedy)
    found = f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCHLEVEL']}"
    if found == expected:
        return Check(name, PASS, f"cudnn_version.h: {found}")
    return Check(name, FAIL, f"cudnn_version.h says {found}, expected {expected}", remedy)


@dataclass(frozen=True)
class _Stat:
    device: str
    inode: str
    links: int
    kind: str


def _cudnn_files(section: Section) -> tuple[dict[str, _Stat], dict[str, _Stat]]:
    src: dict[str, _Stat] = {}
    dst: dict[str, _Stat] = {}
    for line in section.raw:
        words = line.split(None, 5)
        if len(words) != 6 or words[0] not in ("src", "dst") or not words[3].isdigit():
            continue
        stat = _Stat(words[1], words[2], int(words[3]), words[4])
        (src if words[0] == "src" else dst)[words[5]] = stat
    return src, dst


_CUDNN_DEST_DIRS = {"include": "include", "lib": "lib64"}


def _cudnn_links(ctx: _Ctx) -> Check:
    name = "cudnn hard links"
    remedy = f"{_SYSTEM} (hard-links the extracted cuDNN files into the CUDA dir)"
    section = ctx.answers.section("cudnn-files")
    if section is None:
        return _no_answer(name, "the cuDNN files", remedy)
    tree = section.get("tree") or ctx.spec.paths.cudnn_extract_dir
    cuda_dir = section.get("cuda_dir") or ctx.spec.paths.cuda_dir
    src, dst = _cudnn_files(section)
    if not src:
        return Check(
            name,
            FAIL,
            f"no include/cudnn*.h or lib/libcudnn* under {tree} (the extract dir)",
            _force("cudnn", _SYSTEM),
        )
    wanted = {}
    for rel, stat in src.items():
        top, _, rest = rel.partition("/")
        wanted[f"{_CUDNN_DEST_DIRS.get(top, top)}/{rest}"] = stat
    missing = sorted(rel for rel in wanted if rel not in dst)
    copies = sorted(
        rel
        for rel, stat in wanted.items()
        if rel in dst
        and ((dst[rel].device, dst[rel].inode) != (stat.device, stat.inode) or dst[rel].links < 2)
    )
    stale = sorted(rel for rel in dst if rel not in wanted)
    if not (missing or copies or stale):
        return Check(
            name,
            PASS,
            f"{len(wanted)} files in {cuda_dir} are hard links of {tree} (same inode, "
            f"{min(s.links for s in wanted.values())}+ links)",
        )
    parts = []
    if copies:
        parts.append("not hard links (another inode): " + ", ".join(copies))
    if missing:
        parts.append("missing: " + ", ".join(missing))
    if stale:
        parts.append("not from the extract dir (another version?): " + ", ".join(stale))
    return Check(name, FAIL, f"cuDNN files in {cuda_dir} vs {tree}: " + "; ".join(parts), remedy)


def _python_version(ctx: _Ctx) -> Check:
    name = "python version"
    pinned = ctx.spec.python_version
    remedy = _force("env", _PYTHON)
    section = ctx.answers.section("python")
    if section is None:
        return _no_answer(name, "the env's python", remedy)
    if missing := _python_missing(section, primary=True):
        return Check(name, FAIL, missing, _PYTHON)
    answer = section.answer
    if answer is None:
        return Check(name, FAIL, _py_failure(section, "the env's python"), remedy)
    found = answer.get("version")
    if found == pinned:
        return Check(name, PASS, f"python {found} ({answer.get('executable')})")
    return Check(name, FAIL, f"env python is {found}, expected {pinned}", remedy)


def _torch_line(answer: Mapping[str, Any]) -> str:
    """``2.6.0+cu118 True (6, 1)``: version, is_available(), get_device_capability()."""
    text = f"{answer.get('version')} {answer.get('cuda_available')}"
    cap = answer.get("capability")
    if cap:
        text += f" ({cap[0]}, {cap[1]})"
    return text


def _torch_answer(ctx: _Ctx, name: str) -> tuple[dict[str, Any] | None, Check | None]:
    """The torch snippet's answer, or the FAIL saying why there is none."""
    remedy = _force("torch", _PYTHON)
    section = ctx.answers.section("torch")
    if section is None:
        return None, _no_answer(name, "import torch", remedy)
    if missing := _python_missing(section):
        return None, Check(name, FAIL, missing, _PYTHON)
    answer = section.answer
    if answer is None:
        return None, Check(name, FAIL, _py_failure(section, "import torch"), remedy)
    if answer.get("error"):
        return None, Check(name, FAIL, f"import torch failed: {answer['error']}", remedy)
    return answer, None


def _torch_version(ctx: _Ctx) -> Check:
    name = "torch version"
    pinned = ctx.spec.torch.version
    answer, problem = _torch_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    found = answer.get("version")
    if found == pinned:
        return Check(name, PASS, _torch_line(answer))
    return Check(
        name,
        FAIL,
        f"torch {found} in the env, expected {pinned}",
        _force("torch", _PYTHON),
    )


def _gpu_skip(ctx: _Ctx, name: str) -> Check | None:
    """SKIP for checks that need a real GPU behind a CUDA torch."""
    if ctx.sim:
        return Check(name, SKIP, f"{SIMULATED}: no real GPU behind torch.cuda")
    if not _is_cuda_build(ctx.spec.torch.version):
        return Check(
            name,
            SKIP,
            f"the torch pin {ctx.spec.torch.version} is a CPU build: no CUDA to check",
        )
    return None


def _torch_cuda(ctx: _Ctx) -> Check:
    name = "torch cuda"
    if skip := _gpu_skip(ctx, name):
        return skip
    answer, problem = _torch_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    if answer.get("cuda_available") is True:
        return Check(
            name,
            PASS,
            f"torch.cuda.is_available() True: {answer.get('device_count')} device(s), "
            f"CUDA {answer.get('cuda_version')}",
        )
    return Check(
        name,
        FAIL,
        f"torch.cuda.is_available() is {answer.get('cuda_available')} "
        f"(torch {answer.get('version')}, torch.version.cuda {answer.get('cuda_version')})",
        "nvidia-smi must answer first (driver loaded: see nvidia-smi driver); torch must be the "
        f"{ctx.spec.torch.version} build ({_force('torch', _PYTHON)}); "
        "CUDA_VISIBLE_DEVICES must not hide the GPUs",
    )


def _torch_capability(ctx: _Ctx) -> Check:
    name = "torch capability"
    if skip := _gpu_skip(ctx, name):
        return skip
    if ctx.lowest is None:
        return Check(name, SKIP, "no known GPU in the PCI facts to compare with (see gpus)")
    answer, problem = _torch_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    if answer.get("cuda_available") is not True:
        return Check(name, SKIP, "torch.cuda is not available (see torch cuda)")
    caps = [tuple(c) for c in answer.get("capabilities") or [] if len(c) == 2]
    device0 = answer.get("capability")
    if not caps and device0:
        caps = [tuple(device0)]
    if not caps:
        return Check(name, FAIL, "torch reported no device capability", _force("torch", _PYTHON))
    lowest_torch = min(caps)
    shown = f"({device0[0]}, {device0[1]})" if device0 else _cc(lowest_torch)
    if lowest_torch == tuple(ctx.lowest):
        return Check(
            name,
            PASS,
            f"torch.cuda.get_device_capability() {shown}; lowest {_cc(lowest_torch)} = "
            f"lowest on the PCI bus {_cc(ctx.lowest)}",
        )
    return Check(
        name,
        FAIL,
        f"torch sees lowest capability {_cc(lowest_torch)} (device 0: {shown}), the PCI facts "
        f"say {_cc(ctx.lowest)}",
        "torch does not see the GPUs the host has: check CUDA_VISIBLE_DEVICES and "
        "`nvidia-smi -L`; a GPU the driver does not bind is missing here",
    )


def _apex_answer(ctx: _Ctx, name: str) -> tuple[dict[str, Any] | None, Check | None]:
    remedy = _force("apex", _PYTHON)
    section = ctx.answers.section("apex")
    if section is None:
        return None, _no_answer(name, "import apex", remedy)
    if missing := _python_missing(section):
        return None, Check(name, FAIL, missing, _PYTHON)
    answer = section.answer
    if answer is None:
        return None, Check(name, FAIL, _py_failure(section, "import apex"), remedy)
    return answer, None


def _apex(ctx: _Ctx) -> Check:
    name = "apex"
    answer, problem = _apex_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    bad = [f"import {m}: {answer.get(m)}" for m in ("apex", "apex_C") if answer.get(m) != "ok"]
    if not bad:
        return Check(name, PASS, "import apex, apex_C: ok")
    return Check(name, FAIL, "; ".join(bad), _force("apex", _PYTHON))


def _apex_cuda_ext(ctx: _Ctx) -> bool:
    cuda_ext = getattr(ctx.spec.apex, "cuda_ext", None)
    return _is_cuda_build(ctx.spec.torch.version) if cuda_ext is None else bool(cuda_ext)


def _apex_cuda(ctx: _Ctx) -> Check:
    name = "apex cuda ext"
    if not _apex_cuda_ext(ctx):
        return Check(
            name,
            SKIP,
            f"the torch pin {ctx.spec.torch.version} is a CPU build: Apex is built without "
            "CUDA extensions",
        )
    if ctx.sim:
        return Check(name, SKIP, f"{SIMULATED}: the lab's Apex has no CUDA extensions")
    answer, problem = _apex_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    modules = ("amp_C", "fused_layer_norm_cuda")
    bad = [f"import {m}: {answer.get(m)}" for m in modules if answer.get(m) != "ok"]
    if not bad:
        return Check(name, PASS, "import amp_C, fused_layer_norm_cuda: ok")
    return Check(
        name,
        FAIL,
        "; ".join(bad),
        f"Apex was built without its CUDA extensions or against another torch: "
        f"{_force('apex', _PYTHON)} (CUDA_HOME = {ctx.spec.paths.cuda_dir})",
    )


def _apex_key(ctx: _Ctx) -> Check:
    name = "apex build key"
    if ctx.apex_key is None:
        return Check(name, SKIP, "no expected build key (no known GPU in the PCI facts)")
    section = ctx.answers.section("apex-key")
    remedy = _force("apex", _PYTHON)
    if section is None:
        return _no_answer(name, "the Apex build key", remedy)
    missing = section.get("missing")
    if missing:
        return Check(name, FAIL, f"no Apex build key recorded ({missing})", remedy)
    found = section.get("key")
    if found == ctx.apex_key:
        return Check(name, PASS, f"built for {found}")
    return Check(
        name,
        FAIL,
        f"Apex installed is built for {found}, the spec needs {ctx.apex_key}",
        remedy,
    )


def _verl_version(ctx: _Ctx) -> Check:
    name = "verl version"
    pinned = ctx.spec.verl.version
    remedy = _force("verl", _PYTHON)
    section = ctx.answers.section("verl")
    if section is None:
        return _no_answer(name, "import verl", remedy)
    if missing := _python_missing(section):
        return Check(name, FAIL, missing, _PYTHON)
    answer = section.answer
    if answer is None:
        return Check(name, FAIL, _py_failure(section, "import verl"), remedy)
    if answer.get("error"):
        return Check(name, FAIL, f"import verl failed: {answer['error']}", remedy)
    found = answer.get("version")
    if _same_version(found, pinned):
        return Check(name, PASS, f"verl {found} ({answer.get('file')})")
    return Check(name, FAIL, f"verl.__version__ is {found}, expected {pinned}", remedy)


def _verl_checkout(ctx: _Ctx) -> Check:
    name = "verl checkout"
    pin = ctx.spec.verl
    remedy = _PYTHON + f" (checks out {pin.ref} = {pin.commit[:12]})"
    section = ctx.answers.section("verl-git")
    if section is None:
        return _no_answer(name, "the verl checkout", remedy)
    missing = section.get("missing")
    if missing:
        what = "git is not installed" if missing == "git" else f"no verl checkout at {missing}"
        return Check(name, FAIL, what, remedy)
    head = section.get("head") or ""
    ref = section.get("ref") or ""
    if not head:
        return Check(name, FAIL, "the verl checkout is not a git repository", remedy)
    if head != pin.commit:
        return Check(
            name,
            FAIL,
            f"HEAD is {head[:12]}, the spec pins {pin.ref} = {pin.commit[:12]}",
            remedy,
        )
    if ref and ref != pin.commit:
        return Check(
            name,
            FAIL,
            f"HEAD is the pinned commit but {pin.ref} resolves to {ref[:12]} in the checkout",
            "fix stack.verl.ref/commit (they must name the same commit) or the moved tag",
        )
    note = "" if ref else f" ({pin.ref} is not a ref in the checkout)"
    return Check(name, PASS, f"at {pin.ref} = {pin.commit[:12]}{note}")


def _verl_patches(ctx: _Ctx) -> Check:
    from p40fleet import verl_patches

    name = "verl patches"
    pin = ctx.spec.verl
    remedy = f"{_PYTHON} (applies the patch rules for the host's GPU profile)"
    if ctx.profile is None:
        return Check(name, SKIP, "no GPU profile (see gpus)")
    try:
        rules = verl_patches.rule_set(pin.ref, ctx.profile)
    except verl_patches.VerlPatchError as exc:
        return Check(
            name,
            FAIL,
            str(exc),
            "pin a verl ref that has a rule set for this profile (p40fleet/verl_patches.py)",
        )
    expected_ids = [r.id for r in rules.rules]
    section = ctx.answers.section("verl-patches")
    if section is None:
        return _no_answer(name, "the verl patch record", remedy)
    git = ctx.answers.section("verl-git")
    modified = set(git.values("modified")) if git else set()
    record_missing = section.get("missing")
    answer = section.answer
    if record_missing:
        if expected_ids:
            return Check(
                name,
                FAIL,
                f"no patch record {record_missing}: the {len(expected_ids)} {ctx.profile} "
                f"rules for {pin.ref} are not applied",
                remedy,
            )
        if modified:
            return Check(
                name,
                FAIL,
                f"local edits in the verl checkout: {', '.join(sorted(modified))}",
                "save them elsewhere, restore with `git checkout -- <files>` and "
                + _PYTHON.removeprefix("run "),
            )
        return Check(name, PASS, f"no patch rules for {ctx.profile} at {pin.ref}; none recorded")
    if answer is None or answer.get("error"):
        why = (answer or {}).get("error") or _py_failure(section, "reading the record")
        return Check(name, FAIL, f"unreadable patch record: {why}", remedy)
    recorded_ids = list(answer.get("rule_ids") or [])
    if (answer.get("ref"), answer.get("profile")) != (pin.ref, ctx.profile) or (
        recorded_ids != expected_ids
    ):
        return Check(
            name,
            FAIL,
            f"recorded: {len(recorded_ids)} rules for {answer.get('ref')}/"
            f"{answer.get('profile')}; expected: {len(expected_ids)} rules for "
            f"{pin.ref}/{ctx.profile}",
            remedy,
        )
    files: dict[str, str] = answer.get("files") or {}
    found: dict[str, str | None] = answer.get("found") or {}
    drifted = sorted(rel for rel, sha in files.items() if found.get(rel) != sha)
    edits = sorted(modified - set(files))
    if drifted or edits:
        return Check(
            name,
            FAIL,
            "local edits in the verl checkout: " + ", ".join(drifted + edits),
            "save them elsewhere, restore with `git checkout -- <files>` and "
            + _PYTHON.removeprefix("run "),
        )
    if not expected_ids:
        return Check(name, PASS, f"no patch rules for {ctx.profile} at {pin.ref}")
    return Check(
        name,
        PASS,
        f"{len(expected_ids)} {ctx.profile} rules for {pin.ref} applied, "
        f"{len(files)} patched files intact",
    )


# --- the training path ----------------------------------------------------------------------

_TRAINING = "run `pyinfra -y INVENTORY deploy/training.py`"


def _py_section(
    ctx: _Ctx, name: str, section_name: str, what: str, remedy: str
) -> tuple[dict[str, Any] | None, Check | None]:
    """A Python section's answer, or the FAIL saying why there is none."""
    section = ctx.answers.section(section_name)
    if section is None:
        return None, _no_answer(name, what, remedy)
    if missing := _python_missing(section):
        return None, Check(name, FAIL, missing, _PYTHON)
    answer = section.answer
    if answer is None:
        return None, Check(name, FAIL, _py_failure(section, what), remedy)
    if answer.get("error") and len(answer) == 1:
        return None, Check(name, FAIL, f"{what} failed: {answer['error']}", remedy)
    return answer, None


def _trainer_modules(ctx: _Ctx) -> Check:
    name = "trainer modules"
    variant = ctx.spec.verl.requirements or "the env's"
    remedy = _force("verl", _PYTHON)
    answer, problem = _py_section(ctx, name, "trainer", "the verl trainer imports", remedy)
    if problem is not None:
        return problem
    assert answer is not None
    modules: dict[str, Any] = answer.get("modules") or {}
    if not modules:
        return Check(name, FAIL, "the probe imported no trainer module", remedy)
    bad = {m: r for m, r in modules.items() if not (isinstance(r, dict) and r.get("ok"))}
    if not bad:
        return Check(name, PASS, "import " + ", ".join(modules) + ": ok")
    missing = sorted({r.get("missing") for r in bad.values() if isinstance(r, dict)} - {None})
    detail = "; ".join(
        f"import {m}: {r.get('error') if isinstance(r, dict) else r}" for m, r in bad.items()
    )
    if missing:
        fix = (
            f"the env lacks {', '.join(missing)}: verl's runtime needs it pinned in "
            f"files/verl-requirements-{variant}.txt (the lab: and in its wheelhouse), then "
            + remedy.removeprefix("run ")
        )  # fmt: skip
    else:
        fix = remedy
    return Check(name, FAIL, detail, fix)


def _launch_overrides(ctx: _Ctx) -> Check:
    import hashlib

    name = "launch overrides"
    target = ctx.training
    if target is None:
        return Check(name, SKIP, "no launch plan was given to verify against")
    if target.problem:
        return Check(
            name, FAIL, f"no launch plan for this host: {target.problem}",
            "run `pyinfra -y INVENTORY deploy/facts.py` and fix what it reports",
        )  # fmt: skip
    remedy = _force("verl", _PYTHON)
    answer, problem = _py_section(ctx, name, "compose", "composing verl's config", remedy)
    if problem is not None:
        return problem
    assert answer is not None
    expected = hashlib.sha256(json.dumps(list(target.overrides)).encode()).hexdigest()
    if answer.get("sha256") != expected:
        return Check(
            name, FAIL, "the probe composed other overrides than this host's launch plan",
            "run verify again (the plan changed while it ran)",
        )  # fmt: skip
    where = answer.get("config_dir")
    if answer.get("ok") is True:
        return Check(
            name, PASS, f"{answer.get('count')} overrides of ~/launch-ppo.sh compose with "
            f"verl's ppo_trainer config ({where}) and resolve",
        )  # fmt: skip
    fix = (
        f"p40fleet/launch.py renders an override the installed verl ({ctx.spec.verl.ref}) does "
        "not accept: derive it for this verl ref, or pin the verl the plan is written for; "
        "meanwhile pass a replacement as an argument to launch-ppo.sh"
    )
    if answer.get("base_error"):
        return Check(
            name, FAIL, f"verl's own config does not compose ({where}): {answer['base_error']}",
            remedy,
        )  # fmt: skip
    bad: dict[str, str] = answer.get("bad") or {}
    if bad:
        return Check(name, FAIL, "; ".join(f"{o}: {e}" for o, e in bad.items()), fix)
    return Check(name, FAIL, f"the overrides together: {answer.get('error')}", fix)


def _inputs_remedy(ctx: _Ctx, which: str, path: str) -> str:
    archive = getattr(ctx.spec.training, which).archive
    if archive is not None:
        return f"{_TRAINING} (it unpacks {archive.filename} into {path})"
    if which == "model":
        return (
            f"save the Hugging Face model into {path} (config.json, tokenizer, weights), "
            f"or set stack.training.model.archive and {_TRAINING}"
        )
    return (
        f"prepare the parquet files in {path} (for GSM8K: verl's "
        f"examples/data_preprocess/gsm8k.py --local_dir {path}), or set "
        f"stack.training.data.archive and {_TRAINING}"
    )


def _model_files(ctx: _Ctx) -> Check:
    name = "model files"
    target = ctx.training
    if target is None:
        return Check(name, SKIP, "no launch plan was given to verify against")
    path = target.model_path
    remedy = _inputs_remedy(ctx, "model", path)
    answer, problem = _py_section(ctx, name, "model", f"the model {path}", remedy)
    if problem is not None:
        return problem
    assert answer is not None
    if answer.get("path") != path:
        return Check(name, FAIL, f"the probe looked at {answer.get('path')}, not {path}",
                     "run verify again")  # fmt: skip
    if not answer.get("exists"):
        return Check(name, FAIL, f"no model directory {path}", remedy)
    lacking = model_dir_problems(answer.get("files") or [])
    if lacking:
        return Check(name, FAIL, f"{path} lacks {', '.join(lacking)}", remedy)
    if answer.get("config_error"):
        return Check(name, FAIL, f"{path}/config.json: {answer['config_error']}", remedy)
    if answer.get("tokenizer_error"):
        return Check(
            name, FAIL, f"the tokenizer in {path} does not load: {answer['tokenizer_error']}",
            remedy,
        )  # fmt: skip
    return Check(
        name, PASS, f"{path}: config.json ({answer.get('model_type')}), tokenizer "
        f"({answer.get('tokens')} tokens), weights",
    )  # fmt: skip


def _data_files(ctx: _Ctx) -> Check:
    name = "data files"
    target = ctx.training
    if target is None:
        return Check(name, SKIP, "no launch plan was given to verify against")
    section = ctx.answers.section("training-data")
    directory = target.train_file.rsplit("/", 1)[0]
    remedy = _inputs_remedy(ctx, "data", directory)
    if section is None:
        return _no_answer(name, "the data files", remedy)
    found: dict[str, tuple[str, str]] = {}
    for line in section.raw:
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[0] == "found":
            found[parts[3]] = (parts[1], parts[2].removesuffix("_"))
    wanted = list(dict.fromkeys((target.train_file, target.val_file)))
    missing = [f for f in wanted if f not in found]
    if missing:
        return Check(name, FAIL, "missing: " + ", ".join(missing), remedy)
    empty = [f for f in wanted if found[f][0] in ("", "0")]
    not_parquet = [f for f in wanted if f.endswith(".parquet") and found[f][1] != "PAR1"]
    if empty or not_parquet:
        what = [f"{f} is empty" for f in empty]
        what += [f"{f} is not a parquet file" for f in not_parquet if f not in empty]
        return Check(name, FAIL, "; ".join(what), remedy)
    return Check(name, PASS, ", ".join(f"{f} ({found[f][0]} bytes)" for f in wanted))


_CHECKS = (
    _nouveau,
    _driver_installed,
    _dkms,
    _smi_gpus,
    _smi_driver,
    _nvcc,
    _cudnn_version,
    _cudnn_links,
    _python_version,
    _torch_version,
    _torch_cuda,
    _torch_capability,
    _apex,
    _apex_cuda,
    _apex_key,
    _verl_version,
    _verl_checkout,
    _verl_patches,
    _trainer_modules,
    _launch_overrides,
    _model_files,
    _data_files,
)

#: Names of the checks :func:`run_checks` returns, in order (``probe`` only when it broke).
CHECK_NAMES = (
    "gpus",
    "probe",
    "nouveau",
    "driver installed",
    "dkms",
    "nvidia-smi gpus",
    "nvidia-smi driver",
    "nvcc",
    "cudnn version",
    "cudnn hard links",
    "python version",
    "torch version",
    "torch cuda",
    "torch capability",
    "apex",
    "apex cuda ext",
    "apex build key",
    "verl version",
    "verl checkout",
    "verl patches",
    "trainer modules",
    "launch overrides",
    "model files",
    "data files",
)


def run_checks(
    answers: ProbeAnswers,
    spec: StackSpec,
    pci_gpus: Iterable[Any],
    *,
    apex_key: str | None = None,
    training: TrainingTarget | None = None,
) -> list[Check]:
    """Every check for one host, in :data:`CHECK_NAMES` order.

    ``pci_gpus``: the host's ``facts.gpu.PciGpu`` list (anything with ``bus_id`` and
    ``device_id``). ``apex_key``: the Apex build key the spec needs on this host (None: SKIP).
    ``training``: the host's launch plan (overrides, model and data paths) the training-path
    checks compare the probe's answers with (None: those SKIP).
    """
    pci = tuple(pci_gpus)
    summary = summarize_host(
        pci,
        branch=spec.driver_branch,
        allow_maxwell=spec.policy.allow_maxwell,
    )
    host = answers.section("host")
    ctx = _Ctx(
        spec=spec,
        answers=answers,
        pci=pci,
        sim=bool(host and host.get("sim") == "yes"),
        lowest=summary.lowest_capability,
        profile=summary.profile,
        apex_key=apex_key,
        training=training,
    )
    checks = [_gpus(ctx)]
    if not answers.started:
        checks.append(
            Check(
                "probe",
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
                "probe",
                FAIL,
                f"the verify probe stopped early (last section: {last})",
                "run `pyinfra INVENTORY deploy/verify.py --debug` to see why",
            )
        )
    checks += [check(ctx) for check in _CHECKS]
    return checks
