"""The GPU PPO harness's local pieces (benchmarks/gpu_ppo): no GPU, no network, no torch."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jinja2
import pytest

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "benchmarks" / "gpu_ppo"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_ppo_{name}", HARNESS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


assets = _load("assets")
run_ppo = _load("run_ppo")


# --- assets ---------------------------------------------------------------------------------


def test_rows_have_verl_gsm8k_shape_and_consistent_answers():
    rows = assets.gsm8k_rows(20, "train")
    assert rows == assets.gsm8k_rows(20, "train")  # deterministic
    assert rows != assets.gsm8k_rows(20, "test")
    for i, row in enumerate(rows):
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert row["data_source"] == "openai/gsm8k"  # selects verl's gsm8k reward
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].endswith(assets.INSTRUCTION)
        answer = row["extra_info"]["answer"]
        # verl's gsm8k.py takes the ground truth from the text after '####'
        assert answer.split("#### ")[-1] == row["reward_model"]["ground_truth"]
        assert row["extra_info"]["index"] == i and row["extra_info"]["split"] == "train"
        a, b, c = map(int, re.findall(r"\d+", row["extra_info"]["question"]))
        assert int(row["reward_model"]["ground_truth"]) == a + b - c


def test_vocabulary_keeps_qwen_special_ids_and_fills_every_regular_id():
    rows = assets.gsm8k_rows(8, "test")
    files = assets.tokenizer_files(assets.corpus(rows))
    model = files["tokenizer.json"]["model"]
    vocab = model["vocab"]
    assert model["type"] == "WordLevel" and vocab[model["unk_token"]] == 0
    assert sorted(vocab.values()) == list(range(151643))  # no hole below the specials
    added = {a["content"]: a["id"] for a in files["tokenizer.json"]["added_tokens"]}
    assert added == {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
    assert max(added.values()) < assets.QWEN25_05B_CONFIG["vocab_size"]
    for text in assets.corpus(rows):
        assert all(word in vocab for word in assets._WORD.findall(text)), text
    config = files["tokenizer_config.json"]
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"


def test_vocabulary_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="do not fit"):
        assets.vocabulary(["a b c"], size=100)


def test_chat_template_renders_qwen_layout():
    template = jinja2.Environment().from_string(assets.CHAT_TEMPLATE)
    text = template.render(messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_model_config_is_qwen25_05b():
    c = assets.QWEN25_05B_CONFIG
    shape = (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"])
    assert shape == (896, 4864, 24)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]) == (14, 2, 151936)
    assert c["tie_word_embeddings"] is True


def test_write_model_dir(tmp_path):
    assets.write_model_dir(tmp_path, ["two words"])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert json.loads((tmp_path / "config.json").read_text())["vocab_size"] == 151936


def test_parquet_pair_round_trips(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    rows = assets.gsm8k_rows(5, "test")
    assets.write_parquet(rows, tmp_path / "test.parquet")
    assert pq.read_table(tmp_path / "test.parquet").to_pylist() == rows


# --- plan and rendering through the project's own code -----------------------------------------


@pytest.fixture(scope="module")
def config_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(json.dumps(assets.QWEN25_05B_CONFIG))
    return path


@pytest.mark.parametrize(
    ("name", "gpus", "cap"), [("1xP40", 1, 24.0), ("1xP100", 1, 16.0), ("2xP40", 2, 24.0)]
)
def test_render_each_plan(name, gpus, cap, config_path, tmp_path):
    mode = run_ppo.PLANS[name]
    assert (mode.gpus, mode.cap_gib) == (gpus, cap)
    plan = run_ppo.make_plan(mode, run_ppo.load_spec(), config_path)
    assert plan.profile == "pascal"
    script = run_ppo.render(plan, REPO)
    for override in plan.overrides:
        assert override in script or repr(override) in script or f"'{override}'" in script
    assert f"trainer.n_gpus_per_node={gpus}" in script
    assert "actor_rollout_ref.rollout.name=hf" in script
    assert f"MODEL_PATH={plan.model_path}" in script
    path = tmp_path / "launch-ppo.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)  # the script parses
    described = run_ppo.describe_plan(name, mode, plan, script)
    assert described["fake_pci"] == ("10de:1b38" if "P40" in name else "10de:15f8")
    assert described["estimate"]["per_gpu_gib"] is None or described["estimate"]["per_gpu_gib"] > 0


def test_memory_comes_from_the_catalog(config_path):
    p40 = run_ppo.make_plan(run_ppo.PLANS["1xP40"], run_ppo.load_spec(), config_path)
    p100 = run_ppo.make_plan(run_ppo.PLANS["1xP100"], run_ppo.load_spec(), config_path)
    assert (p40.sizing.memory_gib, p100.sizing.memory_gib) == (24, 16)


def test_lengths_go_to_spec_training():
    spec = run_ppo.load_spec(96, 64)
    assert (spec.training.max_prompt_length, spec.training.max_response_length) == (96, 64)


def test_plan_kwargs_follow_the_signature(tmp_path):
    config = {"vocab_size": 7}
    path = tmp_path / "config.json"

    def today(spec, gpus, *, smi_memory_mib=(), model_name="m"):
        raise AssertionError

    def with_mapping(spec, gpus, *, model_config: Mapping | None = None):
        raise AssertionError

    def with_path(spec, gpus, *, model_config: str):
        raise AssertionError

    def with_unknown(spec, gpus, *, cluster):
        raise AssertionError

    assert run_ppo.plan_kwargs(today, config, path, {}) == {}
    assert run_ppo.plan_kwargs(with_mapping, config, path, {}) == {"model_config": config}
    assert run_ppo.plan_kwargs(with_path, config, path, {}) == {"model_config": str(path)}
    assert run_ppo.plan_kwargs(with_unknown, config, path, {"cluster": 1}) == {"cluster": 1}
    with pytest.raises(SystemExit, match="cluster"):
        run_ppo.plan_kwargs(with_unknown, config, path, {})


def test_plan_estimate_found_by_name_or_type():
    @dataclass(frozen=True)
    class MemoryEstimate:
        weights_gib: float
        per_gpu_gib: float

    @dataclass(frozen=True)
    class Sizing:
        memory_gib: float
        memory: MemoryEstimate

    @dataclass(frozen=True)
    class Plan:
        sizing: Sizing
        estimate_gib: float | None = None

    plan = Plan(Sizing(24.0, MemoryEstimate(7.9, 17.5)))
    found = run_ppo.plan_estimate(plan)
    assert found["per_gpu_gib"] == 17.5
    assert "sizing.memory_gib" not in found["fields"]  # the GPU's size is no estimate
    assert run_ppo.plan_estimate(Plan(Sizing(24.0, None), 18.0))["per_gpu_gib"] == 18.0


# --- the trainer's log and the summary ---------------------------------------------------------

_PREFIX = "\x1b[36m(TaskRunner pid=1706)\x1b[0m "
LOG = "\n".join(
    [
        _PREFIX + "step:0 - val-core/openai/gsm8k/reward/mean@1:np.float64(0.0)",
        _PREFIX + "step:1 - critic/vf_loss:np.float64(2.11) - actor/pg_loss:np.float64(-0.0001)"
        " - perf/max_memory_allocated_gb:np.float64(17.96) - response_length/mean:512.0"
        " - timing_s/step:42.13",
        "(TaskRunner pid=1706) step:2 - critic/vf_loss:1.5 - actor/pg_loss:0.002"
        " - timing_s/step:40.5 - training/global_step:2",
    ]
)


def test_parse_steps_reads_verl_console_lines():
    steps = run_ppo.parse_steps(LOG)
    assert steps[0] == {"val-core/openai/gsm8k/reward/mean@1": 0.0}
    assert steps[1]["critic/vf_loss"] == 2.11 and steps[1]["actor/pg_loss"] == -0.0001
    assert steps[1]["perf/max_memory_allocated_gb"] == 17.96
    assert steps[2]["timing_s/step"] == 40.5 and steps[2]["training/global_step"] == 2


def _meas(tmp_path, reserved=23.5, modules=None, rollout="HFRollout"):
    device = {
        "name": "NVIDIA H200",
        "cap_fraction": 0.1717,
        "max_allocated_gib": 17.9,
        "max_reserved_gib": reserved,
        "device_used_max_gib": reserved + 0.6,
    }
    mem = {"pid": 5, "cuda_visible_devices": "0", "cap_errors": [], "devices": [device]}
    (tmp_path / "mem-5.json").write_text(json.dumps(mem))
    view = {"param_dtypes": ["torch.float32"], "attn_implementation": "sdpa"}
    readback = {"pid": 5, "modules": modules or {"actor_module_fsdp": view}}
    readback["rollout_class"] = rollout
    (tmp_path / "readback-5-0-actor.json").write_text(json.dumps(readback))
    return tmp_path


def _describe(estimate=None):
    return {
        "plan": "1xP40",
        "gpu_count": 1,
        "cap_gib": 24.0,
        "estimate": {"fields": {}, "per_gpu_gib": estimate},
        "launch_script": "#!/bin/sh\n",
    }


def test_summary_passes_a_good_run(tmp_path):
    summary = run_ppo.summarize(_describe(17.0), LOG, _meas(tmp_path), 2, 0, False)
    assert summary["ok"], summary["checks"]
    assert summary["steps_done"] == 2 and summary["step_time_s"] == [42.13, 40.5]
    assert summary["peak_per_gpu"][0]["max_reserved_gib"] == 23.5
    assert summary["validation"] == {"val-core/openai/gsm8k/reward/mean@1": 0.0}
    versus = summary["estimate_vs_measured"]
    assert versus["within_25_percent"] and versus["measured_max_allocated_gib"] == 17.9


@pytest.mark.parametrize(
    ("change", "check"),
    [
        ({"reserved": 24.5}, "under_cap"),
        (
            {"modules": {"a": {"param_dtypes": ["torch.bfloat16"], "attn_implementation": "sdpa"}}},
            "fp32_params",
        ),
        (
            {"modules": {"a": {"param_dtypes": ["torch.float32"], "attn_implementation": "eager"}}},
            "sdpa",
        ),
        ({"rollout": "vLLMRollout"}, "rollout_hf"),
    ],
)
def test_summary_fails_each_check(tmp_path, change, check):
    summary = run_ppo.summarize(_describe(), LOG, _meas(tmp_path, **change), 2, 0, False)
    assert not summary["checks"][check] and not summary["ok"]


def test_summary_fails_too_few_steps_a_bad_exit_or_no_gpu_record(tmp_path):
    meas = _meas(tmp_path)
    assert not run_ppo.summarize(_describe(), LOG, meas, 3, 0, False)["checks"]["steps_done"]
    assert not run_ppo.summarize(_describe(), LOG, meas, 2, 1, False)["ok"]
    (meas / "mem-5.json").unlink()
    checks = run_ppo.summarize(_describe(), LOG, meas, 2, 0, False)["checks"]
    assert not checks["capped_every_gpu"] and not checks["under_cap"]
    assert run_ppo.summarize(_describe(), LOG, meas, 2, 0, False)["estimate_vs_measured"] is None


# --- the sitecustomize hook, with stand-ins for torch and verl --------------------------------

FAKE_TORCH = """
import types
class _Props:
    total_memory = 100 * 1024**3
