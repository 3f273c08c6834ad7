"""p40fleet.factbatch on a real pyinfra host (@local): memo, forgetting, plans, the batch format."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import gevent
import pytest
from pyinfra import host
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.facts import _MISSING_COMMAND_MARKER, FactBase
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host

from p40fleet import controller, factbatch

factbatch.install()


class Counted(FactBase):
    """Appends a line to ``path`` each time it runs; returns how many times it has run."""

    def command(self, path: str) -> str:
        return f"echo x >> {path}; wc -l < {path}"

    def process(self, output):
        return int(output[0])


class AsksAnother(FactBase):
    """Like pyinfra's server.Uptime: its command() asks the host another fact."""

    def command(self, path: str) -> str:
        self.seen = host.get_fact(Counted, path=path)
        return f"echo {self.seen}"

    def process(self, output):
        return (self.seen, int(output[0]))


class NoNewline(FactBase):
    def command(self) -> str:
        return "printf 'a\\nb'"

    def process(self, output):
        return list(output)


class Fails(FactBase):
    def command(self) -> str:
        return "echo partial; exit 3"


class NeedsMissingTool(FactBase):
    requires_command = "p40fleet-no-such-tool"

    @staticmethod
    def default():
        return "default"

    def command(self) -> str:
        return "p40fleet-no-such-tool --version"


@pytest.fixture
def local(tmp_path, monkeypatch):
    """A connected @local host in the prepare stage, and a log of the commands it was sent."""
    monkeypatch.setenv(controller.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(factbatch.ENABLE_ENV, "1")
    # this module's test facts may be planned, as the project's facts.* are
    monkeypatch.setattr(factbatch, "PLAN_PACKAGES", ("facts", Counted.__module__))

    def make(data: dict | None = None):
        inventory = Inventory(([("@local", data or {})], {}))
        state = State(inventory, Config())
        state.current_deploy_filename = str(tmp_path / "deploy.py")
        connect_all(state)
        state.set_stage(StateStage.Prepare)
        host = inventory.get_host("@local")
        sent: list[str] = []
        real = host.run_shell_command

        def counting(command, **kwargs):
            sent.append(str(command))
            gevent.sleep(0.05)  # as a remote command does: other greenlets run meanwhile
            return real(command, **kwargs)

        host.run_shell_command = counting
        return state, host, sent

    yield make
    factbatch._BOOKS.clear()  # nothing of these hosts is left for the plans written at exit


def test_a_fact_asked_twice_runs_once_until_a_command_executes(local, tmp_path):
    state, host, sent = local()
    counter = tmp_path / "count"
    assert host.get_fact(Counted, path=str(counter)) == 1
    assert host.get_fact(Counted, path=str(counter)) == 1  # memo
    assert len(sent) == 1
    state.set_stage(StateStage.Execute)
    assert host.get_fact(Counted, path=str(counter)) == 1  # nothing ran on the host yet
    StringCommand("true").execute(state, host, {})
    assert host.get_fact(Counted, path=str(counter)) == 2  # asked again after a command
    assert counter.read_text().count("x") == 2


def test_other_arguments_are_another_fact(local, tmp_path):
    _, host, sent = local()
    assert host.get_fact(Counted, path=str(tmp_path / "a")) == 1
    assert host.get_fact(Counted, path=str(tmp_path / "b")) == 1
    assert len(sent) == 2


def test_switched_off_every_ask_runs(local, tmp_path, monkeypatch):
    monkeypatch.setenv(factbatch.ENABLE_ENV, "0")
    _, host, _ = local()
    counter = tmp_path / "count"
    assert [host.get_fact(Counted, path=str(counter)) for _ in range(3)] == [1, 2, 3]


def test_the_next_run_gathers_the_plan_in_one_command(local, tmp_path):
    counter = tmp_path / "count"
    _, host, sent = local()
    first = [
        host.get_fact(Counted, path=str(counter)),
        host.get_fact(NoNewline),
        host.get_fact(NeedsMissingTool),
        host.get_fact(Fails, _ignore_errors=True),
    ]
    assert len(sent) == 4
    factbatch.save_plans()
    plan = json.loads(factbatch.plan_path(host).read_text())
    assert [r["fact"].rsplit(":", 1)[1] for r in plan["requests"]] == [
        "Counted", "NoNewline", "NeedsMissingTool", "Fails",
    ]  # fmt: skip

    _, host, sent = local()
    again = [
        host.get_fact(Counted, path=str(counter)),
        host.get_fact(NoNewline),
        host.get_fact(NeedsMissingTool),
    ]
    assert len(sent) == 1 and factbatch.MARKER in sent[0]  # all three came from one command
    assert again == [2, ["a", "b"], "default"] and first[1:3] == again[1:3]
    # A fact that exits non-zero is not taken from the batch: pyinfra asks it alone.
    host.get_fact(Fails, _ignore_errors=True)
    assert len(sent) == 2 and factbatch.MARKER not in sent[1]


def test_split_batch_keeps_each_output_exactly():
    token = "t0k"
    commands = [("printf 'a\\n\\nb\\n'", None), ("printf ''", None), ("printf x", None),
                ("exit 7", None), ("echo hi", "p40fleet-no-such-tool")]  # fmt: skip
    script = str(factbatch.batch_command(commands, token).get_raw_value())
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout
    answers = factbatch.split_batch(out.splitlines(), token, len(commands))
    assert answers == {
        0: (0, ["a", "", "b"]),
        1: (0, []),
        2: (0, ["x"]),
        3: (7, []),
        4: (0, [_MISSING_COMMAND_MARKER]),  # what pyinfra prints when the tool is missing
    }


def test_a_plan_never_holds_a_password(local, tmp_path):
    _, host, _ = local()
    request = factbatch.request_for(
        host, Counted, (), {"path": str(tmp_path / "c"), "_sudo_password": "hunter2"}
    )
    assert request is not None
    assert "hunter2" not in json.dumps(request.to_json())


def test_a_broken_plan_is_ignored(local, tmp_path):
    _, host, sent = local()
    path = factbatch.plan_path(host)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"requests": [{"fact": "nowhere:Nothing"}, {"oops": 1}]}))
    assert host.get_fact(Counted, path=str(tmp_path / "c")) == 1
    assert len(sent) == 1


