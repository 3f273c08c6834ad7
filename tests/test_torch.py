"""operations/torch.py: facts in, commands out (tests/opharness.py)."""

from __future__ import annotations

import json
import os

from p40fleet import hashlock
from p40fleet.facts.env import Dist, EnvDistributions
from p40fleet.operations import torch
from p40fleet.verification.check import PASS, SKIP
from tests.opharness import run_op
from tests.probe_answers import checks_for, only_failures, p40, sections
from tests.pylayer import PY

FILES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "files")
REAL_LOCK = os.path.join(FILES, "torch-requirements-v0.5.0.txt")
LAB_LOCK = os.path.join(FILES, "torch-requirements-lab.txt")
SUM = "ab" * 32


def _torch(dists, lock=REAL_LOCK, torchvision="0.21.0+cu118", torchaudio="2.6.0+cu118", **kw):
    return run_op(
        torch.torch,
        python=PY,
        version="2.6.0+cu118",
        torchvision=torchvision,
        torchaudio=torchaudio,
        lock=lock,
        lock_dest="/c/torch.txt",
        index_args=["--index-url", "http://m/simple"],
        facts={EnvDistributions: dists},
        default_facts=True,
        **kw,
    )


AT_PIN = {
    "torch": Dist("2.6.0+cu118"),
    "torchvision": Dist("0.21.0+cu118"),
    "torchaudio": Dist("2.6.0+cu118"),
}


def _locked(lock: str, name: str) -> str:
    with open(lock) as handle:
        return hashlock.pinned(handle.read())[name]


def test_torch_at_pin_is_noop():
    assert not _torch(AT_PIN | {"ninja": Dist(_locked(REAL_LOCK, "ninja"))}).changed


def test_an_env_at_the_pins_without_the_locks_ninja_gets_the_lock_installed():
    """An env made before the lock carried ninja (torch at the pin) would build Apex serially:
    the step installs the lock, which adds ninja (and nothing else moves)."""
    assert torch.BUILD_TOOLS == ("ninja",)
    sums = {"torchvision": SUM, "torchaudio": "cd" * 32}
    for dists in (AT_PIN, AT_PIN | {"ninja": Dist("1.11.1")}):
        result = _torch(dists, sha256=sums)
        assert result.changed and result.commands[-1].endswith(
            "install --require-hashes --index-url http://m/simple -r /c/torch.txt"
        ), result.commands
        ninja = _locked(REAL_LOCK, "ninja")
        assert f"ninja=={ninja} --hash=sha256:" in result.uploads["/c/torch.txt"]
        assert any(f"the lock pins {ninja}" in line for line in result.logs), result.logs


def test_torch_without_a_published_sum_is_refused_naming_the_wheels():
    """The real lock has no sum for torchvision/torchaudio +cu118: nothing unhashed runs."""
    result = _torch({"torch": Dist("2.5.1+cu118")})
    assert result.commands == ["function _fail"], result.commands
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


def test_default_pins_install_torch_and_its_closure_only():
    """Default spec (torchvision/torchaudio None): the real lock installs, and the uploaded file
    holds exactly that: no opt-in line (torchvision, torchaudio, pillow, numpy)."""
    result = _torch({"torch": Dist("2.5.1+cu118")}, torchvision=None, torchaudio=None)
    assert not result.failures, result.failures
    assert result.commands[-1].endswith(
        "install --require-hashes --index-url http://m/simple -r /c/torch.txt"
    )
    lines = hashlock.parse(result.uploads["/c/torch.txt"])
    names = {line.name for line in lines}
    assert {"torch", "triton", "sympy", "nvidia-cudnn-cu11"} <= names
    assert not names & {"torchvision", "torchaudio", "pillow", "numpy"}, names
    assert all(line.hashes for line in lines)


def test_torchvision_alone_selects_its_lines_and_not_torchaudio():
    result = _torch({}, torchaudio=None, sha256={"torchvision": SUM})
    uploaded = result.uploads["/c/torch.txt"]
    names = {line.name for line in hashlock.parse(uploaded)}
    assert {"torchvision", "pillow", "numpy"} <= names and "torchaudio" not in names
    assert f"torchvision==0.21.0+cu118 --hash=sha256:{SUM}" in uploaded


def test_triton_second_sum_is_added_beside_pypis():
    """A mirror filled from the PyTorch index serves another triton file: its sum goes on the
    line next to PyPI's, so either file passes --require-hashes."""
    pypi = "b3e54983cd51875855da7c68ec05c05cf8bb08df361b1d5b69e05e40b0c9bd62"
    result = _torch({}, torchvision=None, torchaudio=None, sha256={"triton": SUM})
    (line,) = [x for x in hashlock.parse(result.uploads["/c/torch.txt"]) if x.name == "triton"]
    assert line.hashes == (pypi, SUM)


