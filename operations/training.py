"""Training inputs on a host (model and data from ``stack.training``) and its launch script.

Staging (``stage``): for a model or dataset with an ``archive``, download it into the artifact
cache (``operations.artifacts.fetch``: sha256 checked before it gets its name), then, AS THE
TRAINING USER (root only opens its own cached archive and streams it to the user's ``tar``: it
never acts in the user's directories, N2), unpack it into a temporary directory beside the
target, check it holds what training needs (``p40fleet.training``), write the marker (the
archive's sha256) and rename it into place. A directory whose marker holds the pinned sum and
whose files are all there is left alone: a re-run downloads nothing and changes nothing. A
directory there without a marker is the admin's: refused, never overwritten. Without an archive
nothing is staged: the admin puts the directory there; the run warns when it is incomplete,
verify FAILs naming the path, and the launch script refuses to start.

The launch script (``launch_script``: ``~/launch-ppo.sh``, rendered from
``files/launch-ppo.sh.j2``) is sized from the model's ``config.json``. pyinfra reads facts when
the deploy file loads, before this run's staging has unpacked anything; pyinfra 3 calls an
operation's body again when it executes (facts are read afresh there), so the plan is made
inside the body: on the first run the script is written from the config.json staging just
unpacked, not from a guess. The training user writes it (``operations.util.as_user.put_as``:
root stages it outside the home); an identical file (same sha1, mode, owner, as the user reads
it) changes nothing.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import Directory
from pyinfra.facts.server import Users

from p40fleet.facts.driver import NvidiaSmi
from p40fleet.facts.gpu import PciGpus
from p40fleet.facts.home import UserFile
from p40fleet.facts.survey import Part, ask, part
from p40fleet.facts.training import ModelConfig, StagedDir, StagedDirState
from p40fleet.launch import ClusterShape, LaunchError, LaunchPlan, plan_launch
from p40fleet.operations import artifacts
from p40fleet.operations.refuse import refuse
from p40fleet.operations.util.as_user import as_user, put_as
from p40fleet.operations.util.unchanged import rendered, same_user_file
from p40fleet.paths import FILES
from p40fleet.spec import StackSpec
from p40fleet.training import (
    MARKER,
    MODEL_CONFIG,
    TOKENIZER_FILES,
    WEIGHT_PATTERNS,
    TrainingTarget,
    data_dir_problems,
    model_dir_problems,
    staged_dir,
)

__all__ = [
    "SCRIPT_NAME",
    "TEMPLATE",
    "gpu_memory_mib",
    "host_plan",
    "launch_script",
    "missing",
    "needs_staging",
    "script_path",
    "stage",
    "training_target",
    "survey_parts",
    "write_launch_script",
]

SCRIPT_NAME = "launch-ppo.sh"
TEMPLATE = str(FILES / "launch-ppo.sh.j2")


def script_path(home: str, name: str = SCRIPT_NAME) -> str:
    """``<home>/launch-ppo.sh``."""
    return posixpath.join(home, name)


def missing(spec: StackSpec, which: str, state: StagedDirState) -> list[str]:
    """What the directory of ``which`` (``model``/``data``) lacks; ``[]`` when complete."""
    if not state.exists:
        return [f"the directory {staged_dir(spec, which)}"]
    if which == "model":
        return model_dir_problems(state.files)
    data = spec.training.data
    return data_dir_problems(state.files, data.train_file, data.val_file)


def needs_staging(spec: StackSpec, which: str, target: Any = None) -> bool:
    """True when ``stage`` would unpack ``which`` on this host now (it has an archive that is
    not staged, or a staged copy that lost files)."""
    archive = getattr(spec.training, which).archive
    if archive is None:
        return False
    state = ask(
        host if target is None else target,
        StagedDir,
        path=staged_dir(spec, which),
        user=spec.user.name,
    )
    return state.marker != archive.sha256.lower() or bool(missing(spec, which, state))


def _complete_test(which: str, spec: StackSpec) -> str:
    """A shell test that holds when ``$src`` has what :func:`missing` asks for."""
    if which == "model":
        tokenizer = " || ".join(f'[ -s "$src/{f}" ]' for f in TOKENIZER_FILES)
        weights = " ".join(f'"$src"/{p}' for p in WEIGHT_PATTERNS)
        return (
            f'[ -s "$src/{MODEL_CONFIG}" ] && {{ {tokenizer}; }} && '
            f'{{ for w in {weights}; do [ -s "$w" ] && exit 0; done; exit 1; }}'
        )
    data = spec.training.data
    return " && ".join(
        f'[ -s "$src"/{_sq(f)} ]' for f in dict.fromkeys((data.train_file, data.val_file))
    )


def _sq(value: str) -> str:
    return shlex.quote(value)


def _tar_flag(filename: str) -> str:
    """GNU tar's decompression option for ``filename`` (it cannot guess one on stdin)."""
    for suffixes, flag in (
        ((".tar.gz", ".tgz"), " -z"),
        ((".tar.xz", ".txz"), " -J"),
        ((".tar.bz2", ".tbz2"), " -j"),
        ((".tar.zst", ".tzst"), " --zstd"),
    ):
        if filename.lower().endswith(suffixes):
            return flag
    return ""


