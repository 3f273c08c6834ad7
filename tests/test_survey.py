"""facts.survey on a real pyinfra host (@local): one command for many facts, the memo, and
when it is forgotten; and that nothing in the project reaches into pyinfra's privates."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra import host
from pyinfra.api import Config, FactBase, Inventory, State, operation
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.facts.server import Which
from pyinfra.operations import server

from p40fleet.facts import survey as memo
from p40fleet.facts.cudnn import PathDevice
from p40fleet.facts.host import LinuxDistribution, MemTotal

REPO = Path(__file__).resolve().parent.parent


class Counted(FactBase):
    """Appends a line to ``path`` each time it runs; returns how many times it has run."""

    def command(self, path: str, step: int = 1) -> str:
        return f"echo x >> {path}; expr $(wc -l < {path}) '*' {step}"

    def process(self, output):
        return int(output[0])


class NoNewline(FactBase):
    def command(self) -> str:
        return "printf 'a\\nb'"

    def process(self, output):
        return list(output)


class Fails(FactBase):
    def command(self) -> str:
        return "echo partial; exit 3"


class NeedsMissingTool(FactBase):
    @staticmethod
    def default():
        return "default"

    def requires_command(self) -> str:
        return "p40fleet-no-such-tool"

    def command(self) -> str:
        return "p40fleet-no-such-tool --version"


@pytest.fixture
def local():
    """A connected @local host in the prepare stage (memo installed), and its command log."""

    def make(install: bool = True):
        inventory = Inventory(([("@local", {})], {}))
        state = State(inventory, Config())
        connect_all(state)
        state.set_stage(StateStage.Prepare)
        target = inventory.get_host("@local")
        if install:
            memo.install(state)
        sent: list[str] = []
        real = target.run_shell_command

        def counting(command, **kwargs):
            sent.append(str(command))
            return real(command, **kwargs)

        target.run_shell_command = counting
        return state, target, sent

    return make


def test_a_survey_answers_many_facts_in_one_command_as_asked_one_by_one(local, tmp_path):
    parts = [
        memo.part(MemTotal),
        memo.part(PathDevice, path=str(tmp_path)),  # (free space moves: not compared)
        memo.part(LinuxDistribution),
        memo.part(Which, command="sh"),
        memo.part(NoNewline),
        memo.part(Counted, path=str(tmp_path / "n")),
    ]
    _, alone, _ = local(install=False)
    expected = [alone.get_fact(cls, **dict(kwargs)) for cls, kwargs in parts[:-1]]
    state, target, sent = local()
    assert memo.survey(target, parts) == len(parts)
    assert len(sent) == 1
    got = [memo.ask(target, cls, **dict(kwargs)) for cls, kwargs in parts]
    assert got[:-1] == expected
    assert got[-1] == 1
    assert len(sent) == 1  # every answer from the memo
    assert memo.survey(target, parts) == 0 and len(sent) == 1  # asked once per run


def test_defaults_fill_in_the_memo_key(local, tmp_path):
    _, target, sent = local()
    path = str(tmp_path / "n")
    memo.survey(target, [memo.part(Counted, path=path)])
    assert memo.ask(target, Counted, path=path, step=1) == 1
    assert memo.answered(target, Counted, path=path)
    assert memo.ask(target, Counted, path=path, step=2) == 4  # another question: asked live
    assert len(sent) == 2


def test_a_missing_command_gives_the_default_and_a_failure_is_asked_live(local):
    _, target, sent = local()
    assert memo.survey(target, [memo.part(NeedsMissingTool), memo.part(Fails)]) == 1
    assert memo.ask(target, NeedsMissingTool) == "default"
    assert len(sent) == 1
    assert not memo.answered(target, Fails)
    with pytest.raises(Exception):  # noqa: B017 - pyinfra's own error for a failing fact
        memo.ask(target, Fails)
    assert len(sent) == 2


def test_without_install_ask_is_get_fact(local, tmp_path):
    _, target, sent = local(install=False)
    path = str(tmp_path / "n")
    assert memo.survey(target, [memo.part(Counted, path=path)]) == 0
    assert [memo.ask(target, Counted, path=path) for _ in range(2)] == [1, 2]
    assert len(sent) == 2


@operation()
def _asks(path: str, seen: list):
    """Asks Counted and yields nothing (a no-op)."""
    seen.append(memo.ask(host, Counted, path=path))
    return
    yield  # pragma: no cover - a generator that yields nothing


def test_the_memo_holds_across_no_op_operations_and_goes_after_a_change(local, tmp_path):
    state, target, _ = local()
    path = str(tmp_path / "n")
    seen: list[int] = []
    add_op(state, _asks, path=path, seen=seen, name="ask 1")
    add_op(state, _asks, path=path, seen=seen, name="ask 2")
    add_op(state, server.shell, commands=[f"echo changed >> {tmp_path / 'log'}"], name="change")
    add_op(state, _asks, path=path, seen=seen, name="ask 3")
    assert seen == [1, 1, 1]  # prepared: one command
    state.set_stage(StateStage.Execute)
    run_ops(state)
    # executed: the two no-op operations from the memo, the one after the change live
    assert seen == [1, 1, 1, 1, 1, 2]
    assert memo.changed(target)


def test_importing_the_operations_changes_nothing_in_pyinfra():
    script = """
