"""The installer doubles inside real lab hosts (sshd in netns, overlay rootfs, fake sysfs).

Uses the session fixture ``lab`` (tests/lab/conftest.py): ``lab.ssh(host, cmd)``,
``lab.reboot(host)``, ``lab.reinstall(host)``. Artifacts come from the test lab instance's
mirror (p40lab.mirror; http://10.231.0.1:8111 in the default lab). Each test group reinstalls
its host first. The doubles are the lab's stand-in for the world (its ``upstream/``, which
answers only the controller): this module's hosts are given a route out while it runs.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from p40lab import httpd, mirror
from p40lab.artifacts import pins as lab_pins

if not (Path(__file__).parent / "conftest.py").exists():
    pytest.skip("the lab fixture (tests/lab/conftest.py) is not there yet", allow_module_level=True)

pytestmark = pytest.mark.lab

ART = f"{mirror.UPSTREAM_URL}/artifacts"  # this lab instance's upstream (tests/conftest.py)
DRIVER = lab_pins.driver_filename(lab_pins.DRIVER_VERSION)
OLD_DRIVER = lab_pins.driver_filename(lab_pins.EXTRA_DRIVER_VERSIONS[0])
CUDA = lab_pins.CUDA_FILENAME
MINICONDA = lab_pins.MINICONDA_FILENAME
CHANNEL = f"{mirror.UPSTREAM_URL}/conda"  # upstream's conda channel (p40lab.sim_stack)


@pytest.fixture(scope="module", autouse=True)
def route_out(lab):
    """Every lab host may reach upstream while this module runs (and no longer after)."""
    lab.ensure_default()  # an up after the opening would close the route (p40lab.hosts)
    addresses = [host["ip"] for host in lab.state["hosts"]]
    for address in addresses:
        httpd.open_upstream(address)
    yield
    for address in addresses:
        httpd.open_upstream(address, False)


def sh(lab, host, cmd, ok=True):
    r = lab.ssh(host, cmd)
    out = (r.stdout or "") + (r.stderr or "")
    if ok:
        assert r.returncode == 0, f"{cmd!r} -> rc={r.returncode}\n{out}"
    return r


def fetch(lab, host, name):
    sh(lab, host, f"mkdir -p /root/art && cd /root/art && curl -fsSO {ART}/{name}")


def drop_headers(lab, host):
    """Lab hosts boot with headers for the running kernel; take them away (as on a fresh box)."""
    sh(lab, host, "rm -rf /lib/modules/$(uname -r)/build")


def use_mirror(lab, host):
    """The image names only the unreachable archive: write upstream's flat repository as the
    source, as the deploy writes the mirror's (deploy/system.py, stack.mirror.apt)."""
    source = shlex.quote(f"deb [trusted=yes] {mirror.UPSTREAM_URL}/apt ./")
    sh(lab, host, f"echo {source} > /etc/apt/sources.list.d/p40fleet-mirror.list && "
       "mkdir -p /etc/apt/p40fleet-aside && { [ ! -f /etc/apt/sources.list ] || "
       "mv /etc/apt/sources.list /etc/apt/p40fleet-aside/; } && apt-get update -qq")  # fmt: skip


def install_headers(lab, host):
    use_mirror(lab, host)
    sh(lab, host, "apt-get install -y -qq linux-headers-$(uname -r)")


def install_build_tools(lab, host, *extra):
    """What the deploy's build prerequisites install (the image has no compiler)."""
    use_mirror(lab, host)
    sh(lab, host, f"apt-get install -y -qq build-essential {' '.join(extra)}")


# ------------------------------------------------------------------ apt / headers


def test_apt_installs_headers_from_lab_mirror(lab):
    lab.reinstall("lab4")
    drop_headers(lab, "lab4")
    r = sh(lab, "lab4", "test -e /lib/modules/$(uname -r)/build", ok=False)
    assert r.returncode != 0
    install_headers(lab, "lab4")
    r = sh(lab, "lab4", "cat /lib/modules/$(uname -r)/build/include/generated/utsrelease.h")
    assert r.stdout.strip().startswith('#define UTS_RELEASE "')


