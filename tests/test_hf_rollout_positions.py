"""The HF rollout's generation positions (issue 24 section 4), run for real on a lab host's env.

verl v0.5.0's ``HFRollout`` passes the prompt's ``position_ids`` to ``generate()`` (verl PR
#1637); transformers 4.53.3 never advances given positions while decoding, so every new token
is fed the last prompt position. The ``hf-rollout-generate-positions`` patch rule drops the
argument. Here verl's own ``HFRollout.generate_sequences``, imported from the patched v0.5.0
sdist tree, generates 6 tokens for a left-padded batch of two prompts of unequal length with
the lab's tiny Qwen2 (``p40lab.training_data``, the bytes the lab mirror serves; its attention
projections scaled, :data:`ATTENTION_SCALE`), along both of verl's paths through it: the
training rollout (sampled, fixed seed) and validation (greedy). Then:

* patched (every ``pascal`` rule): the same tokens as ``model.generate()`` given no position
  ids (same seed), and the same positions at every decode step, advancing by one per token;
* unpatched (every ``pascal`` rule but that one, so fp32 in both): frozen positions, positions
  handed on with the batch (where the actor and critic score the response) that are not those
  the tokens were generated at, and, greedy, other tokens after the first.

The env is what ``deploy/python.py`` gives a lab host, built here on the controller (no lab
instance needed): CPython 3.11, the lab torch (``/opt/wheels``, 2.13.0+cpu), then
``files/torch-requirements-lab.txt`` and ``files/verl-requirements-lab.txt`` installed with
``operations/torch.py``'s and ``operations/verl.py``'s flags (``--require-hashes``), so every
file has the lab's sum; verl is the sdist tree on ``sys.path`` (the host's ``pip install -e``).
It is built once into the test cache (``tests/verl_sdist.py``: ``$P40FLEET_TEST_CACHE``), keyed
by the locks' content: about 6 minutes cold (PyPI and ``/opt/wheels``), 85 s with pip's cache
warm; then the module takes about 15 s.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from verl_sdist import cache_dir, extract_verl

from p40fleet import verl_patches as vp
from p40lab import training_data
from p40lab.wheelhouse import TORCH_LOCK, TORCH_WHEELS, VERL_REQUIREMENTS

RULE = "hf-rollout-generate-positions"
NEW_TOKENS = 6
#: verl's two calls of the HF rollout: the training rollout (sampled: rollout.yaml's
#: do_sample True, temperature 1) and validation (greedy: val_kwargs.do_sample False)
PATHS = ("train", "validate")

#: The lab model's weights are N(0, .02): at that scale its argmax repeats the last token
#: whatever the positions. Its attention projections x10 make the positions reach the tokens
#: (measured: 9 of 12 decode tokens then differ between advancing and frozen positions).
ATTENTION_SCALE = 10.0

#: Run with the env's python: argv = verl tree, model dir, new tokens, attention scale; prints
#: one JSON line.
PROBE = r"""
import json
import sys

tree, model_dir, new_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, tree)

import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from transformers import AutoModelForCausalLM, AutoTokenizer

import verl
from verl import DataProto
from verl.utils.model import compute_position_id_with_mask
from verl.workers.rollout.hf_rollout import HFRollout

assert verl.__file__.startswith(tree), verl.__file__
# verl frees the device's cache after generating (get_torch_device() is torch.cpu here, which
# has nothing to free and no such function): the GPU's call, as a no-op
if not hasattr(torch.cpu, "empty_cache"):
    torch.cpu.empty_cache = lambda: None
torch.manual_seed(0)
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
with torch.no_grad():  # attention x ATTENTION_SCALE, so that positions reach the argmax
    for name, weight in model.named_parameters():
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")):
            weight.mul_(float(sys.argv[4]))
