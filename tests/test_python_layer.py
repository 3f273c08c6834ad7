"""The Python layer's steps offline (``p40fleet/deploys/steps/python.py``, which
deploy/python.py runs): the operations it queues for one host, in order, with the files the
preflight checked; and no refusal of its own (the preflight, run first, refuses a host the
layer cannot serve, so validated_spec() answers None for it).

The steps run in a host's context, as pyinfra runs them, with every
operation of the modules it calls replaced by a recorder; the helpers that decide from facts
(``conda.env_fresh``, ``apex.needed``, the Apex election, ``verl.checkout_moves``) run for real
on a fake host whose facts are their defaults (a fresh host) plus its GPUs.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from pyinfra.context import ctx_host, ctx_state

from p40fleet import preflight
from p40fleet.deploys.steps import preflight as preflight_steps
from p40fleet.deploys.steps import python as python_steps
from p40fleet.facts.gpu import PciGpu, PciGpus
from p40fleet.gpu_catalog import lookup
from p40fleet.operations import apex, artifacts, conda, refuse, torch, training_user, verl
from p40fleet.operations.run import apex_fleet
from p40fleet.spec import load_spec
from tests.opharness import make_host

REPO = Path(__file__).resolve().parent.parent
STEPS_FILE = REPO / "p40fleet" / "deploys" / "steps" / "python.py"
P40 = 0x1B38
MODULES = (apex, apex_fleet, artifacts, conda, refuse, torch, training_user, verl)

#: The Python layer's table of contents: steps 1-6 of deploy/python.py.
STEPS = [
    "training_user.training_user",
    "training_user.directory",
    "training_user.directory",
    "artifacts.artifact",
    "conda.miniconda",
    "conda.conda_tos",
    "conda.env",
    "torch.torch",
    "apex.build_wheel",
    "apex.fetch_wheel",
    "apex.put_wheel",
    "apex.put_sum",
    "apex.install",
    "verl.checkout",
    "verl.patch",
    "verl.requirements",
    "verl.install",
]


def queued(monkeypatch: pytest.MonkeyPatch, stack: dict[str, Any]) -> list[tuple[str, dict]]:
    """``(module.operation, kwargs)`` of each operation the Python layer queues for lab1."""
    spec = load_spec("lab1", stack)
    state, host = make_host({"stack": stack})
    gpus = [PciGpu("0000:01:00.0", 0x10DE, P40, 0x030200, 0x10DE, 0x11D9, lookup(P40))]
    host.get_fact = lambda cls, *a, **k: gpus if cls is PciGpus else cls().default()
    for quiet in ("noop", "log", "log_styled"):
        monkeypatch.setattr(host, quiet, lambda *a, **k: None)
    calls: list[tuple[str, dict]] = []
    monkeypatch.setattr(
        preflight_steps,
        "run",
        lambda: calls.append(("preflight", {"name": host.current_deploy_name})),
    )
    monkeypatch.setattr(python_steps, "validated_spec", lambda **_: spec)
    for module in MODULES:
        for attr in dir(module):
            if hasattr(getattr(module, attr), "_inner"):  # an @operation
                name = f"{module.__name__.rpartition('.')[2]}.{attr}"
                monkeypatch.setattr(
                    module, attr, lambda *a, _name=name, **k: calls.append((_name, k))
                )
    with ctx_state.use(state), ctx_host.use(host):
        python_steps.run()
    return calls


def test_the_preflight_first_then_the_six_steps_in_order(monkeypatch):
    calls = queued(monkeypatch, {})
    assert calls[0] == ("preflight", {"name": "deploy/preflight.py"})  # named as included
    assert [name for name, _ in calls[1:]] == STEPS
    ops = dict(calls[1:])
    spec = load_spec("lab1", {})
    # the locks are the files the preflight checked
    assert ops["conda.env"]["lock"] == str(preflight.conda_lock_path(spec))
    assert ops["torch.torch"]["lock"] == str(preflight.torch_lock_path(spec))
    assert ops["verl.requirements"]["src"] == str(preflight.verl_requirements_path(spec))
    # a fresh host: the env is made in this run, so later steps ignore what the facts saw
    assert ops["torch.torch"]["fresh_env"] and ops["apex.install"]["fresh_env"]
    assert ops["verl.patch"]["name"] == "verl patch rules (pascal)"
    assert ops["apex.put_wheel"]["needed"]  # no apex in a fresh env: the wheel goes up
    assert ops["apex.build_wheel"]["key"] == ops["apex.install"]["key"]


def test_a_mirror_channel_adds_the_condarc_step_and_is_the_envs_only_channel(monkeypatch):
    channel = "https://mirror.example/conda"
    calls = queued(monkeypatch, {"mirror": {"conda_channel": channel}})
    names = [name for name, _ in calls[1:]]
    assert names == [*STEPS[:5], "conda.condarc", *STEPS[5:]]
    ops = dict(calls[1:])
    assert ops["conda.condarc"]["channel"] == channel
    assert ops["conda.env"]["channels"] == ["--override-channels", "-c", channel]


def test_the_python_layer_has_no_refusal_of_its_own():
    """One place decides who gets no Python layer: the preflight (GPUs, verl ref, conda, torch
    and verl locks: ``p40fleet.preflight.python_layer_refusals``)."""
    tree = ast.parse(STEPS_FILE.read_text())
    called = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert not {name for name in called if "refus" in name}, called
