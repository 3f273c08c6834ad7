"""operations.cuda: toolkit runfile flags, gcc/space refusals, skip rules, link, profile."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.facts.server import TmpDir

from p40fleet.facts.cuda import CudaInstall, CudaToolkit, GccMajor, NvccRelease
from p40fleet.facts.host import FreeSpace, FreeSpaceInfo
from p40fleet.operations import cuda
from p40fleet.spec import load_spec
from tests.opharness import at, run_op
from tests.probe_answers import checks_for, only_failures, sections

FIXTURES = Path(__file__).parent / "fixtures/cuda"  # copies of shared/fixtures/cuda

RUN = "/var/cache/p40fleet/cuda_11.8.0_520.61.05_linux.run"
DIR = "/usr/local/cuda-11.8"
TMP = "/var/cache/p40fleet"
NEED = load_spec("t", {}).cuda.tmp_bytes()
FLAGS = f"--silent --toolkit --installpath={DIR} --tmpdir={TMP} --no-man-page"


def free(n: int) -> FreeSpaceInfo:
    return FreeSpaceInfo(TMP, "/var", "/", 10**12, n)


def toolkit(facts, **kwargs):
    args = dict(runfile=RUN, version="11.8.0", cuda_dir=DIR, tmpdir=TMP, tmp_bytes=NEED, max_gcc=11)
    args.update(kwargs)
    return run_op(cuda.toolkit, facts=facts, **args)


FRESH = {CudaToolkit: CudaInstall(), GccMajor: 11, at(FreeSpace, path=TMP): free(10**10)}


def test_fresh_install_exact_flags_never_driver():
    r = toolkit(FRESH)
    assert r.commands == [f"mkdir -p {TMP}", f"sh {RUN} {FLAGS}"]
    assert "--driver" not in r.commands[1] and "--override" not in r.commands[1]


def test_installed_version_json_and_nvcc_is_a_noop():
    facts = {CudaToolkit: CudaInstall(True, "11.8.20220929", True)}
    r = toolkit(facts)
    assert r.commands == [] and "11.8.20220929" in r.noops[0]


def test_partial_tree_without_version_json_reinstalls():
    facts = {**FRESH, CudaToolkit: CudaInstall(exists=True, version=None, nvcc=True)}
    r = toolkit(facts)
    assert r.commands[-1] == f"sh {RUN} {FLAGS}"
    assert "no version.json" in r.logs[0]


def test_version_json_without_nvcc_reinstalls():
    facts = {**FRESH, CudaToolkit: CudaInstall(True, "11.8.20220929", False)}
    assert toolkit(facts).commands[-1] == f"sh {RUN} {FLAGS}"


def test_other_cuda_version_in_dir_reinstalls():
    facts = {**FRESH, CudaToolkit: CudaInstall(True, "12.1.20230417", True)}
    assert toolkit(facts).commands[-1] == f"sh {RUN} {FLAGS}"


def test_gcc_12_without_override_refuses_clearly():
    r = toolkit({**FRESH, GccMajor: 12})
    assert r.commands == ["function _fail"]
    assert "gcc 12 is newer than CUDA 11.8 supports" in r.failures[0]
    assert "allow_gcc_override=True" in r.failures[0]


def test_gcc_12_with_override_adds_override():
    r = toolkit({**FRESH, GccMajor: 12}, allow_gcc_override=True)
    assert r.commands[-1] == f"sh {RUN} {FLAGS} --override"


def test_max_gcc_is_the_spec_s_argument_not_a_constant():
    assert toolkit({**FRESH, GccMajor: 12}, max_gcc=12).commands[-1] == f"sh {RUN} {FLAGS}"
    r = toolkit(FRESH, max_gcc=10)
    assert "gcc 11 is newer than CUDA 11.8 supports (gcc <= 10)" in r.failures[0]
    assert "install gcc-10" in r.failures[0] and "gcc > 10 are unsupported" in r.failures[0]


def test_gcc_11_with_override_allowed_does_not_add_override():
    r = toolkit(FRESH, allow_gcc_override=True)
    assert "--override" not in r.commands[-1]


def test_not_enough_room_in_tmpdir_refuses_with_missing_amount():
    r = toolkit({**FRESH, at(FreeSpace, path=TMP): free(NEED - 1000)})
    assert r.commands == ["function _fail"]
    assert "1000 bytes) missing" in r.failures[0]


def test_tmp_bytes_is_a_parameter():
    r = toolkit({**FRESH, at(FreeSpace, path=TMP): free(2000)}, tmp_bytes=1500)
    assert r.commands[-1] == f"sh {RUN} {FLAGS}"


def test_symlink_created_and_then_noop():
    r = run_op(
        cuda.symlink,
        cuda_dir=DIR,
        cuda_link="/usr/local/cuda",
        facts={Link: None, Directory: {"mode": 755}},
    )
    assert r.commands == [f"ln -s {DIR} /usr/local/cuda"]
    info = {"link_target": DIR, "user": "root", "group": "root"}
    r = run_op(cuda.symlink, cuda_dir=DIR, cuda_link="/usr/local/cuda", facts={Link: info})
    assert r.commands == []


def test_symlink_to_another_toolkit_is_repointed():
    info = {"link_target": "/usr/local/cuda-12.1", "user": "root", "group": "root"}
    r = run_op(cuda.symlink, cuda_dir=DIR, cuda_link="/usr/local/cuda", facts={Link: info})
    assert r.commands == ["rm -f /usr/local/cuda", f"ln -s {DIR} /usr/local/cuda"]


def test_profile_template_sets_cuda_home_path_and_ld_library_path(tmp_path):
    r = run_op(
        cuda.profile,
        cuda_home=DIR,
        version="11.8.0",
        facts={
            File: None,
            TmpDir: "/tmp",
            at(Directory, path="/etc/profile.d/cuda.sh"): None,
            at(Directory, path="/etc/profile.d"): {"mode": 755},
        },
    )
    assert "upload /etc/profile.d/cuda.sh" in r.commands
    text = r.uploads["/etc/profile.d/cuda.sh"]
    assert f"CUDA_HOME={DIR}\nexport CUDA_HOME\n" in text
    # the rendered file does what it says in a real shell, and twice adds nothing
    script = tmp_path / "cuda.sh"
    script.write_text(text)
    out = subprocess.run(
        ["sh", "-c", f'PATH=/usr/bin LD_LIBRARY_PATH= ; . {script}; . {script}; '
         'echo "$CUDA_HOME|$PATH|$LD_LIBRARY_PATH"'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == f"{DIR}|{DIR}/bin:/usr/bin|{DIR}/lib64"


def test_verify():
    ok = run_op(cuda.verify, cuda_dir=DIR, version="11.8.0", facts={NvccRelease: "11.8.89"})
    assert ok.commands == [] and ok.noops
    bad = run_op(cuda.verify, cuda_dir=DIR, version="11.8.0", facts={NvccRelease: None})
    assert "got no answer" in bad.failures[0]


def test_facts_parse_real_outputs():
    nvcc = open(FIXTURES / "nvcc-version-11.8-genffy-blog.txt").read()
    assert NvccRelease().process(nvcc.splitlines()) == "11.8.89"
    out = [
        "##dir",
        "##nvcc",
        "##json",
        '{"cuda": {"name": "CUDA SDK",',
        '"version": "11.8.20220929"}}',
    ]
    assert CudaToolkit().process(out) == CudaInstall(True, "11.8.20220929", True)
    assert CudaToolkit().process(["##dir", "##nvcc"]) == CudaInstall(True, None, True)
    assert GccMajor().process(["12"]) == 12 and GccMajor().process([]) is None


def test_profile_unchanged_is_a_noop():
    first = run_op(
        cuda.profile,
        cuda_home=DIR,
        version="11.8.0",
        facts={
            File: None,
            TmpDir: "/tmp",
            Directory: None,
            at(Directory, path="/etc/profile.d"): {},
        },
    )
    text = first.uploads["/etc/profile.d/cuda.sh"]
    again = run_op(
        cuda.profile,
        cuda_home=DIR,
        version="11.8.0",
        facts={
            File: {"mode": 644, "user": "root", "group": "root"},
            Sha1File: hashlib.sha1(text.encode()).hexdigest(),
            Directory: None,
            at(Directory, path="/etc/profile.d"): {},
        },
    )
    assert again.commands == [] and again.noops


# -- S5/S6: no spec value is parsed by the shell; the link never replaces a non-CUDA path ------

INJECT = "$(touch X)`touch Y`;touch Z"


def test_runfile_flags_are_quoted_and_run_nothing(tmp_path):
    cuda_dir, tmpdir = f"/opt/cuda {INJECT}", str(tmp_path / f"t {INJECT}")
    facts = {**FRESH, at(FreeSpace, path=tmpdir): free(10**10)}
    runfile = tmp_path / "cuda.run"
    runfile.write_text('printf "%s\\n" "$@" > args\n')  # a stub runfile: records its argv
    r = toolkit(facts, runfile=str(runfile), cuda_dir=cuda_dir, tmpdir=tmpdir)
    for command in r.commands:
        subprocess.run(["sh", "-c", command], cwd=tmp_path, check=True)
    assert not [n for n in ("X", "Y", "Z") if (tmp_path / n).exists()]
    args = (tmp_path / "args").read_text().splitlines()
    assert f"--installpath={cuda_dir}" in args and f"--tmpdir={tmpdir}" in args


def test_profile_quotes_cuda_home_and_runs_nothing(tmp_path):
    home = f"/opt/cuda {INJECT}"
    r = run_op(
        cuda.profile,
        cuda_home=home,
        version="11.8.0",
        facts={
            File: None,
            TmpDir: "/tmp",
            at(Directory, path="/etc/profile.d/cuda.sh"): None,
            at(Directory, path="/etc/profile.d"): {"mode": 755},
        },
    )
    (tmp_path / "cuda.sh").write_text(r.uploads["/etc/profile.d/cuda.sh"])
    out = subprocess.run(
        ["sh", "-c", '. ./cuda.sh && printf "%s" "$CUDA_HOME"'],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout == home
    assert not [n for n in ("X", "Y", "Z") if (tmp_path / n).exists()]


@pytest.mark.parametrize(
    "info",
    [
        {"link_target": "python3.8", "user": "root", "group": "root"},  # /usr/bin/python3
        {"link_target": "/etc", "user": "root", "group": "root"},
        {"link_target": "/usr/local/lib", "user": "root", "group": "root"},
        {},  # a file or a directory is there, not a link
    ],
)
def test_symlink_refuses_to_replace_what_is_not_a_cuda_link(info):
    r = run_op(cuda.symlink, cuda_dir=DIR, cuda_link="/usr/local/cuda", facts={Link: info})
    assert r.commands == ["function _fail"]
    assert "host lab1: CUDA symlink /usr/local/cuda: /usr/local/cuda exists" in r.failures[0]
    assert "stack.paths.cuda_link" in r.failures[0]


def test_symlink_into_a_cuda_dir_counts_as_cuda():
    assert cuda.is_cuda_link("/usr/local/cuda", {"link_target": "cuda-12.1"})
    assert cuda.is_cuda_link("/usr/local/cuda", {"link_target": "/opt/nvidia-cuda/11.8"})
    assert cuda.is_cuda_link("/opt/cuda", {"link_target": "/usr/local/cuda-11.8/"})
    assert not cuda.is_cuda_link("/usr/local/cuda", {"link_target": "/usr/local/cuda-11.8/../lib"})
    assert not cuda.is_cuda_link("/usr/local/cuda", {"link_target": "/opt"})


# --- verify's cuda checks (p40fleet/verification/checks/cuda.py) ------------------------------


def test_nvcc_12():
    nvcc = ["Cuda compilation tools, release 12.1, V12.1.105", "@@rc 0"]
    checks = checks_for(sections(nvcc=nvcc))
    assert only_failures(checks) == {"nvcc"}
    assert (
        "release 12.1" in checks["nvcc"].detail and "expected release 11.8" in checks["nvcc"].detail
    )
    assert "'cuda'" in checks["nvcc"].remedy