def test_opt_in_marks_and_select():
    text = (
        "# header\n"
        "torch==1.0 --hash=sha256:" + "1" * 64 + "\n"
        "pillow==2.0 --hash=sha256:" + "2" * 64 + "  # opt-in: torchvision\n"
        "shared==3.0 --hash=sha256:" + "3" * 64 + "  # opt-in: torchvision Torch_Audio\n"
        "torchaudio==4.0  # opt-in: torch-audio\n"
    )
    marks = {line.name: line.opt_in for line in hashlock.parse(text)}
    assert marks == {
        "torch": (),
        "pillow": ("torchvision",),
        "shared": ("torchvision", "torch-audio"),
        "torchaudio": ("torch-audio",),
    }
    assert [x.name for x in hashlock.parse(hashlock.select(text, ["torch"]))] == ["torch"]
    assert [x.name for x in hashlock.parse(hashlock.select(text, ["torch_audio"]))] == [
        "torch",
        "shared",
        "torchaudio",
    ]
    assert hashlock.select(text, []).startswith("# header\n")  # comments kept


def test_render_is_kept_per_text_pins_and_sums_and_each_caller_gets_its_own_list():
    text = "torch==1.0\nsix==1.16 --hash=sha256:" + "6" * 64 + "\n"
    first = hashlock.render(text, {"torch": "1.0"}, {})
    assert first[1] == ["torch==1.0 has no --hash=sha256:"]
    first[1].clear()  # a caller's edit of its answer is not the next caller's answer
    assert hashlock.render(text, {"torch": "1.0"}, {})[1] == ["torch==1.0 has no --hash=sha256:"]
    summed, found = hashlock.render(text, {"torch": "1.0"}, {"torch": "A" * 64})
    assert found == [] and "torch==1.0 --hash=sha256:" + "a" * 64 in summed  # sums: in the key
    assert hashlock.render(text, {"torch": "2.0"}, {})[1][-1] == (
        "the lock has torch==1.0, the spec pins torch==2.0"
    )  # and so are the pins


def test_real_lock_header_states_provenance_and_the_triton_file():
    header = open(REAL_LOCK).read().split("\nfilelock==", 1)[0]
    assert "ONE public source" in header and "github.com/triple-Mu" in header
    # the file each triton sum is for, and what a mirror filled from the torch index needs
    assert "triton-3.2.0-cp310-cp310-manylinux_2_17_x86_64.manylinux2014_x86_64.whl" in header
    assert "triton-3.2.0-cp310-cp310-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl" in header
    assert "stack.torch.sha256.triton" in header


# --- verify's torch checks (p40fleet/verification/checks/torch.py) ----------------------------


def test_wrong_torch_version():
    torch = {"version": "2.5.1+cu118", "cuda_version": "11.8", "cuda_available": True}
    torch |= {"device_count": 2, "capability": [6, 1], "capabilities": [[6, 1], [6, 1]]}
    checks = checks_for(sections(torch=["@@json " + json.dumps(torch), "@@rc 0"]))
    assert only_failures(checks) == {"torch version"}
    bad = checks["torch version"]
    assert "2.5.1+cu118" in bad.detail and "2.6.0+cu118" in bad.detail
    assert "force_reinstall" in bad.remedy and "deploy/python.py" in bad.remedy


def test_cuda_unavailable():
    torch = {"version": "2.6.0+cu118", "cuda_version": "11.8", "cuda_available": False}
    checks = checks_for(sections(torch=["@@json " + json.dumps(torch), "@@rc 0"]))
    assert only_failures(checks) == {"torch cuda"}
    assert "is_available() is False" in checks["torch cuda"].detail
    assert checks["torch cuda"].remedy
    assert checks["torch capability"].status == SKIP  # not measurable, not a faked PASS


def test_capability_mismatch():
    torch = {"version": "2.6.0+cu118", "cuda_version": "11.8", "cuda_available": True}
    torch |= {"device_count": 1, "capability": [7, 0], "capabilities": [[7, 0]]}
    checks = checks_for(sections(torch=["@@json " + json.dumps(torch), "@@rc 0"]))
    assert only_failures(checks) == {"torch capability"}
    assert "7.0" in checks["torch capability"].detail and "6.1" in checks["torch capability"].detail


def test_lowest_capability_on_a_mixed_host():
    gpus = [p40("0000:00:06.0"), p40("0000:00:07.0", device=0x15F8)]  # P40 6.1 + P100 6.0
    torch = {"version": "2.6.0+cu118", "cuda_version": "11.8", "cuda_available": True}
    torch |= {"device_count": 2, "capability": [6, 1], "capabilities": [[6, 1], [6, 0]]}
    lines = sections(torch=["@@json " + json.dumps(torch), "@@rc 0"])
    checks = checks_for(lines, gpus=gpus)
    assert checks["torch capability"].status == PASS
    assert "6.0" in checks["torch capability"].detail
