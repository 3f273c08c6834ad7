"""``p40lab.disks.clone_upper``: the lab tests' seeds and bench_scale's clones of a converged
disk share only the big trees' inodes, and an in-place write there shows in the signature."""

from __future__ import annotations

import os
from pathlib import Path

from p40lab import disks

LINKED = ("home/verl/miniconda3",)


def _tree(top: Path) -> None:
    (top / "home/verl/miniconda3/lib").mkdir(parents=True)
    (top / "home/verl/miniconda3/lib/torch.so").write_bytes(b"x" * 4096)
    (top / "home/verl/launch-ppo.sh").write_text("#!/bin/sh\n")
    (top / "usr/local/cuda/lib64").mkdir(parents=True)
    (top / "usr/local/cuda/lib64/libcudnn.so.8").write_bytes(b"cudnn")
    os.link(top / "usr/local/cuda/lib64/libcudnn.so.8", top / "usr/local/cuda/libcudnn.so.8")
    (top / "etc").mkdir()
    os.symlink("/nowhere", top / "etc/dangling")


def test_clone_links_only_the_big_trees_and_keeps_its_own_hard_links(tmp_path):
    source, clone = tmp_path / "upper", tmp_path / "seed"
    _tree(source)
    copied = disks.clone_upper(source, clone, LINKED)
    assert copied == 2  # the launch script, and cuDNN once for its two names
    torch = "home/verl/miniconda3/lib/torch.so"
    assert os.stat(source / torch).st_ino == os.stat(clone / torch).st_ino
    for rel in ("home/verl/launch-ppo.sh", "usr/local/cuda/lib64/libcudnn.so.8"):
        assert os.stat(source / rel).st_ino != os.stat(clone / rel).st_ino, rel
        assert (source / rel).read_bytes() == (clone / rel).read_bytes()
    lib64 = os.stat(clone / "usr/local/cuda/lib64/libcudnn.so.8")
    assert lib64.st_ino == os.stat(clone / "usr/local/cuda/libcudnn.so.8").st_ino
    assert os.readlink(clone / "etc/dangling") == "/nowhere"
    assert not list(clone.rglob("*.p40lab-unshare"))
    # a write to a copied file stays on its side
    (clone / "home/verl/launch-ppo.sh").write_text("edited\n")
    assert (source / "home/verl/launch-ppo.sh").read_text() == "#!/bin/sh\n"


def test_an_in_place_write_in_a_linked_tree_changes_the_signature(tmp_path):
    source, clone = tmp_path / "upper", tmp_path / "seed"
    _tree(source)
    disks.clone_upper(source, clone, LINKED)
    before = disks.linked_signature(clone, LINKED)
    assert list(before) == ["home/verl/miniconda3/lib/torch.so"]
    (source / "home/verl/launch-ppo.sh").write_text("not linked\n")
    assert disks.linked_signature(clone, LINKED) == before
    with open(source / "home/verl/miniconda3/lib/torch.so", "r+b") as f:  # through the source
        f.write(b"y")
    assert disks.linked_signature(clone, LINKED) != before


def test_files_written_in_place_inside_a_linked_tree_get_their_own_inode(tmp_path):
    """What the seeds lost in CI (fresh disks instead): conda's double writes a package
    archive over the old one in ``pkgs/``, and Apex's build key is ``printf > file`` at the
    env's top. Those are copied; the env's libraries stay linked."""
    source, clone = tmp_path / "upper", tmp_path / "seed"
    _tree(source)
    conda = source / "home/verl/miniconda3"
    (conda / "pkgs/python-3.11.2").mkdir(parents=True)
    (conda / "pkgs/python-3.11.2-h0_0.tar.bz2").write_bytes(b"archive")
    (conda / "pkgs/python-3.11.2/info.json").write_text("{}")
    (conda / "envs/verl-p40/conda-meta").mkdir(parents=True)
    (conda / "envs/verl-p40/.p40fleet-apex-key").write_text("K\n")
    (conda / "envs/verl-p40/conda-meta/history").write_text("==> 1\n")
    (conda / "envs/verl-p40/lib").mkdir()
    (conda / "envs/verl-p40/lib/libtorch.so").write_bytes(b"t" * 4096)
    disks.clone_upper(source, clone, LINKED)
    before = disks.linked_signature(clone, LINKED)
    own = ("pkgs/python-3.11.2-h0_0.tar.bz2", "envs/verl-p40/.p40fleet-apex-key",
           "envs/verl-p40/conda-meta/history")  # fmt: skip
    shared = ("pkgs/python-3.11.2/info.json", "envs/verl-p40/lib/libtorch.so", "lib/torch.so")
    top = "home/verl/miniconda3"
    for rel in own:
        assert os.stat(conda / rel).st_ino != os.stat(clone / top / rel).st_ino, rel
        assert f"{top}/{rel}" not in before, rel
    for rel in shared:
        assert os.stat(conda / rel).st_ino == os.stat(clone / top / rel).st_ino, rel
        assert f"{top}/{rel}" in before, rel
    for rel in own:  # the writes the seeds met, through the source
        with open(conda / rel, "r+b") as f:
            f.write(b"Z")
    assert disks.linked_signature(clone, LINKED) == before
    assert (clone / top / "envs/verl-p40/.p40fleet-apex-key").read_text() == "K\n"
