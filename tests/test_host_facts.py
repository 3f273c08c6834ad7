import subprocess

from p40fleet.facts.host import (
    Cpus,
    FreeSpace,
    KernelHeaders,
    LinuxDistribution,
    MemTotal,
    os_label,
)

UBUNTU_2004 = """/etc/os-release
NAME="Ubuntu"
VERSION="20.04.6 LTS (Focal Fossa)"
ID=ubuntu
ID_LIKE=debian
PRETTY_NAME="Ubuntu 20.04.6 LTS"
VERSION_ID="20.04"
VERSION_CODENAME=focal
---""".splitlines()


def run_sh(command: str) -> tuple[int, list[str]]:
    result = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=False)
    return result.returncode, result.stdout.splitlines()


def test_os_label_from_pyinfra_linux_distribution():
    dist = LinuxDistribution().process(UBUNTU_2004)
    assert dist["name"] == "Ubuntu"
    assert os_label(dist) == "Ubuntu 20.04"


def test_os_label_empty():
    assert os_label(LinuxDistribution().process([])) == "unknown OS"
    assert os_label(None) == "unknown OS"
    assert (
        os_label({"name": "Gentoo", "major": None, "minor": None, "release_meta": {}}) == "Gentoo"
    )


def test_linux_distribution_command_survives_no_release_files(tmp_path):
    command = LinuxDistribution().command().replace("cd /etc/", f"cd {tmp_path}/")
    assert run_sh(command) == (0, [])


def test_kernel_headers():
    info = KernelHeaders().process(["release=5.4.0-216-generic", "headers=yes"])
    assert info.release == "5.4.0-216-generic"
    assert info.headers_installed is True
    assert info.headers_path == "/lib/modules/5.4.0-216-generic/build"
    missing = KernelHeaders().process(["release=6.1.0-18-amd64", "headers=no"])
    assert missing.headers_installed is False
    assert KernelHeaders().process([]).release is None


def test_kernel_headers_command_here():
    rc, lines = run_sh(KernelHeaders().command())
    assert rc == 0
    info = KernelHeaders().process(lines)
    assert info.release
    assert "uname -r" in KernelHeaders().command()


def test_free_space_parse():
    fact = FreeSpace()
    fact.command(path="/var/cache/p40fleet")
    out = [
        "measured=/var",
        "unit=1",
        "/dev/sda1 105089261568 20000000000 80000000000 21% /",
    ]
    info = fact.process(out)
    assert info.path == "/var/cache/p40fleet"
    assert info.measured_path == "/var"
    assert info.available_bytes == 80000000000
    assert info.total_bytes == 105089261568
    assert info.mount_point == "/"


def test_free_space_kib_fallback():
    out = ["measured=/", "unit=1024", "overlay 1000 10 990 1% /"]
    assert FreeSpace().process(out).available_bytes == 990 * 1024


def test_free_space_nothing():
    assert FreeSpace().process(["measured=/x"]) is None
    assert FreeSpace().process([]) is None


def test_free_space_walks_up_to_existing_parent(tmp_path):
    fact = FreeSpace()
    target = tmp_path / "a" / "b c" / "d"
    rc, lines = run_sh(fact.command(path=str(target)))
    assert rc == 0
    info = fact.process(lines)
    assert info.measured_path == str(tmp_path)
    assert info.available_bytes > 0


def test_free_space_quotes_path():
    command = FreeSpace().command(path="/tmp/$(touch /tmp/pwned)")
    assert "'/tmp/$(touch /tmp/pwned)'" in command


def test_mem_total():
    assert MemTotal().process(["MemTotal:       263842096 kB", "MemFree: 1 kB"]) == 263842096 * 1024
    assert MemTotal().process([]) is None
    rc, lines = run_sh(MemTotal().command())
    assert rc == 0 and MemTotal().process(lines) > 0
    assert "|| true" in MemTotal().command()


def test_cpus_is_pyinfra_builtin():
    assert Cpus().process(["16"]) == 16
