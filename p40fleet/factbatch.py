"""Ask each fact once per host between changes, and a host's facts in one command.

pyinfra 3.10 runs a fact's command every time an operation asks for it, and runs every
operation's body twice (once while preparing, to see whether it would change anything, and again
while executing), so a no-op ``deploy/full.py`` sent about 80 commands per host (``PciGpus``
alone six times). A fact's answer can only change when something runs on its host, so:

* **memo** — a fact asked again with the same arguments and the same connector arguments (sudo,
  su user, env, ...) gets a copy of the earlier answer, until a command executes on that host
  (any operation command: shell, upload, download, function): then the host's memo is forgotten,
  before and after the command, so an operation that asks after its own commands sees the change;
* **plan** — the facts asked of a host in a run are recorded on the controller
  (``$P40FLEET_CACHE/fact-plans/``, names and arguments only, never a password). In the next run
  the first fact asked of that host gathers all of them in one shell command per set of connector
  arguments: each fact in its own subshell, its output cut out by a marker carrying its exit
  status. An answer the batch cannot give exactly as pyinfra would (non-zero exit, a processing
  error, an unmet precondition) is not kept: that fact runs alone later, as pyinfra runs it.

Facts asked outside the prepare and execute stages go to pyinfra unchanged, and so does
everything with ``P40FLEET_FACT_BATCH=0``. ``install()`` is called by ``operations/__init__.py``;
it is idempotent.
"""

from __future__ import annotations

import atexit
import copy
import functools
import hashlib
import importlib
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
import gevent.event
from pyinfra import logger
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.command import PyinfraCommand, StringCommand
from pyinfra.api.facts import (
    _MISSING_COMMAND_MARKER,
    FactBase,
    ShortFactBase,
    _handle_fact_kwargs,
    _make_command,
)
from pyinfra.api.host import Host
from pyinfra.api.state import StateStage

from p40fleet import controller

ENABLE_ENV = "P40FLEET_FACT_BATCH"
MARKER = "@@p40fleet-fact"

#: Connector arguments that change what a fact's command prints (they key the memo). The others
#: (timeouts, retries, pty, stdin) do not; a fact asked with stdin, a pty or a retry condition is
#: never batched.
OUTPUT_ARGS = (
    "_sudo", "_sudo_user", "_use_sudo_login", "_preserve_sudo_env",
    "_su_user", "_use_su_login", "_preserve_su_env", "_su_shell",
    "_doas", "_doas_user", "_dzdo", "_dzdo_user",
    "_shell_executable", "_chdir", "_env",
)  # fmt: skip


@dataclass(frozen=True)
class Request:
    """One fact as asked: its class, its bound arguments, the connector arguments that matter."""

    fact: str  # "module:QualName"
    kwargs: tuple[tuple[str, Any], ...]
    connector: tuple[tuple[str, Any], ...]

    @property
    def key(self) -> str:
        return json.dumps([self.fact, self.kwargs, self.connector], sort_keys=True, default=repr)

    def to_json(self) -> dict[str, Any]:
        """The plan entry: ``_env`` (which may hold a proxy password) only as its sha256."""
        connector = dict(self.connector)
        if "_env" in connector:
            connector["_env"] = {"sha256": env_digest(connector["_env"])}
        return {"fact": self.fact, "kwargs": dict(self.kwargs), "connector": connector}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Request:
        return cls(
            str(raw["fact"]),
            _frozen(raw.get("kwargs") or {}),
            _frozen(raw.get("connector") or {}),
        )


@dataclass
class _Book:
    """What one host has been asked in this run."""

    memo: dict[str, Any] = field(default_factory=dict)
    asked: dict[str, Request] = field(default_factory=dict)
    # the greenlet that ran the plan's batch, None before (a fact's command() may ask facts)
    gatherer: Any = None
    # set once the plan's batch has answered: a host's facts are asked from several greenlets
    # (another host's deploy may ask this host's facts), and none should race the batch
    ready: gevent.event.Event = field(default_factory=gevent.event.Event)


def env_digest(env: Any) -> str:
    """sha256 of an ``_env`` value (a dict, or its frozen form): what a plan keeps of it."""
    frozen = _frozen(env) if isinstance(env, dict) else env
    return hashlib.sha256(json.dumps(frozen, default=repr).encode()).hexdigest()


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1") != "0"


