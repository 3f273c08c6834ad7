"""The smoke step of ``verify --smoke``: ONE PPO step through the host's own ~/launch-ppo.sh.

Pure: no pyinfra, no I/O. :func:`smoke_overrides` is the one source of the overrides a smoke
step appends to the launch script, on GPU hosts and on simulated ones (CPU) alike;
:func:`parse_smoke` reads what ``files/verify-smoke.sh.j2`` printed; :func:`smoke_check` turns it
into the ``smoke step`` check (PASS only when verl logged ``training/global_step:1`` and the
script exited 0), :func:`smoke_skip` says why a host is not stepped.
The cluster's step (issue 25, section 4): the same script, rendered for the Ray head, joins the
fleet's Ray cluster and runs ONE step with the cluster's plan (:func:`cluster_overrides`);
:func:`cluster_skip` says why it is not run, :func:`cluster_check` turns its output into the
head's ``smoke step (cluster)`` row.

The script's output (one line each)::

    @@p40fleet-smoke 1          first line
    key=value                   sim, scratch, patch_rc, ray_rc, cluster_rc, rc, run_s,
                                timed_out, left
    @@node NAME IP              (cluster) a planned member, alive in Ray with the resources
    @@missing NAME WHY          (cluster) a planned member the step cannot use, and why
    @@worker IP|local           (cluster) where verl's workers logged from (local: the head)
    @@left NAME                 (cluster) a member whose scratch dir could not be removed
    @@step LINE                 a line of verl's console logger with a step's metrics
    @@error LINE                one of the log's last exception lines (``NameError: ...``)
    @@log LINE                  one of the trainer log's last lines
    @@end                       the script ran to its end
"""

from __future__ import annotations

import re
import shlex
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
    "CLUSTER_CHECK",
    "DEFAULT_TIMEOUT_S",
    "LOG_LINES",
    "RESPONSE_LENGTH",
    "PROMPT_LENGTH",
    "SCRATCH",
    "SmokeRun",
    "cluster_check",
    "cluster_overrides",
    "cluster_skip",
    "cpu_ray_start_args",
    "gpus_per_node",
    "parse_metrics",
    "parse_smoke",
    "shell_word",
    "smoke_check",
    "smoke_overrides",
    "smoke_skip",
]

CHECK = "smoke step"
#: The Ray head's row for ONE step spanning the cluster (issue 25, section 4):
#: :func:`cluster_check`, :func:`cluster_skip` and :data:`MULTI_NODE_DOC`.
CLUSTER_CHECK = "smoke step (cluster)"
#: What was tried, what fails and how the cluster step runs.
MULTI_NODE_DOC = "docs/multi-node-step.md"
#: Default bound of one smoke run (ray start + main_ppo; its own Ray's stop comes after): a cold
#: start on a loaded 2-core lab host took about 200 s (issue 25, the CPU probe), a GPU host
#: loads more.
DEFAULT_TIMEOUT_S = 600
#: Short lengths: the step proves the loop, not the model (tokens, not minutes).
PROMPT_LENGTH = 64
RESPONSE_LENGTH = 16
#: Lines of the trainer's log a FAIL carries.
LOG_LINES = 15
#: Stands for the run's scratch directory (made by the training user when the step starts).
SCRATCH = "@SCRATCH@"
#: The placement-group resource verl 0.5.0 asks for on CPU: a resource named after the device
#: (single_controller/ray/base.py:110-117); Ray's fake GPU satisfies its GPU count
#: (ray_trainer.py:119-135).
_CPU_RAY_RESOURCES = '{"cpu": 1}'


#: Host data that turns the smoke step on (``python -m p40fleet.verify --smoke`` sets it), and
#: its bound in seconds.
SMOKE_DATA = "verify_smoke"
SMOKE_TIMEOUT_DATA = "verify_smoke_timeout"
#: The shortest bound accepted: Ray and the imports alone take longer.
MIN_TIMEOUT_S = 30


def requested(value: object) -> bool:
    """Whether host data ``verify_smoke`` asks for it."""
    return data_flag(value)