import importlib, pkgutil
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.host import Host
from pyinfra.connectors.ssh import SSHConnector

def snapshot():
    found, todo = {}, [PyinfraCommand]
    while todo:
        cls = todo.pop()
        found[cls.__qualname__] = cls.__dict__.get("execute")
        todo.extend(cls.__subclasses__())
    found["get_fact"] = Host.__dict__["get_fact"]
    for name in ("run_shell_command", "put_file", "get_file"):
        found[name] = SSHConnector.__dict__.get(name)
    return found

before = snapshot()
from p40fleet import operations
for info in pkgutil.iter_modules(operations.__path__):
    importlib.import_module(f"p40fleet.operations.{info.name}")
import p40fleet.facts.survey
after = snapshot()
changed = [k for k in before if after.get(k) is not before[k]]
print(changed)
assert not changed, changed
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_pyinfra_is_pinned_to_the_minor_version_the_tests_run():
    import pyinfra

    text = (REPO / "pyproject.toml").read_text()
    major, minor = pyinfra.__version__.split(".")[:2]
    assert f'"pyinfra=={major}.{minor}.*"' in text


class Mutable(FactBase):
    def command(self) -> str:
        return "echo a; echo b"

    def process(self, output):
        return {"lines": list(output)}


class Unpicklable(FactBase):
    def command(self) -> str:
        return "echo a"

    def process(self, output):
        return {"line": output[0], "made_by": lambda: None}  # pickle refuses a lambda


def test_every_ask_from_the_memo_gets_its_own_copy(local):
    _, target, sent = local()
    assert memo.survey(target, [memo.part(Mutable), memo.part(Unpicklable)]) == 2
    first = memo.ask(target, Mutable)
    first["lines"].append("changed by a caller")
    assert memo.ask(target, Mutable) == {"lines": ["a", "b"]}
    odd = memo.ask(target, Unpicklable)
    odd["line"] = "changed by a caller"
    assert memo.ask(target, Unpicklable)["line"] == "a"  # kept by deepcopy instead
    assert len(sent) == 1


def _chunks(command: str) -> tuple[list[bytes], int]:
    """What ``sh -c command`` writes to a pipe, read by read() as it comes; and its status."""
    proc = subprocess.Popen(["sh", "-c", command], stdout=subprocess.PIPE)
    chunks = []
    while chunk := proc.stdout.read1(65536):
        chunks.append(chunk)
    return chunks, proc.wait()


