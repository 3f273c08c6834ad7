import os
import subprocess
from pathlib import Path

import pytest

from facts.driver import (
    SMI_FIELDS,
    SMI_FIELDS_R470,
    SMI_MARKER,
    InstalledDriverVersion,
    LoadedDriverVersion,
    NvidiaSmi,
)
from facts.gpu import PCI_NAME_MARKER, PciGpus
from facts.nouveau import NouveauLoaded
from p40fleet.gpu_catalog import normalize_bus_id
from p40fleet.profile import summarize_host

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"


def fixture_lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def run_sh(command: str, env: dict | None = None) -> tuple[int, list[str]]:
    result = subprocess.run(
        ["/bin/sh", "-c", command], capture_output=True, text=True, env=env, check=False
    )
    return result.returncode, result.stdout.splitlines()


# -- PciGpus ---------------------------------------------------------------------------------


def test_pci_h200_vm_fixture_converted():
    # fixture: "PATH vendor device class subsystem_device"; the command prints the bus id
    # (basename) and appends subsystem_vendor ("-" = unknown here).
    lines = [
        " ".join([f.split()[0].rsplit("/", 1)[-1], *f.split()[1:], "-"])
        for f in fixture_lines("h200-vm-vendor-device-class-subsys.txt")
    ]
    gpus = PciGpus().process(lines)
    assert len(gpus) == 1
    gpu = gpus[0]
    assert gpu.bus_id == "0000:00:06.0"
    assert gpu.device_id == 0x2335
    assert gpu.pci_class == 0x030200
    assert gpu.subsystem == "?:18bf"
    assert gpu.model.name == "H200 SXM 141GB"


def test_pci_h200_vm_fixture_raw():
    gpus = PciGpus().process(fixture_lines("h200-vm-vendor-device-class-subsys.txt"))
    assert [(g.bus_id, g.device_id) for g in gpus] == [("0000:00:06.0", 0x2335)]


def _fake_function(root: Path, bus: str, **attrs: str) -> None:
    d = root / bus
    d.mkdir(parents=True)
    for name, value in attrs.items():
        (d / name).write_text(value + "\n")


def _p40x4_tree(root: Path) -> Path:
    devices = root / "sys/bus/pci/devices"
    _fake_function(
        devices, "0000:00:00.0", vendor="0x8086", device="0x1237", **{"class": "0x060000"}
    )
    for n, bus in enumerate(("04", "05", "84", "85")):
        _fake_function(
            devices,
            f"0000:{bus}:00.0",
            vendor="0x10de",
            device="0x1b38",
            subsystem_vendor="0x10de",
            subsystem_device="0x11d9",
            **{"class": "0x030200"},
        )
        if n == 0:  # an NVIDIA non-GPU function (HDMI audio) must be skipped
            _fake_function(
                devices, "0000:04:00.1", vendor="0x10de", device="0x10ef", **{"class": "0x040300"}
            )
    # a function whose files are partly unreadable
    _fake_function(devices, "0000:06:00.0", vendor="0x10de", device="0x1b38")
    return devices


def test_pci_p40x4_synthetic_tree(tmp_path):
    devices = _p40x4_tree(tmp_path)
    rc, lines = run_sh(PciGpus().command(devices_dir=str(devices)))
    assert rc == 0
    assert "0000:06:00.0 0x10de 0x1b38 - - -" in lines
    gpus = PciGpus().process(lines)
    assert [g.bus_id for g in gpus] == [
        "0000:04:00.0",
        "0000:05:00.0",
        "0000:84:00.0",
        "0000:85:00.0",
    ]
    assert {g.subsystem for g in gpus} == {"10de:11d9"}
    assert {g.model.name for g in gpus} == {"Tesla P40"}


def test_pci_command_never_fails(tmp_path):
    assert run_sh(PciGpus().command(devices_dir=str(tmp_path / "missing"))) == (0, [])
    (tmp_path / "empty").mkdir()
    assert run_sh(PciGpus().command(devices_dir=str(tmp_path / "empty"))) == (0, [])
    assert PciGpus().command().rstrip().endswith("true")
    assert PciGpus.default() == []


def test_pci_command_is_plain_sh():
    command = PciGpus().command()
    for tool in ("lspci", "python", "sed"):
        assert tool not in command
    # awk reads the optional pci.ids name only, and only where the host has it
    assert "command -v awk >/dev/null 2>&1; then" in command


