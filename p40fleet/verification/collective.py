"""The collective check of ``verify --collective``: one all-reduce over the cluster's training
nodes, its bus bandwidth and latency, PASS / FAIL against ``stack.ray.collective_min_busbw_gbs``.

Pure: no pyinfra, no I/O. ``files/verify-collective.sh.j2`` runs on the Ray head as the training
user: its driver holds a TCP store (torch.distributed's rendezvous) on the head's address, asks
Ray for one task on each training node (node affinity, the same placement verl's workers get) and
each task joins the group (NCCL on GPU hosts, gloo on simulated ones) and times ``all_reduce``
at :data:`SIZES`. :func:`parse_collective` reads what it printed, :func:`collective_checks`
turns it into one ``collective <node>`` check per node and one ``collective`` check for the group.

Bandwidth as nccl-tests' ``all_reduce_perf`` defines it (doc/PERFORMANCE.md there)::

    algbw = bytes / time          busbw = algbw * 2 (n - 1) / n        (n ranks)

``time`` is one all-reduce's mean over the timed iterations; a node's numbers use its own time,
the group's the slowest rank's (every rank waits for it). Latency: the time at the smallest size.

The script's output (one line each)::

    @@p40fleet-collective 1        first line
    key=value                      sim, backend, world, rc, timed_out, run_s
    @@member NAME ADDRESS          a training node the check expects, in rank order
    @@missing NAME ADDRESS WHY     a member that is not an alive node of the Ray cluster
    @@rank NAME RANK IP            a rank that answered
    @@time NAME BYTES SECONDS      its mean time of one all-reduce of BYTES
    @@fail NAME TEXT               a rank's error (or no answer), in its own words
    @@error TEXT                   the driver's own error (ray.init, the store's port)
    @@log LINE                     one of the driver's last log lines
    @@end                          the script ran to its end
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from p40fleet.jsonable import ToJson
from p40fleet.verification.check import (
    FAIL,
    PASS,
    SIMULATED,
    SKIP,
    Check,
    data_flag,
    seconds_from_data,
)

__all__ = [
    "CHECK",
    "COLLECTIVE_DATA",
    "COLLECTIVE_TIMEOUT_DATA",
    "DEFAULT_TIMEOUT_S",
    "ITERATIONS",
    "MIN_TIMEOUT_S",
    "SIZES",
    "CollectiveRun",
    "RankResult",
    "algbw_gbs",
    "busbw_gbs",
    "collective_checks",
    "join_timeout_s",
    "parse_collective",
    "requested",
    "timeout_from_data",
]

CHECK = "collective"
#: Host data that turns the check on (``python -m p40fleet.verify --collective`` sets it), and
#: its bound in seconds.
COLLECTIVE_DATA = "verify_collective"
COLLECTIVE_TIMEOUT_DATA = "verify_collective_timeout"
#: One run: ray.init + the tasks' torch import (tens of seconds on a loaded lab host) + the
#: timed loops (seconds on 1 GbE).
DEFAULT_TIMEOUT_S = 180
MIN_TIMEOUT_S = 30
#: Message sizes in bytes (float32): 8 B for the latency, then up to 64 MiB where a link's
#: bandwidth shows (nccl-tests' default range starts at 8 B).
SIZES = (8, 1 << 20, 16 << 20, 64 << 20)
#: (warm-up, timed) iterations per size: fewer where one all-reduce takes longer.
ITERATIONS = ((5, 50), (3, 20), (2, 8), (1, 5))
#: Bytes in a GB, as nccl-tests counts them.
GB = 1e9

_MEMBER_FIX = (
    "see `systemctl status p40fleet-ray` on {name}, then `pyinfra -y INVENTORY deploy/ray.py`"
)


def requested(value: object) -> bool:
    """Whether host data ``verify_collective`` asks for it."""
    return data_flag(value)


def timeout_from_data(value: object) -> int:
    """The bound from host data ``verify_collective_timeout`` (:func:`check.seconds_from_data`)."""
    return seconds_from_data(value, COLLECTIVE_TIMEOUT_DATA, DEFAULT_TIMEOUT_S, MIN_TIMEOUT_S)


def join_timeout_s(timeout_s: int) -> int:
    """How long a rank waits for the rendezvous and the group (a third of the bound, >= 10 s):
    a member that cannot join FAILs within it, the others' waits end too."""
    return max(10, timeout_s // 3)


def algbw_gbs(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: bytes / time."""
    return nbytes / seconds / GB if seconds > 0 else 0.0


def busbw_gbs(nbytes: int, seconds: float, ranks: int) -> float:
    """Bus bandwidth in GB/s (nccl-tests' all-reduce): algbw * 2(n-1)/n; 0 for one rank."""
    if ranks < 1:
        return 0.0
    return algbw_gbs(nbytes, seconds) * 2 * (ranks - 1) / ranks


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _latency(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 0.01 else f"{seconds * 1e3:.1f} ms"


# --- the script's output ------------------------------------------------------------------

_KV = re.compile(r"^([a-z_]+)=(.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class RankResult(ToJson):
    """One rank's answer: its rank and node IP, its mean time per size, or its error."""

    name: str
    rank: int | None = None
    ip: str = ""
    times: tuple[tuple[int, float], ...] = ()
    error: str = ""


@dataclass(frozen=True)
class CollectiveRun(ToJson):
    """What one collective run said."""

    values: Mapping[str, str] = field(default_factory=dict)
    members: tuple[tuple[str, str], ...] = ()
    missing: tuple[tuple[str, str, str], ...] = ()
    ranks: Mapping[str, RankResult] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    log: tuple[str, ...] = ()
    started: bool = False
    complete: bool = False

    @property
    def world(self) -> int:
        return len(self.members)


def parse_collective(output: Iterable[str]) -> CollectiveRun:
    """Read the collective script's stdout (never raises: a malformed line is ignored)."""
    values: dict[str, str] = {}
    members: list[tuple[str, str]] = []
    missing: list[tuple[str, str, str]] = []
    ranks: dict[str, dict] = {}
    errors: list[str] = []
    log: list[str] = []
    started = complete = False
    for raw in output:
        line = _ANSI.sub("", raw.rstrip("\r\n"))
        words = line.split(" ", 4)
        tag = words[0]
        try:
            if tag == "@@p40fleet-collective":
                started = True
            elif tag == "@@end":
                complete = True
            elif tag == "@@member" and len(words) >= 3:
                members.append((words[1], words[2]))
            elif tag == "@@missing" and len(words) >= 3:
                missing.append((words[1], words[2], " ".join(words[3:])))
            elif tag == "@@rank" and len(words) >= 4:
                entry = ranks.setdefault(words[1], {"times": []})
                entry.update(rank=int(words[2]), ip=words[3])
            elif tag == "@@time" and len(words) >= 4:
                entry = ranks.setdefault(words[1], {"times": []})
                entry["times"].append((int(words[2]), float(words[3])))
            elif tag == "@@fail" and len(words) >= 2:
                entry = ranks.setdefault(words[1], {"times": []})
                entry["error"] = line.split(" ", 2)[2] if len(words) > 2 else "failed"
            elif tag == "@@error":
                errors.append(line[len("@@error ") :].strip())
            elif tag == "@@log":
                log.append(line[len("@@log ") :])
            elif (m := _KV.match(line)) is not None:
                values[m.group(1)] = m.group(2)
        except ValueError:
            continue
    results = {
        name: RankResult(
            name,
            entry.get("rank"),
            entry.get("ip", ""),
            tuple(sorted(entry["times"])),
            entry.get("error", ""),
        )
        for name, entry in ranks.items()
    }
    return CollectiveRun(
        values=values,
        members=tuple(members),
        missing=tuple(missing),
        ranks=results,
        errors=tuple(errors),
        log=tuple(log),
        started=started,
        complete=complete,
    )


# --- the checks --------------------------------------------------------------------------


def _where(run: CollectiveRun) -> str:
    backend = run.values.get("backend", "?")
    return f"{backend} ({SIMULATED})" if run.values.get("sim") == "yes" else backend


def _numbers(times: Sequence[tuple[int, float]], ranks: int) -> str:
    """``busbw 0.26 GB/s @ 1 MiB, ..., 0.11 GB/s @ 64 MiB (algbw 0.11); latency 95 us @ 8 B``
    (algbw at the largest size: with one rank, busbw is 0 and algbw still says something)."""
    if not times:
        return "no timings"
    big = [f"{busbw_gbs(b, t, ranks):.3f} GB/s @ {_size(b)}" for b, t in times[1:]]
    small_b, small_t = times[0]
    large_b, large_t = times[-1]
    bw = f"busbw {', '.join(big)} (algbw {algbw_gbs(large_b, large_t):.3f}); " if big else ""
    return f"{bw}latency {_latency(small_t)} @ {_size(small_b)}"


def _largest(times: Sequence[tuple[int, float]]) -> tuple[int, float] | None:
    return max(times) if times else None


def _no_answer_fix(run: CollectiveRun, timeout_s: int) -> str:
    if run.values.get("timed_out") == "yes":
        return (
            f"the check did not end within {timeout_s} s: raise the bound "
            "(--collective-timeout S, host data verify_collective_timeout) or look at the "
            "members named above"
        )
    return (
        "run `pyinfra INVENTORY deploy/verify.py --data verify_collective=yes --debug` to see why"
    )


def collective_checks(
    run: CollectiveRun, *, head: str, floor_gbs: float, timeout_s: int = DEFAULT_TIMEOUT_S
) -> list[Check]:
    """One ``collective <node>`` check per training node and the group's ``collective`` check
    (last): PASS when every member joined, the sum came back right and the group's busbw at
    the largest size is at least ``floor_gbs``; a FAIL names the member and why."""
    if not run.started:
        return [Check(CHECK, FAIL, "the collective script gave no answer (no output)",
                      _no_answer_fix(run, timeout_s))]  # fmt: skip
    where = _where(run)
    n = run.world
    if run.errors and not run.ranks and not run.missing:
        error = run.errors[-1]
        fix = (
            f"free the port on {head} or set stack.ray.collective_port to a free one"
            if "port" in error and ("in use" in error or "bind" in error.lower())
            else f"start {head}'s Ray head (`systemctl status p40fleet-ray`), then "
            "`pyinfra -y INVENTORY deploy/ray.py`"
        )
        return [Check(CHECK, FAIL, f"{where} on head {head}: {error}", fix)]
    out: list[Check] = []
    failed: list[str] = []
    missing = {name: (address, why) for name, address, why in run.missing}
    # members whose rank could not reach the head's store: the others' timeouts are their echo
    blockers = [
        name
        for name, r in run.ranks.items()
        if r.error and "cannot reach the rendezvous" in r.error
    ]
    for name, address in run.members:
        result = run.ranks.get(name)
        if name in missing:
            why = missing[name][1]
            failed.append(f"{name} ({address}) cannot join: {why}")
            fix = _MEMBER_FIX.format(name=name)
            out.append(Check(f"{CHECK} {name}", FAIL, f"{address}: {why}", fix))
        elif missing:  # the driver starts no rank when a member is not in Ray
            lacks = ", ".join(missing)
            out.append(Check(f"{CHECK} {name}", SKIP, f"not run: the group lacks {lacks}"))
        elif result is None or (not result.error and len(result.times) < len(SIZES)):
            said = result.error if result and result.error else f"no answer within {timeout_s} s"
            failed.append(f"{name} ({address}): {said}")
            fix = _no_answer_fix(run, timeout_s)
            out.append(Check(f"{CHECK} {name}", FAIL, f"{address}: {said}", fix))
        elif result.error:
            failed.append(f"{name} ({address}): {result.error}")
            fix = _rank_fix(result.error, name, head, [b for b in blockers if b != name])
            out.append(Check(f"{CHECK} {name}", FAIL, f"{address}: {result.error}", fix))
        else:
            numbers = _numbers(result.times, n)
            detail = f"rank {result.rank} at {result.ip}: {numbers}"
            out.append(Check(f"{CHECK} {name}", PASS, detail))
    if not run.members:
        return [*out, Check(CHECK, FAIL, f"{where}: the script named no member",
                            _no_answer_fix(run, timeout_s))]  # fmt: skip
    if failed:
        # the first cause first: a member that cannot reach the rendezvous or is not in Ray
        failed.sort(key=lambda text: "cannot" not in text and "not an alive" not in text)
        return [*out, Check(CHECK, FAIL, f"{where}, {n} node(s): " + "; ".join(failed),
                            "fix the member named first: the others wait for it")]  # fmt: skip
    # the group: the slowest rank's time at each size (every rank waits for it)
    group: dict[int, float] = {}
    slowest: dict[int, str] = {}
    for result in run.ranks.values():
        for nbytes, seconds in result.times:
            if seconds > group.get(nbytes, -1.0):
                group[nbytes], slowest[nbytes] = seconds, result.name
    times = sorted(group.items())
    summary = f"{where}, {n} node(s) ({', '.join(name for name, _ in run.members)}): "
    summary += _numbers(times, n)
    if n < 2:
        return [*out, Check(CHECK, SKIP, f"{summary}; one training node: no link between "
                            "nodes to measure (busbw is 0 by definition)")]  # fmt: skip
    nbytes, seconds = _largest(times)  # type: ignore[misc]
    busbw = busbw_gbs(nbytes, seconds, n)
    if busbw >= floor_gbs:
        return [*out, Check(CHECK, PASS, f"{summary}; >= floor {floor_gbs:g} GB/s "
                            f"@ {_size(nbytes)}")]  # fmt: skip
    return [
        *out,
        Check(
            CHECK,
            FAIL,
            f"{summary}; busbw {busbw:.3f} GB/s @ {_size(nbytes)} is under the floor "
            f"{floor_gbs:g} GB/s (stack.ray.collective_min_busbw_gbs); slowest: "
            f"{slowest[nbytes]}",
            f"look at the link of {slowest[nbytes]} (its speed: `ethtool IFACE`, errors: "
            "`ip -s link`); with a known slower network, lower stack.ray.collective_min_busbw_gbs",
        ),
    ]


def _rank_fix(error: str, name: str, head: str, blockers: Sequence[str] = ()) -> str:
    if "rendezvous" in error:
        return (
            f"open the port from {name} to {head} (a firewall between them?) or set "
            "stack.ray.collective_port to one that is open"
        )
    if blockers:
        return (
            f"{name} waited for {', '.join(blockers)}, which cannot reach the rendezvous on "
            f"{head}: fix that first (its row names the port)"
        )
    if "CUDA" in error or "cuda" in error:
        return f"make {name}'s GPUs answer (deploy/system.py); a training run may hold them"
    return (
        f"the group did not form: {name} must reach every other member on its ephemeral "
        "ports (gloo/NCCL connect rank to rank); see the error above"
    )
