"""The run's record: what one pyinfra run keeps between its deploy files, its hosts and its
state callbacks, in one typed :class:`RunRecord` per pyinfra ``State``.

    from p40fleet.run_record import run_record

    run_record(state).refused_hosts.add(host.name)

Every field starts empty and lives as long as the State: the next run (a new State, as the
tests make one per run) starts from a new record. The records are kept beside the States, in
a :class:`weakref.WeakKeyDictionary`, so pyinfra's State gets no attribute of ours.

It lives in ``p40fleet/``, the floor every layer may import (``tests/test_import_graph.py``),
because every layer keeps something in it: ``p40fleet/runtime/sshguard.py`` the connect
failures, ``facts/survey.py`` the answers kept, ``operations/`` and the deploy files the rest.
``tests/test_run_record.py`` fails on an attribute of ours on a State anywhere else.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyinfra import state as current_state

if TYPE_CHECKING:
    from pyinfra.api import State

    from p40fleet.apex_cache import BuildLock
    from p40fleet.spec import StackSpec

__all__ = ["RunRecord", "run_record"]


@dataclass
class RunRecord:
    """One run's bookkeeping, by the module that keeps each field (host names as keys)."""

    #: Hosts refused in this run, whose deploys add no more operations (``operations.refuse``).
    refused_hosts: set[str] = field(default_factory=set)

    #: ``(step, reason, fix)`` of each refusal queued per host, for the report after the run
    #: (``operations.refuse``).
    refusals: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)

    #: Each host's spec, validated once for all the run's deploys (``operations.run.spec``).
    specs: dict[str, StackSpec] = field(default_factory=dict)

    #: ``(run id, controller id)`` of this run's lock holder, fixed at first use
    #: (``operations.run_lock``).
    lock_run: tuple[str, str] | None = None

    #: Hosts whose run lock is queued: once per run, whichever deploy comes first.
    lock_queued: set[str] = field(default_factory=set)

    #: Hosts whose run lock this run holds now (taken before the first operation, not yet
    #: released).
    lock_held: set[str] = field(default_factory=set)

    #: Hosts whose lock the verification after the run releases, not their last operation.
    lock_deferred: set[str] = field(default_factory=set)

    #: The host that builds each apex key in this run, None when none does
    #: (``operations.run.apex_fleet``).
    apex_builders: dict[str, str | None] = field(default_factory=dict)

    #: The shared cache's build lock of each key this run builds, by the lock's path, held
    #: until the wheel is stored (``p40fleet.apex_cache.hold``).
    apex_build_locks: dict[str, BuildLock] = field(default_factory=dict)

    #: ``(filename, sha256) -> [lock, (path, why) or None]``: the controller's copy of each
    #: artifact, fetched once per run for all hosts (``operations.artifacts``).
    controller_copies: dict[tuple[str, str], list[Any]] = field(default_factory=dict)

    #: Hosts whose proxy credentials step is queued (``operations.proxy.first_time``).
    proxy_queued: set[str] = field(default_factory=set)

    #: Hosts whose training user an operation of this run creates
    #: (``operations.training_user.queued_hosts``).
    training_user_queued: set[str] = field(default_factory=set)

    #: Whether the survey keeps answers in this run (``facts.survey.install``).
    survey_installed: bool = False

    #: ``facts.survey``'s book per host: the answers kept and whether they still hold (``Any``:
    #: the book's type is ``facts.survey``'s own, a layer above this one).
    survey_books: dict[str, Any] = field(default_factory=dict)

    #: The hosts verified after the run's last operation, with their spec (None: refused;
    #: ``operations.run.verify.verify_after_run``).
    verify_specs: dict[str, StackSpec | None] = field(default_factory=dict)

    #: Whether the verification after the run is registered on the State (once per run).
    verify_registered: bool = False

    #: Whether the verification after the run has reported (once, at the end or at the stop).
    verify_finished: bool = False

    #: Each host's report entry from ``deploy/verify.py``, for the fleet table after the last.
    verify_results: dict[str, dict[str, Any]] = field(default_factory=dict)

    #: Whether ``deploy/verify.py`` has printed the fleet table and written the report.
    verify_printed: bool = False

    #: The run's Ray cluster, planned once for every host (``operations.run.ray_cluster.
    #: membership``; ``Any``: a ``Membership``, that module's own).
    ray_membership: Any = None

    #: Each host's survey row from ``deploy/facts.py``, for the fleet table after the last.
    fact_rows: dict[str, dict[str, str]] = field(default_factory=dict)

    #: ``(kind, message)`` of each host that could not be reached
    #: (``p40fleet.runtime.sshguard``).
    connect_failures: dict[str, tuple[str, str]] = field(default_factory=dict)


_RECORDS: weakref.WeakKeyDictionary[Any, RunRecord] = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


def _the_state(run: Any) -> Any:
    """The State itself. ``from pyinfra import state`` is pyinfra's context proxy: one object
    for every run that forwards to the current State (its hash too); a record keyed by it would
    outlive its State, and a later State at the same address would find it. The proxy's bound
    methods are the State's own."""
    return current_state.is_host_in_limit.__self__ if run is current_state else run


def run_record(run: State) -> RunRecord:
    """The one record of the run ``run`` (a State, or pyinfra's ``state`` proxy for the
    current one); made empty on first use."""
    key = _the_state(run)
    with _GUARD:
        record = _RECORDS.get(key)
        if record is None:
            record = _RECORDS[key] = RunRecord()
    return record