def timeout_from_data(value: object) -> int:
    """The bound from host data ``verify_smoke_timeout`` (:func:`check.seconds_from_data`)."""
    return seconds_from_data(value, SMOKE_TIMEOUT_DATA, DEFAULT_TIMEOUT_S, MIN_TIMEOUT_S)


def gpus_per_node(overrides: Iterable[str]) -> int:
    """``trainer.n_gpus_per_node`` of the host's launch plan (1 when it names none)."""
    value = 1
    for override in overrides:
        key, _, text = override.partition("=")
        if key.lstrip("+") == "trainer.n_gpus_per_node" and text.isdigit():
            value = int(text)
    return max(value, 1)


def smoke_overrides(*, simulated: bool, gpus: int, scratch: str = SCRATCH) -> list[str]:
    """The Hydra overrides a smoke step appends to ~/launch-ppo.sh (the later wins).

    One step, the short lengths, the smallest batch verl 0.5.0 accepts for ``gpus`` workers on
    one node (one sample per worker: ``train_batch_size`` and ``ppo_mini_batch_size`` divisible
    by the world size, micro batches of 1), validation and checkpoints off, Hydra's run dir and
    the checkpoint dir in ``scratch``. ``simulated``: the CPU step of a lab host (one worker).
    """
    return _overrides(1 if simulated else max(gpus, 1), 1, simulated, scratch)


def cluster_overrides(
    *, simulated: bool, nnodes: int, gpus_per_node: int, scratch: str = SCRATCH
) -> list[str]:
    """The overrides of the cluster's step: the cluster plan's ``nnodes`` x ``gpus_per_node``
    (on simulated hosts too: one CPU worker per fake GPU, so verl's placement groups, one per
    node of ``gpus_per_node`` bundles, land on distinct nodes), one sample per worker."""
    return _overrides(max(gpus_per_node, 1), max(nnodes, 1), simulated, scratch)


def _overrides(per_node: int, nnodes: int, simulated: bool, scratch: str) -> list[str]:
    workers = per_node * nnodes
    out = [
        "trainer.total_training_steps=1",
        f"data.max_prompt_length={PROMPT_LENGTH}",
        f"data.max_response_length={RESPONSE_LENGTH}",
        "data.truncation=left",
        "data.dataloader_num_workers=0",
        f"data.train_batch_size={workers}",
        f"data.val_batch_size={workers}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={workers}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        "critic.ppo_micro_batch_size_per_gpu=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={scratch}/checkpoints",
        f"hydra.run.dir={scratch}/hydra",
        f"trainer.nnodes={nnodes}",
        f"trainer.n_gpus_per_node={per_node}",
    ]
    if simulated:
        out.append("trainer.device=cpu")
    return out


def cpu_ray_start_args(port: int) -> list[str]:
    """``ray start`` arguments of a simulated host's CPU step: one fake GPU and a ``cpu``
    resource for verl's placement group, a small object store, no dashboard."""
    return [
        "start", "--head", f"--port={port}", "--num-cpus=4", "--num-gpus=1",
        f"--resources={_CPU_RAY_RESOURCES}", "--include-dashboard=false",
        "--object-store-memory=300000000", "--disable-usage-stats",
    ]  # fmt: skip


def shell_word(override: str) -> str:
    """One override as a shell word: quoted, :data:`SCRATCH` as ``"$S"`` (the scratch dir)."""
    parts = override.split(SCRATCH)
    return '"$S"'.join(shlex.quote(p) if p else "" for p in parts) or "''"


# --- the script's output ------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")
# verl prints numpy scalars as their repr: ``critic/vf_loss:np.float64(2.11)``
_METRIC = re.compile(r"^([^\s:][^:]*):(?:np\.\w+\()?([-+0-9.eE]+|nan|inf)\)?$")
_KV = re.compile(r"^([a-z_]+)=(.*)$")
#: An exception line of a Python traceback (the shell twin is in files/verify-smoke.sh.j2).
_ERROR = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)?(Error|Exception|Interrupt)[A-Za-z]*: ")