def test_image_has_no_compiler_and_no_dkms_and_the_mirror_serves_the_real_ones(lab):
    """A stock Ubuntu 20.04 server: no dkms, gcc, g++, make, pkg-config. The lab's mirror serves
    Debian's build-essential, pkg-config, libglvnd-dev and the dkms double as packages."""
    lab.reinstall("lab4")
    for tool in ("dkms", "gcc", "g++", "cc", "make", "pkg-config"):
        r = sh(lab, "lab4", f"command -v {tool}", ok=False)
        assert r.returncode != 0, f"{tool} is in the image: {r.stdout}"
    install_build_tools(lab, "lab4", "dkms", "pkg-config", "libglvnd-dev")
    status = sh(lab, "lab4", "dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n' "
                "dkms build-essential pkg-config libglvnd-dev gcc make").stdout  # fmt: skip
    for name in ("dkms", "build-essential", "pkg-config", "libglvnd-dev", "gcc", "make"):
        assert f"{name} ii" in status, status
    r = sh(lab, "lab4", "printf 'int main(void){return 0;}' > /tmp/t.c && cc -o /tmp/t /tmp/t.c "
           "&& /tmp/t && pkg-config --exists gl && echo built")  # fmt: skip
    assert r.stdout.strip() == "built"
    assert sh(lab, "lab4", "dkms --version").stdout.strip() == "dkms-2.8.1"


def test_dkms_double_refuses_without_a_kernel_build_tree(lab):
    host = "lab4"
    lab.reinstall(host)
    install_build_tools(lab, host, "dkms")
    drop_headers(lab, host)
    sh(lab, host, "mkdir -p /usr/src/demo-1.0 && touch /usr/src/demo-1.0/demo.ko")
    sh(lab, host, "dkms add -m demo -v 1.0")  # registering the source needs no kernel
    for step in ("build", "install"):
        r = sh(lab, host, f"dkms {step} -m demo -v 1.0", ok=False)
        assert r.returncode != 0
        assert "Your kernel headers for kernel" in r.stderr and "cannot be found" in r.stderr
    sh(lab, host, "! test -e /lib/modules/$(uname -r)/updates/dkms/demo.ko")
    install_headers(lab, host)
    sh(lab, host, "dkms install -m demo -v 1.0")
    sh(lab, host, "test -e /lib/modules/$(uname -r)/updates/dkms/demo.ko")


# ------------------------------------------------------------------ driver


