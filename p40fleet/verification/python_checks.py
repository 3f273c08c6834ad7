"""The Python layer's checks (python, torch, Apex, verl) and the training path's (trainer
modules, launch overrides, model and data files)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import InvalidVersion, Version

from p40fleet.launch import ENTRY_POINT
from p40fleet.training import model_dir_problems
from p40fleet.verification.check import (
    FAIL,
    PASS,
    SIMULATED,
    SKIP,
    Check,
    force_reinstall,
    no_answer,
)
from p40fleet.verification.probe import CheckContext, Section

_PYTHON = "run `pyinfra -y INVENTORY deploy/python.py`"


def _same_version(found: str | None, pinned: str) -> bool:
    if found is None:
        return False
    if found == pinned:
        return True
    try:
        return Version(found) == Version(pinned)
    except InvalidVersion:
        return False


def _cc(cap: tuple[int, int] | list[int] | None) -> str:
    return "?" if not cap else f"{cap[0]}.{cap[1]}"


def _is_cuda_build(torch_version: str) -> bool:
    try:
        local = Version(torch_version).local or ""
    except InvalidVersion:
        return False
    return local.lower().startswith("cu")


def _python_missing(section: Section, primary: bool = False) -> str | None:
    """Why there is no answer when the env's interpreter is not there (full text: ``primary``)."""
    missing = section.get("missing")
    if not missing:
        return None
    if primary:
        return f"no python at {missing}: the conda env is missing"
    return "no conda env python (see python version)"


def _py_failure(section: Section, what: str) -> str:
    """Why a Python snippet gave no answer: its exit status and the last noise line."""
    noise = section.noise
    tail = f": {noise[-1]}" if noise else ""
    if section.rc == 124:
        return f"{what} timed out{tail}"
    return f"{what} gave no answer (exit {section.rc}){tail}"


def python_version(ctx: CheckContext) -> Check:
    name = "python version"
    pinned = ctx.spec.python_version
    remedy = force_reinstall("env", _PYTHON)
    section = ctx.answers.section("python")
    if section is None:
        return no_answer(name, "the env's python", remedy)
    if missing := _python_missing(section, primary=True):
        return Check(name, FAIL, missing, _PYTHON)
    answer = section.answer
    if answer is None:
        return Check(name, FAIL, _py_failure(section, "the env's python"), remedy)
    found = answer.get("version")
    if found == pinned:
        return Check(name, PASS, f"python {found} ({answer.get('executable')})")
    return Check(name, FAIL, f"env python is {found}, expected {pinned}", remedy)


def _torch_line(answer: Mapping[str, Any]) -> str:
    """``2.6.0+cu118 True (6, 1)``: version, is_available(), get_device_capability()."""
    text = f"{answer.get('version')} {answer.get('cuda_available')}"
    cap = answer.get("capability")
    if cap:
        text += f" ({cap[0]}, {cap[1]})"
    return text


def _torch_answer(ctx: CheckContext, name: str) -> tuple[dict[str, Any] | None, Check | None]:
    """The torch snippet's answer, or the FAIL saying why there is none."""
    remedy = force_reinstall("torch", _PYTHON)
    section = ctx.answers.section("torch")
    if section is None:
        return None, no_answer(name, "import torch", remedy)
    if missing := _python_missing(section):
        return None, Check(name, FAIL, missing, _PYTHON)
    answer = section.answer
    if answer is None:
        return None, Check(name, FAIL, _py_failure(section, "import torch"), remedy)
    if answer.get("error"):
        return None, Check(name, FAIL, f"import torch failed: {answer['error']}", remedy)
    return answer, None


def torch_version(ctx: CheckContext) -> Check:
    name = "torch version"
    pinned = ctx.spec.torch.version
    answer, problem = _torch_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    found = answer.get("version")
    if found == pinned:
        return Check(name, PASS, _torch_line(answer))
    return Check(
        name,
        FAIL,
        f"torch {found} in the env, expected {pinned}",
        force_reinstall("torch", _PYTHON),
    )


