"""The Apex builder election: which inventory host builds each build key in this run.

The rule is ``p40fleet.apex_build.first_builder``: nobody when the controller's cache holds the
wheel (checked against its recorded sum), else the first active host in inventory order with
that key that must install apex. This module only feeds it: the other hosts' keys and needs,
each read from that host's own survey (``facts.survey.ask``; pyinfra's public API: facts do
not use the host in context). Hosts are asked in order and only until the builder is found, and
not at all on a cache hit (the usual re-run), so most runs read no other host's facts.

Decided once per run and key (pyinfra loads a deploy file for all hosts in parallel, so every
host asks; the answer is kept in the run's record, ``p40fleet.run_record``). Across
controllers sharing one cache the decision is made under the key's build lock
(``p40fleet/apex_cache.py``): while another live controller holds it, this run elects nobody and
its uploads wait for that wheel.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyinfra import logger
from pyinfra.api import Host, State

from p40fleet import apex_build, apex_cache, preflight
from p40fleet.facts.env import env_dir, env_python
from p40fleet.facts.gpu import PciGpus
from p40fleet.facts.survey import ask
from p40fleet.operations import apex, conda
from p40fleet.operations.refuse import dry_run
from p40fleet.operations.run.survey import survey_host
from p40fleet.run_record import run_record
from p40fleet.spec import SpecError, StackSpec, spec_for_host

__all__ = ["builder", "needs_apex"]


def builder(state: State, key: str) -> str | None:
    """The host that builds ``key`` in this run (None: the wheel is on the controller, or no
    host needs it); the same answer for every host of the run."""
    memo = run_record(state).apex_builders
    if key not in memo:
        specs: dict[str, tuple[Host, StackSpec]] = {}
        local_tar = apex_build.controller_wheel(key)
        in_cache = apex_build.controller_wheel_ok(local_tar)[0]
        held, lock = (False, None) if in_cache else _build_lock(local_tar)
        memo[key] = apex_build.first_builder(
            key,
            in_cache=in_cache or held or apex_build.controller_wheel_ok(local_tar)[0],
            hosts=_python_hosts(state, specs),  # lazy: not walked on a cache hit
            key_of=lambda name: _key_of(*specs[name]),
            needs=lambda name: needs_apex(*specs[name], key),
        )
        if lock is not None and memo[key] is None:
            lock.release()
        elif lock is not None:
            apex_cache.hold(state, lock)  # until fetch_wheel stored the wheel (or exit)
    return memo[key]


def _build_lock(local_tar: str) -> tuple[bool, apex_cache.BuildLock | None]:
    """(held, lock): whether another live controller holds the shared cache's build lock of
    this key (this run builds nothing: its uploads wait for that wheel), else the lock taken
    for this run (None in a dry run: it builds nothing, so it takes nothing)."""
    lock = apex_cache.BuildLock.beside(local_tar)
    if dry_run():
        holder = lock.holder()
        live = holder is not None and lock.stale_why(holder) is None
        got = apex_cache.Acquired("held", holder) if live else apex_cache.Acquired("free")
    else:
        got = lock.acquire()
    if got.kind == "held":
        who = got.holder.describe() if got.holder else "another controller"
        logger.warning(
            f"apex wheel {lock.key}: {who} holds its build lock in the shared cache "
            f"({lock.path}): no host of this run builds it; the uploads wait for that wheel "
            f"(at most {apex_cache.WAIT_S / 3600:.0f} h)"
        )
        return True, None
    if got.message:
        logger.warning(f"apex wheel {lock.key}: {got.message}")
    return False, lock if got.kind == "taken" else None


def _python_hosts(state: State, specs: dict[str, tuple[Host, StackSpec]]) -> Iterator[str]:
    """The active hosts with a valid spec, in inventory order (get_active_hosts() is a set):
    the builder is the same every run. Fills ``specs`` as it goes."""
    active = set(state.inventory.get_active_hosts())
    for target in state.inventory:
        if target not in active:
            continue
        try:
            specs[target.name] = (target, spec_for_host(target))
        except SpecError:
            continue  # refused by preflight: runs no Python layer
        yield target.name


def _key_of(target: Host, spec: StackSpec) -> str | None:
    """``target``'s build key; None when its GPUs are refused (it runs no Python layer)."""
    survey_host(target, spec)  # its facts from its own survey, once per run
    gpus = ask(target, PciGpus)
    if not spec.gpu_summary(gpus).ok:
        return None
    return spec.apex_build(gpus).key


def needs_apex(target: Host, spec: StackSpec, key: str) -> bool:
    """Whether ``target`` must install apex at ``key`` in this run, from its own facts."""
    env, force = spec.env, spec.policy.force_reinstall
    fresh = conda.env_fresh(
        env.conda_prefix, env.name, spec.python_version, spec.user.name, "env" in force, target,
        lock_sum=preflight.conda_lock_sum(spec),
    )  # fmt: skip
    return apex.needed(
        env_python(env.conda_prefix, env.name),
        env_dir(env.conda_prefix, env.name),
        key,
        spec.user.name,
        fresh_env=fresh,
        force="apex" in force,
        target=target,
    )
