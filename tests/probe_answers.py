"""Crafted verify-probe answers for the checks' tests: the P40 PASS case section by section
(``sections``, what ``files/verify-probe.sh.j2`` prints), and ``checks_for``, which runs every
check on them in the registry's order."""

from __future__ import annotations

import json

from p40fleet.facts.gpu import PciGpu
from p40fleet.gpu_catalog import lookup
from p40fleet.spec import load_spec
from p40fleet.training import TrainingTarget
from p40fleet.verification.check import FAIL, Check
from p40fleet.verification.probe import parse_probe
from p40fleet.verification.run import CHECK_NAMES, run_checks
from p40fleet.verl_patches import rule_set

SPEC = load_spec("lab1", {})
KERNEL = "5.4.0-150-generic"
COMMIT = SPEC.verl.commit
APEX_KEY = "25.09-4bdecd06b3c4_torch2.6.0-cu118_cuda11.8.0_sm6.1_py3.10_cpp-cuda"
PASCAL_RULES = [r.id for r in rule_set("v0.5.0", "pascal").rules]
PATCHED = sorted({r.file for r in rule_set("v0.5.0", "pascal").rules})
SHA = {f: f"{i:064x}" for i, f in enumerate(PATCHED)}
MODEL = "/home/verl/models/Qwen2.5-0.5B-Instruct"
TRAIN, VAL = "/home/verl/data/gsm8k/train.parquet", "/home/verl/data/gsm8k/test.parquet"
OVERRIDES = ("data.train_batch_size=64", "actor_rollout_ref.rollout.name=hf")
TARGET = TrainingTarget(MODEL, TRAIN, VAL, OVERRIDES)
TRAINER_MODULES = ("verl.trainer.main_ppo", "verl.workers.fsdp_workers",
                   "verl.workers.rollout.hf_rollout", "verl.utils.dataset.rl_dataset")  # fmt: skip


LAUNCH = "/home/verl/launch-ppo.sh"


def compose_json(**over) -> list[str]:
    """The compose section: what ~/launch-ppo.sh runs (read from it) and whether it composes."""
    answer = {"script": LAUNCH, "python": "/home/verl/miniconda3/envs/verl/bin/python",
              "workdir": "/home/verl", "model_path": MODEL, "train_file": TRAIN, "val_file": VAL,
              "entry_point": "verl.trainer.main_ppo",
              "config_dir": "/home/verl/verl/verl/trainer/config", "count": len(OVERRIDES),
              "ok": True} | over  # fmt: skip
    return ["@@json " + json.dumps(answer), "@@rc 0"]


def model_json(**over) -> list[str]:
    answer = {"path": MODEL, "exists": True, "model_type": "qwen2", "tokens": 151665,
              "files": ["config.json", "model.safetensors", "tokenizer.json",
                        "tokenizer_config.json"]} | over  # fmt: skip
    return ["@@json " + json.dumps(answer), "@@rc 0"]


def trainer_json(**bad: dict) -> list[str]:
    modules = {m: bad.get(m, {"ok": True}) for m in TRAINER_MODULES}
    return ["@@json " + json.dumps({"modules": modules}), "@@rc 0"]


def p40(bus: str, device: int = 0x1B38) -> PciGpu:
    return PciGpu(
        bus_id=bus,
        vendor_id=0x10DE,
        device_id=device,
        pci_class=0x030200,
        subsystem_vendor=0x10DE,
        subsystem_device=0x11D9,
        model=lookup(device),
    )


GPUS = [p40("0000:00:06.0"), p40("0000:00:07.0")]


def smi_row(index: int, bus: str, driver: str = "525.147.05", dev: str = "0x1B3810DE") -> str:
    return f"{index}, Tesla P40, 0000{bus}, {dev}, 6.1, {driver}"


