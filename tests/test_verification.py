"""p40fleet.verification: crafted probe outputs -> PASS / FAIL / SKIP, and the real probe script.

The crafted outputs are what ``files/verify-probe.sh.j2`` prints (sections of key=value lines,
``@@json`` answers, raw command output, ``@@rc``). The last tests render the real probe and run
it with ``sh`` against a fake CUDA/cuDNN tree and a fake conda env in tmp.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from facts.gpu import PciGpu
from facts.verify import VerifyProbe, render_probe
from p40fleet.gpu_catalog import lookup
from p40fleet.spec import load_spec
from p40fleet.training import TrainingTarget
from p40fleet.verification.check import FAIL, PASS, SKIP, Check, host_verdict, spec_failure
from p40fleet.verification.probe import ProbeTargets, parse_probe
from p40fleet.verification.run import CHECK_NAMES, LAB_MARKER, PROBE, REGISTRY, run_checks
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


# --- the PASS case ---------------------------------------------------------------------------


def test_p40_pass_case():
    checks = checks_for(sections())
    assert only_failures(checks) == set(), {n: c.detail for n, c in checks.items()}
    assert all(c.status == PASS for c in checks.values())
    assert checks["torch version"].detail == "2.6.0+cu118 True (6, 1)"
    assert "(6, 1)" in checks["torch capability"].detail
    assert checks["gpus"].detail.startswith("2× Tesla P40 (cc 6.1, profile pascal)")
    assert host_verdict(checks.values()) == PASS
    assert "probe" not in checks


def test_parse_probe_sections_and_noise():
    answers = parse_probe(sections())
    assert answers.started and answers.complete
    torch = answers.section("torch")
    assert torch.rc == 0 and torch.answer["version"] == "2.6.0+cu118"
    assert torch.noise == ["a warning from somewhere=1"]
    assert torch.get("a warning") is None  # noise is never a key=value answer
    assert answers.section("verl-git").values("modified") == PATCHED


# --- one thing wrong at a time ---------------------------------------------------------------


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


def test_nvidia_smi_missing_a_gpu():
    smi = sections()[sections().index("@@section nvidia-smi") + 1 :][:4]
    smi = [smi[0], smi[1], "@@rc 0"]  # only the GPU at 00:06.0
    checks = checks_for(sections(**{"nvidia-smi": smi}))
    assert only_failures(checks) == {"nvidia-smi gpus"}
    detail = checks["nvidia-smi gpus"].detail
    assert "1 of the 2 GPUs" in detail and "0000:00:07.0" in detail and "10de:1b38" in detail
    assert "dmesg" in checks["nvidia-smi gpus"].remedy


def test_driver_mismatch():
    smi = [
        "fields=index,name,pci.bus_id,pci.device_id,compute_cap,driver_version",
        smi_row(0, "0000:00:06.0", driver="535.183.01"),
        smi_row(1, "0000:00:07.0", driver="535.183.01"),
        "@@rc 0",
    ]
    checks = checks_for(
        sections(
            **{"nvidia-smi": smi},
            modinfo=["535.183.01", "@@rc 0"],
            dkms=[f"nvidia/535.183.01, {KERNEL}, x86_64: installed", "@@rc 0"],
        )
    )
    assert only_failures(checks) == {"nvidia-smi driver", "driver installed", "dkms"}
    assert "535.183.01" in checks["nvidia-smi driver"].detail
    assert "expected 525.147.05" in checks["nvidia-smi driver"].detail
    assert "modinfo: nvidia 535.183.01 installed" in checks["driver installed"].detail


def test_driver_not_loaded():
    smi = [
        "fields=index,name,pci.bus_id,pci.device_id,compute_cap,driver_version",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "@@rc 9",
    ]
    checks = checks_for(sections(**{"nvidia-smi": smi}))
    assert only_failures(checks) == {"nvidia-smi gpus", "nvidia-smi driver"}
    assert "exit 9" in checks["nvidia-smi driver"].detail
    assert "reboot" in checks["nvidia-smi driver"].remedy


def test_dkms_old_format_and_other_kernel():
    old = [f"nvidia, 525.147.05, {KERNEL}, x86_64: installed", "@@rc 0"]
    assert checks_for(sections(dkms=old))["dkms"].status == PASS
    other = ["nvidia/525.147.05, 5.4.0-99-generic, x86_64: installed", "@@rc 0"]
    bad = checks_for(sections(dkms=other))["dkms"]
    assert bad.status == FAIL and KERNEL in bad.detail and "5.4.0-99-generic" in bad.detail
    missing = checks_for(sections(dkms=["missing=dkms", "@@rc 127"]))["dkms"]
    assert missing.status == FAIL and missing.detail == "dkms is not installed"


def test_nvcc_12():
    nvcc = ["Cuda compilation tools, release 12.1, V12.1.105", "@@rc 0"]
    checks = checks_for(sections(nvcc=nvcc))
    assert only_failures(checks) == {"nvcc"}
    assert (
        "release 12.1" in checks["nvcc"].detail and "expected release 11.8" in checks["nvcc"].detail
    )
    assert "'cuda'" in checks["nvcc"].remedy


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


def test_verl_version_mismatch():
    verl = ['@@json {"version": "0.4.1", "file": "/x"}', "@@rc 0"]
    checks = checks_for(sections(verl=verl))
    assert only_failures(checks) == {"verl version"}
    assert "0.4.1" in checks["verl version"].detail and "0.5.0" in checks["verl version"].detail


def test_verl_import_error_and_timeout():
    err = ['@@json {"error": "ModuleNotFoundError: No module named \'ray\'"}', "@@rc 0"]
    assert "No module named 'ray'" in checks_for(sections(verl=err))["verl version"].detail
    timeout = ["! still importing", "@@rc 124"]
    assert "timed out" in checks_for(sections(verl=timeout))["verl version"].detail


def test_verl_checkout_and_patches():
    other = "0" * 40
    git = [f"head={other}", f"ref={COMMIT}", "@@rc 0"]
    assert checks_for(sections(**{"verl-git": git}))["verl checkout"].status == FAIL
    drift = dict(SHA)
    drift[PATCHED[0]] = "f" * 64
    rec = {"ref": "v0.5.0", "profile": "pascal", "rule_ids": PASCAL_RULES}
    rec |= {"files": SHA, "found": drift}
    bad = checks_for(sections(**{"verl-patches": ["@@json " + json.dumps(rec), "@@rc 0"]}))
    assert only_failures(bad) == {"verl patches"}
    assert "local edits" in bad["verl patches"].detail and PATCHED[0] in bad["verl patches"].detail
    none = checks_for(sections(**{"verl-patches": ["missing=/home/verl/verl/.p40", "@@rc 0"]}))
    assert none["verl patches"].status == FAIL and "not applied" in none["verl patches"].detail


def test_apex_cuda_ext_missing_and_key_mismatch():
    answer = {m: "ok" for m in ("torch", "apex", "apex_C")}
    answer |= {
        "amp_C": "ModuleNotFoundError: No module named 'amp_C'",
        "fused_layer_norm_cuda": "ok",
    }
    checks = checks_for(
        sections(
            apex=["@@json " + json.dumps(answer), "@@rc 0"], **{"apex-key": ["key=x", "@@rc 0"]}
        )
    )
    assert only_failures(checks) == {"apex cuda ext", "apex build key"}
    assert "amp_C" in checks["apex cuda ext"].detail


def test_nouveau_loaded():
    host = ["sim=no", f"kernel={KERNEL}", "nouveau=loaded", "@@rc 0"]
    checks = checks_for(sections(host=host))
    assert only_failures(checks) == {"nouveau"}
    assert "allow_reboot" in checks["nouveau"].remedy


# --- the training path -----------------------------------------------------------------------


def test_training_path_pass_names_what_it_saw():
    checks = checks_for(sections())
    assert "verl.trainer.main_ppo" in checks["trainer modules"].detail
    assert "2 overrides" in checks["launch overrides"].detail
    assert MODEL in checks["model files"].detail and "qwen2" in checks["model files"].detail
    assert TRAIN in checks["data files"].detail and VAL in checks["data files"].detail


def test_missing_trainer_module_is_named_with_the_fix():
    err = {"ok": False, "missing": "torchdata",
           "error": "ModuleNotFoundError: No module named 'torchdata'"}  # fmt: skip
    checks = checks_for(sections(trainer=trainer_json(**{"verl.trainer.main_ppo": err})))
    assert only_failures(checks) == {"trainer modules"}
    bad = checks["trainer modules"]
    assert "verl.trainer.main_ppo" in bad.detail and "torchdata" in bad.detail
    assert "verl.workers.fsdp_workers" not in bad.detail  # only the failing one
    assert "torchdata" in bad.remedy and "files/verl-requirements-" in bad.remedy


def test_trainer_import_that_kills_the_interpreter_fails():
    checks = checks_for(sections(trainer=["! Segmentation fault", "@@rc 139"]))
    assert checks["trainer modules"].status == FAIL
    assert "exit 139" in checks["trainer modules"].detail


def test_override_verl_refuses_is_named():
    bad = {"+actor_rollout_ref.ref.fsdp_config.model_dtype=fp32": "ConfigCompositionException: "
           "Could not append to config. An item is already at 'model_dtype'"}  # fmt: skip
    compose = compose_json(ok=False, error="ConfigCompositionException: ...", base_error=None,
                           bad=bad)  # fmt: skip
    checks = checks_for(sections(compose=compose))
    assert only_failures(checks) == {"launch overrides"}
    check = checks["launch overrides"]
    assert "+actor_rollout_ref.ref.fsdp_config.model_dtype=fp32" in check.detail
    assert "p40fleet/launch.py" in check.remedy


def test_a_launch_script_that_runs_other_inputs_than_the_plan_fails():
    """The checks of the model and data look at the plan's paths: a script that reads other
    ones (edited by hand, or left from an older plan) is not what verify looked at."""
    other = "/home/verl/models/other"
    checks = checks_for(sections(compose=compose_json(model_path=other)))
    assert only_failures(checks) == {"launch overrides"}
    check = checks["launch overrides"]
    assert f"MODEL_PATH {other!r}" in check.detail and repr(MODEL) in check.detail
    assert "deploy/training.py" in check.remedy and LAUNCH in check.remedy
    target = replace(TARGET, python="/opt/env/bin/python")  # the plan's interpreter differs
    check = checks_for(sections(), training=target)["launch overrides"]
    assert (
        check.status == FAIL and "PYTHON" in check.detail and "/opt/env/bin/python" in check.detail
    )
    moved = checks_for(sections(compose=compose_json(entry_point="verl.other")))
    assert "python -m 'verl.other'" in moved["launch overrides"].detail


def test_a_missing_or_foreign_launch_script_fails_with_the_training_fix():
    gone = checks_for(sections(compose=compose_json(absent=True, ok=None)))["launch overrides"]
    assert gone.status == FAIL and gone.detail == f"no launch script {LAUNCH}"
    assert "deploy/training.py" in gone.remedy
    odd = compose_json(unreadable="0 `exec \"$PYTHON\" -m` lines, not 1: not the script "
                       "p40fleet writes", ok=None)  # fmt: skip
    check = checks_for(sections(compose=odd))["launch overrides"]
    assert check.status == FAIL and "not the script p40fleet writes" in check.detail
    assert "deploy/training.py" in check.remedy


def test_no_launch_plan_fails_with_the_reason():
    target = TrainingTarget(MODEL, TRAIN, VAL, problem="memory size of device 0x1234 unknown")
    checks = checks_for(sections(), training=target)
    assert checks["launch overrides"].status == FAIL
    assert "memory size of device 0x1234 unknown" in checks["launch overrides"].detail


def test_model_dir_missing_or_incomplete_names_the_path():
    gone = checks_for(sections(model=model_json(exists=False)))["model files"]
    assert gone.status == FAIL and MODEL in gone.detail
    assert "save the Hugging Face model into " + MODEL in gone.remedy  # no archive in the spec
    lacking = checks_for(sections(model=model_json(files=["config.json", "tokenizer.json"])))
    assert lacking["model files"].status == FAIL and "weights" in lacking["model files"].detail
    tok = checks_for(sections(model=model_json(tokenizer_error="OSError: bad tokenizer.json")))
    assert tok["model files"].status == FAIL and "bad tokenizer.json" in tok["model files"].detail


def test_model_remedy_names_the_archive_when_the_spec_has_one():
    archive = {"filename": "m.tar", "sha256": "a" * 64, "url": "https://example.org/m.tar"}
    spec = load_spec("lab1", {"training": {"model": {"archive": archive}}})
    check = checks_for(sections(model=model_json(exists=False)), spec=spec)["model files"]
    assert "deploy/training.py" in check.remedy and "m.tar" in check.remedy


def test_data_file_missing_empty_or_not_parquet_is_named():
    data = [f"found 3977 PAR1_ {TRAIN}", f"missing={VAL}", "@@rc 0"]
    check = checks_for(sections(**{"training-data": data}))["data files"]
    assert check.status == FAIL and VAL in check.detail and TRAIN not in check.detail
    assert "gsm8k.py --local_dir /home/verl/data/gsm8k" in check.remedy
    data = [f"found 0 _ {TRAIN}", f"found 12 abcd_ {VAL}", "@@rc 0"]
    check = checks_for(sections(**{"training-data": data}))["data files"]
    assert f"{TRAIN} is empty" in check.detail and f"{VAL} is not a parquet" in check.detail


def test_without_a_plan_the_training_checks_skip():
    checks = checks_for(sections(), training=None)
    for name in ("launch overrides", "model files", "data files"):
        assert checks[name].status == SKIP


# --- simulated host, no GPU, bad spec, broken probe ------------------------------------------


def test_simulated_host_skips_instead_of_passing():
    host = ["sim=yes", f"kernel={KERNEL}", "nouveau=absent", "@@rc 0"]
    torch = {"version": "2.6.0+cu118", "cuda_version": None, "cuda_available": False}
    apex = {"torch": "ok", "apex": "ok", "apex_C": "ok", "amp_C": "ModuleNotFoundError: x"}
    smi = ["fields=x", "garbage from the lab's double", "@@rc 0"]
    probe = sections(
        host=host,
        torch=["@@json " + json.dumps(torch), "@@rc 0"],
        apex=["@@json " + json.dumps(apex), "@@rc 0"],
        **{"nvidia-smi": smi},
    )
    checks = checks_for(probe, simulated=True)
    skipped = {n for n, c in checks.items() if c.status == SKIP}
    assert skipped == {
        "nvidia-smi gpus",
        "nvidia-smi driver",
        "torch cuda",
        "torch capability",
        "apex cuda ext",
    }
    assert all("simulated host" in checks[n].detail for n in skipped)
    assert only_failures(checks) == set()
    # still checked for real on a simulated host:
    assert checks["torch version"].status == PASS
    assert checks["driver installed"].status == PASS
    assert checks["apex"].status == PASS
    wrong = dict(torch, version="2.5.1+cpu")
    sim_bad = checks_for(sections(host=host, torch=["@@json " + json.dumps(wrong), "@@rc 0"]),
                         simulated=True)  # fmt: skip
    assert sim_bad["torch version"].status == FAIL
    bad_driver = checks_for(sections(host=host, modinfo=["535.183.01", "@@rc 0"]), simulated=True)
    assert bad_driver["driver installed"].status == FAIL

    # N14: the same answers from a host its inventory does not mark simulated (a lab marker
    # left on a real host): nothing SKIPs as simulated, and the marker is a FAIL naming it
    real = checks_for(probe)
    assert not any("simulated host" in c.detail for c in real.values() if c.status == SKIP)
    assert real["nvidia-smi gpus"].status == FAIL and real["torch cuda"].status == FAIL
    marker = real["lab marker"]
    assert marker.status == FAIL and "/etc/p40lab-sim" in marker.detail
    assert "p40lab_sim" in marker.detail and "rm -rf /etc/p40lab-sim" in marker.remedy
    # marked simulated but without the marker: checked as real hardware, no marker FAIL
    plain = ["sim=no", f"kernel={KERNEL}", "nouveau=absent", "@@rc 0"]
    unmarked = checks_for(sections(host=plain, **{"nvidia-smi": smi}), simulated=True)
    assert unmarked["nvidia-smi gpus"].status == FAIL and "lab marker" not in unmarked


def test_cpu_torch_pin_skips_cuda_checks():
    spec = load_spec("lab1", {"torch": {"version": "2.6.0+cpu"}})
    torch = {"version": "2.6.0+cpu", "cuda_version": None, "cuda_available": False}
    checks = checks_for(sections(torch=["@@json " + json.dumps(torch), "@@rc 0"]), spec=spec)
    for name in ("torch cuda", "torch capability", "apex cuda ext"):
        assert checks[name].status == SKIP and "CPU build" in checks[name].detail
    assert checks["torch version"].status == PASS


def test_no_gpu_facts_fail_the_host():
    checks = checks_for(sections(), gpus=[], apex_key=None)
    assert checks["gpus"].status == FAIL and "no NVIDIA GPU" in checks["gpus"].detail
    assert checks["verl patches"].status == SKIP
    assert host_verdict(checks.values()) == FAIL


def test_refused_gpu_fails_the_host():
    checks = checks_for(sections(), gpus=[p40("0000:00:06.0", device=0x2335)])  # H200
    assert checks["gpus"].status == FAIL and "R525" in checks["gpus"].detail


def test_spec_failure_is_one_fail():
    (check,) = spec_failure(["stack.cuda.sha256 = 'abc': expected 64 hex characters"])
    assert check.status == FAIL and "stack.cuda.sha256" in check.detail and check.remedy
    assert host_verdict([check]) == FAIL
    assert host_verdict([]) == FAIL


def test_probe_without_output_or_cut_short():
    checks = checks_for([])
    assert set(checks) == {"gpus", "probe"} and checks["probe"].status == FAIL
    cut = sections()[:20]  # no @@end
    checks = checks_for(cut)
    assert checks["probe"].status == FAIL and "stopped early" in checks["probe"].detail
    assert checks["verl version"].status == FAIL  # its section never came


def test_every_check_reports_the_name_the_registry_gives_it():
    """CHECK_NAMES is derived from the registry: each check must report under its entry's name
    (a renamed check or a reordered registry fails here, not in the fleet table)."""
    ran = [c.name for c in run_checks(parse_probe(sections()), SPEC, GPUS, apex_key=APEX_KEY,
                                      training=TARGET)]  # fmt: skip
    assert ran == [name for name in CHECK_NAMES if name not in (PROBE, LAB_MARKER)]
    assert CHECK_NAMES == tuple(name for name, _ in REGISTRY)
    assert CHECK_NAMES[:2] == ("gpus", "probe") and len(set(CHECK_NAMES)) == len(CHECK_NAMES)


def test_check_rejects_unknown_status():
    with pytest.raises(ValueError):
        Check("x", "OK", "")


# --- the real probe script ------------------------------------------------------------------


def _fake_host(tmp: Path) -> dict[str, str]:
    """A CUDA dir with nvcc + hard-linked cuDNN, a venv 'conda env' with fake torch/verl/apex."""
    cuda = tmp / "cuda-11.8"
    tree = tmp / "src" / "cudnn"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "include").mkdir()
    (cuda / "lib64").mkdir()
    (tree / "include").mkdir(parents=True)
    (tree / "lib").mkdir()
    nvcc = cuda / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
    nvcc.chmod(0o755)
    (tree / "include" / "cudnn_version.h").write_text(
        "#define CUDNN_MAJOR 8\n#define CUDNN_MINOR 9\n#define CUDNN_PATCHLEVEL 7\n"
    )
    (tree / "lib" / "libcudnn.so.8.9.7").write_bytes(b"\x7fELF")
    os.symlink("libcudnn.so.8.9.7", tree / "lib" / "libcudnn.so.8")
    os.link(tree / "include" / "cudnn_version.h", cuda / "include" / "cudnn_version.h")
    os.link(tree / "lib" / "libcudnn.so.8.9.7", cuda / "lib64" / "libcudnn.so.8.9.7")
    os.link(tree / "lib" / "libcudnn.so.8", cuda / "lib64" / "libcudnn.so.8", follow_symlinks=False)

    env = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next((env / "lib").glob("python3*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(
        "__version__ = '2.6.0+cu118'\n"
        "class version:\n    cuda = '11.8'\n"
        "class cuda:\n"
        "    is_available = staticmethod(lambda: True)\n"
        "    device_count = staticmethod(lambda: 1)\n"
        "    get_device_capability = staticmethod(lambda i=0: (6, 1))\n"
        "    get_device_name = staticmethod(lambda i=0: 'Tesla P40')\n"
    )
    (site / "verl").mkdir()
    (site / "verl" / "__init__.py").write_text(
        "import sys\nprint('noisy import=1', file=sys.stderr)\n__version__ = '0.5.0'\n"
    )
    (site / "apex").mkdir()
    (site / "apex" / "__init__.py").write_text("")
    (site / "apex_C.py").write_text("")
    key_file = env / ".p40fleet-apex-key"
    key_file.write_text(APEX_KEY + "\n")
    return {
        "cuda_dir": str(cuda),
        "cudnn_tree": str(tree),
        "python": str(env / "bin" / "python"),
        "apex_key_file": str(key_file),
        "verl_checkout": str(tmp / "verl"),
        "verl_ref": "v0.5.0",
        "patch_record": str(tmp / "verl" / ".p40fleet-patches.json"),
        "model_path": str(tmp / "models" / "m"),
        "train_file": str(tmp / "data" / "train.parquet"),
        "val_file": str(tmp / "data" / "test.parquet"),
        "launch_script": str(tmp / "launch-ppo.sh"),
        # the test's own user: the probe's privilege drop runs without runuser then
        "user": getpass.getuser(),
    }


def test_real_probe_runs_read_only_and_parses(tmp_path):
    params = _fake_host(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    script = VerifyProbe().command(ProbeTargets(**params))  # the probe, its output held
    assert render_probe(ProbeTargets(**params)) in script
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    answers = VerifyProbe().process(proc.stdout.splitlines())
    assert answers.started and answers.complete, proc.stdout
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing written (no .pyc)

    checks = {c.name: c for c in run_checks(answers, SPEC, GPUS, apex_key=APEX_KEY)}
    assert checks["nvcc"].status == PASS, checks["nvcc"]
    assert checks["cudnn version"].status == PASS
    assert checks["cudnn hard links"].status == PASS, checks["cudnn hard links"].detail
    assert checks["torch version"].detail == "2.6.0+cu118 True (6, 1)"
    assert checks["verl version"].status == PASS
    assert answers.section("verl").noise == ["noisy import=1"]
    assert checks["apex"].status == PASS
    assert checks["apex build key"].status == PASS
    if not answers.section("host").get("sim") == "yes":
        assert checks["apex cuda ext"].status == FAIL  # the fake apex has no amp_C
    assert checks["verl checkout"].status == FAIL  # no checkout in tmp
    assert "no verl checkout" in checks["verl checkout"].detail


def test_real_probe_sees_a_copied_cudnn_file(tmp_path):
    params = _fake_host(tmp_path)
    lib = Path(params["cuda_dir"]) / "lib64" / "libcudnn.so.8.9.7"
    lib.unlink()
    lib.write_bytes(b"\x7fELF")  # a copy, not a hard link
    proc = subprocess.run(
        ["sh", "-c", render_probe(ProbeTargets(**params))], capture_output=True, text=True
    )
    checks = {c.name: c for c in run_checks(parse_probe(proc.stdout.splitlines()), SPEC, GPUS)}
    assert checks["cudnn hard links"].status == FAIL
    assert "lib64/libcudnn.so.8.9.7" in checks["cudnn hard links"].detail
    assert checks["apex build key"].status == SKIP  # no expected key given


def test_real_probe_imports_torch_once_for_all_python_sections(tmp_path):
    params = _fake_host(tmp_path)
    site = next(Path(params["python"]).parents[1].glob("lib/python3*/site-packages"))
    for module in ("torch", "verl"):
        init = site / module / "__init__.py"
        init.write_text(
            "import os, sys\nprint('pid=%d' % os.getpid(), file=sys.stderr)\n" + init.read_text()
        )
    proc = subprocess.run(
        ["sh", "-c", render_probe(ProbeTargets(**params))], capture_output=True, text=True
    )
    answers = parse_probe(proc.stdout.splitlines())
    torch_pids = [n for n in answers.section("torch").noise if n.startswith("pid=")]
    verl_pids = [n for n in answers.section("verl").noise if n.startswith("pid=")]
    assert len(torch_pids) == 1 and verl_pids == torch_pids, proc.stdout  # one interpreter
    checks = {c.name: c for c in run_checks(answers, SPEC, GPUS, apex_key=APEX_KEY)}
    assert checks["torch version"].detail == "2.6.0+cu118 True (6, 1)"
    assert checks["verl version"].status == PASS


def test_real_probe_asks_again_alone_when_an_import_kills_the_interpreter(tmp_path):
    params = _fake_host(tmp_path)
    site = next(Path(params["python"]).parents[1].glob("lib/python3*/site-packages"))
    (site / "verl" / "__init__.py").write_text(
        "import os, sys\nprint('segfault in verl', file=sys.stderr)\nsys.stderr.flush()\n"
        "os._exit(139)\n"
    )
    proc = subprocess.run(
        ["sh", "-c", render_probe(ProbeTargets(**params))], capture_output=True, text=True
    )
    answers = parse_probe(proc.stdout.splitlines())
    assert answers.complete, proc.stdout
    assert proc.stdout.splitlines().count("@@section verl") == 1, proc.stdout
    assert answers.section("verl").rc == 139
    assert "segfault in verl" in answers.section("verl").noise
    checks = {c.name: c for c in run_checks(answers, SPEC, GPUS, apex_key=APEX_KEY)}
    assert checks["verl version"].status == FAIL
    assert checks["torch version"].detail == "2.6.0+cu118 True (6, 1)"  # answered before it died
    assert checks["apex"].status == PASS


def test_real_probe_does_not_ask_a_hanging_section_twice(tmp_path, monkeypatch):
    import facts.verify

    monkeypatch.setattr(facts.verify, "PYTHON_TIMEOUT_S", 3)
    params = _fake_host(tmp_path)
    site = next(Path(params["python"]).parents[1].glob("lib/python3*/site-packages"))
    imports = tmp_path / "torch-imports"
    (site / "torch" / "__init__.py").write_text(  # CUDA init that never returns
        f"open({str(imports)!r}, 'a').write('x')\nimport time\ntime.sleep(60)\n"
    )
    proc = subprocess.run(
        ["sh", "-c", render_probe(ProbeTargets(**params))], capture_output=True, text=True
    )
    answers = parse_probe(proc.stdout.splitlines())
    assert answers.complete, proc.stdout
    assert answers.section("torch").rc == 124
    # once in the run of all sections, once for apex alone (it imports torch); not again alone
    assert imports.read_text() == "xx", proc.stdout
    checks = {c.name: c for c in run_checks(answers, SPEC, GPUS, apex_key=APEX_KEY)}
    assert "timed out" in checks["torch version"].detail
    assert checks["verl version"].status == PASS  # asked alone after the interpreter was stopped


def _training_host(tmp: Path, params: dict) -> Path:
    """Give the fake env the training path: verl's real Hydra config (the 0.5.0 sdist), hydra
    and omegaconf (the controller's, through a .pth), trainer modules, a transformers stand-in,
    and the lab's tiny model and GSM8K-format data unpacked where ``params`` names them."""
    import site as site_mod
    import tarfile

    from p40lab import training_data
    from tests.verl_sdist import extract_verl

    site = next(Path(params["python"]).parents[1].glob("lib/python3*/site-packages"))
    tree = extract_verl(tmp / "verl-0.5.0")
    verl = site / "verl"
    for package in ("trainer", "workers", "workers/rollout", "utils", "utils/dataset"):
        (verl / package).mkdir(parents=True, exist_ok=True)
        (verl / package / "__init__.py").write_text("")
    (verl / "trainer" / "config").symlink_to(tree / "verl" / "trainer" / "config")
    for module in TRAINER_MODULES:
        (site / (module.replace(".", "/") + ".py")).write_text("")
    (site / "transformers.py").write_text(
        "import json, os\n"
        "class AutoTokenizer:\n"
        "    @staticmethod\n"
        "    def from_pretrained(path):\n"
        "        data = json.load(open(os.path.join(path, 'tokenizer.json')))\n"
        "        return range(len(data['model']['vocab']) + len(data['added_tokens']))\n"
    )
    ours = [p for p in site_mod.getsitepackages() if (Path(p) / "hydra").is_dir()]
    (site / "controller.pth").write_text("\n".join(ours) + "\n")
    for name, data in training_data.archives().items():
        archive = tmp / name
        archive.write_bytes(data)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp / "unpacked")  # our own archive
    Path(params["model_path"]).parent.mkdir(parents=True)
    (tmp / "unpacked" / training_data.MODEL_NAME).rename(params["model_path"])
    (tmp / "unpacked" / training_data.DATA_NAME).rename(Path(params["train_file"]).parent)
    return site


