"""Scenario files: a cluster, its jobs and the faults to inject, loaded from YAML and validated.

Unknown keys are rejected with the key's path (`jobs[0].stp_time: unknown key, did you mean
step_time?`), so a typo never silently falls back to a default.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from producers.simulator.errors import ScenarioError
from producers.simulator.faults import FAULTS
from schemas.files import parse_ts

__all__ = [
    "GPU_CLASSES",
    "CheckpointSpec",
    "ClusterSpec",
    "EvalSpec",
    "FaultSpec",
    "GpuClass",
    "JobSpec",
    "Scenario",
    "TelemetrySpec",
    "builtin_scenarios",
    "load_scenario",
    "parse_duration",
    "scenario_from_mapping",
]

_GIB = 1024**3


@dataclass(frozen=True)
class GpuClass:
    """Static properties of a GPU model, as NVML reports them."""

    name: str
    product: str
    memory_bytes: int
    power_limit_w: float
    busy_power_w: float  # typical draw under dense training, below the limit
    idle_power_w: float
    sm_clock_max_mhz: int
    mem_clock_mhz: int
    gpm: bool = False  # NVML GPM metrics (SM, tensor, DRAM activity): Hopper and newer


GPU_CLASSES: dict[str, GpuClass] = {
    "H100-80GB": GpuClass(
        "H100-80GB", "NVIDIA H100 80GB HBM3", 80 * _GIB, 700.0, 610.0, 72.0, 1980, 2619, True
    ),
    "H200-141GB": GpuClass("H200-141GB", "NVIDIA H200", 141 * _GIB, 700.0, 620.0, 75.0, 1980, 3201, True),
    "A100-80GB": GpuClass("A100-80GB", "NVIDIA A100-SXM4-80GB", 80 * _GIB, 400.0, 340.0, 60.0, 1410, 1593),
}


@dataclass(frozen=True)
class ClusterSpec:
    """The simulated cluster: `nodes` hosts named `<node_prefix>01`... with `gpus_per_node` GPUs each."""

    name: str = "sim"
    nodes: int = 2
    gpus_per_node: int = 8
    gpu_class: str = "H100-80GB"
    node_prefix: str = "node-"
    host_memory_gib: int = 2048
    cpus: int = 192
    # Nodes of another GPU class than `gpu_class` (a mixed fleet: node name -> class).
    gpu_classes: dict[str, str] = field(default_factory=dict)

    @property
    def node_names(self) -> tuple[str, ...]:
        """Host names of every node, in order."""
        return tuple(f"{self.node_prefix}{i:02d}" for i in range(1, self.nodes + 1))

    @property
    def gpu(self) -> GpuClass:
        """The GPU class of the cluster's nodes (those `gpu_classes` does not name)."""
        return GPU_CLASSES[self.gpu_class]

    def class_of(self, node: str) -> str:
        """The GPU class name of one node."""
        return self.gpu_classes.get(node, self.gpu_class)

    def gpu_of(self, node: str) -> GpuClass:
        """The GPU class of one node."""
        return GPU_CLASSES[self.class_of(node)]


@dataclass(frozen=True)
class TelemetrySpec:
    """Node-agent and SDK sampling."""

    interval: float = 2.0
    dataloader_samples: bool = True
    collective_samples: bool = True
    # The SDK's evaluation context sends EvaluationEvent started/completed around each pause;
    # false = only a ValidationResult at the end, as older producers do.
    evaluation_events: bool = True


@dataclass(frozen=True)
class CheckpointSpec:
    """Periodic synchronous checkpoints (steps pause while one is written) and the job's policy."""

    every: float = 600.0
    duration: float = 25.0
    bytes: int = 90 * _GIB
    max_age: float = 1800.0
    timeout: float = 900.0
    uri: str = "s3://sim-checkpoints"


@dataclass(frozen=True)
class EvalSpec:
    """Periodic evaluation: steps pause for `duration` every `every_steps` steps (0 = never)."""

    every_steps: int = 400
    duration: float = 20.0