fractions = {}
calls = []
def _lazy_call(fn):
    calls.append(fn)
    fn()  # as if CUDA were initialised already
cuda = types.SimpleNamespace(
    _lazy_call=_lazy_call,
    device_count=lambda: 1,
    get_device_properties=lambda i: _Props(),
    set_per_process_memory_fraction=lambda f, i: fractions.__setitem__(i, f),
    mem_get_info=lambda i: (90 * 1024**3, 100 * 1024**3),
    get_device_name=lambda i: "Fake GPU",
    max_memory_allocated=lambda i: 3 * 1024**3,
    max_memory_reserved=lambda i: 4 * 1024**3,
    memory_allocated=lambda i: 1024**3,
)
"""

FAKE_WORKERS = """
def register(fn):
    fn.dispatch = "ONE_TO_ALL"
    return fn
class Param:
    dtype = "torch.float32"
    def numel(self):
        return 10
class Model:
    def __init__(self):
        self.config = type("C", (), {"_attn_implementation": "sdpa", "torch_dtype": "f32"})()
    def parameters(self):
        return [Param()]
class ActorRolloutRefWorker:
    role = "ref"
    @register
    def init_model(self):
        self.ref_module_fsdp = Model()
        return "done"
class CriticWorker:
    @register
    def init_model(self):
        self.critic_module = Model()