def test_pci_command_without_awk_or_pciids(tmp_path):
    devices = _p40x4_tree(tmp_path)
    bin_dir = tmp_path / "bin"  # a PATH with cat alone: no awk
    bin_dir.mkdir()
    (bin_dir / "cat").symlink_to("/bin/cat")
    command = PciGpus().command(devices_dir=str(devices), pci_ids=str(PCI_IDS_EXCERPT))
    rc, lines = run_sh(command, env={"PATH": str(bin_dir)})
    assert rc == 0
    assert not [line for line in lines if line.startswith(PCI_NAME_MARKER)]
    gpus = PciGpus().process(lines)
    assert len(gpus) == 4 and {g.model.name for g in gpus} == {"Tesla P40"}
    rc, lines = run_sh(PciGpus().command(devices_dir=str(devices), pci_ids="/nonexistent"))
    assert rc == 0 and all(g.pci_name is None for g in PciGpus().process(lines))


PCI_IDS_EXCERPT = FIXTURES / "pciids-excerpt-debian-2023.04.11.ids"


def _mixed_tree(root: Path) -> Path:
    devices = root / "sys/bus/pci/devices"
    for bus, device in (
        ("0000:04:00.0", "0x1b38"),  # Tesla P40: in the catalog
        ("0000:05:00.0", "0x1b39"),  # Tesla P10: only pci.ids names it
        ("0000:06:00.0", "0x0008"),  # NV1: named, but no capability for that family
        ("0000:07:00.0", "0x0724"),  # an Emulex id in pci.ids, not an NVIDIA one
    ):
        _fake_function(devices, bus, vendor="0x10de", device=device, **{"class": "0x030200"})
    return devices


def test_pci_names_from_the_hosts_pciids(tmp_path):
    command = PciGpus().command(
        devices_dir=str(_mixed_tree(tmp_path)), pci_ids=f"/nonexistent {PCI_IDS_EXCERPT}"
    )
    rc, lines = run_sh(command)
    assert rc == 0
    assert sorted(line for line in lines if line.startswith(PCI_NAME_MARKER)) == [
        f"{PCI_NAME_MARKER} 0008 NV1 [STG2000X-B Series]",
        f"{PCI_NAME_MARKER} 1b38 GP102GL [Tesla P40]",
        f"{PCI_NAME_MARKER} 1b39 GP102GL [Tesla P10]",
    ]
    p40, p10, nv1, other = PciGpus().process(lines)
    assert p40.model.name == "Tesla P40" and p40.model.derived_from is None
    assert p40.identity == "Tesla P40 10de:1b38"
    assert p10.model.compute_capability == (6, 1)
    assert p10.identity == "Tesla P10 10de:1b39 (cc from chip family GP102 in pci.ids name)"
    assert nv1.model is None and nv1.pci_name == "NV1 [STG2000X-B Series]"
    assert "unknown 10de:0008 (pci.ids name 'NV1 [STG2000X-B Series]'" in nv1.identity
    assert other.model is None and other.pci_name is None
    summary = summarize_host([p40, p10, nv1, other])
    assert not summary.ok
    assert "10de:0008 (pci.ids: 'NV1 [STG2000X-B Series]'), 10de:0724:" in summary.refused
    assert summarize_host([p40, p10]).profile == "pascal"


def test_pci_name_lines_are_not_gpus():
    lines = [
        "0000:04:00.0 0x10de 0x1e89 0x030000 - -",
        f"{PCI_NAME_MARKER} 1e89 TU104 [GeForce RTX 2060]",
        f"{PCI_NAME_MARKER} zz junk",
        f"{PCI_NAME_MARKER} 1b38",
    ]
    (gpu,) = PciGpus().process(lines)
    assert gpu.model.name == "GeForce RTX 2060" and gpu.model.compute_capability == (7, 5)


def test_pci_garbage_lines():
    assert PciGpus().process(["", "junk", "0000:01:00.0 0x10de zz 0x030000"]) == []


# -- NvidiaSmi: parsing ----------------------------------------------------------------------


def smi_output(rc: int, body: list[str], fields: str = SMI_FIELDS) -> list[str]:
    return [f"{SMI_MARKER} rc={rc} fields={fields}", *body]