def plans_dir() -> Path:
    return controller.cache_dir() / "fact-plans"


def plan_path(host: Host) -> Path:
    deploy = getattr(host.state, "current_deploy_filename", None) or ""
    digest = hashlib.sha256(f"{host.name}\0{os.path.abspath(deploy)}".encode()).hexdigest()
    return plans_dir() / f"{digest[:20]}.json"


def _frozen(mapping: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    def freeze(value: Any) -> Any:
        if isinstance(value, dict):
            return tuple(sorted((k, freeze(v)) for k, v in value.items()))
        if isinstance(value, list | tuple):
            return tuple(freeze(v) for v in value)
        return value

    return tuple(sorted((k, freeze(v)) for k, v in mapping.items()))


def _fact_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


#: pyinfra facts a plan may name besides the project's own ``facts.*``: read-only, and their
#: arguments quoted (never ``server.Command``, which runs its argument, nor ``server.Home``,
#: which puts its argument in the command unquoted). Others are asked live, as pyinfra does.
PYINFRA_FACTS = frozenset(
    f"pyinfra.facts.{name}"
    for name in (
        "files:File", "files:Directory", "files:Link", "files:Sha1File", "files:Sha256File",
        "files:Md5File", "server:Users", "server:Groups", "server:LinuxDistribution",
        "server:TmpDir", "server:Which", "server:Os", "server:Arch", "server:Kernel",
        "server:KernelVersion", "server:Path", "hardware:Cpus", "systemd:SystemdStatus",
        "systemd:SystemdEnabled", "deb:DebPackages", "deb:DebArch",
    )
)  # fmt: skip


#: Packages whose facts a plan may name (the project's own read-only facts).
PLAN_PACKAGES: tuple[str, ...] = ("facts",)


def plannable(name: str) -> bool:
    """True when a plan may name fact ``name`` ("module:QualName"): a plan file is data that
    decides what runs on a host first thing, so it names only facts that read."""
    module = name.partition(":")[0]
    ours = any(module == p or module.startswith(p + ".") for p in PLAN_PACKAGES)
    return ours or name in PYINFRA_FACTS


def _fact_class(name: str) -> type[FactBase] | None:
    if not plannable(name):
        return None
    module, _, qualname = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return obj if isinstance(obj, type) and issubclass(obj, FactBase) else None


_JSON_SAFE = (str, int, float, bool, type(None))


def _json_safe(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_safe(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_json_safe(v) for v in value)
    return isinstance(value, _JSON_SAFE)


def request_for(host: Host, cls: type[FactBase], args: tuple, kwargs: dict) -> Request | None:
    """The request for this fact as pyinfra would run it now, or None when it cannot be batched."""
    fact_kwargs, global_kwargs = _handle_fact_kwargs(host.state, host, cls, args, kwargs)
    fact_kwargs = {k: v for k, v in fact_kwargs.items() if k != "self"}
    if global_kwargs.get("_stdin") or global_kwargs.get("_get_pty"):
        return None
    if global_kwargs.get("_retry_until") or global_kwargs.get("_retries"):
        return None
    connector = {k: global_kwargs[k] for k in OUTPUT_ARGS if global_kwargs.get(k)}
    if not (_json_safe(fact_kwargs) and _json_safe(connector)):
        return None
    return Request(_fact_name(cls), _frozen(fact_kwargs), _frozen(connector))


# --- the batch ---------------------------------------------------------------------------------


def batch_command(commands: list[tuple[Any, Any]], token: str) -> StringCommand:
    """One shell command running every ``(command, requires_command)`` in its own subshell.

    After each: a line ``@@p40fleet-fact TOKEN I RC`` (I its index, RC its exit status), preceded
    by a newline so that output without a trailing newline still ends its own line.
    """
    parts: list[Any] = []
    for index, (command, requires) in enumerate(commands):
        if requires:
            parts += ["if command -v", requires, ">/dev/null 2>&1; then (", command, "\n);"]
            parts += ["else echo", f"'{_MISSING_COMMAND_MARKER}';", "fi"]
        else:
            parts += ["(", command, "\n)"]
        parts.append(f"; printf '\\n{MARKER} {token} {index} %s\\n' \"$?\"\n")
    return StringCommand(*parts)


def split_batch(lines: list[str], token: str, count: int) -> dict[int, tuple[int, list[str]]]:
    """``{index: (exit status, stdout lines)}`` for every fact whose marker came back."""
    results: dict[int, tuple[int, list[str]]] = {}
    current: list[str] = []
    prefix = f"{MARKER} {token} "
    for line in lines:
        if not line.startswith(prefix):
            current.append(line)
            continue
        index_text, _, rc_text = line[len(prefix) :].partition(" ")
        if current and current[-1] == "":
            current.pop()  # the newline the marker's printf added
        if index_text.isdigit() and rc_text.strip().lstrip("-").isdigit():
            index = int(index_text)
            if 0 <= index < count:
                results[index] = (int(rc_text), current)
        current = []
    return results


def _answer(fact: FactBase, host: Host, rc: int, lines: list[str]) -> tuple[bool, Any]:
    """(kept, data): the data pyinfra would return for this output, if it is sure to be the same."""
    if rc != 0:
        return False, None  # pyinfra would look at stderr and may fail the host: let it
    if lines == [_MISSING_COMMAND_MARKER]:
        return True, fact.default()  # what pyinfra returns while preparing (MissingCommandError)
    if not lines:
        return True, fact.default()
    try:
        return True, fact.process(lines)
    except Exception:  # noqa: BLE001 - pyinfra's own run decides what a processing error means
        return False, None


def gather(host: Host, requests: list[Request]) -> int:
    """Run ``requests`` on ``host`` in one command per connector set; memo the answers kept."""
    book = _book(host)
    groups: dict[tuple, list[tuple[Request, FactBase, Any, Any]]] = {}
    for request in requests:
        cls = _fact_class(request.fact)
        if cls is None or request.key in book.memo:
            continue
        fact = cls()
        fact_kwargs = dict(request.kwargs)
        try:
            if fact.check_preconditions(host.state, host):
                continue
            command = _make_command(fact.command, dict(fact_kwargs))
            requires = _make_command(fact.requires_command, dict(fact_kwargs))
        except Exception:  # noqa: BLE001 - a plan from an older version: ask it live instead
            continue
        groups.setdefault(request.connector, []).append((request, fact, command, requires))
    kept = 0
    for connector, entries in groups.items():
        token = secrets.token_hex(6)
        command = batch_command([(c, r) for _, _, c, r in entries], token)
        global_kwargs, _ = pop_global_arguments(host.state, host, dict(connector))
        executor_kwargs = {k: v for k, v in global_kwargs.items() if k in CONNECTOR_ARGUMENT_KEYS}
        try:
            ok, output = host.run_shell_command(
                command,
                print_output=host.state.print_fact_output,
                print_input=host.state.print_fact_input,
                **executor_kwargs,
            )
        except Exception as exc:  # noqa: BLE001 - the facts are then asked one by one
            logger.debug(f"{host.print_prefix}fact batch failed: {exc!r}")
            continue
        if not ok:
            continue
        answers = split_batch(output.stdout_lines, token, len(entries))
        for index, (request, fact, _, _) in enumerate(entries):
            if index not in answers:
                continue
            keep, data = _answer(fact, host, *answers[index])
            if keep:
                book.memo[request.key] = data
                kept += 1
    logger.debug(f"{host.print_prefix}fact batch: {kept}/{len(requests)} facts in one go")
    return kept


# --- plans on the controller -------------------------------------------------------------------

_BOOKS: dict[int, tuple[Host, _Book]] = {}


def _book(host: Host) -> _Book:
    entry = _BOOKS.get(id(host))
    if entry is None or entry[0] is not host:
        entry = (host, _Book())
        _BOOKS[id(host)] = entry
    return entry[1]


def load_plan(host: Host) -> list[Request]:
    """The host's plan: entries naming a plannable fact, ``_env`` restored from the host's own
    data when its sum matches. Nothing from a plan file others could have written."""
    path = plan_path(host)
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            logger.warning(f"{host.print_prefix}fact plan {path} ignored: writable by others")
            return []
        raw = json.loads(path.read_text())
        requests = []
        for item in raw.get("requests", []):
            request = Request.from_json(item)
            if plannable(request.fact) and (request := _with_env(host, request)) is not None:
                requests.append(request)
        return requests
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def _with_env(host: Host, request: Request) -> Request | None:
    """``request`` with its ``_env`` sum replaced by the host's ``_env`` (None: they differ)."""
    connector = dict(request.connector)
    if "_env" not in connector:
        return request
    stored = dict(connector["_env"]) if isinstance(connector["_env"], tuple) else {}
    current = host.data.get("_env")
    if not isinstance(current, dict) or stored.get("sha256") != env_digest(current):
        return None  # asked with another _env (or an old plan with values): ask it live
    connector["_env"] = _frozen(current)
    return Request(request.fact, request.kwargs, tuple(sorted(connector.items())))


def save_plans() -> None:
    """Write each host's requests of this run (only when they differ from its plan)."""
    for host, book in list(_BOOKS.values()):
        if not book.asked or host.state is None:
            continue
        requests = [r.to_json() for r in book.asked.values()]
        path = plan_path(host)
        if [r.to_json() for r in load_plan(host)] == requests:
            continue
        try:
            # Private to the operator: a plan decides what runs on the host first (0700/0600).
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.parent.chmod(0o700)
            tmp = path.with_suffix(".tmp")
            tmp.unlink(missing_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(json.dumps({"host": host.name, "requests": requests}, indent=1))
            tmp.replace(path)
        except OSError as exc:
            logger.debug(f"fact plan for {host.name} not saved: {exc}")


# --- the hook ----------------------------------------------------------------------------------


_MEMO_STAGES = (StateStage.Prepare, StateStage.Execute)


def forget(host: Host) -> None:
    """Something runs on ``host``: no earlier answer about it holds any more."""
    _book(host).memo.clear()


def cached_fact(original, host: Host, cls, args: tuple, kwargs: dict) -> Any:
    state = host.state
    if not enabled() or state is None or state.current_stage not in _MEMO_STAGES:
        return original(host, cls, *args, **kwargs)
    fact_cls = cls.fact if issubclass(cls, ShortFactBase) else cls
    try:
        request = request_for(host, fact_cls, args, kwargs)
    except Exception:  # noqa: BLE001 - pyinfra reports bad arguments its own way
        request = None
    if request is None:
        return original(host, cls, *args, **kwargs)
    book = _book(host)
    if book.gatherer is None:
        book.gatherer = gevent.getcurrent()
        try:
            if plan := load_plan(host):
                gather(host, plan)
        finally:
            book.ready.set()
    elif book.gatherer is not gevent.getcurrent():
        book.ready.wait()
    book.asked.setdefault(request.key, request)
    if request.key not in book.memo:
        data = original(host, fact_cls, *args, **kwargs)
        if host in state.failed_hosts:
            return _short(cls, data)  # a failed answer is not one to repeat
        book.memo[request.key] = data
    return _short(cls, copy.deepcopy(book.memo[request.key]))


def _short(cls: type, data: Any) -> Any:
    return cls().process_data(data) if issubclass(cls, ShortFactBase) else data


def _forgetting(execute):
    @functools.wraps(execute)
    def wrapped(self, state, host, connector_arguments):
        forget(host)
        try:
            return execute(self, state, host, connector_arguments)
        finally:
            forget(host)

    wrapped.p40fleet_forgets = True  # type: ignore[attr-defined]
    return wrapped


def _command_classes() -> list[type]:
    found, todo = [], [PyinfraCommand]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def install() -> None:
    """Route ``Host.get_fact`` through the memo and the plans (idempotent)."""
    for cls in _command_classes():
        execute = cls.__dict__.get("execute")
        if execute is not None and not getattr(execute, "p40fleet_forgets", False):
            cls.execute = _forgetting(execute)  # type: ignore[method-assign]
    if getattr(Host.get_fact, "p40fleet_batched", False):
        return
    original = Host.get_fact

    @functools.wraps(original)
    def get_fact(self, name_or_cls, *args, **kwargs):
        return cached_fact(original, self, name_or_cls, args, kwargs)

    get_fact.p40fleet_batched = True  # type: ignore[attr-defined]
    Host.get_fact = get_fact  # type: ignore[method-assign]
    atexit.register(save_plans)
