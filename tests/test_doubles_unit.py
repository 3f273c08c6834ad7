"""Installer doubles and the mirror build, without lab hosts (temp dirs, the controller's sh)."""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from p40lab import doubles, httpd, mirror
from p40lab.artifacts import archive
from p40lab.artifacts import pins as lab_pins
from p40lab.artifacts.miniconda import build_miniconda
from p40lab.util import sha256_file

FIXTURES = Path(__file__).parent / "fixtures"  # copies of shared/fixtures (real captures)

needs_tools = pytest.mark.skipif(
    not (shutil.which("gcc") and shutil.which("dpkg-deb")), reason="needs gcc and dpkg-deb"
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("mirror")
    # the default lab's URL, spelled out: the test session's lab instance has another one
    pins = mirror.build(
        d, kernel_release="5.4.0-150-generic", base_url="http://10.231.0.1:8111", debian=False
    )
    return d, pins


def write_gpu(sysroot: Path, bdf: str, device: int) -> None:
    dev = sysroot / "sys/devices/pci0000:00" / bdf
    dev.mkdir(parents=True)
    for k, v in {
        "vendor": "0x10de",
        "device": f"0x{device:04x}",
        "class": "0x030200",
        "subsystem_device": "0x11d9",
    }.items():
        (dev / k).write_text(v + "\n")
    link = sysroot / "sys/bus/pci/devices" / bdf
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(f"../../../devices/pci0000:00/{bdf}")


def smi(
    tmp_path: Path, version: str, *args: str, loaded: str | None
) -> subprocess.CompletedProcess:
    script = tmp_path / "nvidia-smi"
    script.write_text(archive.fill(doubles.source("nvidia-smi.py"), VERSION=version))
    mod = tmp_path / "sys/module/nvidia"
    if loaded is not None:
        mod.mkdir(parents=True, exist_ok=True)
        (mod / "version").write_text(loaded + "\n")
    elif mod.exists():
        shutil.rmtree(mod)
    env = dict(os.environ, P40LAB_SYSROOT=str(tmp_path))
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=env
    )


# ---------------------------------------------------------------- mirror build


@needs_tools
def test_mirror_layout_and_sums(built):
    d, pins = built
    adir = d / "artifacts"
    for key in ("driver", "cuda", "cudnn", "miniconda"):
        p = pins[key]
        assert set(p) == {"version", "filename", "url", "sha256", "size"}
        f = adir / p["filename"]
        assert hashlib.sha256(f.read_bytes()).hexdigest() == p["sha256"]
        assert f.stat().st_size == p["size"]
        assert p["url"] == f"http://10.231.0.1:8111/artifacts/{p['filename']}"
    assert pins["driver"]["filename"] == "NVIDIA-Linux-x86_64-525.147.05.run"
    assert pins["cuda"]["filename"] == "cuda_11.8.0_520.61.05_linux.run"
    assert pins["cudnn"]["filename"] == "cudnn-linux-x86_64-8.9.7.29_cuda11-archive.tar.xz"
    assert pins["miniconda"]["filename"] == "Miniconda3-py310_24.11.1-0-Linux-x86_64.sh"
    assert pins["mirror"] == {"artifacts_url": "http://10.231.0.1:8111/artifacts"}
    assert "driver-525.125.06" in pins["extra_artifacts"]
    tos = pins["extra_artifacts"]["miniconda-py310_25.5.1-0"]
    assert tos["filename"] == "Miniconda3-py310_25.5.1-0-Linux-x86_64.sh"
    assert hashlib.sha256((adir / tos["filename"]).read_bytes()).hexdigest() == tos["sha256"]
    sums = (adir / "SHA256SUMS").read_text().splitlines()
    assert len(sums) == 6
    for line in sums:
        digest, name = line.split("  ")
        assert hashlib.sha256((adir / name).read_bytes()).hexdigest() == digest
    assert set(mirror.stack_overrides(pins)) == {"driver", "cuda", "cudnn", "miniconda", "mirror"}


@needs_tools
def test_build_is_deterministic_for_archives(built, tmp_path):
    d, pins = built
    pins2 = mirror.build(tmp_path, kernel_release="5.4.0-150-generic")
    for key in ("cudnn", "miniconda", "driver", "cuda"):
        assert pins2[key]["sha256"] == pins[key]["sha256"], key


