"""operations.cudnn: same-filesystem check, extract, hard links (real cp -lP run), verify."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from p40fleet.facts.artifacts import UnsafeParent
from p40fleet.facts.cudnn import (
    CudnnExtracted,
    CudnnFile,
    CudnnFiles,
    CudnnHeaderVersion,
    PathDevice,
)
from p40fleet.operations import cudnn
from tests.opharness import at, run_op
from tests.probe_answers import checks_for, only_failures, sections

FIXTURES = Path(__file__).parent / "fixtures/cuda"  # copies of shared/fixtures/cuda

SRC_ROOT = "/usr/local/src"
TAR = "/var/cache/p40fleet/cudnn-linux-x86_64-8.9.7.29_cuda11-archive.tar.xz"
TREE = "/usr/local/src/cudnn-linux-x86_64-8.9.7.29_cuda11-archive"
DIR = "/usr/local/cuda-11.8"
HEADER_897 = "#define CUDNN_MAJOR 8\n#define CUDNN_MINOR 9\n#define CUDNN_PATCHLEVEL 7\n"


def sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def local_fact(cls, **kwargs):
    fact = cls()
    return fact.process(sh(fact.command(**kwargs)).stdout.splitlines())


# --- same_filesystem / extract ---------------------------------------------------------------


def test_same_filesystem_is_a_noop():
    r = run_op(cudnn.same_filesystem, extract_dir=SRC_ROOT, cuda_dir=DIR, facts={PathDevice: 2049})
    assert r.commands == [] and r.noops


def test_cross_device_layout_is_a_clear_error():
    r = run_op(
        cudnn.same_filesystem,
        extract_dir="/data/src",
        cuda_dir=DIR,
        facts={at(PathDevice, path="/data/src"): 2050, at(PathDevice, path=DIR): 2049},
    )
    assert r.commands == ["function _fail"]
    assert "different filesystems" in r.failures[0]
    assert "Invalid cross-device link" in r.failures[0]
    assert "cudnn_extract_dir" in r.failures[0]


def test_extract_dir_name():
    assert cudnn.extracted_dir(SRC_ROOT, TAR) == TREE


ARCHIVE_SUM = "c" * 64


def test_extract_into_partial_then_rename_then_mark_and_noop_when_marked():
    header = f"{TREE}/include/cudnn_version.h"
    r = run_op(
        cudnn.extract,
        archive=TAR,
        extract_dir=SRC_ROOT,
        version="8.9.7.29",
        sha256=ARCHIVE_SUM,
        facts={at(CudnnHeaderVersion, path=header): None, CudnnExtracted: None, UnsafeParent: None},
    )
    (cmd,) = r.commands
    assert f"tar -xf {TAR} -C {TREE}.partial" in cmd
    name = TREE.rsplit("/", 1)[1]
    # the tree gets its name only after tar exited 0, the marker after that
    assert cmd.index("tar -xf") < cmd.index(f"mv {TREE}.partial/{name} {TREE}")
    assert cmd.index(f"{TREE}.partial/{name} {TREE}") < cmd.index(f"{TREE}/.p40fleet-extracted")
    r = run_op(
        cudnn.extract,
        archive=TAR,
        extract_dir=SRC_ROOT,
        version="8.9.7.29",
        sha256=ARCHIVE_SUM,
        facts={
            CudnnHeaderVersion: "8.9.7",
            at(CudnnExtracted, tree=TREE): ARCHIVE_SUM,
            UnsafeParent: None,
        },
    )
    assert r.commands == [] and r.noops


def test_tree_without_completion_marker_is_extracted_again():
    # S11: the header says 8.9.7 but tar never finished (or an older run wrote no marker)
    for marker in (None, "d" * 64):  # none, or one naming another archive
        r = run_op(
            cudnn.extract,
            archive=TAR,
            extract_dir=SRC_ROOT,
            version="8.9.7.29",
            sha256=ARCHIVE_SUM,
            facts={CudnnHeaderVersion: "8.9.7", CudnnExtracted: marker, UnsafeParent: None},
        )
        assert len(r.commands) == 1 and "tar -xf" in r.commands[0]
    assert "no completion marker" in r.logs[0]


def _tarball(tmp_path: Path) -> tuple[Path, bytes]:
    import io
    import tarfile

    name = TREE.rsplit("/", 1)[1]
    archive = tmp_path / f"{name}.tar"
    lib = os.urandom(2_000_000)
    with tarfile.open(archive, "w") as tf:
        for rel, data in [
            ("include/cudnn_version.h", b"#define CUDNN_MAJOR 8\n#define CUDNN_MINOR 9\n"
             b"#define CUDNN_PATCHLEVEL 7\n"),
            ("lib/libcudnn_ops_infer.so.8.9.7", lib),
        ]:  # fmt: skip
            info = tarfile.TarInfo(f"{name}/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return archive, lib


def _fact(cls, **kwargs):
    fact = cls()
    out = subprocess.run(["sh", "-c", fact.command(**kwargs)], capture_output=True, text=True)
    return fact.process(out.stdout.splitlines())


def test_interrupted_extract_is_redone_for_real(tmp_path):
    import hashlib

    archive, lib = _tarball(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    # the review's S11 block: tar cut off after the header, inside the library
    subprocess.run(f"head -c 1000000 {archive} | tar -xf - -C {src}", shell=True)
    tree = cudnn.extracted_dir(str(src), str(archive))
    assert os.path.getsize(f"{tree}/lib/libcudnn_ops_infer.so.8.9.7") < len(lib)
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    facts = {
        CudnnHeaderVersion: _fact(CudnnHeaderVersion, path=f"{tree}/include/cudnn_version.h"),
        CudnnExtracted: _fact(CudnnExtracted, tree=tree),
        UnsafeParent: None,
    }
    assert facts[CudnnHeaderVersion] == "8.9.7" and facts[CudnnExtracted] is None
    r = run_op(cudnn.extract, archive=str(archive), extract_dir=str(src), version="8.9.7.29",
               sha256=sha, facts=facts)  # fmt: skip
    (cmd,) = r.commands
    assert subprocess.run(["sh", "-c", cmd]).returncode == 0
    assert Path(f"{tree}/lib/libcudnn_ops_infer.so.8.9.7").read_bytes() == lib
    assert sorted(os.listdir(src)) == [Path(tree).name]  # no .partial left
    assert _fact(CudnnExtracted, tree=tree) == sha
    # a tar that fails leaves the complete tree alone and never renames a partial one
    archive.write_bytes(archive.read_bytes()[:1_000_000])
    assert subprocess.run(["sh", "-c", cmd], capture_output=True).returncode != 0
    assert Path(f"{tree}/lib/libcudnn_ops_infer.so.8.9.7").read_bytes() == lib


# --- link (facts in, commands out) -----------------------------------------------------------


def f(inode: int, symlink: bool = False, device: int = 1) -> CudnnFile:
    return CudnnFile(device=device, inode=inode, symlink=symlink)


SRC = {
    "include/cudnn.h": f(10),
    "include/cudnn_version.h": f(11),
    "lib/libcudnn.so.8.9.7": f(12),
    "lib/libcudnn.so.8": f(13, True),
}


def link(dst):
    return run_op(
        cudnn.link, src_dir=TREE, cuda_dir=DIR, facts={CudnnFiles: {"src": SRC, "dst": dst}}
    )


def test_fresh_links_headers_and_libs_then_ldconfig():
    r = link({})
    assert r.commands == [
        f"mkdir -p {DIR}/include && cp -lP {TREE}/include/cudnn.h "
        f"{TREE}/include/cudnn_version.h {DIR}/include/",
        f"mkdir -p {DIR}/lib64 && cp -lP {TREE}/lib/libcudnn.so.8 "
        f"{TREE}/lib/libcudnn.so.8.9.7 {DIR}/lib64/",
        "ldconfig",
    ]


def test_same_inodes_are_a_noop():
    dst = {
        "include/cudnn.h": f(10),
        "include/cudnn_version.h": f(11),
        "lib64/libcudnn.so.8.9.7": f(12),
        "lib64/libcudnn.so.8": f(13, True),
    }
    r = link(dst)
    assert r.commands == [] and r.noops


def test_other_version_files_are_replaced_and_stale_ones_removed():
    dst = {
        "include/cudnn.h": f(90),  # a copy / another version: same name, other inode
        "include/cudnn_version.h": f(11),
        "lib64/libcudnn.so.8.9.1": f(91),  # another version's library
        "lib64/libcudnn.so.8": f(92, True),
    }
    r = link(dst)
    assert r.commands == [
        f"rm -f {DIR}/include/cudnn.h {DIR}/lib64/libcudnn.so.8 {DIR}/lib64/libcudnn.so.8.9.1",
        f"mkdir -p {DIR}/include && cp -lP {TREE}/include/cudnn.h {DIR}/include/",
        f"mkdir -p {DIR}/lib64 && cp -lP {TREE}/lib/libcudnn.so.8 "
        f"{TREE}/lib/libcudnn.so.8.9.7 {DIR}/lib64/",
        "ldconfig",
    ]
    assert "libcudnn.so.8.9.1" in r.logs[0]


def test_same_inode_number_on_another_device_is_not_the_same_file():
    dst = {k.replace("lib/", "lib64/"): f(v.inode, v.symlink, device=2) for k, v in SRC.items()}
    assert link(dst).commands[0].startswith("rm -f ")


def test_empty_source_tree_refuses():
    r = run_op(cudnn.link, src_dir=TREE, cuda_dir=DIR, facts={CudnnFiles: {"src": {}, "dst": {}}})
    assert "no include/cudnn*.h" in r.failures[0]


# --- link, for real: fact command + cp -lP on this machine -----------------------------------


def _tree(root: Path, patch: int) -> Path:
    tree = root / f"cudnn-8.9.{patch}"
    (tree / "include").mkdir(parents=True)
    (tree / "lib").mkdir()
    (tree / "include" / "cudnn_version.h").write_text(HEADER_897.replace("7\n", f"{patch}\n"))
    (tree / "include" / "cudnn.h").write_text("/* cudnn */\n")
    (tree / "lib" / f"libcudnn.so.8.9.{patch}").write_bytes(b"\x7fELF")
    os.symlink(f"libcudnn.so.8.9.{patch}", tree / "lib" / "libcudnn.so.8")
    os.symlink("libcudnn.so.8", tree / "lib" / "libcudnn.so")
    return tree


def _apply(tree: Path, cuda_dir: Path):
    facts = local_fact(CudnnFiles, src_dir=str(tree), cuda_dir=str(cuda_dir))
    r = run_op(cudnn.link, src_dir=str(tree), cuda_dir=str(cuda_dir), facts={CudnnFiles: facts})
    for command in r.commands:
        if command != "ldconfig":  # leave this machine's linker cache alone
            out = sh(command)
            assert out.returncode == 0, out.stderr
    return r


def test_real_hard_links_idempotent_and_replacing_another_version(tmp_path):
    cuda_dir = tmp_path / "cuda-11.8"
    (cuda_dir / "lib64").mkdir(parents=True)
    old = _tree(tmp_path, 1)
    assert _apply(old, cuda_dir).commands[-1] == "ldconfig"
    assert local_fact(CudnnHeaderVersion, path=f"{cuda_dir}/include/cudnn_version.h") == "8.9.1"

    new = _tree(tmp_path, 7)
    r = _apply(new, cuda_dir)
    assert "libcudnn.so.8.9.1" in r.logs[0]
    lib64 = sorted(p.name for p in (cuda_dir / "lib64").iterdir())
    assert lib64 == ["libcudnn.so", "libcudnn.so.8", "libcudnn.so.8.9.7"]
    real = cuda_dir / "lib64" / "libcudnn.so.8.9.7"
    assert real.stat().st_ino == (new / "lib" / "libcudnn.so.8.9.7").stat().st_ino
    assert os.readlink(cuda_dir / "lib64" / "libcudnn.so.8") == "libcudnn.so.8.9.7"
    assert local_fact(CudnnHeaderVersion, path=f"{cuda_dir}/include/cudnn_version.h") == "8.9.7"

    again = _apply(new, cuda_dir)  # a re-run: cp -lP would fail with "File exists"
    assert again.commands == [] and again.noops


def test_path_device_of_a_path_not_created_yet_is_its_parent(tmp_path):
    here = local_fact(PathDevice, path=str(tmp_path))
    assert here == os.stat(tmp_path).st_dev
    assert local_fact(PathDevice, path=str(tmp_path / "not" / "yet")) == here


# --- verify ----------------------------------------------------------------------------------


def test_verify_reads_cudnn_version_h():
    header = f"{DIR}/include/cudnn_version.h"
    ok = run_op(
        cudnn.verify,
        cuda_dir=DIR,
        version="8.9.7.29",
        facts={at(CudnnHeaderVersion, path=header): "8.9.7"},
    )
    assert ok.commands == [] and ok.noops
    bad = run_op(
        cudnn.verify, cuda_dir=DIR, version="8.9.7.29", facts={CudnnHeaderVersion: "8.9.1"}
    )
    assert bad.commands == ["function _fail"]
    assert "says 8.9.1, expected 8.9.7" in bad.failures[0]


def test_header_fact_parses_a_real_cudnn_version_h():
    path = str(FIXTURES / "cudnn_version.h-8.9.1-full-xiaohaoo-yolo-tensorrt.h")
    assert local_fact(CudnnHeaderVersion, path=path) == "8.9.1"
    assert local_fact(CudnnHeaderVersion, path="/nonexistent/cudnn_version.h") is None


def test_extract_refuses_a_dir_another_account_could_rename():
    # S7: root extracts there, then hard-links the tree into the CUDA dir
    r = run_op(
        cudnn.extract,
        archive=TAR,
        extract_dir="/data/src",
        version="8.9.7.29",
        sha256=ARCHIVE_SUM,
        facts={UnsafeParent: "/data is owned by uid 2001, not root"},
    )
    assert r.commands == ["function _fail"]  # the refusal only: no tar
    (failure,) = r.failures
    assert "/data is owned by uid 2001" in failure and "chown root:root /data" in failure
    assert "stack.paths.cudnn_extract_dir" in failure


# --- verify's cudnn checks (p40fleet/verification/checks/cudnn.py) ----------------------------


def test_cudnn_not_hard_linked():
    files = sections()[sections().index("@@section cudnn-files") + 1 :][:9]
    files[6] = "dst 2049 555 1 regular_file lib64/libcudnn.so.8.9.7"  # a copy: other inode
    checks = checks_for(sections(**{"cudnn-files": files}))
    assert only_failures(checks) == {"cudnn hard links"}
    assert "not hard links" in checks["cudnn hard links"].detail
    assert "lib64/libcudnn.so.8.9.7" in checks["cudnn hard links"].detail


def test_cudnn_wrong_version_header():
    header = ["#define CUDNN_MAJOR 8", "#define CUDNN_MINOR 6", "#define CUDNN_PATCHLEVEL 0"]
    checks = checks_for(sections(**{"cudnn-header": header + ["@@rc 0"]}))
    assert only_failures(checks) == {"cudnn version"}
    assert "8.6.0" in checks["cudnn version"].detail