def _write_launch_script(params: dict, plan, overrides) -> None:
    """``params["launch_script"]`` as operations/launch.py renders files/launch-ppo.sh.j2 for
    ``plan``, with the fake host's paths and these overrides."""
    import shlex

    import jinja2

    from operations.launch import TEMPLATE

    q = shlex.quote
    values = plan.template_vars() | {
        key: q(params[key]) for key in ("python", "model_path", "train_file", "val_file")
    }
    values["overrides"] = [q(o) for o in overrides]
    text = jinja2.Template(Path(TEMPLATE).read_text(), keep_trailing_newline=True).render(values)
    Path(params["launch_script"]).write_text(text)
    Path(params["launch_script"]).chmod(0o755)  # as files.template(mode="755") leaves it


def test_real_probe_runs_the_training_path(tmp_path):
    """The probe composes the overrides it reads from the launch script, not the plan's."""
    from p40fleet.launch import plan_launch

    params = _fake_host(tmp_path)
    site = _training_host(tmp_path, params)
    plan = plan_launch(SPEC, [0x1B38] * 2)
    _write_launch_script(params, plan, plan.overrides)
    target = TrainingTarget(params["model_path"], params["train_file"], params["val_file"],
                            plan.overrides, python=params["python"])  # fmt: skip
    proc = subprocess.run(
        ["sh", "-c", render_probe(ProbeTargets(**params))], capture_output=True, text=True
    )
    answers = parse_probe(proc.stdout.splitlines())
    assert answers.complete, proc.stdout + proc.stderr
    checks = {c.name: c for c in run_checks(answers, SPEC, GPUS, training=target)}
    for name in ("trainer modules", "launch overrides", "model files", "data files"):
        assert checks[name].status == PASS, (name, checks[name].detail, proc.stdout[-3000:])
    assert f"{len(plan.overrides)} overrides" in checks["launch overrides"].detail
    assert "(512 tokens)" in checks["model files"].detail

    # the same script without its execute bit: users could not start it, so no PASS
    Path(params["launch_script"]).chmod(0o644)
    proc = subprocess.run(
        ["sh", "-c", render_probe(ProbeTargets(**params))], capture_output=True, text=True
    )
    answers = parse_probe(proc.stdout.splitlines())
    check = {c.name: c for c in run_checks(answers, SPEC, GPUS, training=target)}[
        "launch overrides"
    ]
    assert check.status == FAIL and "not executable" in check.detail, check.detail
    assert "deploy/training.py" in check.remedy
    Path(params["launch_script"]).chmod(0o755)

    # one override verl does not have, a trainer module that needs a missing package, a
    # deleted data file: each FAIL names it
    _write_launch_script(params, plan, (*plan.overrides, "actor_rollout_ref.no_such_key=1"))
    (site / "verl" / "trainer" / "main_ppo.py").write_text("import torchdata_not_here\n")
    Path(params["val_file"]).unlink()
    proc = subprocess.run(
        ["sh", "-c", render_probe(ProbeTargets(**params))], capture_output=True, text=True
    )
    answers = parse_probe(proc.stdout.splitlines())
    checks = {c.name: c for c in run_checks(answers, SPEC, GPUS, training=target)}
    overrides = checks["launch overrides"]
    assert overrides.status == FAIL and overrides.detail.startswith(
        "actor_rollout_ref.no_such_key=1: "
    ), overrides.detail
    assert plan.overrides[0] not in overrides.detail  # only the bad one is named
    trainer = checks["trainer modules"]
    assert trainer.status == FAIL and "verl.trainer.main_ppo" in trainer.detail
    assert "torchdata_not_here" in trainer.remedy
    data = checks["data files"]
    assert data.status == FAIL and data.detail == f"missing: {params['val_file']}"