@dataclass(frozen=True)
class JobSpec:
    """One training job: identity, placement, speed and training-curve knobs."""

    id: str
    team: str
    owner: str = "sim-user"
    nodes: tuple[str, ...] = ()
    gpus_per_node: int = 8
    gpu_offset: int = 0  # first GPU index the job uses on each node (co-located jobs split a node)
    start: float = 0.0
    end: float | None = None
    model_name: str = "llama-7b"
    model_version: str = "v1"
    dataset_version: str = "ds-2026-01"
    workload_family: str = ""
    global_batch_size: int = 512
    seq_len: int = 4096
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    step_time: float = 1.0
    step_noise: float = 0.03
    rank_jitter: float = 0.0  # each rank's own extra step-to-step jitter (lognormal sigma, drawn per rank)
    rank_speed_spread: float = 0.0  # each rank persistently slower by a factor drawn in [1, 1 + spread]
    slow_ranks: dict[int, float] = field(default_factory=dict)  # rank -> persistent compute factor
    data_wait_fraction: float = 0.03
    comm_fraction: float = 0.12
    # DDP: the gradient all-reduce overlaps backward and no `comm` segment is timed, so a fast
    # rank's backward includes its wait for the slowest rank's gradients (only a tail is exposed).
    comm_overlap: bool = False
    warmup_steps: int = 20
    init_time: float = 30.0
    dataloader_workers: int = 8
    loss_initial: float = 10.5
    loss_final: float = 2.1
    learning_rate: float = 3e-4
    lr_warmup_steps: int = 200
    total_steps: int = 20000  # the run's target (JobStarted.target_steps)
    epoch_steps: int = 0  # steps per epoch (StepCompleted.epoch); 0: the loop reports no epochs
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    evaluation: EvalSpec = field(default_factory=EvalSpec)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def gpu_indices(self) -> range:
        """The GPU indices the job uses on each of its nodes."""
        return range(self.gpu_offset, self.gpu_offset + self.gpus_per_node)

    @property
    def world_size(self) -> int:
        """Ranks of the job: one per GPU."""
        return len(self.nodes) * self.gpus_per_node

    @property
    def family(self) -> str:
        """Workload family (defaults to `<model_name>-pretrain`)."""
        return self.workload_family or f"{self.model_name}-pretrain"


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault: its type, target, window (`duration` None = to the end) and knobs."""

    type: str
    job: str
    start: float
    duration: float | None
    rank: int | None = None
    node: str | None = None
    gpu: int | None = None
    magnitude: float | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> float | None:
        """Offset where the fault's window closes, or None."""
        return None if self.duration is None else self.start + self.duration


@dataclass(frozen=True)
class Scenario:
    """A whole simulation: cluster, jobs, faults, event-time window."""

    name: str
    duration: float
    start_ms: int
    cluster: ClusterSpec
    telemetry: TelemetrySpec
    jobs: tuple[JobSpec, ...]
    faults: tuple[FaultSpec, ...] = ()
    description: str = ""
    source: str = ""

    def with_overrides(self, *, duration: float | None = None, start_ms: int | None = None) -> Scenario:
        """The same scenario with another length or start time."""
        return replace(
            self,
            duration=self.duration if duration is None else duration,
            start_ms=self.start_ms if start_ms is None else start_ms,
        )

    def job(self, job_id: str) -> JobSpec:
        """A job by id."""
        for job in self.jobs:
            if job.id == job_id:
                return job
        raise KeyError(job_id)


# --------------------------------------------------------------------------- parsing

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DEFAULT_START = "2026-01-01T00:00:00Z"


def parse_duration(value: Any) -> float:
    """`90`, `90s`, `20m`, `1h30m`, `500ms` -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 90s, 20m or 1h30m, got a boolean")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            return float(text)  # a bare number is seconds
        pos, total = 0, 0.0
        for match in _DURATION.finditer(text):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if text and pos == len(text):
            return total
    raise ValueError(f"expected a duration like 90s, 20m or 1h30m, got {value!r}")


class _Ctx:
    """Where we are while parsing: the file name, for messages."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, key: str | None, reason: str) -> ScenarioError:
        return ScenarioError(self.source, key, reason)


def _mapping(ctx: _Ctx, value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ctx.error(where or None, f"expected a mapping of keys, got {type(value).__name__}")
    return value


def _check_keys(ctx: _Ctx, data: Mapping[str, Any], allowed: list[str], where: str) -> None:
    for key in data:
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            did = f", did you mean {hint[0]}?" if hint else f"; known keys: {', '.join(allowed)}"
            raise ctx.error(f"{where}.{key}" if where else str(key), f"unknown key{did}")


Conv = Callable[[Any], Any]


def _opt(conv: Conv) -> Conv:
    return lambda v: None if v is None else conv(v)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"expected an integer, got {v!r}")
    return v