def test_driver_flow(lab):
    host = "lab1"
    lab.reinstall(host)
    drop_headers(lab, host)
    fetch(lab, host, DRIVER)
    run = f"sh /root/art/{DRIVER}"
    # not --silent, no TTY (ssh without a pty) -> refused
    r = sh(lab, host, f"{run} --dkms </dev/null", ok=False)
    assert r.returncode == 1 and "ERROR:" in r.stdout
    # no compiler (a stock image)
    r = sh(lab, host, f"{run} --silent --dkms", ok=False)
    assert r.returncode == 1 and "Unable to find the system utility `cc`" in r.stdout
    install_build_tools(lab, host)
    # no headers for the running kernel
    r = sh(lab, host, f"{run} --silent --dkms", ok=False)
    assert r.returncode == 1
    assert "ERROR: Unable to find the kernel source tree for the currently running kernel" in (
        r.stdout
    )
    assert (
        "Unable to find the kernel source tree"
        in sh(lab, host, "cat /var/log/nvidia-installer.log").stdout
    )
    install_headers(lab, host)
    # nouveau loaded (fresh host)
    sh(lab, host, "test -d /sys/module/nouveau")
    r = sh(lab, host, f"{run} --silent --dkms", ok=False)
    assert r.returncode == 1
    assert "ERROR: The Nouveau kernel driver is currently in use by your system." in r.stdout
    # a blacklist alone + reboot is not enough; blacklist + update-initramfs -u + reboot is
    sh(lab, host, "printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' "
                  "> /etc/modprobe.d/blacklist-nouveau.conf")  # fmt: skip
    lab.reboot(host)
    sh(lab, host, "test -d /sys/module/nouveau")
    r = sh(lab, host, "update-initramfs -u")
    assert r.stdout.startswith("update-initramfs: Generating /boot/initrd.img-")
    lab.reboot(host)
    sh(lab, host, "! test -e /sys/module/nouveau")
    # without dkms(8), --dkms is skipped with only a log line: installed, never registered
    sh(lab, host, f"{run} --silent --dkms")
    assert "The kernel module will not be registered with DKMS" in (
        sh(lab, host, "cat /var/log/nvidia-installer.log").stdout
    )
    sh(lab, host, "! test -e /var/lib/dkms/nvidia")
    sh(lab, host, "apt-get install -y -qq dkms")
    r = sh(lab, host, f"{run} --silent --dkms")
    assert "Executing: dkms install -m nvidia" in (
        sh(lab, host, "cat /var/log/nvidia-installer.log").stdout
    )
    r = sh(lab, host, "modinfo -F version nvidia")
    assert r.stdout.strip() == lab_pins.DRIVER_VERSION
    r = sh(lab, host, "dkms status")
    assert f"nvidia/{lab_pins.DRIVER_VERSION}, " in r.stdout and ": installed" in r.stdout
    # installed but not loaded before the reboot
    r = sh(lab, host, "nvidia-smi", ok=False)
    assert r.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in r.stdout
    lab.reboot(host)
    r = sh(lab, host, "nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader")
    rows = r.stdout.strip().splitlines()
    assert len(rows) == 4
    assert all(row.endswith(f"Tesla P40, {lab_pins.DRIVER_VERSION}") for row in rows)
    assert "Driver Version: 525.147.05" in sh(lab, host, "nvidia-smi").stdout
    # another version: the installer uninstalls the old one first; mismatch until reboot
    fetch(lab, host, OLD_DRIVER)
    sh(lab, host, f"sh /root/art/{OLD_DRIVER} -s --dkms")
    log = sh(lab, host, "cat /var/log/nvidia-installer.log").stdout
    assert "Uninstalling the previous installation (525.147.05)" in log
    r = sh(lab, host, "nvidia-smi", ok=False)
    assert r.returncode == 18 and "Driver/library version mismatch" in r.stdout
    assert sh(lab, host, "modinfo -F version nvidia").stdout.strip() == "525.125.06"


# ------------------------------------------------------------------ CUDA


def test_cuda_flow(lab):
    host = "lab2"
    lab.reinstall(host)
    fetch(lab, host, CUDA)
    install_build_tools(lab, host)
    run = f"sh /root/art/{CUDA}"
    dest = "--installpath=/usr/local/cuda-11.8"
    r = sh(lab, host, f"{run} --toolkit {dest} </dev/null", ok=False)
    assert r.returncode == 1
    r = sh(lab, host, f"{run} --silent --toolkit {dest}", ok=False)  # Debian's gcc is 12
    assert r.returncode == 1
    assert "Failed to verify gcc version. See log at /var/log/cuda-installer.log" in r.stdout
    assert "unsupported compiler version" in sh(lab, host, "cat /var/log/cuda-installer.log").stdout
    # too small tmpdir (hosts are root in their own mount namespace)
    sh(lab, host, "mkdir -p /mnt/small && mount -t tmpfs -o size=64m p40small /mnt/small")
    r = sh(lab, host, f"{run} --silent --toolkit --override --tmpdir=/mnt/small {dest}", ok=False)
    assert r.returncode == 1 and "Not enough space left in /mnt/small" in r.stderr
    sh(lab, host, "umount /mnt/small")
    # killed midway: partial tree, no version.json
    sh(lab, host, f"timeout 1.2 {run} --silent --toolkit --override {dest}; true")
    sh(lab, host, "sleep 0.5; test -d /usr/local/cuda-11.8/bin")
    sh(lab, host, "! test -e /usr/local/cuda-11.8/version.json")
    sh(lab, host, f"{run} --silent --toolkit --override --no-man-page {dest}")
    r = sh(lab, host, "/usr/local/cuda-11.8/bin/nvcc --version")
    assert "Cuda compilation tools, release 11.8, V11.8.89" in r.stdout
    r = sh(lab, host, "python3 -c \"import json;print(json.load(open("
                      "'/usr/local/cuda-11.8/version.json'))['cuda']['version'])\"")  # fmt: skip
    assert r.stdout.strip() == "11.8.20220929"
    sh(lab, host, "test -e /usr/local/cuda-11.8/lib64/libcudart.so.11.8.89")