"""

PROBE = """
import json, os, time, torch
from verl.workers import fsdp_workers as w
assert w.ActorRolloutRefWorker.init_model.dispatch == "ONE_TO_ALL"  # @register kept
assert w.ActorRolloutRefWorker().init_model() == "done"
w.CriticWorker().init_model()
deadline = time.time() + 10
# the hook writes mem-PID.json.tmp, then renames it: wait for the renamed file, not the .tmp
# (an exit between the two left only the .tmp: CI failed once on it, under load)
while not any(n.startswith("mem-") and n.endswith(".json")
              for n in os.listdir(os.environ["P40_MEAS_DIR"])):
    assert time.time() < deadline, "no memory record"
    time.sleep(0.1)
print(json.dumps(torch.fractions))
"""


def test_hook_caps_memory_and_reads_models_back(tmp_path):
    fakes = tmp_path / "fakes"
    (fakes / "torch").mkdir(parents=True)
    (fakes / "torch" / "__init__.py").write_text(FAKE_TORCH)
    (fakes / "verl" / "workers").mkdir(parents=True)
    (fakes / "verl" / "__init__.py").write_text("")
    (fakes / "verl" / "workers" / "__init__.py").write_text("")
    (fakes / "verl" / "workers" / "fsdp_workers.py").write_text(FAKE_WORKERS)
    meas = tmp_path / "meas"
    meas.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HARNESS / "hook"), str(fakes)]),
        "P40_CAP_GIB": "24",
        "P40_MEAS_DIR": str(meas),
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"0": 0.24}
    mem = json.loads(next(meas.glob("mem-*.json")).read_text())
    assert mem["devices"][0]["cap_fraction"] == 0.24
    assert mem["devices"][0]["max_reserved_gib"] == 4.0
    roles = sorted(json.loads(p.read_text())["role"] for p in meas.glob("readback-*.json"))
    assert roles == ["critic", "ref"]
    ref = json.loads(next(meas.glob("readback-*-ref.json")).read_text())
    assert ref["modules"]["ref_module_fsdp"]["attn_implementation"] == "sdpa"


def test_hook_is_inert_without_a_cap(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(HARNESS / "hook")}
    env.pop("P40_CAP_GIB", None)
    probe = "import sys; print(any(type(f).__name__ == '_AfterImport' for f in sys.meta_path))"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


# --- --smoke: verify's own job on the device ------------------------------------------------


def _device_smoke_output() -> str:
    """The job's stdout as the H200 run returned it (docs/measurements/smoke-1xP40.log)."""
    log = (REPO / "docs" / "measurements" / "smoke-1xP40.log").read_text()
    return log[log.index("@@p40fleet-smoke") :]