def _pos_int(v: Any) -> int:
    n = _int(v)
    if n < 1:
        raise ValueError(f"expected a positive integer, got {v!r}")
    return n


def _nonneg_int(v: Any) -> int:
    n = _int(v)
    if n < 0:
        raise ValueError(f"expected zero or a positive integer, got {v!r}")
    return n


def _float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"expected a number, got {v!r}")
    return float(v)


def _nonneg_float(v: Any) -> float:
    x = _float(v)
    if x < 0:
        raise ValueError(f"expected zero or a positive number, got {v!r}")
    return x


def _pos_float(v: Any) -> float:
    x = _float(v)
    if x <= 0:
        raise ValueError(f"expected a positive number, got {v!r}")
    return x


def _fraction(v: Any) -> float:
    x = _float(v)
    if not 0 <= x < 1:
        raise ValueError(f"expected a fraction in [0, 1), got {v!r}")
    return x


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError(f"expected a non-empty string, got {v!r}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def _pos_duration(v: Any) -> float:
    d = parse_duration(v)
    if d <= 0:
        raise ValueError(f"expected a positive duration, got {v!r}")
    return d


def _labels(v: Any) -> dict[str, str]:
    if not isinstance(v, Mapping):
        raise ValueError("expected a mapping of label -> value")
    return {str(k): str(x) for k, x in v.items()}


def _fields(ctx: _Ctx, data: Mapping[str, Any], spec: dict[str, Conv], where: str) -> dict[str, Any]:
    _check_keys(ctx, data, list(spec), where)
    out: dict[str, Any] = {}
    for key, conv in spec.items():
        if key in data:
            try:
                out[key] = conv(data[key])
            except ValueError as exc:
                raise ctx.error(f"{where}.{key}" if where else key, str(exc)) from None
    return out


def _class_map(value: Any) -> dict[str, str]:
    """`{node: gpu class}`: names only (checked against the nodes and the classes once both are known)."""
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError("expected a mapping of node name -> GPU class")
    return {str(k): str(v) for k, v in value.items()}


_CLUSTER: dict[str, Conv] = {
    "name": _str,
    "nodes": _pos_int,
    "gpus_per_node": _pos_int,
    "gpu_class": _str,
    "node_prefix": _str,
    "host_memory_gib": _pos_int,
    "cpus": _pos_int,
    "gpu_classes": lambda v: _class_map(v),
}
_TELEMETRY: dict[str, Conv] = {
    "interval": _pos_duration,
    "dataloader_samples": _bool,
    "collective_samples": _bool,
    "evaluation_events": _bool,
}
_CHECKPOINT: dict[str, Conv] = {
    "every": _pos_duration,
    "duration": _pos_duration,
    "bytes": lambda v: _pos_int(int(v)) if isinstance(v, float) else _pos_int(v),
    "max_age": _pos_duration,
    "timeout": _pos_duration,
    "uri": _str,
}
_EVAL: dict[str, Conv] = {"every_steps": _nonneg_int, "duration": _pos_duration}
_JOB_SIMPLE: dict[str, Conv] = {
    "id": _str,
    "team": _str,
    "owner": _str,
    "nodes": lambda v: v,  # resolved against the cluster below
    "gpus_per_node": _pos_int,
    "gpu_offset": _nonneg_int,
    "start": parse_duration,
    "end": _opt(_pos_duration),
    "model_name": _str,
    "model_version": _str,
    "dataset_version": _str,
    "workload_family": _str,
    "global_batch_size": _pos_int,
    "seq_len": _pos_int,
    "tensor_parallel": _pos_int,
    "pipeline_parallel": _pos_int,
    "step_time": _pos_duration,
    "step_noise": _fraction,
    "rank_jitter": _fraction,
    "rank_speed_spread": _fraction,
    "slow_ranks": lambda v: _slow_ranks(v),
    "data_wait_fraction": _fraction,
    "comm_fraction": _fraction,
    "comm_overlap": _bool,
    "warmup_steps": _nonneg_int,
    "init_time": parse_duration,
    "dataloader_workers": _pos_int,
    "loss_initial": _pos_float,
    "loss_final": _pos_float,
    "learning_rate": _pos_float,
    "lr_warmup_steps": _nonneg_int,
    "total_steps": _pos_int,
    "epoch_steps": _nonneg_int,
    "checkpoint": lambda v: v,
    "evaluation": lambda v: v,
    "labels": _labels,
}
_FAULT_COMMON: dict[str, Conv] = {
    "type": _str,
    "job": _str,
    "rank": _opt(_nonneg_int),
    "node": _opt(_str),
    "gpu": _opt(_nonneg_int),
    "start": parse_duration,
    "duration": _opt(parse_duration),
    "magnitude": _pos_float,
}
_PARAM_CONV: dict[str, Conv] = {
    "variant": lambda v: _choice(v, ("thermal", "power", "degraded")),
    "gpus": lambda v: _choice(v, ("busy", "idle")),
    "retransmits": _float,
    "error": _str,
    "xid": _opt(_pos_int),
    "count": _pos_int,
    "oom_kills": _nonneg_int,
    "rank_fault": _bool,
    "pid": _opt(_pos_int),
    "mem_gib": _pos_float,
    "restarts": _pos_int,
    "every": _pos_duration,
    "ramp": parse_duration,
    "extra_wait": lambda v: _nonneg_float(v),
    "kind": lambda v: _choice(v, ("exception", "exit", "cuda_oom", "oom")),
    "to_gpu": _nonneg_int,
    "spare_gpu": _nonneg_int,
    "keep": _pos_int,
    "delay": parse_duration,
}
_TOP = ["name", "description", "duration", "start", "cluster", "telemetry", "jobs", "faults"]


def _slow_ranks(v: Any) -> dict[int, float]:
    if not isinstance(v, Mapping):
        raise ValueError("expected a mapping of rank -> compute factor, e.g. {3: 1.04}")
    out = {}
    for rank, factor in v.items():
        r, x = _nonneg_int(rank), _pos_float(factor)
        out[r] = x
    return out


def _choice(v: Any, choices: tuple[str, ...]) -> str:
    if v not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
    return str(v)


def _job(ctx: _Ctx, raw: Any, where: str, cluster: ClusterSpec, placed: list[JobSpec]) -> JobSpec:
    data = _mapping(ctx, raw, where)
    values = _fields(ctx, data, _JOB_SIMPLE, where)
    for key in ("id", "team"):
        if key not in values:
            raise ctx.error(f"{where}.{key}", "required key is missing")
    values["checkpoint"] = CheckpointSpec(
        **_fields(
            ctx,
            _mapping(ctx, values.get("checkpoint"), f"{where}.checkpoint"),
            _CHECKPOINT,
            f"{where}.checkpoint",
        )
    )
    values["evaluation"] = EvalSpec(
        **_fields(
            ctx, _mapping(ctx, values.get("evaluation"), f"{where}.evaluation"), _EVAL, f"{where}.evaluation"
        )
    )
    gpus = values.setdefault("gpus_per_node", cluster.gpus_per_node)
    offset = values.get("gpu_offset", 0)
    if gpus > cluster.gpus_per_node:
        raise ctx.error(
            f"{where}.gpus_per_node", f"the cluster's nodes have only {cluster.gpus_per_node} GPUs"
        )
    if offset + gpus > cluster.gpus_per_node:
        raise ctx.error(
            f"{where}.gpu_offset",
            f"GPUs {offset}..{offset + gpus - 1} do not fit a node of {cluster.gpus_per_node} GPUs",
        )
    mine = set(range(offset, offset + gpus))
    start, end = values.get("start", 0.0), values.get("end")
    if end is not None and end <= start:
        raise ctx.error(f"{where}.end", "must be after start")
    nodes_raw = values.get("nodes", 1)
    known = cluster.node_names
    if isinstance(nodes_raw, int) and not isinstance(nodes_raw, bool):
        busy = {
            n
            for j in placed
            if _overlaps(j.start, j.end, start, end) and mine & set(j.gpu_indices)
            for n in j.nodes
        }
        free = [n for n in known if n not in busy]
        if nodes_raw < 1 or nodes_raw > len(free):
            raise ctx.error(
                f"{where}.nodes", f"asks for {nodes_raw} nodes, {len(free)} are free at its start"
            )
        nodes = tuple(free[:nodes_raw])
    elif isinstance(nodes_raw, list) and nodes_raw and all(isinstance(n, str) for n in nodes_raw):
        for n in nodes_raw:
            other = next(
                (
                    j
                    for j in placed
                    if n in j.nodes and _overlaps(j.start, j.end, start, end) and mine & set(j.gpu_indices)
                ),
                None,
            )
            if other is not None:
                raise ctx.error(
                    f"{where}.nodes",
                    f"{n}'s GPUs {min(mine & set(other.gpu_indices))}.. are already used by job {other.id} "
                    "at that time (co-located jobs need disjoint GPUs: set gpu_offset)",
                )
            if n not in known:
                raise ctx.error(
                    f"{where}.nodes", f"{n!r} is not a node of the cluster ({known[0]}..{known[-1]})"
                )
        nodes = tuple(nodes_raw)
    else:
        raise ctx.error(f"{where}.nodes", "expected a node count or a list of node names")
    values["nodes"] = nodes
    world = len(nodes) * gpus
    for rank in values.get("slow_ranks", {}):
        if rank >= world:
            raise ctx.error(f"{where}.slow_ranks", f"rank {rank} is not a rank of this job (0..{world - 1})")
    return JobSpec(**values)


def _overlaps(a0: float, a1: float | None, b0: float, b1: float | None) -> bool:
    return (a1 is None or b0 < a1) and (b1 is None or a0 < b1)


def _fault(
    ctx: _Ctx, raw: Any, where: str, jobs: dict[str, JobSpec], duration: float, node_gpus: int = 8
) -> FaultSpec:
    data = _mapping(ctx, raw, where)
    kind_name = data.get("type")
    if kind_name not in FAULTS:
        hint = difflib.get_close_matches(str(kind_name), list(FAULTS), n=1)
        did = f" (did you mean {hint[0]}?)" if hint else f"; known: {', '.join(FAULTS)}"
        raise ctx.error(f"{where}.type", f"unknown fault type {kind_name!r}{did}")
    kind = FAULTS[kind_name]
    extra = [k for k in kind.params if k not in ("duration", "magnitude")]
    spec = dict(_FAULT_COMMON) | {k: _PARAM_CONV[k] for k in extra}
    if "magnitude" not in kind.params:
        spec.pop("magnitude")
    values = _fields(ctx, data, spec, where)
    for key in ("job", "start"):
        if key not in values:
            raise ctx.error(f"{where}.{key}", "required key is missing")
    job = jobs.get(values["job"])
    if job is None:
        raise ctx.error(f"{where}.job", f"no job {values['job']!r} in this scenario")
    if values["start"] >= duration:
        raise ctx.error(f"{where}.start", "starts after the scenario ends")
    rank, node, gpu = values.get("rank"), values.get("node"), values.get("gpu")
    if rank is not None and rank >= job.world_size:
        raise ctx.error(f"{where}.rank", f"job {job.id} has ranks 0..{job.world_size - 1}")
    if node is not None and node not in job.nodes:
        raise ctx.error(f"{where}.node", f"job {job.id} runs on {', '.join(job.nodes)}")
    if gpu is not None and gpu not in job.gpu_indices:
        raise ctx.error(
            f"{where}.gpu", f"job {job.id} uses GPUs {job.gpu_indices[0]}..{job.gpu_indices[-1]} of each node"
        )
    if kind.scope == "rank" and rank is None:
        raise ctx.error(f"{where}.rank", f"a {kind.name} fault needs the rank it hits")
    if kind.name == "contention" and (node is None or gpu is None):
        raise ctx.error(
            f"{where}.gpu", "a contention fault needs the node and gpu the foreign process lands on"
        )
    if (
        kind.scope == "gpu"
        and rank is None
        and (node is None or gpu is None)
        and "spare_gpu" not in kind.params
    ):
        raise ctx.error(f"{where}.rank", f"a {kind.name} fault needs a rank, or a node and a gpu")
    for key in ("to_gpu", "spare_gpu"):
        if key in kind.params:
            index = values.get(key, kind.params[key])
            if index in job.gpu_indices or index >= node_gpus:
                raise ctx.error(
                    f"{where}.{key}",
                    f"GPU {index} must be a GPU of the node the job does not use (it uses "
                    f"{job.gpu_indices[0]}..{job.gpu_indices[-1]})",
                )
    params = {k: values.pop(k) if k in values else kind.params[k] for k in extra}
    return FaultSpec(
        type=kind.name,
        job=job.id,
        start=values["start"],
        duration=values["duration"] if "duration" in values else kind.params.get("duration"),
        rank=rank,
        node=node,
        gpu=gpu,
        magnitude=values.get("magnitude", kind.params.get("magnitude")),
        params=params,
    )


def scenario_from_mapping(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a parsed YAML document and build the `Scenario`; `ScenarioError` names the bad key."""
    ctx = _Ctx(source)
    top = _mapping(ctx, data, "")
    _check_keys(ctx, top, _TOP, "")
    name = top.get("name") or Path(source).stem
    try:
        duration = _pos_duration(top.get("duration", "20m"))
    except ValueError as exc:
        raise ctx.error("duration", str(exc)) from None
    try:
        start_ms = parse_ts(top.get("start", _DEFAULT_START))
    except (ValueError, TypeError) as exc:
        raise ctx.error("start", f"expected an ISO-8601 time, {exc}") from None
    cluster = ClusterSpec(**_fields(ctx, _mapping(ctx, top.get("cluster"), "cluster"), _CLUSTER, "cluster"))
    if cluster.gpu_class not in GPU_CLASSES:
        raise ctx.error("cluster.gpu_class", f"unknown GPU class; known: {', '.join(GPU_CLASSES)}")
    for node, gpu_class in sorted(cluster.gpu_classes.items()):
        if node not in cluster.node_names:
            raise ctx.error(f"cluster.gpu_classes.{node}", "no such node in the cluster")
        if gpu_class not in GPU_CLASSES:
            raise ctx.error(
                f"cluster.gpu_classes.{node}", f"unknown GPU class; known: {', '.join(GPU_CLASSES)}"
            )
    telemetry = TelemetrySpec(
        **_fields(ctx, _mapping(ctx, top.get("telemetry"), "telemetry"), _TELEMETRY, "telemetry")
    )
    raw_jobs = top.get("jobs")
    if not isinstance(raw_jobs, list) or not raw_jobs:
        raise ctx.error("jobs", "expected a non-empty list of jobs")
    jobs: list[JobSpec] = []
    for i, raw in enumerate(raw_jobs):
        job = _job(ctx, raw, f"jobs[{i}]", cluster, jobs)
        if any(j.id == job.id for j in jobs):
            raise ctx.error(f"jobs[{i}].id", f"job id {job.id!r} is used twice")
        jobs.append(job)
    by_id = {j.id: j for j in jobs}
    raw_faults = top.get("faults") or []
    if not isinstance(raw_faults, list):
        raise ctx.error("faults", "expected a list of faults")
    faults = tuple(
        _fault(ctx, raw, f"faults[{i}]", by_id, duration, cluster.gpus_per_node)
        for i, raw in enumerate(raw_faults)
    )
    return Scenario(
        name=str(name),
        duration=duration,
        start_ms=start_ms,
        cluster=cluster,
        telemetry=telemetry,
        jobs=tuple(jobs),
        faults=faults,
        description=str(top.get("description") or ""),
        source=source,
    )


def _scenario_dir() -> Path:
    return Path(str(resources.files("producers") / "scenarios"))


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped in `producers/scenarios/`, sorted."""
    return sorted(p.stem for p in _scenario_dir().glob("*.yaml"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A built-in scenario by name, or a YAML file by path; raises `ScenarioError`."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        candidate = _scenario_dir() / f"{name_or_path}.yaml"
        if not candidate.exists():
            raise ScenarioError(
                str(name_or_path),
                None,
                f"no such scenario file or built-in; built-ins: {', '.join(builtin_scenarios())}",
            )
        path = candidate
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(str(path), None, "no such file") from None
    except OSError as exc:
        raise ScenarioError(str(path), None, f"cannot read it ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ScenarioError(str(path), None, f"not valid YAML{where}") from None
    return scenario_from_mapping(data, path.name)
