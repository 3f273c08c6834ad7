"""Facts about the training user's conda layer: Miniconda, its ToS plugin, the env's python, the
env's distributions and the small marker files kept in the env (torch, Apex, verl read these).

Every command exits 0 whatever it finds (missing prefix, broken interpreter) and encodes the
state in its output, so gathering these facts never fails a host. Each runs as the training user
``user`` (``p40fleet.privdrop``, clean environment), never as root: the env and conda are that
user's to change. While ``user`` does not exist the answer is "missing".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from p40fleet.jsonable import ToJson
from p40fleet.privdrop import ENDED, as_user_script

__all__ = [
    "CONDA_BROKEN",
    "CONDA_HEALTHY",
    "CONDA_MISSING",
    "ENV_BROKEN",
    "ENV_MISSING",
    "ENV_OK",
    "TOS_NO_CONDA",
    "TOS_NO_PLUGIN",
    "TOS_PLUGIN",
    "TOS_UNKNOWN",
    "CondaInstall",
    "CondaState",
    "CondaTos",
    "CondaTosState",
    "Dist",
    "EnvDistributions",
    "EnvPython",
    "EnvPythonState",
    "MarkerText",
    "env_dir",
    "env_python",
    "normalize_name",
]

CONDA_MISSING = "missing"  # no prefix directory at all: fresh ``-b -p PREFIX``
CONDA_BROKEN = "broken"  # prefix exists but ``bin/conda --version`` fails: ``-b -u -p PREFIX``
CONDA_HEALTHY = "healthy"

ENV_MISSING = "missing"
ENV_BROKEN = "broken"  # env dir exists but its python does not run
ENV_OK = "ok"  # python runs; compare ``version`` with the pin

_MARK = "##p40fleet"
#: Bytes of a marker file a fact reads (markers hold a key or a sum: a few dozen bytes).
MARKER_LIMIT = 4096


def env_dir(prefix: str, name: str) -> str:
    """``PREFIX/envs/NAME``."""
    return f"{prefix.rstrip('/')}/envs/{name}"


def env_python(prefix: str, name: str) -> str:
    """The env's interpreter, ``PREFIX/envs/NAME/bin/python``."""
    return f"{env_dir(prefix, name)}/bin/python"


def normalize_name(name: str) -> str:
    """PEP 503 normal form of a distribution name (``Torch_Audio`` -> ``torch-audio``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _as(user: str, command: StringCommand, missing: str = "true") -> str:
    """``command`` run as the training user (``missing``: shell run while it does not exist)."""
    return as_user_script(user, command.get_raw_value(), missing)


#: Answer of a fact while the training user does not exist yet.
_MISSING = f"echo '{_MARK} missing'"


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


@dataclass(frozen=True)
class EnvPythonState(ToJson):
    """The env's interpreter: ``missing``/``broken``/``ok``; ``detail`` says what went wrong."""

    state: str
    version: str | None = None
    detail: str | None = None


class EnvPython(FactBase[EnvPythonState]):
    """
    Returns the ``EnvPythonState`` of ``PREFIX/envs/NAME/bin/python`` (runs it, never fails).
    """

    @staticmethod
    @override
    def default() -> EnvPythonState:
        return EnvPythonState(ENV_MISSING)

    @override
    def command(self, prefix: str, env_name: str, user: str) -> str:
        name = env_name
        probe = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
        return _as(user, StringCommand(
            "if [ ! -d",
            QuoteString(env_dir(prefix, name)),
            f"]; then echo '{_MARK} missing';",
            "elif out=$(",
            QuoteString(env_python(prefix, name)),
            "-c",
            QuoteString(probe),
            "2>&1); then",
            f'echo "{_MARK} ok $out";',
            f'else echo "{_MARK} broken"; printf "%s\\n" "$out" | tail -n 3; fi; true',
        ), _MISSING)  # fmt: skip

    @override
    def process(self, output: list[str]) -> EnvPythonState:
        lines = list(output)
        for index, line in enumerate(lines):
            if not line.startswith(_MARK):
                continue
            words = line[len(_MARK) :].split()
            if words and words[0] == ENV_OK and len(words) > 1:
                return EnvPythonState(ENV_OK, words[1])
            if words and words[0] == ENV_MISSING:
                return EnvPythonState(ENV_MISSING)
            detail = " ".join(x.strip() for x in lines[index + 1 :] if x.strip()) or None
            return EnvPythonState(ENV_BROKEN, detail=detail or "python did not run")
        ended = [line.split()[-1] for line in lines if line.startswith(ENDED)]
        if ended:
            return EnvPythonState(
                ENV_BROKEN, detail=f"the env's python did not answer in {ended[0]} s (ended)"
            )
        return EnvPythonState(ENV_BROKEN, detail="no output from the python probe")


@dataclass(frozen=True)
class Dist(ToJson):
    """One installed distribution: version and, for an editable install, its source dir."""

    version: str
    editable: str | None = None


_DISTS_PROBE = """
import importlib.metadata as m, json
out = {}
for d in m.distributions():
    name = d.metadata["Name"]
    if not name:
        continue
    editable = None
    try:
        info = json.loads(d.read_text("direct_url.json") or "{}")
        if info.get("dir_info", {}).get("editable"):
            editable = info.get("url", "").removeprefix("file://")
    except Exception:
        pass
    out[name] = [d.version, editable]
print(json.dumps(out))
""".strip()


class EnvDistributions(FactBase[dict[str, Dist]]):
    """
    Returns the distributions installed in an interpreter: ``{pep503-name: Dist}``.

    Uses ``importlib.metadata`` (no import of the packages themselves); ``{}`` when the
    interpreter is missing or broken.
    """

    default = dict

    @override
    def command(self, python: str, user: str) -> str:
        return _as(user, StringCommand(
            "if [ -x",
            QuoteString(python),
            "]; then",
            QuoteString(python),
            "-c",
            QuoteString(_DISTS_PROBE),
            "2>/dev/null; fi; true",
        ))  # fmt: skip

    @override
    def process(self, output: list[str]) -> dict[str, Dist]:
        for line in output:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                data = json.loads(line)
            except ValueError:
                return {}
            return {
                normalize_name(name): Dist(str(value[0]), value[1] or None)
                for name, value in data.items()
            }
        return {}


class MarkerText(FactBase[str | None]):
    """
    Returns the stripped text of a small marker file (its first ``MARKER_LIMIT`` bytes), or
    ``None`` when it is not a regular file (missing, a symlink, a device, a FIFO).
    """

    @override
    def command(self, path: str, user: str) -> str:
        q = QuoteString(path)
        return _as(user, StringCommand(
            "if [ -f", q, "] && [ ! -L", q,
            f"]; then echo '{_MARK} file'; head -c {MARKER_LIMIT}", q, "; fi; true",
        ))  # fmt: skip

    @override
    def process(self, output: list[str]) -> str | None:
        lines = list(output)
        if not lines or not lines[0].startswith(_MARK):
            return None
        return "\n".join(lines[1:]).strip()