def _gpu_skip(ctx: CheckContext, name: str) -> Check | None:
    """SKIP for checks that need a real GPU behind a CUDA torch."""
    if ctx.sim:
        return Check(name, SKIP, f"{SIMULATED}: no real GPU behind torch.cuda")
    if not _is_cuda_build(ctx.spec.torch.version):
        return Check(
            name,
            SKIP,
            f"the torch pin {ctx.spec.torch.version} is a CPU build: no CUDA to check",
        )
    return None


def torch_cuda(ctx: CheckContext) -> Check:
    name = "torch cuda"
    if skip := _gpu_skip(ctx, name):
        return skip
    answer, problem = _torch_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    if answer.get("cuda_available") is True:
        return Check(
            name,
            PASS,
            f"torch.cuda.is_available() True: {answer.get('device_count')} device(s), "
            f"CUDA {answer.get('cuda_version')}",
        )
    return Check(
        name,
        FAIL,
        f"torch.cuda.is_available() is {answer.get('cuda_available')} "
        f"(torch {answer.get('version')}, torch.version.cuda {answer.get('cuda_version')})",
        "nvidia-smi must answer first (driver loaded: see nvidia-smi driver); torch must be the "
        f"{ctx.spec.torch.version} build ({force_reinstall('torch', _PYTHON)}); "
        "CUDA_VISIBLE_DEVICES must not hide the GPUs",
    )


def torch_capability(ctx: CheckContext) -> Check:
    name = "torch capability"
    if skip := _gpu_skip(ctx, name):
        return skip
    if ctx.lowest is None:
        return Check(name, SKIP, "no known GPU in the PCI facts to compare with (see gpus)")
    answer, problem = _torch_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    if answer.get("cuda_available") is not True:
        return Check(name, SKIP, "torch.cuda is not available (see torch cuda)")
    caps = [tuple(c) for c in answer.get("capabilities") or [] if len(c) == 2]
    device0 = answer.get("capability")
    if not caps and device0:
        caps = [tuple(device0)]
    if not caps:
        return Check(
            name, FAIL, "torch reported no device capability", force_reinstall("torch", _PYTHON)
        )
    lowest_torch = min(caps)
    shown = f"({device0[0]}, {device0[1]})" if device0 else _cc(lowest_torch)
    if lowest_torch == tuple(ctx.lowest):
        return Check(
            name,
            PASS,
            f"torch.cuda.get_device_capability() {shown}; lowest {_cc(lowest_torch)} = "
            f"lowest on the PCI bus {_cc(ctx.lowest)}",
        )
    return Check(
        name,
        FAIL,
        f"torch sees lowest capability {_cc(lowest_torch)} (device 0: {shown}), the PCI facts "
        f"say {_cc(ctx.lowest)}",
        "torch does not see the GPUs the host has: check CUDA_VISIBLE_DEVICES and "
        "`nvidia-smi -L`; a GPU the driver does not bind is missing here",
    )


def _apex_answer(ctx: CheckContext, name: str) -> tuple[dict[str, Any] | None, Check | None]:
    remedy = force_reinstall("apex", _PYTHON)
    section = ctx.answers.section("apex")
    if section is None:
        return None, no_answer(name, "import apex", remedy)
    if missing := _python_missing(section):
        return None, Check(name, FAIL, missing, _PYTHON)
    answer = section.answer
    if answer is None:
        return None, Check(name, FAIL, _py_failure(section, "import apex"), remedy)
    return answer, None


def apex(ctx: CheckContext) -> Check:
    name = "apex"
    answer, problem = _apex_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    bad = [f"import {m}: {answer.get(m)}" for m in ("apex", "apex_C") if answer.get(m) != "ok"]
    if not bad:
        return Check(name, PASS, "import apex, apex_C: ok")
    return Check(name, FAIL, "; ".join(bad), force_reinstall("apex", _PYTHON))


