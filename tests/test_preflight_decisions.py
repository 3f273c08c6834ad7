"""Preflight decisions: which facts refuse a host, and what the message says."""

import re

from p40fleet import hashlock, preflight
from p40fleet.profile import summarize_host
from p40fleet.spec import load_spec

SPEC = load_spec("h1", {})


def test_p40_host_passes_gpu_check():
    assert preflight.gpu_refusal(summarize_host([0x1B38] * 4)) is None


def test_h200_refused_by_r525_names_the_gpu():
    refusal = preflight.gpu_refusal(summarize_host([0x2335] * 2))
    assert refusal is not None
    assert "H200" in refusal.reason and refusal.step == "GPU check"


def test_no_gpu_refused():
    refusal = preflight.gpu_refusal(summarize_host([]))
    assert refusal is not None and "no NVIDIA GPU" in refusal.reason


def test_os_supported_and_refused():
    assert preflight.os_refusal("Ubuntu 20.04") is None
    refusal = preflight.os_refusal("Debian 12")
    assert refusal is not None and "Debian 12" in refusal.reason and "20.04" in refusal.remedy


def test_space_needed_counts_only_unverified_artifacts_and_the_cuda_unpack():
    everything = preflight.space_needed(SPEC, {}, cuda_installed=False)
    cuda = SPEC.cuda.size
    cudnn = SPEC.cudnn.size
    assert everything == cuda + cudnn + SPEC.cuda.tmp_bytes()
    assert SPEC.cuda.tmp_bytes() == int(cuda * 1.1)  # no unpack_bytes pinned: 1.1 x the file
    cached = {"driver": True, "cuda": True, "cudnn": True, "miniconda": True}
    assert preflight.space_needed(SPEC, cached, cuda_installed=True) == 0


def test_space_refusal_says_how_much_is_missing():
    refusal = preflight.space_refusal("/var/cache/p40fleet", 2 * 2**30, 10 * 2**30)
    assert refusal is not None
    assert "8.0 GiB missing" in refusal.reason and "artifact_cache" in refusal.remedy
    assert preflight.space_refusal("/x", 10 * 2**30, 2 * 2**30) is None


def test_mirror_refusals_tell_missing_file_from_dead_mirror():
    answers = [
        ("driver", "http://m/artifacts/d.run", 200, ""),
        ("cuda", "http://m/artifacts/c.run", 404, ""),
        ("cudnn", "http://m/artifacts/n.tar.xz", 0, "curl: (7) Failed to connect"),
    ]
    refusals = preflight.mirror_refusals(answers)
    assert [r.step for r in refusals] == ["cuda artifact", "cudnn artifact"]
    assert "HTTP 404" in refusals[0].reason and "c.run" in refusals[0].remedy
    assert "did not answer" in refusals[1].reason and "Failed to connect" in refusals[1].reason


def test_verl_ref_without_hf_rollout_refuses_pascal_naming_ref_and_reason():
    seed = "62549582a71881fe861b09f8375e3aea80ac6754"
    refusal = preflight.verl_refusal(seed, summarize_host([0x1B38] * 4))
    assert refusal is not None and refusal.step == "verl ref"
    assert f"verl ref {seed} is unsupported for profile pascal" in refusal.reason
    assert "HF rollout" in refusal.reason and "compute capability >= 7.0" in refusal.reason
    assert "v0.5.0" in refusal.remedy
    # the same ref serves cc >= 7.0 (vLLM), and v0.5.0 serves Pascal
    assert preflight.verl_refusal(seed, summarize_host([0x20B2])) is None
    assert preflight.verl_refusal("v0.5.0", summarize_host([0x1B38])) is None
    assert preflight.verl_refusal("v0.5.0-lab1", summarize_host([0x15F8])) is None


def test_unknown_verl_ref_is_refused_and_gpu_refusals_are_left_to_the_gpu_check():
    refusal = preflight.verl_refusal("v9.9.9", summarize_host([0x1B38]))
    assert refusal is not None and "no patch rule set" in refusal.reason
    assert preflight.verl_refusal("v9.9.9", summarize_host([])) is None


# -- the Python layer's refusals, decided in the preflight (issue 24 section 1) ---------------

P40 = summarize_host([0x1B38] * 4)
TV_SUM = "ab" * 32
LAB = {"torch": {"version": "2.13.0+cpu"}}


def test_default_stack_torch_lock_installs_torch_and_its_closure_only():
    """The default spec pins torch alone: its selection of the real lock has a sum on every
    line and no torchvision/torchaudio/pillow/numpy (only torchvision needs pillow, numpy)."""
    assert preflight.torch_refusal(SPEC) is None
    assert preflight.python_layer_refusals(SPEC, P40) == []
    text, problems = preflight.torch_lock(SPEC)
    assert problems == []
    names = {line.name for line in hashlock.parse(text)}
    assert "torch" in names and "triton" in names and "sympy" in names
    assert not names & {"torchvision", "torchaudio", "pillow", "numpy"}, names


def test_torchvision_pinned_without_a_sum_is_refused_by_the_preflight():
    spec = load_spec("h1", {"torch": {"torchvision": "0.21.0+cu118"}})
    refusal = preflight.torch_refusal(spec)
    assert refusal is not None and refusal.step == "torch lock"
    assert "torch-requirements-v0.5.0.txt" in refusal.reason
    assert "torchvision==0.21.0+cu118 has no --hash=sha256:" in refusal.reason
    assert "torchaudio" not in refusal.reason  # not pinned: not selected, not refused
    assert "stack.torch.sha256" in refusal.remedy
    assert preflight.python_layer_refusals(spec, P40) == [refusal]