def _unpack_script(which: str, spec: StackSpec, dest: str) -> str:
    """sh run AS the training user, the archive on its stdin: unpack into
    ``.NAME.p40fleet-staging`` beside ``dest``, check, mark, rename (no chown: the user made
    every file)."""
    archive = getattr(spec.training, which).archive
    assert archive is not None
    user = spec.user.name
    base, name = posixpath.split(dest)
    tmp = posixpath.join(base, f".{name}.p40fleet-staging")
    old = posixpath.join(base, f".{name}.p40fleet-old")
    what = "config.json, a tokenizer and weights" if which == "model" else "the data files"
    expected = (
        f"{MODEL_CONFIG}, one of {', '.join(TOKENIZER_FILES)} and {' or '.join(WEIGHT_PATTERNS)}"
        if which == "model"
        else " and ".join(dict.fromkeys((spec.training.data.train_file,
                                         spec.training.data.val_file)))
    )  # fmt: skip
    lacks = (
        f"{archive.filename} does not hold {what} at its top (or in its one top directory): "
        f"expected {expected}. Remedy: rebuild the archive, or fix "
        f"stack.training.{which} (name, files, archive.sha256)"
    )
    cannot = (
        f"{user} cannot create {base}: make it a directory of {user}'s "
        f"(install -d -o {user} -g {user} {base}) and re-run"
    )
    q = _sq
    # A single top directory holds the files (tar cf m.tar NAME/); else the top is the dir.
    # The check runs in a subshell so its `exit` ends only the test.
    return "\n".join(
        [
            "set -e",
            f"mkdir -p {q(base)} || {{ echo {q(cannot)} >&2; exit 1; }}",
            f"rm -rf {q(tmp)} {q(old)}",
            f"mkdir {q(tmp)}",
            f"tar -xf -{_tar_flag(archive.filename)} -C {q(tmp)} --no-same-owner",
            f"src={q(tmp)}",
            f"set -- {q(tmp)}/* {q(tmp)}/.[!.]*",
            'if [ "$#" -ge 1 ] && [ -d "$1" ] && [ ! -L "$1" ]; then',
            '    n=0; for e in "$@"; do [ -e "$e" ] && n=$((n + 1)); done',
            '    [ "$n" -eq 1 ] && src=$1',
            "fi",
            f"if ! ( {_complete_test(which, spec)} ); then",
            f"    rm -rf {q(tmp)}; echo {q(lacks)} >&2; exit 1",
            "fi",
            f'echo {q(archive.sha256.lower() + "  " + archive.filename)} > "$src/{MARKER}"',
            f"if [ -e {q(dest)} ]; then mv {q(dest)} {q(old)}; fi",
            f'mv "$src" {q(dest)}',
            f"rm -rf {q(tmp)} {q(old)}",
        ]
    )