@needs_tools
def test_ensure_mirror_caches_and_restores(tmp_path, monkeypatch):
    """The doubles' build is cached by its stamp and a corrupted artifact restored. The
    wheelhouse (pip download of ~115 projects: 2 min here, every lab run's own subject) is
    not: a stand-in answers for it."""
    from p40lab import wheelhouse

    wheels = {"pip_index_url": f"{mirror.BASE_URL}/simple", "torch": {"version": "2.6.0"},
              "files": 0, "bytes": 0}  # fmt: skip
    monkeypatch.setattr(wheelhouse, "build_wheelhouse", lambda *a, **kw: wheels)
    calls = []
    real_build = mirror.build
    monkeypatch.setattr(mirror, "build", lambda *a, **kw: calls.append(1) or real_build(*a, **kw))
    # the stand-in's stack goes here, never into a lab instance's state (a running lab's hosts
    # would read its torch 2.6.0: make test runs the lab tests beside this one)
    published = []
    monkeypatch.setattr(mirror._lab, "set_stack_overrides", lambda s, **kw: published.append(s))
    # the lab instance's own URL: the calls below without a state fall back to it
    # tool=False: upstream only (p40fleet.mirror's build of the hosts' mirror needs the
    # instance's server, which a unit test has not)
    pins = mirror.ensure_mirror({"mirror_url": mirror.BASE_URL}, tmp_path, tool=False)
    assert calls == [1]
    again = mirror.ensure_mirror(None, tmp_path, tool=False)
    assert calls == [1] and again == pins
    name = pins["driver"]["filename"]
    upstream = tmp_path / mirror.UPSTREAM
    mirror.corrupt_artifact(name, upstream)
    assert sha256_file(upstream / "artifacts" / name) != pins["driver"]["sha256"]
    assert mirror.ensure_mirror(None, tmp_path, tool=False) == pins  # restored, not rebuilt
    assert calls == [1]
    assert [s["torch"]["version"] for s in published] == ["2.6.0"] * 3  # published each time
    assert pins["driver"]["url"].startswith(f"{mirror.UPSTREAM_URL}/artifacts/")


def test_an_old_mirror_dir_moves_into_upstream_keeping_its_files(tmp_path):
    """Before #27's lab build the mirror dir held upstream's files at its top."""
    (tmp_path / mirror.STAMP_FILE).write_text("{}")
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels/six-1.17.0-py2.py3-none-any.whl").write_bytes(b"wheel")
    mirror._move_old_layout(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [mirror.UPSTREAM]
    moved = tmp_path / mirror.UPSTREAM / "wheels/six-1.17.0-py2.py3-none-any.whl"
    assert moved.read_bytes() == b"wheel"
    mirror._move_old_layout(tmp_path)  # once only
    assert moved.is_file()


@needs_tools
def test_cudnn_tarball_layout(built):
    d, pins = built
    with tarfile.open(d / "artifacts" / pins["cudnn"]["filename"]) as tar:
        members = {m.name: m for m in tar.getmembers()}
        top = "cudnn-linux-x86_64-8.9.7.29_cuda11-archive"
        assert all(n == top or n.startswith(top + "/") for n in members)
        for h in ("cudnn.h", "cudnn_version.h", "cudnn_ops_infer.h", "cudnn_cnn_train.h"):
            assert f"{top}/include/{h}" in members
        assert f"{top}/LICENSE" in members
        for lib in ("libcudnn", "libcudnn_adv_infer", "libcudnn_adv_train", "libcudnn_cnn_infer",
                    "libcudnn_cnn_train", "libcudnn_ops_infer", "libcudnn_ops_train"):  # fmt: skip
            assert members[f"{top}/lib/{lib}.so.8.9.7"].isfile()
            assert members[f"{top}/lib/{lib}.so.8"].linkname == f"{lib}.so.8.9.7"
            assert members[f"{top}/lib/{lib}.so"].linkname == f"{lib}.so.8"
        assert {m.mtime for m in members.values()} == {archive.FIXED_MTIME}
        vh = tar.extractfile(f"{top}/include/cudnn_version.h").read().decode()
        so = tar.extractfile(f"{top}/lib/libcudnn.so.8.9.7").read()
    defs = dict(re.findall(r"#define (CUDNN_MAJOR|CUDNN_MINOR|CUDNN_PATCHLEVEL) (\d+)", vh))
    assert defs == {"CUDNN_MAJOR": "8", "CUDNN_MINOR": "9", "CUDNN_PATCHLEVEL": "7"}
    assert so[:4] == b"\x7fELF" and b"libcudnn.so.8" in so
    # same parse works on the real 8.9.1 header
    real = next((FIXTURES / "cuda").glob("cudnn_version.h-8.9.1*"), None)
    if real:
        rdefs = dict(re.findall(r"#define (CUDNN_\w+) (\d+)", real.read_text()))
        assert (rdefs["CUDNN_MAJOR"], rdefs["CUDNN_MINOR"], rdefs["CUDNN_PATCHLEVEL"]) == (
            "8",
            "9",
            "1",
        )


@needs_tools
def test_apt_repo_index(built):
    d, _ = built
    packages = (d / "apt/Packages").read_text()
    assert "Package: linux-headers-5.4.0-150-generic\n" in packages
    # the kernel update: a second release's image and headers
    assert "Package: linux-image-5.4.0-150-generic-p40lab2\n" in packages
    assert "Package: linux-headers-5.4.0-150-generic-p40lab2\n" in packages
    # dkms is a package of the mirror (never in a host's image); build-essential comes from
    # Debian's archive (debian=True, the lab's build), not a double
    assert "Package: dkms\nVersion: 2.8.1-5ubuntu2+p40lab1\n" in packages
    assert "Package: build-essential\n" not in packages
    for m in re.finditer(r"Filename: \./(\S+)\nSize: (\d+)\n.*\nSHA256: (\w+)", packages):
        data = (d / "apt" / m.group(1)).read_bytes()
        assert len(data) == int(m.group(2))
        assert hashlib.sha256(data).hexdigest() == m.group(3)
    deb = next((d / "apt").glob("linux-headers-5.4.0-150-generic_*.deb"))
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True).stdout
    assert "./lib/modules/5.4.0-150-generic/build -> /usr/src/linux-headers-5.4.0-150-generic" in (
        listing
    )
    assert "include/generated/utsrelease.h" in listing
    assert "Release" in os.listdir(d / "apt")