def _apex_cuda_ext(ctx: CheckContext) -> bool:
    cuda_ext = getattr(ctx.spec.apex, "cuda_ext", None)
    return _is_cuda_build(ctx.spec.torch.version) if cuda_ext is None else bool(cuda_ext)


def apex_cuda(ctx: CheckContext) -> Check:
    name = "apex cuda ext"
    if not _apex_cuda_ext(ctx):
        return Check(
            name,
            SKIP,
            f"the torch pin {ctx.spec.torch.version} is a CPU build: Apex is built without "
            "CUDA extensions",
        )
    if ctx.sim:
        return Check(name, SKIP, f"{SIMULATED}: the lab's Apex has no CUDA extensions")
    answer, problem = _apex_answer(ctx, name)
    if problem is not None:
        return problem
    assert answer is not None
    modules = ("amp_C", "fused_layer_norm_cuda")
    bad = [f"import {m}: {answer.get(m)}" for m in modules if answer.get(m) != "ok"]
    if not bad:
        return Check(name, PASS, "import amp_C, fused_layer_norm_cuda: ok")
    return Check(
        name,
        FAIL,
        "; ".join(bad),
        f"Apex was built without its CUDA extensions or against another torch: "
        f"{force_reinstall('apex', _PYTHON)} (CUDA_HOME = {ctx.spec.paths.cuda_dir})",
    )


def apex_key(ctx: CheckContext) -> Check:
    name = "apex build key"
    if ctx.apex_key is None:
        return Check(name, SKIP, "no expected build key (no known GPU in the PCI facts)")
    section = ctx.answers.section("apex-key")
    remedy = force_reinstall("apex", _PYTHON)
    if section is None:
        return no_answer(name, "the Apex build key", remedy)
    missing = section.get("missing")
    if missing:
        return Check(name, FAIL, f"no Apex build key recorded ({missing})", remedy)
    found = section.get("key")
    if found == ctx.apex_key:
        return Check(name, PASS, f"built for {found}")
    return Check(
        name,
        FAIL,
        f"Apex installed is built for {found}, the spec needs {ctx.apex_key}",
        remedy,
    )


def verl_version(ctx: CheckContext) -> Check:
    name = "verl version"
    pinned = ctx.spec.verl.version
    remedy = force_reinstall("verl", _PYTHON)
    section = ctx.answers.section("verl")
    if section is None:
        return no_answer(name, "import verl", remedy)
    if missing := _python_missing(section):
        return Check(name, FAIL, missing, _PYTHON)
    answer = section.answer
    if answer is None:
        return Check(name, FAIL, _py_failure(section, "import verl"), remedy)
    if answer.get("error"):
        return Check(name, FAIL, f"import verl failed: {answer['error']}", remedy)
    found = answer.get("version")
    if _same_version(found, pinned):
        return Check(name, PASS, f"verl {found} ({answer.get('file')})")
    return Check(name, FAIL, f"verl.__version__ is {found}, expected {pinned}", remedy)


def verl_checkout(ctx: CheckContext) -> Check:
    name = "verl checkout"
    pin = ctx.spec.verl
    remedy = _PYTHON + f" (checks out {pin.ref} = {pin.commit[:12]})"
    section = ctx.answers.section("verl-git")
    if section is None:
        return no_answer(name, "the verl checkout", remedy)
    missing = section.get("missing")
    if missing:
        what = "git is not installed" if missing == "git" else f"no verl checkout at {missing}"
        return Check(name, FAIL, what, remedy)
    head = section.get("head") or ""
    ref = section.get("ref") or ""
    if not head:
        return Check(name, FAIL, "the verl checkout is not a git repository", remedy)
    if head != pin.commit:
        return Check(
            name,
            FAIL,
            f"HEAD is {head[:12]}, the spec pins {pin.ref} = {pin.commit[:12]}",
            remedy,
        )
    if ref and ref != pin.commit:
        return Check(
            name,
            FAIL,
            f"HEAD is the pinned commit but {pin.ref} resolves to {ref[:12]} in the checkout",
            "fix stack.verl.ref/commit (they must name the same commit) or the moved tag",
        )
    note = "" if ref else f" ({pin.ref} is not a ref in the checkout)"
    return Check(name, PASS, f"at {pin.ref} = {pin.commit[:12]}{note}")