eos, pad = tok.eos_token_id, tok.pad_token_id
texts = ["Ada has 3 apples.", "Ben has 12 marbles and buys 7 more. How many marbles now?"]
rows = [tok(t)["input_ids"] for t in texts]
width = max(map(len, rows))
ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # left-padded, as verl's
mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
seen = []  # the last position id of each row at every forward (prefill, then each token)
model.register_forward_pre_hook(
    lambda m, a, kw: seen.append(kw["position_ids"][:, -1].tolist()), with_kwargs=True
)
# verl's rollout.yaml: the training rollout samples, validation is greedy (val_kwargs)
config = OmegaConf.create({
    "do_sample": True, "temperature": 1.0, "response_length": new_tokens, "top_p": 1.0,
    "top_k": -1, "n": 1, "micro_batch_size": len(rows),
    "val_kwargs": {"do_sample": False, "top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1},
})
rollout = HFRollout(model, config)
paths = {  # name: (meta_info as verl's trainer sends it, generate()'s kwargs for the same)
    "train": ({}, {"do_sample": True, "top_p": 1.0, "top_k": 0, "temperature": 1.0}),
    "validate": ({"validate": True, "do_sample": False}, {"do_sample": False}),
}
result = {"lengths": [len(r) for r in rows], "eos": eos}
for name, (meta, kwargs) in paths.items():
    batch = TensorDict({"input_ids": ids, "attention_mask": mask,
                        "position_ids": compute_position_id_with_mask(mask)},
                       batch_size=len(rows))
    seen.clear()
    torch.manual_seed(1234)
    out = rollout.generate_sequences(
        DataProto(batch=batch, meta_info={"eos_token_id": eos, "pad_token_id": pad, **meta})
    )
    rollout_positions = list(seen)
    seen.clear()
    model.eval()  # the rollout leaves it in train mode
    torch.manual_seed(1234)
    ref = model.generate(input_ids=ids, attention_mask=mask, num_beams=1,
                         max_new_tokens=new_tokens, eos_token_id=eos, pad_token_id=pad, **kwargs)
    result[name] = {
        "rollout": out.batch["responses"].tolist(),
        "response_positions": out.batch["position_ids"][:, width:].tolist(),
        "generate": [r + [pad] * (new_tokens - len(r)) for r in ref[:, width:].tolist()],
        "rollout_positions": rollout_positions, "generate_positions": list(seen),
    }
print(json.dumps(result))
"""


def _lock_digest() -> str:
    h = hashlib.sha256()
    for lock in (TORCH_LOCK, VERL_REQUIREMENTS):
        h.update(lock.read_bytes())
    return h.hexdigest()[:16]


def _pip(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "--disable-pip-version-check", "install", "-q", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(
            f"lab env: {' '.join(cmd)} failed (it needs PyPI and the lab torch wheel in "
            f"{TORCH_WHEELS}, $P40LAB_TORCH_WHEELS):\n{proc.stderr[-3000:]}",
            False,
        )


@pytest.fixture(scope="session")
def lab_env_python() -> Path:
    """The python of a lab host's verl env, built once per lock content (see the module doc)."""
    if sys.version_info[:2] != (3, 11):
        pytest.fail(f"the lab env is CPython 3.11 (the locks' cp311); this is {sys.version}")
    root = cache_dir()
    env = root / f"lab-env-{_lock_digest()}"
    python = env / "bin" / "python"
    with open(root / ".lab-env.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time, others reuse it
        if not (env / ".complete").is_file():
            shutil.rmtree(env, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
            # operations/torch.py, then operations/verl.py's flags
            _pip(python, "--require-hashes", "--find-links", str(TORCH_WHEELS), "-r",
                 str(TORCH_LOCK))  # fmt: skip
            _pip(python, "--require-hashes", "--no-build-isolation", "--use-pep517", "-r",
                 str(VERL_REQUIREMENTS))  # fmt: skip
            (env / ".complete").write_text("ok\n")
    return python


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    """The lab's model archive (the mirror's bytes), extracted."""
    dest = tmp_path_factory.mktemp("model")
    data = training_data.archives()[training_data.MODEL_ARCHIVE]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest)
    return dest / training_data.MODEL_NAME


def _tree(tmp_path_factory, name: str, drop: str | None) -> Path:
    """The v0.5.0 sdist tree with the pascal rules applied (``drop``: all but that one)."""
    tree = extract_verl(tmp_path_factory.mktemp(name) / "verl")
    ruleset = vp.rule_set("v0.5.0", "pascal").to_json_dict()
    rules = [r for r in ruleset["rules"] if r["id"] != drop]
    assert len(rules) == len(ruleset["rules"]) - (drop is not None)
    vp.load_applier().apply(str(tree), dict(ruleset, rules=rules))
    return tree


def _probe(python: Path, tree: Path, model: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [str(python), "-c", PROBE, str(tree), str(model), str(NEW_TOKENS), str(ATTENTION_SCALE)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tree,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(lab_env_python, tiny_qwen2, tmp_path_factory) -> dict[str, dict]:
    return {
        "patched": _probe(lab_env_python, _tree(tmp_path_factory, "patched", None), tiny_qwen2),
        "unpatched": _probe(lab_env_python, _tree(tmp_path_factory, "unpatched", RULE),
                            tiny_qwen2),
    }  # fmt: skip


def _advancing(lengths: list[int]) -> list[list[int]]:
    """The last position of each row at the prefill and at each decode step, advancing."""
    return [[n - 1 + step for n in lengths] for step in range(NEW_TOKENS)]


def _fed_at(run: dict) -> list[list[int]]:
    """Per row, the position each response token but the last (never fed back) was fed at."""
    steps = run["rollout_positions"][1:]  # decode step k feeds response token k
    return [[s[row] for s in steps] for row in range(len(steps[0]))]


def _handed_on(run: dict) -> list[list[int]]:
    """Per row, verl's position ids of the same response tokens (the batch it returns)."""
    return [row[:-1] for row in run["response_positions"]]


def test_batch_is_left_padded_with_unequal_prompts(runs):
    lengths = runs["patched"]["lengths"]
    assert len(lengths) == 2 and lengths[0] < lengths[1]


@pytest.mark.parametrize("path", PATHS)
def test_patched_rollout_generates_what_generate_without_positions_does(runs, path):
    patched, lengths = runs["patched"][path], runs["patched"]["lengths"]
    assert patched["rollout"] == patched["generate"]
    assert [len(r) for r in patched["rollout"]] == [NEW_TOKENS] * 2
    assert runs["patched"]["eos"] not in sum(patched["rollout"], [])  # NEW_TOKENS real ones
    # the positions the model was fed: transformers' own, advancing one per token
    assert patched["rollout_positions"] == patched["generate_positions"]
    assert patched["rollout_positions"] == _advancing(lengths)
    # and they are the positions verl hands on with the batch (the actor's and the critic's
    # forward passes score the response at them): token k was generated at position p_k
    assert _fed_at(patched) == _handed_on(patched)


@pytest.mark.parametrize("path", PATHS)
def test_unpatched_rollout_freezes_positions(runs, path):
    unpatched, lengths = runs["unpatched"][path], runs["unpatched"]["lengths"]
    assert unpatched["rollout_positions"] == [[n - 1 for n in lengths]] * NEW_TOKENS
    assert unpatched["generate_positions"] == _advancing(lengths)
    # verl still hands on advancing positions: the training scores tokens at positions other
    # than those they were generated at
    assert unpatched["response_positions"] == runs["patched"][path]["response_positions"]
    assert _fed_at(unpatched) != _handed_on(unpatched)
    # the reference does not depend on the tree
    assert unpatched["generate"] == runs["patched"][path]["generate"]


def test_unpatched_greedy_rollout_generates_other_tokens(runs):
    """Validation (greedy): the prefill's positions are right either way, so the first token
    agrees; the frozen decode steps give other tokens. (The sampled training path draws the
    same uniforms, which mostly land on the same tokens when the logits differ a little: its
    damage is in the positions above, not visible in six tokens.)"""
    unpatched = runs["unpatched"]["validate"]
    for got, want in zip(unpatched["rollout"], unpatched["generate"], strict=True):
        assert got[0] == want[0] and got[1:] != want[1:], (got, want)
