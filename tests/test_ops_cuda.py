"""operations.cuda: toolkit runfile flags, gcc/space refusals, skip rules, link, profile."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.facts.server import TmpDir

from facts.host import FreeSpace, FreeSpaceInfo
from facts.system import CudaInstall, CudaToolkit, GccMajor, NvccRelease
from operations import cuda
from tests.opharness import at, run_op

FIXTURES = Path(__file__).parent / "fixtures/cuda"  # copies of shared/fixtures/cuda

RUN = "/var/cache/p40fleet/cuda_11.8.0_520.61.05_linux.run"
DIR = "/usr/local/cuda-11.8"
TMP = "/var/cache/p40fleet"
NEED = cuda.default_tmp_bytes(4336730777)
FLAGS = f"--silent --toolkit --installpath={DIR} --tmpdir={TMP} --no-man-page"


def free(n: int) -> FreeSpaceInfo:
    return FreeSpaceInfo(TMP, "/var", "/", 10**12, n)


def toolkit(facts, **kwargs):
    args = dict(runfile=RUN, version="11.8.0", cuda_dir=DIR, tmpdir=TMP, tmp_bytes=NEED)
    args.update(kwargs)
    return run_op(cuda.toolkit, facts=facts, **args)


FRESH = {CudaToolkit: CudaInstall(), GccMajor: 11, at(FreeSpace, path=TMP): free(10**10)}


def test_default_tmp_bytes_is_size_times_1_1_or_4_5_gb():
    assert NEED == int(4336730777 * 1.1)
    assert cuda.default_tmp_bytes(None) == 4_500_000_000


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
    assert f"export CUDA_HOME={DIR}\n" in text
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