def test_a_card_known_only_by_its_chip_family_is_not_unknown_to_verify():
    """verify reads the same PCI facts as preflight: a model derived from pci.ids counts."""
    from p40fleet.gpu_catalog import derive_model

    device = 0x1B3F  # a GP102 id absent from the catalog
    assert lookup(device) is None
    gp102 = derive_model(device, "GP102GL [Tesla P40 variant]")
    assert gp102 is not None and gp102.compute_capability == (6, 1)
    gpus = [replace(p40("0000:00:06.0"), device_id=device, model=gp102), p40("0000:00:07.0")]
    checks = checks_for(sections(), gpus=gpus)
    assert checks["gpus"].status == PASS, checks["gpus"].detail
    assert "unknown" not in checks["gpus"].detail
    assert "chip family GP102" in checks["gpus"].detail


def test_the_verification_package_imports_one_way():
    """check <- probe, smoke <- system_checks, python_checks, ray_checks <- run: no module imports
    one on its own floor or above it (so none can import in a circle)."""
    import ast

    floor = {"check": 0, "probe": 1, "smoke": 1, "collective": 1, "system_checks": 2,
             "python_checks": 2, "ray_checks": 2, "smoke_script": 2, "collective_script": 2,
             "run": 3}  # fmt: skip
    package = Path(__file__).resolve().parent.parent / "p40fleet" / "verification"
    assert {p.stem for p in package.glob("*.py")} - {"__init__"} == set(floor)
    for name, level in floor.items():
        tree = ast.parse((package / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "p40fleet.verification":
                used = [alias.name for alias in node.names if alias.name in floor]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "p40fleet.verification."
            ):
                used = [node.module.rsplit(".", 1)[1]]
            else:
                continue
            for other in used:
                assert floor[other] < level, f"{name}.py imports {other} (same floor or above)"


def test_probe_targets_are_one_frozen_value_the_fact_and_the_run_share():
    """deploy/verify.py (the fact) and the run after the last operation probe the same targets,
    built once; they are hashable, and a stored plain copy (the fact batch's plan, JSON) renders
    the same probe."""
    from operations.verification import probe_targets
    from p40fleet.verl_patches import RECORD_NAME

    targets = probe_targets(SPEC, TARGET)
    assert hash(targets) == hash(probe_targets(SPEC, TARGET))
    with pytest.raises(AttributeError):
        targets.user = "root"  # type: ignore[misc]
    assert targets.patch_record == f"{SPEC.env.verl_checkout}/{RECORD_NAME}"
    assert (targets.model_path, targets.launch_script) == (MODEL, f"{SPEC.user.home}/launch-ppo.sh")
    stored = json.loads(json.dumps(targets))
    assert VerifyProbe().command(stored) == VerifyProbe().command(targets)
    assert render_probe(targets) in VerifyProbe().command(targets)