def verl_patches(ctx: CheckContext) -> Check:
    from p40fleet import verl_patches

    name = "verl patches"
    pin = ctx.spec.verl
    remedy = f"{_PYTHON} (applies the patch rules for the host's GPU profile)"
    if ctx.profile is None:
        return Check(name, SKIP, "no GPU profile (see gpus)")
    try:
        rules = verl_patches.rule_set(pin.ref, ctx.profile)
    except verl_patches.VerlPatchError as exc:
        return Check(
            name,
            FAIL,
            str(exc),
            "pin a verl ref that has a rule set for this profile (p40fleet/verl_patches.py)",
        )
    expected_ids = [r.id for r in rules.rules]
    section = ctx.answers.section("verl-patches")
    if section is None:
        return no_answer(name, "the verl patch record", remedy)
    git = ctx.answers.section("verl-git")
    modified = set(git.values("modified")) if git else set()
    record_missing = section.get("missing")
    answer = section.answer
    if record_missing:
        if expected_ids:
            return Check(
                name,
                FAIL,
                f"no patch record {record_missing}: the {len(expected_ids)} {ctx.profile} "
                f"rules for {pin.ref} are not applied",
                remedy,
            )
        if modified:
            return Check(
                name,
                FAIL,
                f"local edits in the verl checkout: {', '.join(sorted(modified))}",
                "save them elsewhere, restore with `git checkout -- <files>` and "
                + _PYTHON.removeprefix("run "),
            )
        return Check(name, PASS, f"no patch rules for {ctx.profile} at {pin.ref}; none recorded")
    if answer is None or answer.get("error"):
        why = (answer or {}).get("error") or _py_failure(section, "reading the record")
        return Check(name, FAIL, f"unreadable patch record: {why}", remedy)
    recorded_ids = list(answer.get("rule_ids") or [])
    if (answer.get("ref"), answer.get("profile")) != (pin.ref, ctx.profile) or (
        recorded_ids != expected_ids
    ):
        return Check(
            name,
            FAIL,
            f"recorded: {len(recorded_ids)} rules for {answer.get('ref')}/"
            f"{answer.get('profile')}; expected: {len(expected_ids)} rules for "
            f"{pin.ref}/{ctx.profile}",
            remedy,
        )
    files: dict[str, str] = answer.get("files") or {}
    found: dict[str, str | None] = answer.get("found") or {}
    drifted = sorted(rel for rel, sha in files.items() if found.get(rel) != sha)
    edits = sorted(modified - set(files))
    if drifted or edits:
        return Check(
            name,
            FAIL,
            "local edits in the verl checkout: " + ", ".join(drifted + edits),
            "save them elsewhere, restore with `git checkout -- <files>` and "
            + _PYTHON.removeprefix("run "),
        )
    if not expected_ids:
        return Check(name, PASS, f"no patch rules for {ctx.profile} at {pin.ref}")
    return Check(
        name,
        PASS,
        f"{len(expected_ids)} {ctx.profile} rules for {pin.ref} applied, "
        f"{len(files)} patched files intact",
    )


# --- the training path ----------------------------------------------------------------------

_TRAINING = "run `pyinfra -y INVENTORY deploy/training.py`"