def parse_metrics(lines: Iterable[str]) -> dict[int, dict[str, float]]:
    """verl's console logger lines (``[(TaskRunner pid=N)] step:N - key:value - ...``) ->
    {N: {key: value}}."""
    steps: dict[int, dict[str, float]] = {}
    for line in lines:
        match = _STEP.search(_ANSI.sub("", line))
        if not match:
            continue
        metrics = steps.setdefault(int(match.group(1)), {})
        for part in match.group(2).split(" - "):
            m = _METRIC.match(part.strip())
            if m:
                metrics[m.group(1)] = float(m.group(2))
    return steps


@dataclass(frozen=True)
class SmokeRun(ToJson):
    """What one smoke run said: its keys (``rc``, ``sim``, ...), the trainer's last log lines,
    the step metrics verl logged, and whether the script ran to its end."""

    values: Mapping[str, str] = field(default_factory=dict)
    log: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    metrics: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    started: bool = False
    complete: bool = False
    nodes: tuple[tuple[str, str], ...] = ()  # the cluster step's: (member, its Ray address)
    missing: tuple[tuple[str, str], ...] = ()  # (member, why the step cannot use it)
    workers: tuple[str, ...] = ()  # the addresses verl's workers logged from ("local": here)
    left: tuple[str, ...] = ()  # members whose scratch dir is left

    def int_value(self, key: str) -> int | None:
        text = self.values.get(key, "")
        return int(text) if re.fullmatch(r"-?\d+", text) else None


def parse_smoke(output: Iterable[str]) -> SmokeRun:
    """Read the smoke script's stdout (never raises)."""
    values: dict[str, str] = {}
    log: list[str] = []
    errors: list[str] = []
    step_lines: list[str] = []
    nodes: list[tuple[str, str]] = []
    missing: list[tuple[str, str]] = []
    workers: list[str] = []
    left: list[str] = []
    started = complete = False
    for raw in output:
        line = raw.rstrip("\r\n")
        if line.startswith("@@p40fleet-smoke"):
            started = True
        elif line.strip() == "@@end":
            complete = True
        elif line.startswith("@@log "):
            log.append(_ANSI.sub("", line[len("@@log ") :]))
        elif line.startswith("@@error "):
            errors.append(_ANSI.sub("", line[len("@@error ") :]).strip())
        elif line.startswith("@@step "):
            step_lines.append(line[len("@@step ") :])
        elif line.startswith("@@node "):
            name, _, address = line[len("@@node ") :].strip().partition(" ")
            nodes.append((name, address.strip()))
        elif line.startswith("@@missing "):
            name, _, why = line[len("@@missing ") :].strip().partition(" ")
            missing.append((name, why.strip()))
        elif line.startswith("@@worker "):
            workers.append(line[len("@@worker ") :].strip())
        elif line.startswith("@@left "):
            left.append(line[len("@@left ") :].strip())
        elif (m := _KV.match(line)) is not None:
            values[m.group(1)] = m.group(2)
    metrics = parse_metrics(step_lines)
    if not errors:  # an older script, or the exception is among the last lines
        errors = [ln.strip() for ln in log if _ERROR.match(ln)][-3:]
    return SmokeRun(values, tuple(log), tuple(errors), metrics, started, complete,
                    tuple(nodes), tuple(missing), tuple(workers), tuple(left))  # fmt: skip


# --- the check --------------------------------------------------------------------------

_MISSING_WHY = {"model files": "staged model", "data files": "training data"}


def smoke_skip(checks: Sequence[Check]) -> Check | None:
    """The SKIP of a host that is not stepped: no staged model or data (named), or another
    check failed. None: every other check passed, the step runs."""
    missing = [c for c in checks if c.name in _MISSING_WHY and c.status != PASS]
    if missing:
        what = "; ".join(f"no {_MISSING_WHY[c.name]} ({c.detail})" for c in missing)
        return Check(CHECK, SKIP, f"not run: {what}")
    failed = [c.name for c in checks if c.status == FAIL]
    if failed:
        return Check(CHECK, SKIP, f"not run: the host fails {', '.join(failed)}")
    return None


def _where(run: SmokeRun) -> str:
    return f"CPU ({SIMULATED})" if run.values.get("sim") == "yes" else "GPU"


