"""Training inputs: where the model and the data live on a host, and what makes them complete.

Pure: no pyinfra, no I/O. ``operations/training.py`` stages them (``deploy/training.py``),
``p40fleet.verification`` verifies them from the probe's answers, ``p40fleet.launch`` names them in
the launch script. One rule for all three, so a staged directory that verify would FAIL is
never called staged.

Archive layout: a tar (any compression GNU tar reads) whose members are either the directory's
files, or one top directory holding them (``tar cf m.tar Qwen2.5-0.5B-Instruct/``); both unpack
to ``env.model_dir/<name>`` / ``env.data_dir/<name>``. A staged directory carries
:data:`MARKER` = the archive's sha256: the next run compares it and changes nothing.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass

from p40fleet.spec import StackSpec

__all__ = [
    "MARKER",
    "MODEL_CONFIG",
    "TOKENIZER_FILES",
    "WEIGHT_PATTERNS",
    "TrainingTarget",
    "data_dir_problems",
    "model_dir_problems",
    "staged_dir",
    "training_paths",
]

#: File in a staged directory holding the sha256 of the archive it was unpacked from.
MARKER = ".p40fleet-archive"
MODEL_CONFIG = "config.json"
#: Any one of these is a tokenizer transformers' AutoTokenizer can load.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
#: Any one of these is a weights file (a sharded model has an index plus shards).
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")

WHICH = ("model", "data")


def staged_dir(spec: StackSpec, which: str) -> str:
    """``env.model_dir/<model.name>`` or ``env.data_dir/<data.name>``."""
    if which == "model":
        return posixpath.join(spec.env.model_dir, spec.training.model.name)
    if which == "data":
        return posixpath.join(spec.env.data_dir, spec.training.data.name)
    raise KeyError(f"unknown training input {which!r} (known: {', '.join(WHICH)})")


def training_paths(spec: StackSpec) -> tuple[str, str, str]:
    """(model dir, train file, val file) on the host, from ``stack.training``."""
    data = staged_dir(spec, "data")
    return (
        staged_dir(spec, "model"),
        posixpath.join(data, spec.training.data.train_file),
        posixpath.join(data, spec.training.data.val_file),
    )


def model_dir_problems(names: Iterable[str]) -> list[str]:
    """What a model directory with these top-level file names lacks (empty: complete)."""
    names = set(names)
    problems = []
    if MODEL_CONFIG not in names:
        problems.append(MODEL_CONFIG)
    if not names & set(TOKENIZER_FILES):
        problems.append("a tokenizer (" + " or ".join(TOKENIZER_FILES) + ")")
    if not any(fnmatch.fnmatch(n, p) for n in names for p in WEIGHT_PATTERNS):
        problems.append("weights (" + " or ".join(WEIGHT_PATTERNS) + ")")
    return problems


def data_dir_problems(names: Iterable[str], train_file: str, val_file: str) -> list[str]:
    """The data files missing from a data directory with these top-level file names."""
    names = set(names)
    return [f for f in dict.fromkeys((train_file, val_file)) if f not in names]


@dataclass(frozen=True)
class TrainingTarget:
    """What verify checks a host can train on: the launch plan's overrides and paths.

    ``problem`` is set (and ``overrides`` empty) when the host has no launch plan.
    """

    model_path: str
    train_file: str
    val_file: str
    overrides: tuple[str, ...] = ()
    problem: str | None = None
    python: str | None = None  #: the interpreter the launch script runs

    @classmethod
    def from_plan(cls, plan) -> TrainingTarget:
        """From a ``p40fleet.launch.LaunchPlan``."""
        return cls(
            plan.model_path, plan.train_file, plan.val_file, tuple(plan.overrides),
            python=plan.python,
        )  # fmt: skip

    @classmethod
    def unplanned(cls, spec: StackSpec, problem: str) -> TrainingTarget:
        """No plan (``problem`` says why): the paths still come from ``stack.training``."""
        return cls(*training_paths(spec), problem=problem)
