"""The training path's checks: trainer modules, launch overrides, model and data files."""

from __future__ import annotations

from typing import Any

from p40fleet.launch import ENTRY_POINT
from p40fleet.training import model_dir_problems
from p40fleet.verification.check import FAIL, PASS, SKIP, Check, force_reinstall, no_answer
from p40fleet.verification.checks._common import PYTHON, py_failure, python_missing
from p40fleet.verification.probe import CheckContext

_TRAINING = "run `pyinfra -y INVENTORY deploy/training.py`"


def _py_section(
    ctx: CheckContext, name: str, section_name: str, what: str, remedy: str
) -> tuple[dict[str, Any] | None, Check | None]:
    """A Python section's answer, or the FAIL saying why there is none."""
    section = ctx.answers.section(section_name)
    if section is None:
        return None, no_answer(name, what, remedy)
    if missing := python_missing(section):
        return None, Check(name, FAIL, missing, PYTHON)
    answer = section.answer
    if answer is None:
        return None, Check(name, FAIL, py_failure(section, what), remedy)
    if answer.get("error") and len(answer) == 1:
        return None, Check(name, FAIL, f"{what} failed: {answer['error']}", remedy)
    return answer, None


def trainer_modules(ctx: CheckContext) -> Check:
    name = "trainer modules"
    variant = ctx.spec.verl.requirements or "the env's"
    remedy = force_reinstall("verl", PYTHON)
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
    remedy = force_reinstall("verl", PYTHON)
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