@pytest.mark.parametrize(("output", "status"), [("real", "PASS"), ("no-step", "FAIL")])
def test_smoke_mode_runs_verifys_job_and_judges_it_as_verify_does(
    tmp_path, monkeypatch, output, status
):
    """--smoke runs exactly the job verify renders (render_job, smoke_overrides) and judges its
    output with smoke_check: the device run and verify share one code path."""
    from p40fleet.verification.smoke_script import SmokeTargets, render_job

    text = _device_smoke_output()
    if output == "no-step":  # the same run without verl's step line: never a PASS
        text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("@@step "))
    ran = []

    def fake_run(argv, **kwargs):
        ran.append((argv, Path(argv[1]).read_text()))
        return subprocess.CompletedProcess(argv, 0, stdout=text.encode())

    monkeypatch.setattr(run_ppo.subprocess, "run", fake_run)
    monkeypatch.setattr(run_ppo, "gpu_facts", list)
    mode = run_ppo.PLANS["1xP40"]
    plan = type("Plan", (), {"model_path": "/home/verl/models/Qwen2.5-0.5B-Instruct"})()
    spec = type("Spec", (), {"verl": type("V", (), {"ref": "v0.5.0"})()})()
    args = type("Args", (), {"stage": tmp_path, "timeout_s": 480, "out": tmp_path})()
    summary = run_ppo.run_smoke(
        "1xP40", mode, plan, spec, _describe(), Path("/home/verl/launch-ppo.sh"), {},
        tmp_path / "log", _meas(tmp_path), args, 1.0,
    )  # fmt: skip
    ((argv, job),) = ran
    assert argv[0] == "sh" and argv[2] == "no"
    targets = SmokeTargets(
        "verl", sys.executable, "/home/verl/launch-ppo.sh", "/unused", "v0.5.0", mode.gpus, 480
    )
    assert job == render_job(targets)
    assert summary["smoke_check"]["status"] == status
    assert summary["ok"] is (status == "PASS")
    written = json.loads((tmp_path / "smoke-1xP40.json").read_text())
    assert written["smoke_check"] == summary["smoke_check"]