def test_plans_live_under_the_controller_cache(local, tmp_path):
    _, host, _ = local()
    assert Path(factbatch.plan_path(host)).is_relative_to(tmp_path / "cache" / "fact-plans")


def test_facts_asked_from_other_greenlets_wait_for_the_batch(local, tmp_path):
    _, host, _ = local()
    host.get_fact(Counted, path=str(tmp_path / "a"))
    host.get_fact(Counted, path=str(tmp_path / "b"))
    factbatch.save_plans()
    factbatch._BOOKS.clear()

    _, host, sent = local()
    asks = [gevent.spawn(host.get_fact, Counted, path=str(tmp_path / n)) for n in "ab"]
    gevent.joinall(asks, raise_error=True)
    assert [g.value for g in asks] == [2, 2]
    assert len(sent) == 1  # the second greenlet waited for the batch instead of asking alone


def test_a_planned_fact_whose_command_asks_another_fact_does_not_wait_for_itself(local, tmp_path):
    counter = str(tmp_path / "c")
    _, first, _ = local()
    with ctx_host.use(first):
        assert first.get_fact(AsksAnother, path=counter) == (1, 1)
    factbatch.save_plans()
    factbatch._BOOKS.clear()

    _, again, sent = local()
    with gevent.Timeout(20), ctx_host.use(again):  # a deadlock would hang here, not pass
        assert again.get_fact(AsksAnother, path=counter)[1] >= 2
    assert any(factbatch.MARKER in command for command in sent)


# -- S13: a plan names only read-only facts, holds no _env value, and is private ---------------


def test_a_plan_naming_a_command_fact_is_ignored(local, tmp_path):
    _, host, sent = local()
    marker = tmp_path / "ran"
    path = factbatch.plan_path(host)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"requests": [
        {"fact": "pyinfra.facts.server:Command", "kwargs": {"command": f"touch {marker}"}},
        {"fact": "pyinfra.facts.server:Home", "kwargs": {"user": f"; touch {marker}"}},
        {"fact": f"{Counted.__module__}:Counted", "kwargs": {"path": str(tmp_path / "c")}},
    ]}))  # fmt: skip
    path.chmod(0o600)
    assert [r.fact.rsplit(":", 1)[1] for r in factbatch.load_plan(host)] == ["Counted"]
    host.get_fact(Counted, path=str(tmp_path / "c"))  # the first ask gathers the plan
    assert sent and not [command for command in sent if str(marker) in command]
    assert not marker.exists()
    assert not factbatch.plannable("pyinfra.facts.server:Command")
    assert factbatch.plannable("facts.gpu:PciGpus") and factbatch.plannable(
        "pyinfra.facts.files:File"
    )


def test_env_values_never_reach_a_plan_and_the_plan_still_serves(local, tmp_path):
    secret = "http://user:s3cret@proxy:3128"
    data = {"_env": {"HTTPS_PROXY": secret}}
    _, host, sent = local(data)
    counter = str(tmp_path / "c")
    assert host.get_fact(Counted, path=counter) == 1
    request = factbatch.request_for(host, Counted, (), {"path": counter})
    assert secret in request.key  # the memo tells envs apart ...
    assert "s3cret" not in json.dumps(request.to_json())  # ... the plan keeps only a sum
    factbatch.save_plans()
    path = factbatch.plan_path(host)
    assert "s3cret" not in path.read_text() and "sha256" in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    factbatch._BOOKS.clear()

    _, host, sent = local(data)  # same _env: the plan serves, with the real value
    assert host.get_fact(Counted, path=counter) == 2 and len(sent) == 1
    factbatch._BOOKS.clear()
    _, host, sent = local({"_env": {"HTTPS_PROXY": "http://other"}})  # another _env: asked live
    assert factbatch.load_plan(host) == []


def test_a_plan_others_can_write_is_ignored(local, tmp_path):
    _, host, _ = local()
    host.get_fact(Counted, path=str(tmp_path / "c"))
    factbatch.save_plans()
    path = factbatch.plan_path(host)
    assert factbatch.load_plan(host)
    path.chmod(0o666)
    assert factbatch.load_plan(host) == []