def _tail(run: SmokeRun) -> str:
    """The log's last lines; when an exception was logged, the lines that end with it (Ray's
    workers keep printing after the driver's traceback)."""
    lines = [line.strip() for line in run.log if line.strip(" ^~\t")]  # no caret lines
    if run.errors:
        last = max((i for i, ln in enumerate(lines) if ln == run.errors[-1]), default=None)
        if last is not None:
            lines = lines[: last + 1]
    lines = lines[-LOG_LINES:]
    return " | ".join(lines) if lines else "(the trainer's log is empty)"


def _fix(run: SmokeRun, timeout_s: int) -> str:
    """The remedy for a FAIL, from what the run said."""
    text = "\n".join(run.log)
    if run.values.get("timed_out") == "yes":
        return (
            f"the step did not end within {timeout_s} s: on a loaded host a cold start takes "
            "minutes; raise the bound (--smoke-timeout S, host data verify_smoke_timeout) or "
            "look at the log's last lines for where it hung"
        )
    if run.values.get("scratch_rc") not in (None, "0"):
        return "the training user could not make a scratch directory in /tmp: free space there"
    if run.values.get("patch_rc") not in (None, "0"):
        return (
            "the lab-cpu rules of p40fleet/verl_patches.py do not match the host's verl: "
            "update the rule set for this verl ref"
        )
    if run.values.get("ray_rc") not in (None, "0"):
        return (
            "`ray start` failed as the training user: is the env's ray installed "
            "(deploy/python.py) and the smoke port free?"
        )
    if "launch-ppo:" in text:
        refusal = next(ln for ln in run.log if "launch-ppo:" in ln)
        return f"{refusal.split('launch-ppo:', 1)[1].strip()}; then run deploy/training.py"
    if run.values.get("launch") == "absent":
        return "~/launch-ppo.sh is missing or not executable: run deploy/training.py"
    return (
        "run ~/launch-ppo.sh as the training user to reproduce; if the script or the env was "
        "changed by hand, `deploy/training.py` rewrites the script and `deploy/python.py` "
        "repairs the env"
    )


def smoke_check(
    run: SmokeRun, *, model: str, overrides: Sequence[str], timeout_s: int = DEFAULT_TIMEOUT_S
) -> Check:
    """PASS only when verl logged ``training/global_step:1`` and the launch script exited 0;
    the detail carries the step time, peak memory per GPU, the model and the lengths."""
    used = f"model {model}, lengths {PROMPT_LENGTH}+{RESPONSE_LENGTH}"
    batch = next((o.split("=", 1)[1] for o in overrides if o.startswith("data.train_batch")), "?")
    if not run.started:
        return Check(
            CHECK,
            FAIL,
            "the smoke script gave no answer (no output)",
            "run `pyinfra INVENTORY deploy/verify.py --data verify_smoke=yes --debug` to see why",
        )
    where = _where(run)
    rc = run.int_value("rc")
    step = next((m for n, m in sorted(run.metrics.items()) if m.get("training/global_step")), {})
    stepped = step.get("training/global_step") == 1.0
    if stepped and rc == 0 and run.complete:
        seconds = step.get("timing_s/step")
        peak = step.get("perf/max_memory_allocated_gb")
        timing = f"{seconds:.2f} s (timing_s/step)" if seconds is not None else "time not logged"
        if run.values.get("sim") == "yes":
            memory = "peak GPU memory: none on CPU"
        elif peak is not None:
            memory = f"peak {peak:.2f} GiB allocated per GPU (perf/max_memory_allocated_gb)"
        else:
            memory = "peak memory not logged"
        total = run.values.get("run_s", "?")
        return Check(
            CHECK,
            PASS,
            f"{where}: 1 PPO step in {timing}, {memory}; {used}, batch {batch}; run {total} s",
        )
    if rc is None:
        said = "the launch script did not run"
    elif run.values.get("timed_out") == "yes":
        said = f"stopped after {timeout_s} s"
    else:
        said = f"launch script exit {rc}"
    logged = "training/global_step:1 logged" if stepped else "no training/global_step:1"
    error = f"error: {run.errors[-1]}; " if run.errors else ""
    return Check(
        CHECK,
        FAIL,
        f"{where}: {said}, {logged}; {error}{used}; last lines: {_tail(run)}",
        _fix(run, timeout_s),
    )


