"""operations/torch.py: facts in, commands out (tests/opharness.py)."""

from __future__ import annotations

import os

from facts.conda import Dist, EnvDistributions
from operations import torch
from tests.opharness import run_op
from tests.pylayer import PY

FILES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "files")
REAL_LOCK = os.path.join(FILES, "torch-requirements-v0.5.0.txt")
LAB_LOCK = os.path.join(FILES, "torch-requirements-lab.txt")
SUM = "ab" * 32


def _torch(dists, lock=REAL_LOCK, **kw):
    return run_op(
        torch.torch,
        python=PY,
        version="2.6.0+cu118",
        torchvision="0.21.0+cu118",
        torchaudio="2.6.0+cu118",
        lock=lock,
        lock_dest="/c/torch.txt",
        index_args=["--index-url", "http://m/simple"],
        facts={EnvDistributions: dists},
        default_facts=True,
        **kw,
    )


def test_torch_at_pin_is_noop():
    dists = {
        "torch": Dist("2.6.0+cu118"),
        "torchvision": Dist("0.21.0+cu118"),
        "torchaudio": Dist("2.6.0+cu118"),
    }
    assert not _torch(dists).changed


def test_torch_without_a_published_sum_is_refused_naming_the_wheels():
    """The real lock has no sum for torchvision/torchaudio +cu118: nothing unhashed runs."""
    result = _torch({"torch": Dist("2.5.1+cu118")})
    assert result.commands == ["function _refuse"], result.commands
    (message,) = result.failures
    assert "torch install" in message and "stack.torch.sha256" in message
    assert "torchvision==0.21.0+cu118 has no --hash" in message
    assert "torchaudio==2.6.0+cu118 has no --hash" in message
    assert "torch==2.6.0+cu118 has no" not in message  # its published sum is in the lock


def test_torch_installs_the_whole_closure_with_require_hashes():
    sums = {"torchvision": SUM, "torchaudio": "cd" * 32}
    result = _torch({"torch": Dist("2.5.1+cu118")}, sha256=sums)
    assert result.commands[-2:] == [
        "upload /c/torch.txt",
        f"{PY} -m pip --disable-pip-version-check install --require-hashes "
        "--index-url http://m/simple -r /c/torch.txt",
    ]
    uploaded = result.uploads["/c/torch.txt"]
    assert f"torchvision==0.21.0+cu118 --hash=sha256:{SUM}" in uploaded
    # torch's own closure is in the same file, every line hashed
    for name in ("sympy==", "networkx==", "jinja2==", "filelock==", "fsspec==", "triton=="):
        assert name in uploaded
    lines = [x for x in uploaded.splitlines() if x and not x.startswith("#")]
    assert len(lines) > 20 and all("--hash=sha256:" in x for x in lines)


def test_torch_lock_at_another_version_than_the_spec_is_refused():
    result = run_op(
        torch.torch,
        python=PY,
        version="2.12.0+cpu",
        lock=LAB_LOCK,
        lock_dest="/c/torch.txt",
        facts={EnvDistributions: {}},
        default_facts=True,
    )
    assert "the lock has torch==2.13.0+cpu, the spec pins torch==2.12.0+cpu" in result.failures[0]


def test_torch_lab_without_vision_audio_and_fresh_env():
    result = run_op(
        torch.torch,
        python=PY,
        version="2.13.0+cpu",
        torchvision=None,
        torchaudio=None,
        lock=LAB_LOCK,
        lock_dest="/c/torch.txt",
        fresh_env=True,
        default_facts=True,
    )
    assert result.commands[-1].endswith("install --require-hashes -r /c/torch.txt")