@operation()
def stage(which: str, spec: StackSpec):
    """
    Stage ``stack.training.<which>`` (``model`` or ``data``) from its archive, once.

    + which: ``model`` (into env.model_dir/<name>) or ``data`` (into env.data_dir/<name>)
    + spec: the host's StackSpec (archive, mirror, training user, artifact cache)

    No archive: changes nothing (warns when the directory is incomplete; verify FAILs).
    """
    inputs = getattr(spec.training, which)
    archive = inputs.archive
    dest = staged_dir(spec, which)
    state = ask(host, StagedDir, path=dest, user=spec.user.name)
    lacking = missing(spec, which, state)
    if archive is None:
        if lacking:
            host.log(
                f"training {which} {dest} lacks {', '.join(lacking)} and stack.training.{which} "
                "has no archive to stage it from: put it there (verify FAILs until then)"
            )
        else:
            host.noop(f"training {which} {dest} is there (no archive to stage)")
        return
    sha256 = archive.sha256.lower()
    if state.marker == sha256 and not lacking:
        host.noop(f"training {which} {dest} is staged from {archive.filename} ({sha256[:12]}…)")
        return
    if state.exists and state.marker is None and state.files:
        yield from refuse._inner(
            step=f"stage training {which}",
            reason=f"{dest} exists and was not unpacked from an archive by p40fleet (no "
            f"{MARKER} in it): it is not overwritten",
            remedy=f"move {dest} away so {archive.filename} can be unpacked there, or drop "
            f"stack.training.{which}.archive to train on the directory as it is",
        )
        return
    if state.marker == sha256:
        host.log(f"training {which} {dest} lost {', '.join(lacking)}: unpacking it again")
    url = spec.training_archive_url(which)
    assert url is not None  # the spec refuses an archive without a URL or a mirror
    cache = spec.paths.artifact_cache
    yield from artifacts.fetch._inner(
        url=url, sha256=sha256, dest_dir=cache, filename=archive.filename, size=archive.size,
        proxy=spec.proxy,
    )  # fmt: skip
    script = _unpack_script(which, spec, dest)
    # Root opens its own checked copy; the user's tar reads it on stdin (N2).
    yield StringCommand(
        as_user(spec.user.name, StringCommand(script)),
        "<",
        QuoteString(posixpath.join(cache, archive.filename)),
    )


def gpu_memory_mib(gpu_count: int, target: Any = None) -> list[int | None]:
    """nvidia-smi's ``memory.total`` per GPU, or ``[]`` when it does not answer for all of them."""
    smi = ask(host if target is None else target, NvidiaSmi)
    if not smi.ok or len(smi.gpus) != gpu_count:
        return []
    return [gpu.memory_mib for gpu in smi.gpus]


def host_plan(
    spec: StackSpec,
    target: Any = None,
    model_config: Mapping | None | bool = False,
    cluster: ClusterShape | None = None,
) -> LaunchPlan:
    """This host's launch plan from its facts (GPUs, nvidia-smi memory, the model's config.json;
    ``model_config=False``: read it now). Raises ``LaunchError`` when the host gets none.
    The one place a host's plan is made: the launch script and verify both use it."""
    target = host if target is None else target
    gpus = list(ask(target, PciGpus))
    if model_config is False:
        model_config = ask(target, ModelConfig, path=staged_dir(spec, "model"), user=spec.user.name)
    return plan_launch(
        spec,
        gpus,
        smi_memory_mib=gpu_memory_mib(len(gpus), target),
        model_config=model_config or None,
        cluster=cluster,
        host=getattr(target, "name", None) if cluster is not None else None,
    )


def training_target(spec: StackSpec, target: Any = None) -> TrainingTarget:
    """What verify checks this host against: its launch plan's overrides and paths (read from
    its facts now), or the reason it has no plan."""
    try:
        return TrainingTarget.from_plan(host_plan(spec, target))
    except LaunchError as exc:
        return TrainingTarget.unplanned(spec, str(exc))