def cluster_skip(checks: Sequence[Check], head: str) -> Check | None:
    """The SKIP of the cluster's step when the head cannot run it: the head's own ``smoke
    step`` did not pass, or another of its checks (``ray cluster`` among them: a member not
    active) failed. None: the step runs (its script still SKIPs a member Ray cannot use)."""
    failed = [c.name for c in checks if c.status == FAIL and c.name != CHECK]
    if failed:
        return Check(CLUSTER_CHECK, SKIP, f"not run: the head {head} fails {', '.join(failed)}")
    own = next((c for c in checks if c.name == CHECK), None)
    if own is None or own.status != PASS:
        why = f"{own.status}: {own.detail}" if own is not None else "not run"
        return Check(CLUSTER_CHECK, SKIP, f"not run: the head {head}'s own `{CHECK}` did not "
                     f"pass ({why}); a cluster step would stop where it stops")  # fmt: skip
    return None


def _plan(members: Sequence[str], gpus_per_node: int) -> str:
    return f"{len(members)} node(s) x {gpus_per_node} GPU(s) ({', '.join(members)})"


def _workers_on(run: SmokeRun, head: str) -> list[str]:
    """The members verl's workers logged from (Ray prefixes a remote worker's lines with its
    node's address; the head's own workers have none)."""
    names = {address: name for name, address in run.nodes}
    seen = [head if w == "local" else names.get(w, w) for w in run.workers]
    return sorted(set(seen))


def cluster_check(
    run: SmokeRun,
    *,
    head: str,
    members: Sequence[str],
    gpus_per_node: int,
    model: str,
    timeout_s: int = DEFAULT_TIMEOUT_S,
) -> Check:
    """The head's ``smoke step (cluster)`` row: PASS only when verl logged
    ``training/global_step:1`` over the cluster's plan and the launch script exited 0; the
    detail carries the step time and the nodes verl's workers ran on. SKIP when a planned
    member is not an alive Ray node offering the plan's resources (named, with the fix)."""
    plan = _plan(members, gpus_per_node)
    if not run.started:
        return Check(
            CLUSTER_CHECK,
            FAIL,
            "the cluster smoke script gave no answer (no output)",
            "run `pyinfra INVENTORY deploy/verify.py --data verify_smoke=yes --debug` to see why",
        )
    where = _where(run)
    if run.missing:
        what = "; ".join(f"{name}: {why}" for name, why in run.missing)
        return Check(
            CLUSTER_CHECK,
            SKIP,
            f"not run: the cluster's plan {plan} needs every member in Ray: {what}",
            "run deploy/ray.py (a member's unit offers what the plan needs), check the members "
            "named, then verify again",
        )
    if run.values.get("cluster_rc") not in (None, "0"):
        return Check(
            CLUSTER_CHECK,
            FAIL,
            f"{where}: the head could not read the Ray cluster's nodes (exit "
            f"{run.values.get('cluster_rc')}); last lines: {_tail(run)}",
            "check the head's Ray member (`systemctl status p40fleet-ray`) and the cluster's "
            "token (/etc/p40fleet), then run deploy/ray.py",
        )
    overrides = cluster_overrides(simulated=run.values.get("sim") == "yes",
                                  nnodes=len(members), gpus_per_node=gpus_per_node)  # fmt: skip
    step = smoke_check(run, model=model, overrides=overrides, timeout_s=timeout_s)
    if step.status != PASS:
        return Check(CLUSTER_CHECK, step.status, f"{plan}: {step.detail}", step.remedy)
    on = _workers_on(run, head)
    seen = f"workers on {len(on)} node(s) ({', '.join(on)})" if on else "workers' nodes not logged"
    left = f"; scratch left on {', '.join(run.left)}" if run.left else ""
    detail = step.detail.replace(": 1 PPO step in ", f": 1 PPO step over {plan} in ", 1)
    return Check(CLUSTER_CHECK, PASS, f"{detail}; {seen}{left}")
