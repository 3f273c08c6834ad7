import os
import subprocess
from dataclasses import replace
from pathlib import Path

from p40fleet.facts.driver import InstalledDriverVersion, LoadedDriverVersion, NvidiaSmi
from p40fleet.facts.gpu import PCI_NAME_MARKER, PciGpus
from p40fleet.facts.nouveau import NouveauLoaded
from p40fleet.gpu_catalog import lookup, normalize_bus_id
from p40fleet.profile import summarize_host
from p40fleet.verification.check import FAIL, PASS
from tests.probe_answers import checks_for, p40, sections

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


# -- all the GPU-side facts -------------------------------------------------------------------


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


# --- verify's gpu checks (p40fleet/verification/checks/gpu.py) --------------------------------


def test_refused_gpu_fails_the_host():
    checks = checks_for(sections(), gpus=[p40("0000:00:06.0", device=0x2335)])  # H200
    assert checks["gpus"].status == FAIL and "R525" in checks["gpus"].detail


def test_a_card_known_only_by_its_chip_family_is_not_unknown_to_verify():
    """verify reads the same PCI facts as preflight: a model derived from pci.ids counts."""
    from p40fleet.gpu_catalog import derive_model

    device = 0x1B3F  # a GP102 id absent from the catalog
    assert lookup(device) is None
    gp102 = derive_model(device, "GP102GL [Tesla P40 variant]")
    assert gp102 is not None and gp102.compute_capability == (6, 1)
    gpus = [replace(p40("0000:00:06.0"), device_id=device, model=gp102), p40("0000:00:07.0")]
    checks = checks_for(sections(), gpus=gpus)
    assert checks["gpus"].status == PASS, checks["gpus"].detail
    assert "unknown" not in checks["gpus"].detail
    assert "chip family GP102" in checks["gpus"].detail
