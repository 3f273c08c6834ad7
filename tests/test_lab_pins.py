"""The lab restates the stack pins as its own constants (p40lab must not import p40fleet): each
one is held here to the spec's default, so that a pin changed on one side alone fails a unit test
instead of a lab run. No lab needed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from p40fleet.spec import StackSpec
from p40lab import apex_remote, verl_remote, wheelhouse
from p40lab.artifacts import pins

SPEC = StackSpec()
REPO = Path(__file__).resolve().parent.parent


def _conda_of(miniconda_version: str) -> str:
    """``py310_24.11.1-0`` -> ``24.11.1`` (the conda a Miniconda installer bundles)."""
    return miniconda_version.split("_", 1)[1].rsplit("-", 1)[0]


def _pyxy(python_version: str) -> str:
    """``3.10.12`` -> ``py310`` (Miniconda's name for the python it carries)."""
    return "py" + "".join(python_version.split(".")[:2])


# (what, the lab's value, the spec's default): must be equal.
SAME = [
    ("driver version", pins.DRIVER_VERSION, SPEC.driver.version),
    ("driver runfile", pins.driver_filename(pins.DRIVER_VERSION), SPEC.driver.filename),
    ("CUDA version", pins.CUDA_VERSION, SPEC.cuda.version),
    ("CUDA runfile (and its bundled driver)", pins.CUDA_FILENAME, SPEC.cuda.filename),
    ("CUDA runfile size (the double's unpack need)", pins.CUDA_UNPACK_BYTES_REAL, SPEC.cuda.size),
    ("CUDA install dir", f"/usr/local/cuda-{pins.CUDA_SHORT}", SPEC.paths.cuda_dir),
    ("cuDNN version", pins.CUDNN_VERSION, SPEC.cudnn.version),
    ("cuDNN archive", pins.CUDNN_FILENAME, SPEC.cudnn.filename),
    ("Miniconda version", pins.MINICONDA_VERSION, SPEC.miniconda.version),
    ("Miniconda installer", pins.MINICONDA_FILENAME, SPEC.miniconda.filename),
    ("conda in the Miniconda", pins.CONDA_VERSION, _conda_of(SPEC.miniconda.version)),
    ("Miniconda's python", pins.MINICONDA_VERSION.split("_")[0], _pyxy(SPEC.python_version)),
    ("verl ref", verl_remote.REF, SPEC.verl.ref),
    ("verl version", verl_remote.VERL_VERSION, SPEC.verl.version),
    ("Apex ref", apex_remote.TAG, SPEC.apex.ref),
]

# (what, the lab's value, the spec's default, why they legitimately differ). The lab publishes
# its own values as host data ``stack`` overrides (p40lab.sim_stack.sim_stack); if a pair ever
# agrees, move it to SAME. Not compared, because the lab computes them when it builds the mirror:
# the artifacts' sha256 and size (the doubles' own bytes, p40lab.mirror.make_pins) and URLs (the
# lab's mirror, not NVIDIA's or Anaconda's).
DIFFERENT = [
    ("host python", wheelhouse.PYTHON_VERSION, SPEC.python_version,
     "the hosts run the base image's python (bookworm), the wheelhouse is built for it"),
    ("torch", wheelhouse.TORCH_VERSION, SPEC.torch.version,
     "the hosts have no CUDA: the wheelhouse serves a CPU build of torch"),
    ("verl commit", verl_remote.EXPECTED_COMMIT, SPEC.verl.commit,
     "the lab's verl repo is rebuilt from the PyPI sdist: its own commit ids"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "lab", "spec"), SAME, ids=[row[0] for row in SAME])
def test_lab_pin_follows_the_spec_default(what: str, lab: object, spec: object) -> None:
    assert lab == spec, (
        f"{what}: the lab builds {lab!r} but the spec's default is {spec!r}; change both "
        "p40lab (p40lab/artifacts/pins.py, verl_remote.py, apex_remote.py) and p40fleet.spec"
    )


@pytest.mark.parametrize(
    ("what", "lab", "spec", "why"), DIFFERENT, ids=[row[0] for row in DIFFERENT]
)
def test_lab_values_that_legitimately_differ(what: str, lab: object, spec: object, why: str):
    assert lab != spec, (
        f"{what}: the lab and the spec now agree ({lab!r}; was: {why}): move it to SAME"
    )


def test_the_lab_pins_derive_their_file_names() -> None:
    """The file names follow the versions (a new version changes one constant)."""
    assert pins.CUDA_VERSION in pins.CUDA_FILENAME and pins.CUDA_DRIVER in pins.CUDA_FILENAME
    assert pins.CUDNN_FILENAME.startswith(f"cudnn-linux-x86_64-{pins.CUDNN_VERSION}_")
    assert _conda_of(pins.MINICONDA_TOS_VERSION) == pins.CONDA_TOS_VERSION


def test_lab_conda_lock_is_the_lab_channels_files():
    """files/conda-env-lab.txt names exactly the files the lab's conda channel serves, with
    their sha256 (what the double checks), for the lab's python (Debian bookworm's 3.11.2)."""
    from p40fleet import condalock
    from p40lab import sim_stack

    lock = (REPO / "files" / "conda-env-lab.txt").read_text()
    assert lock == sim_stack.conda_lock_text("3.11.2")
    assert condalock.problems(lock, "3.11.2") == []
    served = {f"{subdir}/{name}": hashlib.sha256(data).hexdigest()
              for subdir, name, data, _ in sim_stack.conda_packages("3.11.2")}  # fmt: skip
    locked = {f"{p.subdir}/{p.filename}": p.sha256 for p in condalock.parse(lock)}
    assert locked == served
    assert {p.channel for p in condalock.parse(lock)} == {sim_stack.LAB_LOCK_CHANNEL}


def test_default_conda_lock_is_complete():
    """files/conda-env-v0.5.0.txt: python at the spec's pin, every line with a sha256."""
    from p40fleet import condalock

    lock = (REPO / "files" / "conda-env-v0.5.0.txt").read_text()
    assert condalock.problems(lock, SPEC.python_version) == []
    packages = condalock.parse(lock)
    assert all(p.sha256 and not p.md5 for p in packages)
    assert {p.name for p in packages} >= {"python", "pip", "openssl", "libffi", "libsqlite"}
