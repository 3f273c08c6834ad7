"""p40fleet.verification: crafted probe outputs -> PASS / FAIL / SKIP, and the real probe script.

The crafted outputs are what ``files/verify-probe.sh.j2`` prints (sections of key=value lines,
``@@json`` answers, raw command output, ``@@rc``: ``tests/probe_answers.py``). Here: the PASS
case, what spans components, the registry; one component's checks are tested with its other
layers (``tests/test_<component>.py``). The last tests render the real probe and run it with
``sh`` against a fake CUDA/cuDNN tree and a fake conda env in tmp.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p40fleet.facts.verify import VerifyProbe, render_probe
from p40fleet.spec import load_spec
from p40fleet.training import TrainingTarget
from p40fleet.verification.check import FAIL, PASS, SKIP, Check, host_verdict, spec_failure
from p40fleet.verification.probe import ProbeTargets, parse_probe
from p40fleet.verification.run import CHECK_NAMES, LAB_MARKER, PROBE, REGISTRY, run_checks
from tests.probe_answers import (
    APEX_KEY,
    GPUS,
    KERNEL,
    MODEL,
    PATCHED,
    SPEC,
    TARGET,
    TRAINER_MODULES,
    checks_for,
    only_failures,
    sections,
)

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


# --- one thing wrong at a time: in each component's tests (tests/test_<component>.py) --------


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
    from p40fleet.facts import verify as verify_fact

    monkeypatch.setattr(verify_fact, "PYTHON_TIMEOUT_S", 3)
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
    """``params["launch_script"]`` as operations/training.py renders files/launch-ppo.sh.j2 for
    ``plan``, with the fake host's paths and these overrides."""
    import shlex

    import jinja2

    from p40fleet.operations.training import TEMPLATE

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


def test_the_verification_package_imports_one_way():
    """check <- probe, smoke <- checks._common <- checks.<component> <- run: no module imports
    one on its own floor or above it (so none can import in a circle)."""
    import ast

    components = ("gpu", "nouveau", "driver", "cuda", "cudnn", "conda", "torch", "apex", "verl",
                  "training", "ray")  # fmt: skip
    floor = {"check": 0, "probe": 1, "smoke": 1, "collective": 1, "checks": 2,
             "checks._common": 2, "smoke_script": 2, "collective_script": 2,
             **{f"checks.{c}": 3 for c in components}, "run": 4}  # fmt: skip
    package = Path(__file__).resolve().parent.parent / "p40fleet" / "verification"
    found = {
        ".".join(p.relative_to(package).with_suffix("").parts).removesuffix(".__init__")
        for p in package.rglob("*.py")
    }
    assert found - {"__init__"} == set(floor)
    for name, level in floor.items():
        path = package / (name.replace(".", "/") + ("/__init__.py" if name == "checks" else ".py"))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "p40fleet.verification"
            ):
                continue
            base = node.module.removeprefix("p40fleet.verification").lstrip(".")
            used = [
                f"{base}.{alias.name}".lstrip(".")
                if f"{base}.{alias.name}".lstrip(".") in floor
                else base
                for alias in node.names
            ]
            for other in used:
                if other:
                    assert floor[other] < level, f"{name} imports {other} (same floor or above)"


def test_probe_targets_are_one_frozen_value_the_fact_and_the_run_share():
    """deploy/verify.py (the fact) and the run after the last operation probe the same targets,
    built once; they are hashable, and a stored plain copy (the fact batch's plan, JSON) renders
    the same probe."""
    from p40fleet.operations.run.verify import probe_targets
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
