"""operations.driver: GPU refusal, build prerequisites, runfile install/replace, verification."""

from __future__ import annotations

from pyinfra.facts.apt import AptSources
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import Which

from facts.driver import InstalledDriverVersion, NvidiaSmi, SmiGpu, SmiResult
from facts.gpu import PciGpu, PciGpus
from facts.host import KernelHeaders, KernelInfo
from operations import driver
from p40fleet.gpu_catalog import lookup
from tests.opharness import at, run_op

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


def test_prereqs_present_is_a_noop_without_apt_update():
    r = run_op(
        driver.build_prereqs,
        facts={KernelHeaders: KernelInfo(KR, f"/lib/modules/{KR}/build", True), Which: "/x"},
    )
    assert r.commands == [] and r.noops


def test_missing_headers_and_tools_installed_with_apt_update():
    r = run_op(
        driver.build_prereqs,
        facts={
            KernelHeaders: KernelInfo(KR, f"/lib/modules/{KR}/build", False),
            at(Which, command="cc"): "/usr/bin/cc",
            at(Which, command="make"): None,
            at(Which, command="ld"): "/usr/bin/ld",
            DebPackages: {},
            AptSources: [],
        },
    )
    assert r.commands[0] == "apt-get update"
    assert r.commands[1].endswith(f"install linux-headers-{KR} build-essential")
    assert "DEBIAN_FRONTEND=noninteractive" in r.commands[1]


def test_only_headers_missing():
    r = run_op(
        driver.build_prereqs,
        facts={KernelHeaders: KernelInfo(KR, None, False), Which: "/x", DebPackages: {}},
    )
    assert r.commands[0] == "apt-get update"
    assert r.commands[1].endswith(f"install linux-headers-{KR}")


# --- install ---------------------------------------------------------------------------------


def test_fresh_install_runs_the_runfile_with_exact_flags():
    r = run_op(driver.install, runfile=RUN, version=PIN, facts={InstalledDriverVersion: None})
    assert r.commands == [f"sh {RUN} --silent --dkms --no-questions --ui=none"]


def test_pinned_version_installed_is_a_noop():
    r = run_op(driver.install, runfile=RUN, version=PIN, facts={InstalledDriverVersion: PIN})
    assert r.commands == [] and r.noops == [f"NVIDIA driver {PIN} is installed"]


def test_force_reinstalls():
    r = run_op(
        driver.install, runfile=RUN, version=PIN, force=True, facts={InstalledDriverVersion: PIN}
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
        facts={InstalledDriverVersion: "520.61.05", Which: None},
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