def test_smi_h200_fixture():
    result = NvidiaSmi().process(smi_output(0, fixture_lines("h200-noheader-nounits-580.csv")))
    assert result.ok and result.state == "ok"
    assert result.driver_version == "580.159.04"
    (gpu,) = result.gpus
    assert gpu.index == 0
    assert gpu.name == "NVIDIA H200"
    assert gpu.bus_id == "0000:00:06.0"
    assert gpu.pci_id == 0x2335
    assert gpu.compute_capability == (9, 0)
    assert gpu.memory_mib == 143771
    assert gpu.model.name == "H200 SXM 141GB"


def test_smi_header_and_units_are_tolerated():
    lines = fixture_lines("h200-index-name-busid-devid-cc-mem-driver-uuid-vbios-580.csv")
    fields = SMI_FIELDS + ",uuid,vbios_version"
    result = NvidiaSmi().process(smi_output(0, lines, fields))
    (gpu,) = result.gpus  # header row skipped
    assert gpu.memory_mib == 143771  # "143771 MiB"
    assert gpu.compute_capability == (9, 0)


def test_smi_p40_rows():
    body = [
        f"{i}, Tesla P40, 00000000:{bus}:00.0, 0x1B3810DE, 6.1, 24576, 525.147.05"
        for i, bus in enumerate(("04", "05", "84"))
    ] + ["3, NVIDIA GeForce RTX 3090, 00000000:85:00.0, 0x220410DE, 8.6, 24576, 525.147.05"]
    result = NvidiaSmi().process(smi_output(0, body))
    assert [g.compute_capability for g in result.gpus] == [(6, 1)] * 3 + [(8, 6)]
    assert [g.model.name for g in result.gpus][-1] == "GeForce RTX 3090"
    assert result.gpus[2].bus_id == "0000:84:00.0"


def test_smi_r470_fallback_takes_capability_from_catalog():
    body = ["0, Tesla P40, 00000000:04:00.0, 0x1B3810DE, 22919, 470.182.03"]
    result = NvidiaSmi().process(smi_output(0, body, SMI_FIELDS_R470))
    (gpu,) = result.gpus
    assert gpu.compute_capability == (6, 1)
    assert gpu.driver_version == "470.182.03"


def test_smi_r470_error_without_fallback_is_not_ok():
    # the fixture is what R470 prints for compute_cap; if the second query failed too
    lines = fixture_lines("compute_cap-not-valid-field-470.182.03-candle-733.txt")[1:]
    result = NvidiaSmi().process(smi_output(2, lines))
    assert result.state == "not-loaded"
    assert result.exit_code == 2
    assert "not a valid field" in result.message


def test_smi_mismatch_fixture():
    lines = fixture_lines("nvml-driver-library-mismatch-545-genffy-blog.txt")
    result = NvidiaSmi().process(smi_output(18, lines))
    assert result.state == "mismatch"
    assert not result.ok
    assert "Driver/library version mismatch" in result.message
    assert result.gpus == ()


def test_smi_not_loaded():
    msg = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    result = NvidiaSmi().process(smi_output(9, [msg]))
    assert result.state == "not-loaded"
    assert result.message == msg


def test_smi_no_devices():
    assert NvidiaSmi().process(smi_output(6, ["No devices were found"])).state == "no-devices"


def test_smi_absent_and_default():
    assert NvidiaSmi().process([f"{SMI_MARKER} absent"]).state == "absent"
    assert NvidiaSmi().process([]).state == "absent"
    assert NvidiaSmi.default().state == "absent"


def test_smi_na_values():
    body = ["0, Tesla P40, 00000000:04:00.0, 0x1B3810DE, [N/A], [N/A], 525.147.05"]
    (gpu,) = NvidiaSmi().process(smi_output(0, body)).gpus
    assert gpu.compute_capability == (6, 1)  # from the catalog
    assert gpu.memory_mib is None


def test_compute_cap_fixture_values_parse():
    # mistral.rs capture: 3x P40 + 3090 compute_cap column
    caps = fixture_lines("compute_cap-3x-tesla-p40-1x-rtx3090-mistralrs-951.csv")[1:]
    body = [
        f"{i}, GPU, 0000:0{i}:00.0, 0x000010DE, {cc}, 1, 525.147.05" for i, cc in enumerate(caps)
    ]
    result = NvidiaSmi().process(smi_output(0, body, SMI_FIELDS))
    assert [g.compute_capability for g in result.gpus] == [(6, 1), (6, 1), (6, 1), (8, 6)]


# -- NvidiaSmi: the command itself, against fake nvidia-smi binaries -------------------------

