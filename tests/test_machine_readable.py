"""Machine-readable output (issue 28): ``pyinfra --json`` keeps stdout JSON with this project's
deploys (their human lines and tables go to stderr), every fact's answer is serialisable by
pyinfra's CLI (``pyinfra INVENTORY fact facts.X.Y``), and tables fit the terminal's width.

End to end on ``@local`` (read-only: facts and the verification change nothing), and for
every fact class of ``facts/`` a walk of the type it declares.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
import types
import typing
from collections.abc import Mapping, Sequence, Set
from pathlib import Path

import pytest
from pyinfra.api import FactBase
from pyinfra_cli.util import json_encode

from p40fleet import facts, report
from p40fleet.facts.driver import NvidiaSmi
from p40fleet.facts.packages import DebInstalled
from p40fleet.jsonable import ToJson

REPO = Path(__file__).resolve().parent.parent
TABLE = tuple("┏┃┡│└")


def pyinfra(*args: str, columns: int | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (report.REPORT_ENV, "COLUMNS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", *args], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip


@pytest.mark.parametrize("deploy", ["deploy/facts.py", "deploy/verify.py"])
def test_pyinfra_json_keeps_stdout_json(deploy):
    args = ["--json", "@local", deploy] + (["-y"] if deploy == "deploy/facts.py" else ["--dry"])
    proc = pyinfra(*args)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # nothing but pyinfra's JSON on stdout
    assert set(data) >= {"plan", "results"}
    marker = "p40fleet: GPU facts" if deploy == "deploy/facts.py" else "[@local] verify: REFUSED"
    assert marker in proc.stderr, proc.stderr  # the human output is still there, on stderr


def test_pyinfra_json_of_a_failing_verification_puts_nothing_of_ours_on_stdout():
    proc = pyinfra("--json", "-y", "@local", "deploy/verify.py")
    assert proc.returncode == 1
    # pyinfra prints no JSON when every host failed ("No hosts remaining!"); we print nothing
    assert proc.stdout.strip() == "" or json.loads(proc.stdout) is not None, proc.stdout
    assert "[@local] verify: REFUSED" in proc.stderr and "p40fleet verify:" in proc.stderr


def test_ad_hoc_facts_print_as_json():
    proc = pyinfra(
        "--json", "@local", "fact", "p40fleet.facts.driver.NvidiaSmi",
        "p40fleet.facts.host.KernelHeaders", "p40fleet.facts.gpu.PciGpus",
        "p40fleet.facts.host.FreeSpace", "path=/",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["p40fleet.facts.driver.NvidiaSmi"]["@local"]["state"] in (
        "absent",
        "not-loaded",
        "ok",
    )
    assert "release" in data["p40fleet.facts.host.KernelHeaders"]["@local"]
    assert data["p40fleet.facts.host.FreeSpace (path=/)"]["@local"]["mount_point"] == "/"


def _fact_classes() -> list[type]:
    found = []
    for info in pkgutil.iter_modules(facts.__path__):
        module = importlib.import_module(f"p40fleet.facts.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, FactBase) and cls.__module__ == module.__name__:
                found.append(cls)
    return found


def _declared(cls: type):
    (base,) = [b for b in cls.__orig_bases__ if typing.get_origin(b) is FactBase]
    (answer,) = typing.get_args(base)
    return answer


_JSON = (str, int, float, bool, type(None), dict, list, tuple)
_UNIONS = (typing.Union, types.UnionType)


def _unserialisable(kind, module: str, seen: set, plain: bool = False) -> list[str]:
    """Types in ``kind`` pyinfra's json_encode refuses: not JSON's own and no to_json().
    ``plain``: inside a to_json() answer (``p40fleet.jsonable.plain``), where dataclasses, sets
    and mappings are converted too."""
    if isinstance(kind, typing.ForwardRef):
        kind = eval(kind.__forward_arg__, vars(sys.modules[module]))  # noqa: S307 - our source
    if kind is Ellipsis or kind is typing.Any or (kind, plain) in seen:
        return []
    seen.add((kind, plain))
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is not None:
        inner = [bad for arg in args for bad in _unserialisable(arg, module, seen, plain)]
        if origin in _JSON or origin in _UNIONS:
            return inner
        if plain and isinstance(origin, type) and issubclass(origin, (Mapping, Set, Sequence)):
            return inner
        return [repr(kind), *inner]
    if (
        isinstance(kind, type)
        and dataclasses.is_dataclass(kind)
        and (plain or hasattr(kind, "to_json"))
    ):
        hints = typing.get_type_hints(kind, vars(sys.modules[kind.__module__]))
        owner = kind.__module__
        return [bad for hint in hints.values() for bad in _unserialisable(hint, owner, seen, True)]
    if isinstance(kind, type) and hasattr(kind, "to_json"):
        return []
    if plain and isinstance(kind, type) and issubclass(kind, (Mapping, Set, Sequence)):
        return []
    if plain and kind in (datetime.date, datetime.datetime):  # plain() writes ISO 8601
        return []
    return [] if kind in _JSON else [repr(kind)]


@pytest.mark.parametrize("cls", _fact_classes(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_fact_answer_is_serialisable_by_pyinfra(cls):
    assert _unserialisable(_declared(cls), cls.__module__, set()) == []
    default = cls.default() if callable(getattr(cls, "default", None)) else None
    json.dumps(default, default=json_encode)  # the CLI's encoder


def test_answers_with_values_serialise_as_their_fields():
    row = "0, Tesla P40, 00000000:3B:00.0, 0x1B3810DE, 6.1, 24576, 525.147.05"
    smi = NvidiaSmi().process(["##p40fleet-nvidia-smi rc=0", row])
    assert smi.ok and smi.gpus, smi
    data = json.loads(json.dumps(smi, default=json_encode))
    assert isinstance(smi, ToJson) and data["state"] == "ok"
    assert data["gpus"][0]["name"] == "Tesla P40" and data["gpus"][0]["compute_capability"] == [
        6,
        1,
    ]
    packages = DebInstalled().process(["gcc ii", "dkms rc"])
    assert "gcc" in packages and json.loads(json.dumps(packages, default=json_encode)) == ["gcc"]


def test_tables_fit_the_terminal_width():
    proc = pyinfra("-y", "@local", "deploy/verify.py", columns=80)
    rows = [line for line in proc.stdout.splitlines() if line.startswith(TABLE)]
    assert rows and max(len(line) for line in rows) <= 80, proc.stdout
    wide = pyinfra("-y", "@local", "deploy/verify.py", columns=160)
    rows = [line for line in wide.stdout.splitlines() if line.startswith(TABLE)]
    assert rows and 80 < max(len(line) for line in rows) <= 160, wide.stdout