@pytest.mark.parametrize(
    ("command", "status"),
    [
        ("echo a; sleep 0.3; printf 'b\\n\\n\\n'", 0),
        ("echo a; sleep 0.3; printf b; exit 3", 3),
        ("printf ''", 0),
    ],
)
def test_one_write_sends_the_same_bytes_and_status_in_one_write(command, status):
    plain, plain_status = _chunks(command)
    held, held_status = _chunks(memo.one_write(command).get_raw_value())
    assert (held_status, plain_status) == (status, status)
    assert b"".join(held) == b"".join(plain)  # trailing newlines kept
    assert len(held) <= 1
    if b"".join(plain):
        assert len(plain) == 2  # without it: one write per echo, each its own SSH packet


# -- N4: no part answers for another -------------------------------------------------------


class Said(FactBase):
    """A root part: what it printed."""

    def command(self, text: str) -> str:
        return f"echo {text}"

    def process(self, output):
        return list(output)


#: The survey's secret as a part run inside it can read it: from the survey's own command line
#: (/proc/$$/cmdline, readable by any local user), else a guess.
_STEAL = (
    "t=$(tr '\\0' '\\n' < /proc/$$/cmdline | sed -n 's/.*-v t=\\([0-9a-f]*\\).*/\\1/p;"
    " s/.*@@p40fleet-survey \\([0-9a-f]*\\) .*/\\1/p' | head -n 1); t=${t:-000000000000}; "
)


class Forger(FactBase):
    """A part whose output the training user controls (a .pth, a file name with a newline):
    it prints the end marker of part 0 with the survey's real secret, after a forged answer,
    with and without a leading newline and a carriage return."""

    def command(self) -> str:
        return _STEAL + (
            "printf 'forged\\n@@p40fleet-survey %s 0 0\\nforged\\r@@p40fleet-survey %s 0 0\\n'"
            ' "$t" "$t"; printf \'@@p40fleet-survey %s 0 0\' "$t"'
        )

    def process(self, output):
        return list(output)


def test_a_part_cannot_answer_for_another_even_with_the_secret(local):
    """N4: a part printing part 0's marker (with the secret it read in /proc) changes nothing:
    every line of a part's output comes back framed, and only root's awk prints markers."""
    _, target, sent = local()
    assert memo.survey(target, [memo.part(Said, text="root"), memo.part(Forger)]) == 2
    assert len(sent) == 1
    assert memo.ask(target, Said, text="root") == ["root"]
    forged = memo.ask(target, Forger)
    assert forged[0] == "forged" and forged[1].startswith("@@p40fleet-survey "), forged
    assert re.fullmatch(r"@@p40fleet-survey [0-9a-f]{12,} 0 0", forged[1]), forged  # stole it
    assert len(sent) == 1


def test_a_marker_without_this_runs_secret_is_not_taken(local, monkeypatch):
    """The controller checks the secret on each marker: an answer under another secret (what
    the survey's stdout says outside root's framing) is asked live, not kept."""
    _, target, sent = local()
    real = memo.Survey.process

    def other_secret(self, output):
        return {i: ("0" * 32, st, lines) for i, (_, st, lines) in real(self, output).items()}

    monkeypatch.setattr(memo.Survey, "process", other_secret)
    assert memo.survey(target, [memo.part(Said, text="root")]) == 0
    assert not memo.answered(target, Said, text="root")
    assert "Secret(...)" == repr(memo.Secret.new())  # pyinfra's debug log shows only this


def test_a_part_longer_than_the_limit_is_asked_live(local, monkeypatch):
    monkeypatch.setattr(memo, "PART_LIMIT", 10)
    _, target, sent = local()
    long = "a-line-of-20-bytes-x"
    assert memo.survey(target, [memo.part(Said, text=long), memo.part(NoNewline)]) == 1
    assert not memo.answered(target, Said, text=long)
    assert memo.ask(target, NoNewline) == ["a", "b"]
