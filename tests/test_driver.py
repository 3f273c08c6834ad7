"""operations.driver: GPU refusal, build prerequisites, runfile install/replace, verification;
facts.driver: nvidia-smi and the installed and loaded module, parsed and run against fakes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.facts.apt import AptSources
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import Which

from p40fleet.facts.driver import (
    SMI_FIELDS,
    SMI_FIELDS_R470,
    SMI_MARKER,
    InstalledDriverVersion,
    LoadedDriverVersion,
    NvidiaSmi,
    SmiGpu,
    SmiResult,
)
from p40fleet.facts.gpu import PciGpu, PciGpus
from p40fleet.facts.host import KernelHeaders, KernelInfo
from p40fleet.facts.packages import DebInstalled
from p40fleet.gpu_catalog import lookup
from p40fleet.operations import driver
from p40fleet.verification.check import FAIL, PASS
from tests.opharness import at, run_op
from tests.probe_answers import KERNEL, checks_for, only_failures, sections, smi_row
from tests.test_apt_lock import apt_commands
from tests.test_gpu import fixture_lines, run_sh

PIN = "525.147.05"
RUN = "/var/cache/p40fleet/NVIDIA-Linux-x86_64-525.147.05.run"
KR = "6.1.0-18-amd64"


def gpu(device: int, bus: str = "0000:00:06.0") -> PciGpu:
    return PciGpu(bus, 0x10DE, device, 0x030200, 0x10DE, 0x11D9, lookup(device))


def smi(version: str | None, state: str = "ok") -> SmiResult:
    if state != "ok":
        return SmiResult(state=state, message="NVIDIA-SMI has failed", exit_code=9)
    row = SmiGpu(0, "Tesla P40", "0000:00:06.0", 0x1B38, (6, 1), 23040, version)
    return SmiResult(state="ok", gpus=(row,), exit_code=0)


# --- supported_gpus --------------------------------------------------------------------------


def test_p40s_are_supported_by_525():
    r = run_op(driver.supported_gpus, version=PIN, facts={PciGpus: [gpu(0x1B38), gpu(0x1B38)]})
    assert r.commands == [] and "supports all 2 GPU(s)" in r.noops[0]


def test_h200_is_refused_before_anything_changes():
    r = run_op(
        driver.supported_gpus,
        version=PIN,
        facts={PciGpus: [gpu(0x1B38), gpu(0x2335, "0000:00:07.0")]},
    )
    assert r.commands == ["function _fail"]
    (message,) = r.failures
    assert "0000:00:07.0 10de:2335" in message and "R525" in message
    assert "0000:00:06.0" not in message


def test_kepler_is_refused():
    r = run_op(driver.supported_gpus, version=PIN, facts={PciGpus: [gpu(0x102D)]})
    assert r.commands == ["function _fail"]


def test_no_gpu_is_refused():
    r = run_op(driver.supported_gpus, version=PIN, facts={PciGpus: []})
    assert "no NVIDIA GPU" in r.failures[0]


# --- build_prereqs ---------------------------------------------------------------------------


HEADERS = KernelInfo(KR, f"/lib/modules/{KR}/build", True)
NO_HEADERS = KernelInfo(KR, None, False)
ALL_BUILD = frozenset(driver.BUILD_PACKAGES)


def prereqs(kernel: KernelInfo, installed: frozenset[str]):
    return run_op(
        driver.build_prereqs,
        facts={
            KernelHeaders: kernel,
            at(DebInstalled, packages=driver.BUILD_PACKAGES): installed,
            DebPackages: {},
            AptSources: [],
        },
    )


def test_build_packages_are_the_ones_a_stock_focal_server_lacks():
    assert driver.BUILD_PACKAGES == ("dkms", "build-essential", "pkg-config", "libglvnd-dev")


def test_prereqs_present_is_a_noop_without_apt_update():
    r = prereqs(HEADERS, ALL_BUILD)
    assert r.commands == [] and r.noops
    assert "dkms" in r.noops[0] and KR in r.noops[0]


def test_nothing_present_installs_headers_and_every_build_package_with_apt_update():
    r = prereqs(NO_HEADERS, frozenset())
    update, install = apt_commands(r)  # both wait for the dpkg lock (tests/test_apt_lock.py)
    assert update.startswith("apt-get -q ") and update.endswith(" update")
    assert install.endswith(f"linux-headers-{KR} dkms build-essential pkg-config libglvnd-dev")
    assert "DEBIAN_FRONTEND=noninteractive" in install


def test_only_dkms_missing_installs_it_although_headers_and_compilers_are_there():
    r = prereqs(HEADERS, ALL_BUILD - {"dkms"})
    update, install = apt_commands(r)
    assert update.endswith(" update")
    assert install.endswith(' install -o DPkg::Lock::Timeout="$p40_rest" dkms')


def test_only_headers_missing():
    r = prereqs(NO_HEADERS, ALL_BUILD)
    update, install = apt_commands(r)
    assert update.endswith(" update")
    assert install.endswith(f'install -o DPkg::Lock::Timeout="$p40_rest" linux-headers-{KR}')


def test_deb_installed_counts_only_fully_installed_packages():
    lines = ["dkms ii ", "pkg-config rc ", "libglvnd-dev iU ", "build-essential ii"]
    assert DebInstalled().process(lines) == {"dkms", "build-essential"}
    assert DebInstalled().process([]) == frozenset()


def test_deb_installed_command_quotes_names_and_never_fails():
    command = DebInstalled().command(packages=("dkms", "g++")).get_raw_value()
    assert command == (
        "dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n' -- dkms g++ 2>/dev/null || true"
    )
    with pytest.raises(ValueError, match="not a Debian package name"):
        DebInstalled().command(packages=("dkms; reboot",))


def test_deb_installed_against_this_machines_dpkg():
    command = DebInstalled().command(packages=("dpkg", "p40fleet-no-such-package"))
    rc, lines = run_sh(command.get_raw_value())
    assert rc == 0 and DebInstalled().process(lines) == {"dpkg"}


# --- install ---------------------------------------------------------------------------------


def test_fresh_install_runs_the_runfile_with_exact_flags():
    r = run_op(
        driver.install,
        runfile=RUN,
        version=PIN,
        facts={InstalledDriverVersion: None, at(Which, command="dkms"): "/usr/sbin/dkms"},
    )
    assert r.commands == [f"sh {RUN} --silent --dkms --no-questions --ui=none"]


def test_install_without_dkms_is_refused_naming_the_package_and_the_fix():
    r = run_op(
        driver.install,
        runfile=RUN,
        version=PIN,
        facts={InstalledDriverVersion: None, at(Which, command="dkms"): None},
    )
    assert r.commands == ["function _fail"]
    (message,) = r.failures
    assert f"driver {PIN}: dkms is not installed (package dkms)" in message
    assert "fix: apt-get install dkms" in message


def test_pinned_version_installed_is_a_noop():
    r = run_op(driver.install, runfile=RUN, version=PIN, facts={InstalledDriverVersion: PIN})
    assert r.commands == [] and r.noops == [f"NVIDIA driver {PIN} is installed"]


def test_force_reinstalls():
    r = run_op(
        driver.install,
        runfile=RUN,
        version=PIN,
        force=True,
        facts={InstalledDriverVersion: PIN, at(Which, command="dkms"): "/usr/sbin/dkms"},
    )
    assert r.commands == [f"sh {RUN} --silent --dkms --no-questions --ui=none"]


def test_other_version_is_uninstalled_first_and_said():
    r = run_op(
        driver.install,
        runfile=RUN,
        version=PIN,
        facts={InstalledDriverVersion: "545.23.08", Which: "/usr/bin/nvidia-uninstall"},
    )
    assert r.commands == [
        "nvidia-uninstall --silent",
        f"sh {RUN} --silent --dkms --no-questions --ui=none",
    ]
    assert r.logs == [f"replacing NVIDIA driver 545.23.08 with {PIN}"]


def test_other_version_without_nvidia_uninstall_leaves_it_to_the_runfile():
    r = run_op(
        driver.install,
        runfile=RUN,
        version=PIN,
        facts={
            InstalledDriverVersion: "520.61.05",
            at(Which, command="dkms"): "/usr/sbin/dkms",
            Which: None,
        },
    )
    assert r.commands == [f"sh {RUN} --silent --dkms --no-questions --ui=none"]
    assert "replacing NVIDIA driver 520.61.05" in r.logs[0]


# --- loaded / verify -------------------------------------------------------------------------


def test_loaded_and_answering_is_a_noop():
    r = run_op(driver.loaded, version=PIN, allow_reboot=True, facts={NvidiaSmi: smi(PIN)})
    assert r.commands == []


def test_installed_not_loaded_reboots_when_allowed():
    r = run_op(
        driver.loaded,
        version=PIN,
        allow_reboot=True,
        facts={NvidiaSmi: smi(None, "not-loaded"), InstalledDriverVersion: PIN},
    )
    assert "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &" in r.commands


def test_installed_not_loaded_refuses_without_allow_reboot():
    r = run_op(
        driver.loaded,
        version=PIN,
        allow_reboot=False,
        facts={NvidiaSmi: smi(None, "not-loaded"), InstalledDriverVersion: PIN},
    )
    assert r.commands == ["function _fail"]
    assert "reboot required" in r.failures[0] and "allow_reboot=True" in r.failures[0]


def test_verify_passes_on_the_pinned_version():
    r = run_op(driver.verify, version=PIN, facts={NvidiaSmi: smi(PIN)})
    assert r.commands == [] and r.noops


def test_verify_fails_with_a_remedy_on_another_version():
    r = run_op(driver.verify, version=PIN, facts={NvidiaSmi: smi("545.23.08")})
    assert r.commands == ["function _fail"]
    assert "got 545.23.08" in r.failures[0] and "nvidia-installer.log" in r.failures[0]


def test_verify_fails_when_nvidia_smi_does_not_answer():
    r = run_op(driver.verify, version=PIN, facts={NvidiaSmi: smi(None, "not-loaded")})
    assert "got not-loaded" in r.failures[0]


# == facts.driver ============================================================================

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


# -- the installed and loaded module ---------------------------------------------------------


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


# --- verify's driver checks (p40fleet/verification/checks/driver.py) --------------------------


def test_nvidia_smi_missing_a_gpu():
    smi = sections()[sections().index("@@section nvidia-smi") + 1 :][:4]
    smi = [smi[0], smi[1], "@@rc 0"]  # only the GPU at 00:06.0
    checks = checks_for(sections(**{"nvidia-smi": smi}))
    assert only_failures(checks) == {"nvidia-smi gpus"}
    detail = checks["nvidia-smi gpus"].detail
    assert "1 of the 2 GPUs" in detail and "0000:00:07.0" in detail and "10de:1b38" in detail
    assert "dmesg" in checks["nvidia-smi gpus"].remedy


def test_driver_mismatch():
    smi = [
        "fields=index,name,pci.bus_id,pci.device_id,compute_cap,driver_version",
        smi_row(0, "0000:00:06.0", driver="535.183.01"),
        smi_row(1, "0000:00:07.0", driver="535.183.01"),
        "@@rc 0",
    ]
    checks = checks_for(
        sections(
            **{"nvidia-smi": smi},
            modinfo=["535.183.01", "@@rc 0"],
            dkms=[f"nvidia/535.183.01, {KERNEL}, x86_64: installed", "@@rc 0"],
        )
    )
    assert only_failures(checks) == {"nvidia-smi driver", "driver installed", "dkms"}
    assert "535.183.01" in checks["nvidia-smi driver"].detail
    assert "expected 525.147.05" in checks["nvidia-smi driver"].detail
    assert "modinfo: nvidia 535.183.01 installed" in checks["driver installed"].detail


def test_driver_not_loaded():
    smi = [
        "fields=index,name,pci.bus_id,pci.device_id,compute_cap,driver_version",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "@@rc 9",
    ]
    checks = checks_for(sections(**{"nvidia-smi": smi}))
    assert only_failures(checks) == {"nvidia-smi gpus", "nvidia-smi driver"}
    assert "exit 9" in checks["nvidia-smi driver"].detail
    assert "reboot" in checks["nvidia-smi driver"].remedy


def test_dkms_old_format_and_other_kernel():
    old = [f"nvidia, 525.147.05, {KERNEL}, x86_64: installed", "@@rc 0"]
    assert checks_for(sections(dkms=old))["dkms"].status == PASS
    other = ["nvidia/525.147.05, 5.4.0-99-generic, x86_64: installed", "@@rc 0"]
    bad = checks_for(sections(dkms=other))["dkms"]
    assert bad.status == FAIL and KERNEL in bad.detail and "5.4.0-99-generic" in bad.detail
    missing = checks_for(sections(dkms=["missing=dkms", "@@rc 127"]))["dkms"]
    assert missing.status == FAIL and missing.detail == "dkms is not installed"