@operation()
def launch_script(
    spec: StackSpec,
    make_plan: Callable[[Mapping | None], LaunchPlan],
    user_queued: bool = False,
    model_queued: bool = False,
):
    """
    Write the training user's ``~/launch-ppo.sh`` from the plan for this host's model.

    + spec: the host's StackSpec
    + make_plan: the model's parsed config.json (or None) -> this host's ``LaunchPlan``
    + user_queued: an earlier operation of this run creates the training user
    + model_queued: an earlier operation of this run stages the model (see the module doc)
    """
    model_dir = staged_dir(spec, "model")
    config = ask(host, ModelConfig, path=model_dir, user=spec.user.name)
    if config is None and model_queued:
        # Before staging ran (pyinfra's first pass): the body runs again once it has; should
        # config.json still be missing then, this command stops the host saying so.
        config_path = posixpath.join(model_dir, MODEL_CONFIG)
        yield StringCommand(
            "test", "-s", QuoteString(config_path), "||", "{", "echo",
            QuoteString(f"no {config_path} after staging the model: the launch script is "
                        "sized from it; check stack.training.model.archive"),
            ">&2;", "exit", "1;", "}",
        )  # fmt: skip
        return
    try:
        plan = make_plan(config)
    except LaunchError as exc:
        yield from refuse._inner(
            step="launch script",
            reason=str(exc),
            remedy="run deploy/facts.py and fix what it reports",
        )
        return
    yield from write_launch_script(
        plan=plan, user=spec.user.name, home=spec.user.home, user_queued=user_queued
    )


def write_launch_script(
    plan: LaunchPlan, user: str, home: str, name: str = SCRIPT_NAME, user_queued: bool = False
):
    """
    The commands of :func:`launch_script` once the plan is made (not an operation): write
    ``<home>/<name>`` (mode 755, owned by ``user``) running verl's PPO per ``plan``.

    + plan: the host's launch plan (``p40fleet.launch.plan_launch``)
    + user: the training user (owner and group of the script)
    + home: the training user's home, where the script goes
    + name: the script's file name
    + user_queued: an earlier operation of this run creates the user and home (deploy/full.py)

    Refuses the host (changes nothing) when the user or its home does not exist yet: the
    Python layer (deploy/python.py) creates both.
    """
    if not user_queued and user not in ask(host, Users):
        yield from refuse._inner(
            step="launch script",
            reason=f"training user {user} does not exist",
            remedy="run deploy/python.py first (it creates the training user)",
        )
        return
    if not user_queued and not ask(host, Directory, path=home):
        yield from refuse._inner(
            step="launch script",
            reason=f"home directory {home} of training user {user} does not exist",
            remedy="run deploy/python.py first (it creates the training user and its home)",
        )
        return
    values = plan.template_vars()
    dest = script_path(home, name)
    text = rendered(TEMPLATE, **values)
    if same_user_file(dest, text, user, "755"):
        return
    if ask(host, UserFile, path=dest, user=user).kind == "dir":
        yield from refuse._inner(
            step="launch script",
            reason=f"{dest} is a directory where the launch script goes",
            remedy=f"as {user}, move it away (mv {dest} {dest}.moved) and re-run",
        )
        return
    yield from put_as(user, text, dest, "755")


def survey_parts(spec: StackSpec) -> list[Part]:
    """The facts this module asks on a converged host: :func:`stage`, :func:`needs_staging`,
    :func:`host_plan` and :func:`launch_script` (``operations.run.survey``)."""
    user = spec.user
    by_user = {"user": user.name}
    model = staged_dir(spec, "model")
    return [
        part(StagedDir, path=model, **by_user),
        part(StagedDir, path=staged_dir(spec, "data"), **by_user),
        part(ModelConfig, path=model, **by_user),
        part(PciGpus),
        part(NvidiaSmi),
        part(Users),  # a user not queued by this run
        part(Directory, path=user.home),
        part(UserFile, path=script_path(user.home), user=user.name),
    ]