@needs_tools
def test_runfile_is_makeself_like(built, tmp_path):
    d, pins = built
    run = d / "artifacts" / pins["driver"]["filename"]
    r = subprocess.run(["sh", str(run), "--info"], capture_output=True, text=True)
    assert r.returncode == 0 and "525.147.05" in r.stdout
    r = subprocess.run(["sh", str(run), "-v"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0
    assert "nvidia-installer:  version 525.147.05" in r.stdout
    r = subprocess.run(["sh", str(run), "-x"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0
    x = tmp_path / "NVIDIA-Linux-x86_64-525.147.05"
    assert (x / "nvidia-installer").exists() and (x / "kernel/nvidia.ko").exists()
    modinfo = subprocess.run(
        ["readelf", "-p", ".modinfo", str(x / "kernel/nvidia.ko")], capture_output=True, text=True
    )
    if modinfo.returncode == 0:
        assert "version=525.147.05" in modinfo.stdout
    # a corrupted copy fails makeself's integrity check (exit 2), like the real one
    bad = tmp_path / "bad.run"
    mirror.corrupt_artifact(pins["driver"]["filename"], d)
    shutil.copy(run, bad)
    mirror.restore_artifact(pins["driver"]["filename"], d)
    assert sha256_file(run) == pins["driver"]["sha256"]
    r = subprocess.run(["sh", str(bad), "-s"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "Error in MD5 checksums" in r.stderr


# ---------------------------------------------------------------- nvidia-smi double


@pytest.fixture
def sysroot(tmp_path):
    for i in range(2):
        write_gpu(tmp_path, f"0000:{4 + i:02x}:00.0", 0x1B38)
    return tmp_path


def test_smi_not_loaded(sysroot):
    r = smi(sysroot, "525.147.05", loaded=None)
    assert r.returncode == 9
    assert r.stdout.startswith(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )


def test_smi_mismatch(sysroot):
    r = smi(sysroot, "525.147.05", loaded="525.125.06")
    assert r.returncode == 18
    assert r.stdout == "Failed to initialize NVML: Driver/library version mismatch\n"


def test_smi_table_matches_r525_layout(sysroot):
    r = smi(sysroot, "525.147.05", loaded="525.147.05")
    assert r.returncode == 0, r.stdout
    lines = r.stdout.splitlines()
    assert re.match(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}", lines[0])
    ref = FIXTURES / "nvidia-smi/tesla-v100-sxm2-32gb-525.105.17-wan2.1-issue-5.txt"
    ref_lines = ref.read_text().splitlines()
    # header: identical up to the version string (same length: 525.105.17 / 525.147.05)
    assert lines[2] == ref_lines[1].replace("525.105.17", "525.147.05")
    assert lines[1] == ref_lines[0] and lines[3:8] == ref_lines[2:7]
    p40 = (FIXTURES / "nvidia-smi/tesla-p40-x1-520.61.05-genffy-blog.txt").read_text()
    p40_lines = p40.splitlines()

    # every GPU row has the same column borders as the real rows
    def borders(s):
        return [i for i, c in enumerate(s) if c == "|"]

    for mine, real in zip(lines[8:12], p40_lines[7:11], strict=True):
        assert borders(mine) == borders(real) and len(mine) == len(real)
    assert lines[8].startswith("|   0  Tesla P40           Off  | 00000000:04:00.0 Off |")
    assert "24576MiB" in lines[9] and "250W" in lines[9]
    assert lines[12].startswith("|   1  Tesla P40")
    assert all(len(line) == 79 for line in lines[1:])
    assert "No running processes found" in r.stdout


def test_smi_query_formats(sysroot):
    fields = "index,name,pci.bus_id,pci.device_id,compute_cap,memory.total,driver_version,uuid"
    r = smi(sysroot, "525.147.05", f"--query-gpu={fields}", "--format=csv", loaded="525.147.05")
    assert r.returncode == 0
    head, row0, row1 = r.stdout.splitlines()
    ref = FIXTURES / "query-gpu/h200-index-name-busid-devid-cc-mem-driver-uuid-vbios-580.csv"
    assert ref.read_text().splitlines()[0].startswith(head)
    assert row0.startswith(
        "0, Tesla P40, 00000000:04:00.0, 0x1B3810DE, 6.1, 24576 MiB, 525.147.05, GPU-"
    )
    r = smi(
        sysroot, "525.147.05", "--query-gpu=index,memory.total,compute_cap",
        "--format=csv,noheader,nounits", loaded="525.147.05",
    )  # fmt: skip
    assert r.stdout == "0, 24576, 6.1\n1, 24576, 6.1\n"
    r = smi(sysroot, "525.147.05", "--query-gpu=bogus", "--format=csv", loaded="525.147.05")
    assert r.returncode == 2
    assert r.stdout.startswith('Field "bogus" is not a valid field to query.')


def test_smi_h200_not_supported_by_r525(tmp_path):
    write_gpu(tmp_path, "0000:04:00.0", 0x2335)
    r = smi(tmp_path, "525.147.05", loaded="525.147.05")
    assert r.returncode == 6 and "No devices were found" in r.stdout
    r = smi(tmp_path, "580.159.04", "--query-gpu=name,memory.total,compute_cap",
            "--format=csv,noheader,nounits", loaded="580.159.04")  # fmt: skip
    assert r.stdout == "NVIDIA H200, 143771, 9.0\n"


def test_smi_p100(tmp_path):
    write_gpu(tmp_path, "0000:04:00.0", 0x15F8)
    r = smi(tmp_path, "525.147.05", "--query-gpu=name,memory.total,compute_cap",
            "--format=csv,noheader", loaded="525.147.05")  # fmt: skip
    assert r.stdout == "Tesla P100-PCIE-16GB, 16384 MiB, 6.0\n"


# ---------------------------------------------------------------- system doubles


def test_install_system_doubles(tmp_path):
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "lib").symlink_to("usr/lib")
    (tmp_path / "etc/apt/sources.list.d").mkdir(parents=True)
    (tmp_path / "etc/apt/sources.list.d/debian.sources").write_text("Types: deb\n")
    doubles.install_system_doubles(tmp_path, "5.4.0-150-generic")
    # the image names only the distribution's archive (unreachable from a lab host): the
    # mirror's apt repo comes through the deploy (stack.mirror.apt)
    sources = (tmp_path / "etc/apt/sources.list").read_text()
    assert sources.endswith("deb http://deb.debian.org/debian bookworm main\n")
    assert "10.231.0.1" not in sources
    assert not (tmp_path / "etc/apt/sources.list.d/debian.sources").exists()
    assert os.access(tmp_path / "usr/sbin/update-initramfs", os.X_OK)
    # a stock Ubuntu 20.04 server has no dkms: the mirror's apt repo serves it
    assert not (tmp_path / "usr/sbin/dkms").exists()
    assert not (tmp_path / "var/lib/dkms").exists()
    assert (tmp_path / "etc/ld.so.preload").read_text() == f"/{doubles.UNAME_SHIM}\n"
    assert (tmp_path / doubles.UNAME_SHIM).read_bytes()[:4] == b"\x7fELF"
    assert (tmp_path / "usr/lib/modules/5.4.0-150-generic").is_dir()
    assert not (tmp_path / "usr/lib/modules/5.4.0-150-generic/build").exists()


def test_dkms_status_format(tmp_path):
    tree = tmp_path / "dkms"
    kr = os.uname().release
    (tree / f"nvidia/525.147.05/{kr}/x86_64/module").mkdir(parents=True)
    (tree / f"nvidia/525.147.05/{kr}/x86_64/module/nvidia.ko").write_bytes(b"")
    (tree / "other/1.0").mkdir(parents=True)
    r = subprocess.run(
        ["sh", str(doubles.DOUBLES_DIR / "dkms"), "status"],
        capture_output=True, text=True, env=dict(os.environ, DKMS_TREE=str(tree)),
    )  # fmt: skip
    assert r.returncode == 0
    # "built" because /lib/modules/<kr>/updates/dkms/nvidia.ko is not on this controller
    assert f"nvidia/525.147.05, {kr}, x86_64: " in r.stdout
    assert "other/1.0: added" in r.stdout


@needs_tools
def test_dkms_package_holds_the_double_and_its_kernel_hooks(built):
    d, _ = built
    deb = d / "apt/dkms_2.8.1-5ubuntu2+p40lab1_all.deb"
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True).stdout
    for path in (
        "usr/sbin/dkms",
        "etc/kernel/postinst.d/dkms",
        "etc/kernel/header_postinst.d/dkms",
    ):
        assert re.search(rf"^-rwxr-xr-x .* \./{re.escape(path)}$", listing, re.M), listing
    depends = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True, text=True
    )
    assert depends.stdout.strip() == "kmod, gcc | c-compiler, make"


@needs_tools
def test_second_kernel_image_runs_the_kernel_hooks_and_becomes_the_boot_default(built):
    d, _ = built
    deb = next((d / "apt").glob("linux-image-*-p40lab2_*.deb"))
    script = subprocess.run(
        ["dpkg-deb", "-I", str(deb), "postinst"], capture_output=True, text=True
    ).stdout
    kr2 = "5.4.0-150-generic-p40lab2"
    assert f"run-parts --report --arg={kr2} --arg=/boot/vmlinuz-{kr2} /etc/kernel/postinst.d" in (
        script
    )
    assert f"echo {kr2} > /boot/p40lab-default-kernel" in script
    headers = next((d / "apt").glob(f"linux-headers-{kr2}_*.deb"))
    script = subprocess.run(
        ["dpkg-deb", "-I", str(headers), "postinst"], capture_output=True, text=True
    ).stdout
    assert f"--arg={kr2} --arg=/usr/src/linux-headers-{kr2} /etc/kernel/header_postinst.d" in (
        script
    )


def test_booted_release_follows_the_installed_default_kernel(tmp_path):
    from p40lab import boot

    assert boot.booted_release(tmp_path) == os.uname().release
    (tmp_path / "boot").mkdir()
    (tmp_path / "boot/p40lab-default-kernel").write_text("5.4.0-99-generic\n")
    assert boot.booted_release(tmp_path) == os.uname().release  # no image: not bootable
    (tmp_path / "boot/vmlinuz-5.4.0-99-generic").write_text("x")
    assert boot.booted_release(tmp_path) == "5.4.0-99-generic"
    (tmp_path / "boot/p40lab-default-kernel").write_text("../../etc\n")
    assert boot.booted_release(tmp_path) == os.uname().release
    decision = boot.apply_hook(tmp_path, tmp_path / "modules", "5.4.0-99-generic")
    assert decision == {"kernel": "5.4.0-99-generic", "nouveau": True, "nvidia": None}


def _dkms(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DKMS_TREE=str(tmp_path / "tree"))
    return subprocess.run(
        ["sh", str(doubles.DOUBLES_DIR / "dkms"), *args], capture_output=True, text=True, env=env
    )


def test_dkms_double_refuses_to_build_for_a_kernel_without_its_build_tree(tmp_path):
    r = _dkms(tmp_path, "build", "-m", "nvidia", "-v", "1.0", "-k", "0.0.0-p40lab-none")
    # no source dir first: the same refusal order as dkms (source, then kernel)
    assert r.returncode == 1 and "Could not find module source directory" in r.stderr
    for step in ("build", "install", "autoinstall"):
        r = _dkms(tmp_path, step, "nvidia/525.147.05", "-k", "0.0.0-p40lab-none")
        if step == "autoinstall":
            assert r.returncode == 0  # nothing AUTOINSTALL registered here
        else:
            assert r.returncode == 1, step


def test_update_initramfs_usage_exit_code():
    r = subprocess.run(["sh", str(doubles.DOUBLES_DIR / "update-initramfs")], capture_output=True)
    assert r.returncode == 2 and b"Usage: update-initramfs" in r.stderr


# ---------------------------------------------------------------- Miniconda doubles

DEFAULT_CHANNELS = ("https://repo.anaconda.com/pkgs/main", "https://repo.anaconda.com/pkgs/r")


@pytest.fixture(scope="module")
def minicondas(tmp_path_factory):
    """Both installer doubles, installed: the pinned 24.11.1 and 25.5.1 with the ToS plugin."""
    root = tmp_path_factory.mktemp("miniconda")
    prefixes = {}
    for key, data in (
        ("24.11.1", build_miniconda()),
        (
            "25.5.1",
            build_miniconda(
                lab_pins.MINICONDA_TOS_VERSION, lab_pins.CONDA_TOS_VERSION, tos_plugin=True
            ),
        ),
    ):
        installer = root / f"{key}.sh"
        installer.write_bytes(data)
        prefix = root / key
        r = subprocess.run(
            ["bash", str(installer), "-b", "-p", str(prefix)], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        prefixes[key] = prefix
    host_py = subprocess.run(
        ["/usr/bin/python3", "-c", "import platform; print(platform.python_version())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return prefixes, host_py


@pytest.fixture(scope="module")
def channel(tmp_path_factory, minicondas):
    """A file:// conda channel listing the host python (p40lab.sim_stack's mirror channel)."""
    from p40lab.sim_stack import build_conda_channel

    _, host_py = minicondas
    root = tmp_path_factory.mktemp("channel")
    build_conda_channel(root, host_py)
    return f"file://{root}"


# No route out, as on a lab host: the proxy variables (conda honours them too) point at a port
# that refuses, so the internet channels fail at once whatever network the controller has.
OFFLINE = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
CONNECTION_FAILED = "CondaHTTPError: HTTP 000 CONNECTION FAILED for url <"


def conda(prefix: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "CONDA_PLUGINS_AUTO_ACCEPT_TOS"}
    environ |= OFFLINE
    return subprocess.run(
        [str(prefix / "bin/conda"), *args],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, env=environ | env,
    )  # fmt: skip


def test_conda_24_11_1_has_no_tos_subcommand(minicondas):
    prefixes, _ = minicondas
    prefix = prefixes["24.11.1"]
    assert conda(prefix, "--version").stdout.strip() == "conda 24.11.1"
    for args in (["tos", "--help"], ["tos", "accept", "--override-channels", "--channel",
                                      DEFAULT_CHANNELS[0]]):  # fmt: skip
        r = conda(prefix, *args)
        assert r.returncode == 2  # argparse's exit code
        usage, error = r.stderr.splitlines()
        assert usage == "usage: conda [-h] [-v] [--no-plugins] [-V] COMMAND ..."
        assert error.startswith(
            "conda: error: argument COMMAND: invalid choice: 'tos' (choose from 'activate', "
        )
        assert "'create'" in error and "'tos'" not in error.split("(choose from")[1]
        assert r.stdout == ""


def test_conda_24_11_1_checks_no_tos_and_needs_a_reachable_channel(minicondas, channel):
    prefixes, host_py = minicondas
    prefix = prefixes["24.11.1"]
    r = conda(prefix, "create", "-n", "e", f"python={host_py}", "-y")
    assert r.returncode == 1 and "CondaToS" not in r.stderr
    assert r.stdout.rstrip().endswith("Collecting package metadata (repodata.json): failed")
    assert f"{CONNECTION_FAILED}{DEFAULT_CHANNELS[0]}/linux-64/repodata.json>" in r.stderr
    assert "'https//repo.anaconda.com/pkgs/main/linux-64'" in r.stderr  # conda's own last line
    assert not (prefix / "envs/e").exists()
    r = conda(prefix, "create", "-n", "e", f"python={host_py}", "-y", "--override-channels",
              "-c", channel)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (prefix / "envs/e/bin/python").exists()
    # a version the channel does not list is not found, as with real repodata
    r = conda(prefix, "create", "-n", "x", "python=3.10.99", "-y", "--override-channels",
              "-c", channel)  # fmt: skip
    assert r.returncode == 1 and "PackagesNotFoundError" in r.stderr
    assert f"{channel}/linux-64" in r.stderr


def test_conda_condarc_channels_replace_the_defaults(minicondas, channel, tmp_path):
    prefixes, host_py = minicondas
    prefix = prefixes["24.11.1"]
    from p40fleet.operations.conda import condarc_text

    (prefix / ".condarc").write_text(condarc_text(channel))
    try:
        r = conda(prefix, "create", "-n", "rc", f"python={host_py}", "-y")
        assert r.returncode == 0, r.stderr
        history = (prefix / "envs/rc/conda-meta/history").read_text()
        assert f"# channels: {channel}\n" in history
        # default_channels is what "defaults" means: the mirror's index answers (no such python)
        r = conda(prefix, "create", "-n", "x", "python=3.10.99", "-y", "--override-channels",
                  "-c", "defaults")  # fmt: skip
        assert r.returncode == 1 and "PackagesNotFoundError" in r.stderr
        assert f"  - {channel}/linux-64" in r.stderr and "repo.anaconda.com" not in r.stderr
        missing = f"file://{tmp_path}/no-channel"
        r = conda(prefix, "create", "-n", "rc", "python=3", "-y", "-c", missing)
        assert (
            r.returncode == 1
            and f"{CONNECTION_FAILED}{missing}/linux-64/repodata.json>" in r.stderr
        )
    finally:
        (prefix / ".condarc").unlink()


def test_conda_explicit_lock_checks_every_file_as_conda_does(minicondas, tmp_path):
    """N7: `create --file` of an explicit lock fetches each URL and checks its sum: a changed
    file or a wrong sum fails naming the URL, a missing file fails naming it, no env is made."""
    from p40lab.sim_stack import build_conda_channel, conda_lock_text

    prefixes, host_py = minicondas
    prefix = prefixes["24.11.1"]
    root = tmp_path / "channel"
    build_conda_channel(root, host_py)
    channel = f"file://{root}"
    good = conda_lock_text(host_py, channel)
    lock = tmp_path / "lock.txt"

    def create(text, env):
        lock.write_text(text)
        return conda(prefix, "create", "-n", env, "--file", str(lock), "-y")

    r = create(good, "locked")
    assert r.returncode == 0, r.stderr
    assert (prefix / "envs/locked/bin/python").exists()
    history = (prefix / "envs/locked/conda-meta/history").read_text()
    assert f"+python-{host_py}-h0_0_cpython\n" in history and "+tzdata-2024a-p40lab_0\n" in history
    python_url = f"{channel}/linux-64/python-{host_py}-h0_0_cpython.tar.bz2"
    # a wrong sum in the lock: conda's ChecksumMismatchError, naming the file's URL
    digest = good.split(python_url + "#sha256:")[1][:64]
    r = create(good.replace(digest, "0" * 64), "bad")
    assert r.returncode == 1 and "ChecksumMismatchError: Conda detected a mismatch" in r.stderr
    assert f"for url '{python_url}'" in r.stderr and f"expected sha256: {'0' * 64}" in r.stderr
    assert f"actual sha256: {digest}" in r.stderr and not (prefix / "envs/bad").exists()
    # md5 anchors are checked too (conda list --explicit --md5)
    data = (root / "linux-64" / python_url.rsplit("/", 1)[1]).read_bytes()
    r = create(good.replace(f"#sha256:{digest}", f"#{'1' * 32}"), "bad")
    assert r.returncode == 1 and "expected md5: " + "1" * 32 in r.stderr
    assert f"actual md5: {hashlib.md5(data).hexdigest()}" in r.stderr
    # the channel's file changed under the lock (a mirror cannot swap what is installed)
    tz = root / "noarch" / "tzdata-2024a-p40lab_0.tar.bz2"
    tz.write_bytes(tz.read_bytes() + b"x")
    r = create(good, "bad")
    assert r.returncode == 1 and f"for url '{channel}/noarch/tzdata-2024a-p40lab_0" in r.stderr
    # a file the channel does not have: CondaHTTPError naming it
    tz.unlink()
    r = create(good, "bad")
    assert r.returncode == 1 and f"{CONNECTION_FAILED}{channel}/noarch/tzdata-2024a" in r.stderr
    assert not (prefix / "envs/bad").exists()
    # a line conda cannot parse
    r = create(good.replace("#sha256:", "#sha1:"), "bad")
    assert r.returncode == 1 and "Could not parse explicit URL" in r.stderr


def test_conda_double_replaces_its_files_never_writes_through_a_hard_link(minicondas, tmp_path):
    """The package cache's archives, ``.condarc`` and the ToS records are new files renamed into
    place (conda's download(): NAME.partial, then rename): another hard link of the old file,
    as a lab clone has of its seed's, keeps the old bytes; a checksum mismatch keeps the old
    archive."""
    from p40lab.sim_stack import build_conda_channel, conda_lock_text

    prefixes, host_py = minicondas
    prefix = prefixes["25.5.1"]
    root = tmp_path / "channel"
    build_conda_channel(root, host_py)
    channel = f"file://{root}"
    lock = tmp_path / "lock.txt"
    fn = f"python-{host_py}-h0_0_cpython.tar.bz2"
    cached, seed = prefix / "pkgs" / fn, tmp_path / "seed"

    def create() -> subprocess.CompletedProcess:
        return conda(prefix, "create", "-n", "linked", "--file", str(lock), "-y",
                     CONDA_PLUGINS_AUTO_ACCEPT_TOS="yes")  # fmt: skip

    def old_file(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        seed.mkdir(exist_ok=True)
        (seed / path.name).unlink(missing_ok=True)
        path.write_bytes(data)
        os.link(path, seed / path.name)

    def untouched(path: Path, data: bytes) -> None:
        assert (seed / path.name).read_bytes() == data
        assert os.stat(seed / path.name).st_nlink == 1  # path is another inode now
        assert not path.with_name(path.name + ".partial").exists()

    # a wrong sum: the cached archive stays as it was, no partial file left
    good = conda_lock_text(host_py, channel)
    digest = good.split(f"{fn}#sha256:")[1][:64]
    old_file(cached, b"old archive")
    lock.write_text(good.replace(digest, "0" * 64))
    r = create()
    assert r.returncode == 1 and "ChecksumMismatchError" in r.stderr
    assert cached.read_bytes() == b"old archive"
    assert not cached.with_name(fn + ".partial").exists()
    # the right sum: the new archive replaces the old one, the seed's link keeps the old bytes
    lock.write_text(good)
    r = create()
    try:
        assert r.returncode == 0, r.stderr
        assert cached.read_bytes() == (root / "linux-64" / fn).read_bytes()
        untouched(cached, b"old archive")
    finally:
        shutil.rmtree(prefix / "envs/linked", ignore_errors=True)
    condarc = prefix / ".condarc"
    old_file(condarc, b"channels:\n  - old\n")
    try:
        r = conda(prefix, "config", "--add", "channels", channel)
        assert r.returncode == 0, r.stderr
        assert f"  - {channel}\n" in condarc.read_text()
        untouched(condarc, b"channels:\n  - old\n")
    finally:
        condarc.unlink()
    tos = prefix / "conda-meta/tos" / "https_repo.anaconda.com_pkgs_main.json"
    old_file(tos, b"{}")
    try:
        r = conda(prefix, "tos", "accept", "--override-channels", "--channel", DEFAULT_CHANNELS[0])
        assert r.returncode == 0, r.stderr
        assert '"tos_accepted": true' in tos.read_text()
        untouched(tos, b"{}")
    finally:
        tos.unlink()


def test_conda_25_5_1_needs_tos_accepted_on_defaults(minicondas, channel):
    prefixes, host_py = minicondas
    prefix = prefixes["25.5.1"]
    assert conda(prefix, "--version").stdout.strip() == "conda 25.5.1"
    r = conda(prefix, "tos", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: conda tos")
    r = conda(prefix, "create", "-n", "e", f"python={host_py}", "-y")
    assert r.returncode == 1
    assert r.stderr.startswith("CondaToSNonInteractiveError: Terms of Service have not been")
    assert all(c in r.stderr for c in DEFAULT_CHANNELS)
    # conda-forge and the plugin's own switch get past the check (to the fetch: no route out)
    forge = ["--override-channels", "-c", "conda-forge"]
    r = conda(prefix, "create", "-n", "x", "python=3.10.99", "-y", *forge)
    assert r.returncode == 1 and CONNECTION_FAILED in r.stderr and "CondaToS" not in r.stderr
    r = conda(prefix, "create", "-n", "x", "python=3.10.99", "-y",
              CONDA_PLUGINS_AUTO_ACCEPT_TOS="yes")  # fmt: skip
    assert r.returncode == 1 and CONNECTION_FAILED in r.stderr and "CondaToS" not in r.stderr
    for ch in DEFAULT_CHANNELS:
        r = conda(prefix, "tos", "accept", "--override-channels", "--channel", ch)
        assert r.returncode == 0, r.stderr
    r = conda(prefix, "create", "-n", "e", f"python={host_py}", "-y")
    assert r.returncode == 1 and CONNECTION_FAILED in r.stderr and "CondaToS" not in r.stderr
    # a mirror channel needs no ToS at all: its index answers (the solver finds no such python)
    r = conda(prefix, "create", "-n", "e", "python=3.10.99", "-y", "--override-channels",
              "-c", channel)  # fmt: skip
    assert r.returncode == 1 and "PackagesNotFoundError" in r.stderr and "CondaToS" not in r.stderr


def test_conda_tos_fact_tells_the_doubles_apart(minicondas, tmp_path):
    from p40fleet.facts.conda import CondaTos

    prefixes, _ = minicondas

    def fact(prefix: Path):
        command = str(CondaTos().command(prefix=str(prefix), user=getpass.getuser()))
        r = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
        assert r.returncode == 0
        return CondaTos().process(r.stdout.splitlines())

    assert fact(prefixes["24.11.1"]).state == "no-plugin"
    assert fact(prefixes["25.5.1"]).state == "plugin"
    assert fact(tmp_path / "none").state == "no-conda"
    broken = tmp_path / "broken/bin"
    broken.mkdir(parents=True)
    (broken / "conda").write_text("#!/bin/sh\necho 'Traceback: boom' >&2; exit 1\n")
    (broken / "conda").chmod(0o755)
    odd = fact(tmp_path / "broken")
    assert odd.state == "unknown" and "rc=1" in odd.detail and "boom" in odd.detail


# ---------------------------------------------------------------- server


@needs_tools
def test_server_logs_bytes(built, tmp_path):
    d, pins = built
    log = tmp_path / "access.log"
    pidf = tmp_path / "mirror.pid"
    pid = httpd.start_server(d, "127.0.0.1", 18111, access_log=log, pid_file=pidf)
    try:
        assert int(pidf.read_text()) == pid
        url = f"http://127.0.0.1:18111/artifacts/{pins['cudnn']['filename']}"
        data = urllib.request.urlopen(url, timeout=5).read()
        assert hashlib.sha256(data).hexdigest() == pins["cudnn"]["sha256"]
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen("http://127.0.0.1:18111/artifacts/nope", timeout=5)
        deadline = time.monotonic() + 5  # the server logs after the client has its answer
        while len(httpd.access_entries(log)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        assert httpd.stop_server(pid_file=pidf)
    assert not pidf.exists()
    entries = httpd.access_entries(log)
    assert [(e["status"], e["path"].rsplit("/", 1)[1]) for e in entries] == [
        (200, pins["cudnn"]["filename"]),
        (404, "nope"),
    ]
    assert httpd.bytes_served(log, path_prefix="/artifacts/cudnn") == pins["cudnn"]["size"]


def test_base_image_has_no_compiler_dkms_or_pkg_config():
    """A stock Ubuntu 20.04 server has none of them: the deploy installs them from the mirror."""
    from p40lab import base

    for name in ("dkms", "gcc", "g++", "make", "pkg-config", "build-essential"):
        assert name in base.NOT_IN_BASE
        assert name not in base.PACKAGES
    assert "dkms" not in doubles.SYSTEM_DOUBLES


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("gcc"),
    reason="needs root, unshare and gcc",
)
def test_uname_shim_reports_the_release_the_host_booted(tmp_path):
    shim = tmp_path / "shim.so"
    shim.write_bytes(doubles.uname_shim())
    real = os.uname().release
    script = (
        "mount -t tmpfs p40lab-test /run && mkdir /run/p40lab-sim && "
        f"LD_PRELOAD={shim} uname -r && "
        "echo 5.4.0-99-generic > /run/p40lab-sim/kernel-release && "
        f"LD_PRELOAD={shim} uname -r && "
        f"LD_PRELOAD={shim} python3 -c 'import os; print(os.uname().release)'"
    )
    r = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [real, "5.4.0-99-generic", "5.4.0-99-generic"]