# ------------------------------------------------------------------ Miniconda / conda


def test_conda_flow(lab):
    host = "lab3"
    lab.reinstall(host)
    fetch(lab, host, MINICONDA)
    inst = f"bash /root/art/{MINICONDA}"
    r = sh(lab, host, f"{inst} -p /root/mc </dev/null", ok=False)
    assert r.returncode != 0
    sh(lab, host, f"{inst} -b -p /root/mc")
    r = sh(lab, host, f"{inst} -b -p /root/mc", ok=False)
    assert r.returncode == 1
    assert "ERROR: File or directory already exists: '/root/mc'" in r.stderr
    sh(lab, host, f"{inst} -b -u -p /root/mc")
    conda = "/root/mc/bin/conda"
    assert sh(lab, host, f"{conda} --version").stdout.strip() == "conda 24.11.1"
    pyv = sh(lab, host, "python3 -c 'import platform;print(platform.python_version())'")
    pyv = pyv.stdout.strip()
    create = f"{conda} create -n verl-p40 python={pyv} -y"
    # 24.11.1 predates the ToS plugin: no `conda tos`, and create on the defaults checks nothing
    r = sh(lab, host, f"{conda} tos --help", ok=False)
    assert r.returncode == 2 and "invalid choice: 'tos'" in r.stderr
    # no route out: conda-forge and the defaults fail as real conda does; the mirror answers
    r = sh(lab, host, f"{conda} create -n x python=3.10.99 -y --override-channels -c conda-forge",
           ok=False)  # fmt: skip
    assert r.returncode == 1 and "CondaHTTPError: HTTP 000 CONNECTION FAILED" in r.stderr
    r = sh(lab, host, create, ok=False)
    assert r.returncode == 1 and "repo.anaconda.com/pkgs/main/linux-64/repodata.json" in r.stderr
    r = sh(lab, host, f"{conda} create -n x python=3.10.99 -y --override-channels -c {CHANNEL}",
           ok=False)  # fmt: skip
    assert r.returncode == 1 and "PackagesNotFoundError" in r.stderr
    sh(lab, host, f"{create} --override-channels -c {CHANNEL}")
    r = sh(lab, host, f"{conda} run -n verl-p40 python -c 'import sys; print(sys.prefix)'")
    assert r.stdout.strip() == "/root/mc/envs/verl-p40"
    assert "/root/mc/envs/verl-p40" in sh(lab, host, f"{conda} env list --json").stdout
    sh(lab, host, f"{conda} env remove -n verl-p40 -y")
    assert "verl-p40" not in sh(lab, host, f"{conda} env list --json").stdout


def test_conda_tos_plugin_flow(lab):
    """Miniconda 25.5.1 bundles conda-anaconda-tos: create on the defaults needs the ToS."""
    host = "lab3"
    lab.reinstall(host)
    fetch(lab, host, lab_pins.MINICONDA_TOS_FILENAME)
    sh(lab, host, f"bash /root/art/{lab_pins.MINICONDA_TOS_FILENAME} -b -p /root/mc")
    conda = "/root/mc/bin/conda"
    assert sh(lab, host, f"{conda} --version").stdout.strip() == "conda 25.5.1"
    sh(lab, host, f"{conda} tos --help")
    pyv = sh(lab, host, "python3 -c 'import platform;print(platform.python_version())'")
    create = f"{conda} create -n verl-p40 python={pyv.stdout.strip()} -y"
    r = sh(lab, host, create, ok=False)
    assert r.returncode == 1 and "CondaToSNonInteractiveError" in r.stderr
    for ch in ("https://repo.anaconda.com/pkgs/main", "https://repo.anaconda.com/pkgs/r"):
        sh(lab, host, f"{conda} tos accept --override-channels --channel {shlex.quote(ch)}")
    r = sh(lab, host, create, ok=False)  # accepted; the defaults are still out of reach
    assert r.returncode == 1 and "CondaHTTPError" in r.stderr and "CondaToS" not in r.stderr
    sh(lab, host, f"{create} --override-channels -c {CHANNEL}")
