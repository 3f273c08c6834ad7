"""Facts about the training user's conda env: its python, its distributions and the small marker
files kept in it (torch, Apex, verl read these), and the helpers every fact run as that user
shares (``facts.conda``, ``facts.verl``).

Every command exits 0 whatever it finds (missing env, broken interpreter) and encodes the state
in its output, so gathering these facts never fails a host. Each runs as the training user
``user`` (``p40fleet.privdrop``, clean environment), never as root: the env is that user's to
change. While ``user`` does not exist the answer is "missing".
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
    "ENV_BROKEN",
    "ENV_MISSING",
    "ENV_OK",
    "Dist",
    "EnvDistributions",
    "EnvPython",
    "EnvPythonState",
    "MarkerText",
    "env_dir",
    "env_python",
    "normalize_name",
]

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
