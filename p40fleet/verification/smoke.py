"""The smoke step of ``verify --smoke``: ONE PPO step through the host's own ~/launch-ppo.sh.

Pure: no pyinfra, no I/O. :func:`smoke_overrides` is the one source of the overrides a smoke
step appends to the launch script, on GPU hosts and on simulated ones (CPU) alike;
:func:`parse_smoke` reads what ``files/verify-smoke.sh.j2`` printed; :func:`smoke_check` turns it
into the ``smoke step`` check (PASS only when verl logged ``training/global_step:1`` and the
script exited 0), :func:`smoke_skip` says why a host is not stepped.

The script's output (one line each)::

    @@p40fleet-smoke 1          first line
    key=value                   sim, scratch, patch_rc, ray_rc, rc, run_s, timed_out, left
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
#: The head's row for a step spanning the cluster (issue 25, section 4): not run yet, see
#: :func:`cluster_skip` and :data:`MULTI_NODE_DOC`.
CLUSTER_CHECK = "smoke step (cluster)"
#: What was tried, what fails and what a cluster step needs.
MULTI_NODE_DOC = "docs/multi-node-step.md"
#: Default bound of one smoke run (ray start + main_ppo + ray stop): a cold start on a loaded
#: 2-core lab host took about 200 s (issue 25, the CPU probe), a GPU host loads more.
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
    workers = 1 if simulated else max(gpus, 1)
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
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={workers}",
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

    def int_value(self, key: str) -> int | None:
        text = self.values.get(key, "")
        return int(text) if re.fullmatch(r"-?\d+", text) else None


def parse_smoke(output: Iterable[str]) -> SmokeRun:
    """Read the smoke script's stdout (never raises)."""
    values: dict[str, str] = {}
    log: list[str] = []
    errors: list[str] = []
    step_lines: list[str] = []
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
        elif (m := _KV.match(line)) is not None:
            values[m.group(1)] = m.group(2)
    metrics = parse_metrics(step_lines)
    if not errors:  # an older script, or the exception is among the last lines
        errors = [ln.strip() for ln in log if _ERROR.match(ln)][-3:]
    return SmokeRun(values, tuple(log), tuple(errors), metrics, started, complete)


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


def cluster_skip(*, simulated: bool, members: Sequence[str], gpus_per_node: int) -> Check:
    """The Ray head's ``smoke step (cluster)`` row: why ``--smoke`` steps every host alone and
    not the cluster's plan (``members`` x ``gpus_per_node``). On simulated hosts the step cannot
    run over the fleet's Ray cluster as it is (measured: :data:`MULTI_NODE_DOC`); on GPU hosts
    the cluster step is not built."""
    plan = f"{len(members)} node(s) x {gpus_per_node} GPU(s) ({', '.join(members)})"
    if simulated:
        why = (
            f"not run on simulated hosts: the cluster's plan {plan} needs every member's Ray "
            "node to offer verl a GPU and a `cpu` resource, and the fleet's Ray units on "
            "simulated hosts offer neither (verl 0.5.0 ray_trainer.py:133: Total available GPUs "
            "0 is less than total desired GPUs N); the lab-cpu verl copy is only in the head's "
            "scratch dir, and a member that imports its own ~/verl stops at "
            "fsdp_workers.py:122 (No available nccl backend found on device type cpu). verl on "
            "CPU does span 2 lab hosts with gloo over a Ray that offers both (by hand, "
            f"{MULTI_NODE_DOC}); each host's own `{CHECK}` is the proof here"
        )
    else:
        why = (
            f"not run: a step with the cluster's plan {plan} is not built into --smoke yet "
            f"({MULTI_NODE_DOC}); each host's own `{CHECK}` steps its GPUs alone"
        )
    return Check(CLUSTER_CHECK, SKIP, why)