def _py_section(
    ctx: CheckContext, name: str, section_name: str, what: str, remedy: str
) -> tuple[dict[str, Any] | None, Check | None]:
    """A Python section's answer, or the FAIL saying why there is none."""
    section = ctx.answers.section(section_name)
    if section is None:
        return None, no_answer(name, what, remedy)
    if missing := _python_missing(section):
        return None, Check(name, FAIL, missing, _PYTHON)
    answer = section.answer
    if answer is None:
        return None, Check(name, FAIL, _py_failure(section, what), remedy)
    if answer.get("error") and len(answer) == 1:
        return None, Check(name, FAIL, f"{what} failed: {answer['error']}", remedy)
    return answer, None


def trainer_modules(ctx: CheckContext) -> Check:
    name = "trainer modules"
    variant = ctx.spec.verl.requirements or "the env's"
    remedy = force_reinstall("verl", _PYTHON)
    answer, problem = _py_section(ctx, name, "trainer", "the verl trainer imports", remedy)
    if problem is not None:
        return problem
    assert answer is not None
    modules: dict[str, Any] = answer.get("modules") or {}
    if not modules:
        return Check(name, FAIL, "the probe imported no trainer module", remedy)
    bad = {m: r for m, r in modules.items() if not (isinstance(r, dict) and r.get("ok"))}
    if not bad:
        return Check(name, PASS, "import " + ", ".join(modules) + ": ok")
    missing = sorted({r.get("missing") for r in bad.values() if isinstance(r, dict)} - {None})
    detail = "; ".join(
        f"import {m}: {r.get('error') if isinstance(r, dict) else r}" for m, r in bad.items()
    )
    if missing:
        fix = (
            f"the env lacks {', '.join(missing)}: verl's runtime needs it pinned in "
            f"files/verl-requirements-{variant}.txt (the lab: and in its wheelhouse), then "
            + remedy.removeprefix("run ")
        )  # fmt: skip
    else:
        fix = remedy
    return Check(name, FAIL, detail, fix)


def launch_overrides(ctx: CheckContext) -> Check:
    """The overrides ``~/launch-ppo.sh`` passes compose with the installed verl's config, and
    the script reads the model and data the other training checks looked at: what users run,
    read from the script itself (not re-derived from the plan)."""
    name = "launch overrides"
    target = ctx.training
    if target is None:
        return Check(name, SKIP, "no launch plan was given to verify against")
    if target.problem:
        return Check(
            name, FAIL, f"no launch plan for this host: {target.problem}",
            "run `pyinfra -y INVENTORY deploy/facts.py` and fix what it reports",
        )  # fmt: skip
    remedy = force_reinstall("verl", _PYTHON)
    answer, problem = _py_section(ctx, name, "compose", "composing verl's config", remedy)
    if problem is not None:
        return problem
    assert answer is not None
    script = answer.get("script")
    rewrite = f"{_TRAINING} (it writes {script} from this host's plan)"
    if answer.get("absent"):
        return Check(name, FAIL, f"no launch script {script}", rewrite)
    if answer.get("unreadable"):
        return Check(name, FAIL, f"{script}: {answer['unreadable']}", rewrite)
    planned = {
        "python": target.python,
        "entry_point": ENTRY_POINT,
        "model_path": target.model_path,
        "train_file": target.train_file,
        "val_file": target.val_file,
    }
    drift = [
        f"{key.upper() if key != 'entry_point' else 'python -m'} {answer.get(key)!r} "
        f"(the plan: {path!r})"
        for key, path in planned.items()
        if path is not None and answer.get(key) != path
    ]
    if drift:
        return Check(
            name, FAIL, f"{script} does not run what this host's plan says: "
            + "; ".join(drift), rewrite,
        )  # fmt: skip
    where = answer.get("config_dir")
    if answer.get("ok") is True:
        return Check(
            name, PASS, f"{answer.get('count')} overrides of {script} compose with "
            f"verl's ppo_trainer config ({where}) and resolve",
        )  # fmt: skip
    fix = (
        f"p40fleet/launch.py renders an override the installed verl ({ctx.spec.verl.ref}) does "
        "not accept: derive it for this verl ref, or pin the verl the plan is written for; "
        "meanwhile pass a replacement as an argument to launch-ppo.sh"
    )
    if answer.get("base_error"):
        return Check(
            name, FAIL, f"verl's own config does not compose ({where}): {answer['base_error']}",
            remedy,
        )  # fmt: skip
    bad: dict[str, str] = answer.get("bad") or {}
    if bad:
        return Check(name, FAIL, "; ".join(f"{o}: {e}" for o, e in bad.items()), fix)
    return Check(name, FAIL, f"the overrides together: {answer.get('error')}", fix)