def sections(**over: list[str] | None) -> dict[str, list[str]]:
    """The P40 PASS case, section by section; ``over`` replaces (None: drops) sections."""
    base: dict[str, list[str] | None] = {
        "host": ["sim=no", f"kernel={KERNEL}", "nouveau=absent", "@@rc 0"],
        "modinfo": ["525.147.05", "@@rc 0"],
        "dkms": [f"nvidia/525.147.05, {KERNEL}, x86_64: installed", "@@rc 0"],
        "nvidia-smi": [
            "fields=index,name,pci.bus_id,pci.device_id,compute_cap,driver_version",
            smi_row(0, "0000:00:06.0"),
            smi_row(1, "0000:00:07.0"),
            "@@rc 0",
        ],
        "nvcc": [
            "nvcc: NVIDIA (R) Cuda compiler driver",
            "Cuda compilation tools, release 11.8, V11.8.89",
            "@@rc 0",
        ],
        "cudnn-header": [
            "#define CUDNN_MAJOR 8",
            "#define CUDNN_MINOR 9",
            "#define CUDNN_PATCHLEVEL 7",
            "@@rc 0",
        ],
        "cudnn-files": [
            "tree=/usr/local/src/cudnn",
            "cuda_dir=/usr/local/cuda-11.8",
            "src 2049 100 2 regular_file include/cudnn_version.h",
            "src 2049 101 2 regular_file lib/libcudnn.so.8.9.7",
            "src 2049 102 2 symbolic_link lib/libcudnn.so.8",
            "dst 2049 100 2 regular_file include/cudnn_version.h",
            "dst 2049 101 2 regular_file lib64/libcudnn.so.8.9.7",
            "dst 2049 102 2 symbolic_link lib64/libcudnn.so.8",
            "@@rc 0",
        ],
        "python": [
            '@@json {"version": "3.10.12", "executable": "/home/verl/miniconda3/envs/verl-p40/'
            'bin/python"}',
            "@@rc 0",
        ],
        "torch": [
            "! a warning from somewhere=1",
            "@@json "
            + json.dumps(
                {
                    "version": "2.6.0+cu118",
                    "cuda_version": "11.8",
                    "cuda_available": True,
                    "device_count": 2,
                    "capability": [6, 1],
                    "capabilities": [[6, 1], [6, 1]],
                }
            ),
            "@@rc 0",
        ],
        "verl": [
            '@@json {"version": "0.5.0", "file": "/home/verl/verl/verl/__init__.py"}',
            "@@rc 0",
        ],
        "apex": [
            "@@json "
            + json.dumps(
                {m: "ok" for m in ("torch", "apex", "apex_C", "amp_C", "fused_layer_norm_cuda")}
            ),
            "@@rc 0",
        ],
        "trainer": trainer_json(),
        "compose": compose_json(),
        "model": model_json(),
        "training-data": [f"found 3977 PAR1_ {TRAIN}", f"found 7061 PAR1_ {VAL}", "@@rc 0"],
        "apex-key": [f"key={APEX_KEY}", "@@rc 0"],
        "verl-git": [f"head={COMMIT}", f"ref={COMMIT}"]
        + [f"modified={f}" for f in PATCHED]
        + ["@@rc 0"],
        "verl-patches": [
            "@@json "
            + json.dumps(
                {
                    "ref": "v0.5.0",
                    "profile": "pascal",
                    "rule_ids": PASCAL_RULES,
                    "files": SHA,
                    "found": SHA,
                }
            ),
            "@@rc 0",
        ],
    }
    base.update(over)
    lines = ["@@p40fleet-verify 1"]
    for name, body in base.items():
        if body is not None:
            lines += [f"@@section {name}", *body]
    return lines + ["@@end"]


def checks_for(
    lines: list[str], gpus=GPUS, spec=SPEC, apex_key=APEX_KEY, training=TARGET, simulated=False
) -> dict[str, Check]:
    result = run_checks(parse_probe(lines), spec, gpus, apex_key=apex_key, training=training,
                        simulated=simulated)  # fmt: skip
    assert [c.name for c in result] == [n for n in CHECK_NAMES if n in {c.name for c in result}]
    return {c.name: c for c in result}


def status(checks: dict[str, Check]) -> dict[str, str]:
    return {name: c.status for name, c in checks.items()}


def only_failures(checks: dict[str, Check]) -> set[str]:
    return {name for name, c in checks.items() if c.status == FAIL}