FAKE_OK = """#!/bin/sh
echo "0, Tesla P40, 00000000:04:00.0, 0x1B3810DE, 6.1, 24576, 525.147.05"
"""
FAKE_R470 = """#!/bin/sh
case "$*" in
  *compute_cap*) echo 'Field "compute_cap" is not a valid field to query.'; exit 2;;
esac
echo "0, Tesla P40, 00000000:04:00.0, 0x1B3810DE, 22919, 470.182.03"
"""
FAKE_MISMATCH = """#!/bin/sh
echo "Failed to initialize NVML: Driver/library version mismatch"
echo "NVML library version: 545.23"
exit 18
"""
FAKE_NOT_LOADED = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
"""


def run_smi(tmp_path: Path, script: str | None) -> tuple[int, list[str]]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    if script is not None:
        fake = bindir / "nvidia-smi"
        fake.write_text(script)
        fake.chmod(0o755)
    # keep only dirs with the shell's basics, never a real nvidia-smi
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "LC_ALL": "C"}
    if Path("/usr/bin/nvidia-smi").exists():
        pytest.skip("a real nvidia-smi is on this machine")
    return run_sh(NvidiaSmi().command(), env=env)


@pytest.mark.parametrize(
    ("script", "state"),
    [
        (None, "absent"),
        (FAKE_OK, "ok"),
        (FAKE_R470, "ok"),
        (FAKE_MISMATCH, "mismatch"),
        (FAKE_NOT_LOADED, "not-loaded"),
    ],
)
def test_smi_command_states(tmp_path, script, state):
    rc, lines = run_smi(tmp_path, script)
    assert rc == 0
    result = NvidiaSmi().process(lines)
    assert result.state == state
    if state == "ok":
        (gpu,) = result.gpus
        assert gpu.compute_capability == (6, 1)
        assert gpu.pci_id == 0x1B38


def test_smi_command_r470_requeries_without_compute_cap(tmp_path):
    _, lines = run_smi(tmp_path, FAKE_R470)
    assert lines[0] == f"{SMI_MARKER} rc=0 fields={SMI_FIELDS_R470}"
    assert NvidiaSmi().process(lines).driver_version == "470.182.03"


def test_smi_command_captures_stderr(tmp_path):
    _, lines = run_smi(tmp_path, FAKE_NOT_LOADED)
    assert "couldn't communicate" in NvidiaSmi().process(lines).message


def test_smi_command_is_safe():
    command = NvidiaSmi().command()
    assert command.rstrip().endswith("true")
    assert "2>&1" in command
    assert "command -v nvidia-smi" in command


# -- driver / nouveau ------------------------------------------------------------------------


def test_installed_driver_version():
    fact = InstalledDriverVersion()
    assert fact.process(["525.147.05"]) == "525.147.05"
    assert fact.process([]) is None
    assert fact.process(["modinfo: ERROR: Module nvidia not found."]) is None
    assert "|| true" in fact.command()
    assert "modinfo -F version nvidia" in fact.command()


def test_installed_driver_command_never_fails():
    env = {"PATH": "/nonexistent"}
    assert run_sh(InstalledDriverVersion().command(), env=env)[0] == 0


def test_loaded_driver_version():
    fact = LoadedDriverVersion()
    assert fact.process(["525.147.05"]) == "525.147.05"
    assert fact.process(fixture_lines("proc-driver-nvidia-version-545.23.08-genffy-blog.txt")) == (
        "545.23.08"
    )
    assert fact.process([]) is None
    assert fact.command().rstrip().endswith("true")


def test_nouveau_loaded():
    assert NouveauLoaded().process(["yes"]) is True
    assert NouveauLoaded().process(["no"]) is False
    assert "/sys/module/nouveau" in NouveauLoaded().command()


def test_fact_commands_exit_zero_here():
    for fact in (
        PciGpus(),
        NvidiaSmi(),
        InstalledDriverVersion(),
        LoadedDriverVersion(),
        NouveauLoaded(),
    ):
        rc, _ = run_sh(fact.command(), env=dict(os.environ))
        assert rc == 0, fact


def test_normalize_bus_id():
    assert normalize_bus_id("00000000:04:00.0") == "0000:04:00.0"
    assert normalize_bus_id("0000:84:00.0") == "0000:84:00.0"
    assert normalize_bus_id("00000000:0A:00.0") == "0000:0a:00.0"
