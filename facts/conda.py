"""Facts about the training user's Miniconda: the install at its prefix and its ToS plugin (the
env inside it: ``facts.env``).

Every command exits 0 whatever it finds (missing prefix, broken conda) and encodes the state in
its output, so gathering these facts never fails a host. Each runs as the training user ``user``
(``p40fleet.privdrop``, clean environment), never as root: conda is that user's to change. While
``user`` does not exist the answer is "missing".
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from p40fleet.facts.env import _MARK, _MISSING, _as
from p40fleet.jsonable import ToJson

__all__ = [
    "CONDA_BROKEN",
    "CONDA_HEALTHY",
    "CONDA_MISSING",
    "TOS_NO_CONDA",
    "TOS_NO_PLUGIN",
    "TOS_PLUGIN",
    "TOS_UNKNOWN",
    "CondaInstall",
    "CondaState",
    "CondaTos",
    "CondaTosState",
]

CONDA_MISSING = "missing"  # no prefix directory at all: fresh ``-b -p PREFIX``
CONDA_BROKEN = "broken"  # prefix exists but ``bin/conda --version`` fails: ``-b -u -p PREFIX``
CONDA_HEALTHY = "healthy"


def _marked(output: list[str]) -> list[str]:
    return [line[len(_MARK) :].strip() for line in output if line.startswith(_MARK)]


@dataclass(frozen=True)
class CondaState(ToJson):
    """Miniconda at a prefix: ``missing``, ``broken`` or ``healthy`` (with conda's version)."""

    state: str
    version: str | None = None

    @property
    def healthy(self) -> bool:
        return self.state == CONDA_HEALTHY


class CondaInstall(FactBase[CondaState]):
    """
    Returns the ``CondaState`` of a Miniconda prefix (runs ``PREFIX/bin/conda --version``).
    """

    @staticmethod
    @override
    def default() -> CondaState:
        return CondaState(CONDA_MISSING)

    @override
    def command(self, prefix: str, user: str) -> str:
        conda = QuoteString(f"{prefix.rstrip('/')}/bin/conda")
        return _as(user, StringCommand(
            "if [ ! -e",
            QuoteString(prefix),
            f"]; then echo '{_MARK} missing';",
            "elif out=$(",
            conda,
            "--version 2>&1); then",
            f'echo "{_MARK} healthy $out";',
            f"else echo '{_MARK} broken'; fi; true",
        ), _MISSING)  # fmt: skip

    @override
    def process(self, output: list[str]) -> CondaState:
        for line in _marked(output):
            words = line.split()
            if words and words[0] == CONDA_HEALTHY:
                # "conda 24.11.1" -> "24.11.1"
                return CondaState(CONDA_HEALTHY, words[-1] if len(words) > 1 else None)
            if words and words[0] in (CONDA_MISSING, CONDA_BROKEN):
                return CondaState(words[0])
        return CondaState(CONDA_BROKEN)


TOS_PLUGIN = "plugin"  # `conda tos --help` works: conda-anaconda-tos is installed
TOS_NO_PLUGIN = "no-plugin"  # `invalid choice: 'tos'`: a conda without it (Miniconda < 25.5.1)
TOS_NO_CONDA = "no-conda"  # PREFIX/bin/conda missing or not executable (not installed yet)
TOS_UNKNOWN = "unknown"  # conda failed some other way; ``detail`` has its last lines


@dataclass(frozen=True)
class CondaTosState(ToJson):
    """Whether the installed conda checks Anaconda's Terms of Service (the plugin is there)."""

    state: str
    detail: str | None = None


class CondaTos(FactBase[CondaTosState]):
    """
    Returns the ``CondaTosState`` of ``PREFIX/bin/conda`` (runs ``conda tos --help``).

    The ToS check is a plugin (``conda-anaconda-tos``, bundled from Miniconda 25.5.1); a conda
    without it rejects the subcommand with argparse's ``invalid choice: 'tos'`` (exit 2).
    """

    @staticmethod
    @override
    def default() -> CondaTosState:
        return CondaTosState(TOS_NO_CONDA)

    @override
    def command(self, prefix: str, user: str) -> str:
        conda = QuoteString(f"{prefix.rstrip('/')}/bin/conda")
        return _as(user, StringCommand(
            "if [ ! -x",
            conda,
            f"]; then echo '{_MARK} {TOS_NO_CONDA}';",
            "elif out=$(",
            conda,
            f"tos --help 2>&1); then echo '{_MARK} {TOS_PLUGIN}';",
            f'else echo "{_MARK} rc=$?"; printf "%s\\n" "$out" | tail -n 3; fi; true',
        ), f"echo '{_MARK} {TOS_NO_CONDA}'")  # fmt: skip

    @override
    def process(self, output: list[str]) -> CondaTosState:
        marked = _marked(output)
        if marked and marked[0] in (TOS_PLUGIN, TOS_NO_CONDA):
            return CondaTosState(marked[0])
        rest = [line for line in output if line.strip() and not line.startswith(_MARK)]
        text = "\n".join(rest)
        if "invalid choice: 'tos'" in text:
            return CondaTosState(TOS_NO_PLUGIN)
        rc = marked[0] if marked else "no marker"
        return CondaTosState(TOS_UNKNOWN, f"conda tos --help failed ({rc}): {text}".strip())
