"""p40fleet.runtime.host_gate: each host meets the gate once, before its first operation of the
run; a refused host is failed alone (``State.fail_hosts`` at ``operation_start``, a
``PyinfraError`` at ``operation_host_start`` under ``--serial``). Real pyinfra States here;
the run lock's use of it, end to end, is tests/test_run_lock.py's."""

from __future__ import annotations

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.exceptions import PyinfraError

from p40fleet.runtime import host_gate


def fleet(*names: str) -> State:
    """A State whose hosts are connected (active), as pyinfra leaves them before run_ops."""
    state = State(Inventory(([(name, {}) for name in names], {})), Config())
    for one in state.inventory:
        state.activate_host(one)
    return state


class Refuses(host_gate.HostGate):
    """Refuses the hosts named in ``REFUSED``; remembers each call of ``admit``."""

    REFUSED = {"b"}

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def admit(self, state, hosts):  # noqa: ARG002
        self.calls.append(sorted(one.name for one in hosts))
        return {one: f"{one.name} refused" for one in hosts if one.name in self.REFUSED}


def the_gate(state: State) -> Refuses:
    (gate,) = [h for h in state.callback_handlers if isinstance(h, Refuses)]
    return gate


def test_installed_once_per_state():
    first, second = fleet("a"), fleet("a")
    assert host_gate.install(first, Refuses) is True
    assert host_gate.install(first, Refuses) is False
    assert host_gate.install(second, Refuses) is True  # a new run: its own gate
    assert the_gate(first) is not the_gate(second)


def test_the_first_operation_start_gates_every_host_at_once_and_fails_the_refused():
    state = fleet("a", "b", "c")
    host_gate.install(state, Refuses)
    state.trigger_callbacks("operation_start", "op1")
    assert the_gate(state).calls == [["a", "b", "c"]]
    assert {h.name for h in state.failed_hosts} == {"b"}
    # pyinfra asks for the operation's hosts after operation_start: b is not among them
    assert sorted(h.name for h in state.inventory.get_active_hosts()) == ["a", "c"]
    for one in state.inventory.get_active_hosts():  # the hosts' own start: gated already
        state.trigger_callbacks("operation_host_start", one, "op1")
    state.trigger_callbacks("operation_start", "op2")
    assert the_gate(state).calls == [["a", "b", "c"]]  # once per run


def test_no_host_left_is_pyinfras_own_error():
    state = fleet("b")
    host_gate.install(state, Refuses)
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        state.trigger_callbacks("operation_start", "op1")


def test_serial_gates_each_host_at_its_first_operation_and_raises_for_a_refused_one():
    """--serial: no operation_start; pyinfra's _run_serial_ops fails the host whose operation
    raised PyinfraError, and goes on with the next host."""
    state = fleet("a", "b")
    host_gate.install(state, Refuses)
    a, b = state.inventory.get_host("a"), state.inventory.get_host("b")
    for op in ("op1", "op2"):
        state.trigger_callbacks("operation_host_start", a, op)
    with pytest.raises(PyinfraError, match="b refused"):
        state.trigger_callbacks("operation_host_start", b, "op1")
    assert the_gate(state).calls == [["a"], ["b"]]
    assert state.failed_hosts == set()  # pyinfra's _run_serial_ops fails b, not the gate