def _inputs_remedy(ctx: CheckContext, which: str, path: str) -> str:
    archive = getattr(ctx.spec.training, which).archive
    if archive is not None:
        return f"{_TRAINING} (it unpacks {archive.filename} into {path})"
    if which == "model":
        return (
            f"save the Hugging Face model into {path} (config.json, tokenizer, weights), "
            f"or set stack.training.model.archive and {_TRAINING}"
        )
    return (
        f"prepare the parquet files in {path} (for GSM8K: verl's "
        f"examples/data_preprocess/gsm8k.py --local_dir {path}), or set "
        f"stack.training.data.archive and {_TRAINING}"
    )


def model_files(ctx: CheckContext) -> Check:
    name = "model files"
    target = ctx.training
    if target is None:
        return Check(name, SKIP, "no launch plan was given to verify against")
    path = target.model_path
    remedy = _inputs_remedy(ctx, "model", path)
    answer, problem = _py_section(ctx, name, "model", f"the model {path}", remedy)
    if problem is not None:
        return problem
    assert answer is not None
    if answer.get("path") != path:
        return Check(name, FAIL, f"the probe looked at {answer.get('path')}, not {path}",
                     "run verify again")  # fmt: skip
    if not answer.get("exists"):
        return Check(name, FAIL, f"no model directory {path}", remedy)
    lacking = model_dir_problems(answer.get("files") or [])
    if lacking:
        return Check(name, FAIL, f"{path} lacks {', '.join(lacking)}", remedy)
    if answer.get("config_error"):
        return Check(name, FAIL, f"{path}/config.json: {answer['config_error']}", remedy)
    if answer.get("tokenizer_error"):
        return Check(
            name, FAIL, f"the tokenizer in {path} does not load: {answer['tokenizer_error']}",
            remedy,
        )  # fmt: skip
    return Check(
        name, PASS, f"{path}: config.json ({answer.get('model_type')}), tokenizer "
        f"({answer.get('tokens')} tokens), weights",
    )  # fmt: skip


def data_files(ctx: CheckContext) -> Check:
    name = "data files"
    target = ctx.training
    if target is None:
        return Check(name, SKIP, "no launch plan was given to verify against")
    section = ctx.answers.section("training-data")
    directory = target.train_file.rsplit("/", 1)[0]
    remedy = _inputs_remedy(ctx, "data", directory)
    if section is None:
        return no_answer(name, "the data files", remedy)
    found: dict[str, tuple[str, str]] = {}
    for line in section.raw:
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[0] == "found":
            found[parts[3]] = (parts[1], parts[2].removesuffix("_"))
    wanted = list(dict.fromkeys((target.train_file, target.val_file)))
    missing = [f for f in wanted if f not in found]
    if missing:
        return Check(name, FAIL, "missing: " + ", ".join(missing), remedy)
    empty = [f for f in wanted if found[f][0] in ("", "0")]
    not_parquet = [f for f in wanted if f.endswith(".parquet") and found[f][1] != "PAR1"]
    if empty or not_parquet:
        what = [f"{f} is empty" for f in empty]
        what += [f"{f} is not a parquet file" for f in not_parquet if f not in empty]
        return Check(name, FAIL, "; ".join(what), remedy)
    return Check(name, PASS, ", ".join(f"{f} ({found[f][0]} bytes)" for f in wanted))
