"""pyinfra inventory of the simulated lab (``python -m p40lab up``), read from the lab state.

    python -m p40lab up
    pyinfra -y inventories/sim.py exec -- hostname
    pyinfra -y inventories/sim.py deploy/<deploy>.py --limit lab1

State: ``$P40LAB_STATE`` or ``/var/lib/p40lab/state.json`` (written by ``p40lab up``; another
instance's with ``$P40LAB_INSTANCE``, see ``p40lab/state.py``). When the
lab is down this inventory refuses to load, so pyinfra never silently runs against 0 hosts.

Groups: ``sim`` (every lab host, lab1..labN, whatever GPUs each has), ``ray_head`` (lab1).
SSH: root with the lab's ed25519 key, the lab's own known_hosts, strict host key checking, no
agent, no ~/.ssh keys. ``P40LAB_SSH_USER=admin`` connects as the lab's non-root admin instead,
with ``_sudo`` (a NOPASSWD rule, as a dedicated deploy account has); ``admin-pw``'s sudo asks
its password: ``P40LAB_SUDO_PASSWORD`` becomes ``_sudo_password`` (the lab keeps it in
``p40lab.disks.sudo_password_file()``).
Host data: ``gpu_layout`` and ``sim_os`` for information, ``p40lab_sim`` (the only thing that
makes a host "simulated": its GPU checks SKIP; ``p40fleet.verification.check``), and ``stack`` =
``inventories/group_data/all.py``'s ``stack`` deep-merged with the lab's overrides (the doubles'
sums, the mirror, the base image's python, the lab's torch, ``training``: the lab's own tiny
model and GSM8K-format data archives with their sums, ``p40lab.training_data``:
``state["stack"]``, published by ``p40lab.mirror`` through
``p40lab.state.set_stack_overrides``). A host-level ``stack`` replaces the group's, hence the
explicit merge; ``stack_host`` stays free for per-run overrides.
"""

import copy
import json
import os
import runpy
from pathlib import Path

from p40lab.state import cli, state_path


class SimLabDown(RuntimeError):
    pass


# the state of the lab instance $P40LAB_INSTANCE names (one rule, in p40lab.state)
_STATE = state_path()
_DOWN = f"the simulated lab is not up: run `{cli('up')}`"


def _load_state() -> dict:
    try:
        data = json.loads(_STATE.read_text())
    except FileNotFoundError:
        raise SimLabDown(f"{_DOWN} (no state file {_STATE})") from None
    except (OSError, ValueError) as exc:
        raise SimLabDown(f"{_DOWN} (unreadable state {_STATE}: {exc})") from None
    if not data.get("up") or not data.get("hosts"):
        raise SimLabDown(f"{_DOWN} (state {_STATE} says down)")
    dead = [h["name"] for h in data["hosts"] if not _alive(h.get("supervisor_pid"))]
    if dead:
        raise SimLabDown(
            f"{_DOWN}: hosts {', '.join(dead)} are not running "
            "(stale state? run `python -m p40lab down` then `python -m p40lab up`)"
        )
    return data


def _alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie answers kill(0) too
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _merge(dst: dict, src: dict) -> dict:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value)
        else:
            dst[key] = copy.deepcopy(value)
    return dst


def _group_stack() -> dict:
    all_py = Path(__file__).resolve().parent / "group_data" / "all.py"
    if not all_py.exists():
        return {}
    return copy.deepcopy(runpy.run_path(str(all_py)).get("stack") or {})


def _json_env(name: str, example: str) -> dict:
    """``$NAME``: JSON ``{host or "*": {...}}`` for one run (tests, demos), e.g. ``example``."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise SystemExit(f"{name} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise SystemExit(f'{name} must be {{"HOST" or "*": {{...}}}}, e.g. {example}')
    return data


_state = _load_state()
_stack = _merge(_group_stack(), _state.get("stack") or {})
# P40LAB_STACK_HOST: per-run stack_host; P40LAB_HOST_DATA: extra host data (_sudo_password...)
_overrides = _json_env("P40LAB_STACK_HOST", '{"lab3": {"policy": {"allow_reboot": false}}}')
_host_data = _json_env("P40LAB_HOST_DATA", '{"*": {"_sudo": true}}')


def _stack_host(name: str, overrides: dict) -> dict:
    return _merge(copy.deepcopy(overrides.get("*", {})), overrides.get(name, {}))


# the connecting account: root, or a lab admin that reaches root through sudo
_USER = os.environ.get("P40LAB_SSH_USER", "").strip() or "root"
_SUDO = {} if _USER == "root" else {"_sudo": True}
if _SUDO and os.environ.get("P40LAB_SUDO_PASSWORD"):
    _SUDO["_sudo_password"] = os.environ["P40LAB_SUDO_PASSWORD"]

_SSH = {
    "ssh_user": _USER,
    "ssh_hostname": None,
    "ssh_key": _state["ssh_key"],
    "ssh_known_hosts_file": _state["known_hosts"],
    "ssh_strict_host_key_checking": "yes",
    "ssh_allow_agent": False,
    "ssh_look_for_keys": False,
}

sim = [
    (
        h["name"],
        dict(
            _SSH,
            **_SUDO,
            ssh_hostname=h["ip"],
            gpu_layout=h["layout"],
            sim_os=h["os"],
            p40lab_sim=True,  # a simulated host: its GPU checks SKIP (never read from its disk)
            stack=copy.deepcopy(_stack),
            stack_host=_stack_host(h["name"], _overrides),
        )
        | _host_data.get("*", {})
        | _host_data.get(h["name"], {}),
    )
    for h in _state["hosts"]
]

ray_head = [_state["hosts"][0]["name"]]

del _state, _stack, _overrides, _host_data, _USER, _SUDO
