"""The NVIDIA driver from its runfile, pinned to one version (R525: 525.147.05).

Order: ``supported_gpus`` (before anything on the host changes) -> ``build_prereqs`` ->
``install`` -> ``loaded`` (reboot if the new module cannot load yet) -> ``verify``.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.server import Which

from p40fleet.facts.driver import SMI_OK, InstalledDriverVersion, NvidiaSmi
from p40fleet.facts.gpu import PciGpus
from p40fleet.facts.host import KernelHeaders
from p40fleet.facts.packages import DebInstalled
from p40fleet.facts.survey import Part, ask, part
from p40fleet.footprint import BUILD_PACKAGES  # one list: the deploy, the footprint, the mirror
from p40fleet.operations import run_lock
from p40fleet.operations.refuse import refuse
from p40fleet.operations.util import apt_lock
from p40fleet.operations.util.reboot import rebooted
from p40fleet.profile import driver_branch, driver_supports
from p40fleet.spec import Proxy, StackSpec

__all__ = ["build_prereqs", "install", "loaded", "supported_gpus", "verify", "survey_parts"]

#: The Debian packages the runfile's DKMS build needs beside the running kernel's headers, each
#: decided from its own dpkg state: a stock Ubuntu 20.04 server has none of them. Without
#: ``dkms`` the runfile's ``--dkms`` skips DKMS silently and the first kernel update boots
#: without ``nvidia.ko``; without pkg-config and libglvnd-dev it only warns (and guesses paths).
DKMS_PACKAGE = "dkms"
REBOOT_DELAY_S = 2
REBOOT_TIMEOUT_S = 600


@operation()
def supported_gpus(version: str, require_gpu: bool = True):
    """
    Refuse this host when driver ``version``'s branch does not support one of its GPUs.

    + version: the pinned driver version (its branch is what matters, e.g. ``525``)
    + require_gpu: also refuse a host without any NVIDIA GPU
    """
    branch = driver_branch(version) or version
    gpus = ask(host, PciGpus)
    if not gpus:
        if require_gpu:
            yield from refuse._inner(
                step="driver install",
                reason="no NVIDIA GPU found in /sys/bus/pci/devices",
                remedy="check the host (is the card seated and powered?) or take it out of "
                "the inventory",
            )
        else:
            host.noop("no NVIDIA GPU; nothing to check")
        return
    refused = []
    for gpu in gpus:
        ok, why = driver_supports(branch, gpu.model)
        if not ok:
            refused.append(f"{gpu.bus_id} 10de:{gpu.device_id:04x}: {why}")
    if refused:
        yield from refuse._inner(
            step=f"driver {version}",
            reason="\n".join(refused),
            remedy=f"take these GPUs out of the host or pin a driver branch that supports them "
            f"(stack.driver); R{branch} is not installed here",
        )
        return
    host.noop(f"driver R{branch} supports all {len(gpus)} GPU(s)")


def apt_install(packages: list[str], lock_wait_s: int, proxy: Proxy | None):
    """The one place this module builds apt commands: ``apt-get update`` then an install of
    ``packages`` (pyinfra's ``apt.packages``, non-interactive), each waiting for the dpkg lock
    and going through ``stack.proxy``."""
    yield from apt_lock.packages(
        packages, host.name, "driver build prerequisites", lock_wait_s, proxy=proxy
    )


@operation()
def build_prereqs(lock_wait_s: int = apt_lock.DEFAULT_TIMEOUT_S, proxy: Proxy | None = None):
    """
    Install what a DKMS build of the driver needs: ``linux-headers-$(uname -r)`` and
    :data:`BUILD_PACKAGES` (dkms, build-essential, pkg-config, libglvnd-dev), each one that
    dpkg does not report installed.

    + proxy: ``stack.proxy`` for apt (None: no proxy)

    apt runs (with ``update``) only when something is missing, waiting for the dpkg lock.

    + lock_wait_s: how long apt waits for the dpkg lock (``stack.policy.dpkg_lock_wait_s``)
    """
    kernel = ask(host, KernelHeaders)
    installed = ask(host, DebInstalled, packages=BUILD_PACKAGES)
    missing = []
    if not kernel.headers_installed:
        missing.append(f"linux-headers-{kernel.release}")
    missing += [name for name in BUILD_PACKAGES if name not in installed]
    if not missing:
        host.noop(f"headers for {kernel.release} and {', '.join(BUILD_PACKAGES)} are installed")
        return
    yield from apt_install(missing, lock_wait_s, proxy)


@operation()
def install(runfile: str, version: str, force: bool = False):
    """
    Run the driver runfile unless ``modinfo -F version nvidia`` already says ``version``.

    + runfile: path of the verified ``NVIDIA-Linux-x86_64-VERSION.run`` on the host
    + version: the pinned version, e.g. ``525.147.05``
    + force: reinstall even when that version is installed (policy.force_reinstall)
    """
    installed = ask(host, InstalledDriverVersion)
    if installed == version and not force:
        host.noop(f"NVIDIA driver {version} is installed")
        return
    if not ask(host, Which, command="dkms"):
        # The runfile would install anyway, unregistered: nothing rebuilds it for a new kernel.
        yield from refuse._inner(
            step=f"driver {version}",
            reason=f"dkms is not installed (package {DKMS_PACKAGE}): the runfile's --dkms "
            "would skip DKMS without an error and the next kernel update would boot without "
            "nvidia.ko",
            remedy=f"apt-get install {DKMS_PACKAGE} (the build prerequisites step installs it "
            "from the host's apt sources: check they serve it), then re-run",
        )
        return
    if installed and installed != version:
        host.log(f"replacing NVIDIA driver {installed} with {version}")
        if ask(host, Which, command="nvidia-uninstall"):
            yield "nvidia-uninstall --silent"
        # Otherwise the new runfile finds the old runfile install and removes it itself.
    yield StringCommand(
        "sh",
        QuoteString(runfile),
        "--silent --dkms --no-questions --ui=none",
    )


@operation(is_idempotent=False)
def loaded(
    version: str,
    allow_reboot: bool = False,
    delay: int = REBOOT_DELAY_S,
    reboot_timeout: int = REBOOT_TIMEOUT_S,
):
    """
    Reboot when the installed driver is not the one running (nvidia-smi does not answer).

    + version: the pinned version
    + allow_reboot: ``spec.policy.allow_reboot``; without it the host fails with a remedy
    """
    smi = ask(host, NvidiaSmi)
    if smi.state == SMI_OK and smi.driver_version == version:
        host.noop(f"nvidia-smi answers with driver {version}")
        return
    if ask(host, InstalledDriverVersion) != version:
        host.noop(f"driver {version} is not installed (yet): nothing to load")
        return
    if not allow_reboot:
        yield from refuse._inner(
            step=f"driver {version}",
            reason=f"reboot required: driver {version} is installed but not loaded "
            f"(nvidia-smi: {smi.state})",
            remedy="run with allow_reboot=True or reboot it yourself, then re-run",
        )
        return
    yield from rebooted(delay=delay, interval=1, reboot_timeout=reboot_timeout)
    yield from run_lock.refreshed()  # this run's lock now names the new boot


@operation()
def verify(version: str):
    """
    Fail the host unless ``nvidia-smi`` answers with driver ``version``.

    + version: the pinned version
    """
    smi = ask(host, NvidiaSmi)
    if smi.state == SMI_OK and smi.driver_version == version:
        host.noop(f"nvidia-smi: driver {version}, {len(smi.gpus)} GPU(s)")
        return
    seen = smi.driver_version if smi.state == SMI_OK else smi.state
    detail = f": {smi.message}" if smi.message else ""
    yield from refuse._inner(
        step=f"driver {version}",
        reason=f"nvidia-smi does not answer with driver {version} (got {seen}{detail})",
        remedy="reboot the host (or run with allow_reboot=True) and re-run; if it persists "
        "read /var/log/nvidia-installer.log",
    )


def survey_parts(spec: StackSpec) -> list[Part]:  # noqa: ARG001 - the same for every spec
    """The facts this module's operations ask on a converged host (``operations.run.survey``)."""
    return [
        part(PciGpus),  # supported_gpus
        part(KernelHeaders),  # build_prereqs
        part(DebInstalled, packages=BUILD_PACKAGES),
        part(InstalledDriverVersion),  # install
        part(NvidiaSmi),  # loaded, verify
    ]