def test_torchvision_pinned_with_its_sum_selects_it_and_its_deps():
    spec = load_spec(
        "h1", {"torch": {"torchvision": "0.21.0+cu118", "sha256": {"torchvision": TV_SUM}}}
    )
    assert preflight.torch_refusal(spec) is None
    text, _ = preflight.torch_lock(spec)
    lines = {line.name: line for line in hashlock.parse(text)}
    assert lines["torchvision"].hashes == (TV_SUM,)
    assert {"pillow", "numpy"} <= set(lines) and "torchaudio" not in lines


def test_both_opt_ins_need_both_sums():
    pinned = {"torchvision": "0.21.0+cu118", "torchaudio": "2.6.0+cu118"}
    half = load_spec("h1", {"torch": {**pinned, "sha256": {"torchvision": TV_SUM}}})
    refusal = preflight.torch_refusal(half)
    assert refusal is not None
    assert "torchaudio==2.6.0+cu118 has no --hash" in refusal.reason
    assert "torchvision" not in refusal.reason
    both = load_spec(
        "h1", {"torch": {**pinned, "sha256": {"torchvision": TV_SUM, "torchaudio": TV_SUM}}}
    )
    assert preflight.torch_refusal(both) is None


def test_lab_lock_without_the_pinned_package_is_refused():
    """The simulated lab's lock has no torchvision line at all: pinning it is refused too."""
    assert preflight.torch_refusal(load_spec("h1", LAB)) is None
    spec = load_spec("h1", {"torch": {"version": "2.13.0+cpu", "torchvision": "0.28.0+cpu"}})
    refusal = preflight.torch_refusal(spec)
    assert refusal is not None and "torch-requirements-lab.txt" in refusal.reason
    assert "the lock has no torchvision line, the spec pins torchvision==0.28.0+cpu" in (
        refusal.reason
    )


def test_conda_lock_refusals_name_the_missing_sums_and_the_fix(tmp_path):
    """N7: a lock line without a sum, or no python at the pin, refuses the host before any
    change, naming the file and how to make it (conda list --explicit --sha256)."""
    spec = load_spec("h1", {})
    assert preflight.conda_refusal(spec) is None  # the real default lock is complete
    text = preflight.conda_lock_path(spec).read_text()
    lock = tmp_path / "conda-env-x.txt"
    lock.write_text(re.sub(r"(openssl-[^#]+)#sha256:[0-9a-f]{64}", r"\1", text))
    refusal = preflight.conda_refusal(spec, lock)
    assert refusal is not None and refusal.step == "conda lock"
    assert "openssl-3.1.2-hd590300_0.conda has no sum" in refusal.reason
    assert "conda list -n lock --explicit --sha256 > files/conda-env-x.txt" in refusal.remedy
    other = load_spec("h1", {"python_version": "3.10.13"})
    refusal = preflight.conda_refusal(other)
    assert "the lock has python 3.10.12, the spec pins python 3.10.13" in refusal.reason


def test_torch_pin_the_lock_does_not_hold_is_refused():
    spec = load_spec("h1", {"torch": {"version": "2.12.0+cpu"}})
    refusal = preflight.torch_refusal(spec)
    assert refusal is not None
    assert "the lock has torch==2.13.0+cpu, the spec pins torch==2.12.0+cpu" in refusal.reason


def test_variant_without_locks_is_refused_for_every_lock():
    spec = load_spec("h1", {"verl": {"requirements": "nope"}})
    steps = {r.step: r for r in preflight.python_layer_refusals(spec, P40)}
    assert set(steps) == {"conda lock", "torch lock", "verl requirements"}, steps
    assert "conda-env-nope.txt: cannot read it" in steps["conda lock"].reason
    assert "cannot read it" in steps["torch lock"].reason
    assert "verl-requirements-nope.txt does not exist" in steps["verl requirements"].reason
    assert "stack.verl.requirements" in steps["verl requirements"].remedy


def test_unsupported_verl_ref_is_among_the_python_layer_refusals():
    seed = "62549582a71881fe861b09f8375e3aea80ac6754"
    spec = load_spec("h1", {"verl": {"ref": seed, "commit": seed, "version": "0.5.0.dev0"}})
    assert [r.step for r in preflight.python_layer_refusals(spec, P40)] == ["verl ref"]


def test_the_host_heads_only_unverified_urls_and_none_when_the_controller_pushes():
    done = {"driver": True, "cuda": False, "cudnn": True, "miniconda": False}
    assert preflight.heads_to_ask(SPEC, done) == ["cuda", "miniconda"]
    mirrored = load_spec("h1", {"mirror": {"artifacts_url": "http://10.0.0.1:8111/artifacts"}})
    assert preflight.heads_to_ask(mirrored, {}) == ["driver", "cuda", "cudnn", "miniconda"]
    pushed = load_spec("h1", {"mirror": {"artifacts_url": "http://10.0.0.1:8111/artifacts",
                                         "push_from_controller": True}})  # fmt: skip
    # the host may reach no URL at all: the controller fetches, uploads, the host checks
    assert preflight.heads_to_ask(pushed, {}) == []
