"""What the simulator's passes share: phase slots, NVML bits, record defaults, holdings, fault windows.

The job pass (`jobrun`) fills per-GPU phase accumulators; the telemetry pass (`telemetry`,
`sdk_samples`) reads them back. Both place faults in time with the helpers here.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field
from typing import Any

from producers.simulator.scenario import FaultSpec
from schemas.records import default_schemas

__all__ = ["gpu_uuid"]

# Phase slots of a GPU's per-interval accumulator.
# _SPIN: NCCL kernels spinning while blocked in a collective (GPU busy, counts as collective time);
# _BLOCKED: blocked in a collective call with no kernel running (collective time only);
# _HUNG: a kernel that never returns (a deadlocked or spin-waiting kernel): its blocks stay resident
# on every SM, so the GPU reads busy, but it issues no tensor work and moves little data.
_DATA, _COMPUTE, _COMM, _CKPT, _EVAL, _SPIN, _STEPS, _BLOCKED, _HUNG = range(9)
_FWD, _BWD, _OPT = 0.32, 0.6, 0.08  # a step's compute split into forward, backward and optimizer
_DDP_TAIL = 0.3  # share of the all-reduce DDP leaves exposed after the last backward bucket
_SLOTS = 9
_GIB = 1024**3
_GRAD_BYTES = 14_000_000_000  # bf16 gradients of a ~7B-parameter model, all-reduced every step
_IDLE_SM_MHZ = 345
_NEVER = math.inf

# NVML clock-event (throttle) reason bits.
_GPU_IDLE = 0x1
_SW_POWER_CAP = 0x4
_HW_SLOWDOWN = 0x8
_SW_THERMAL = 0x20
_HW_THERMAL = 0x40
_HW_POWER_BRAKE = 0x80

_CRASH_DETAILS = (
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: exitcode 1",
    "RuntimeError: NCCL communicator was aborted on rank",
)


def _filled(record_type: str) -> dict[str, Any]:
    """Defaults of every optional field of a record type, so records are complete."""
    out: dict[str, Any] = {}
    for f in default_schemas().records[record_type].json["fields"]:
        if "default" in f:
            default = f["default"]
            out[f["name"]] = type(default)(default) if isinstance(default, list | dict) else default
    return out


_DEFAULTS = {name: _filled(name) for name in default_schemas().records}


def gpu_uuid(cluster: str, node: str, index: int) -> str:
    """A stable NVML-style UUID for a GPU slot (hardware identity: independent of the seed)."""
    h = hashlib.sha1(f"{cluster}/{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass(frozen=True)
class _Rank:
    rank: int
    local_rank: int
    node: str
    gpu_index: int
    gpu_uuid: str


@dataclass
class _Holding:
    """A process holding a GPU over [start, end): its pid shows in the GPU's samples."""

    start: float
    end: float
    pid: int
    job_id: str
    run_id: str
    rank: int | None  # None for a process that belongs to no rank (foreign)
    mem_bytes: int


@dataclass
class _Effect:
    """Where a fault shows in the data (seconds from the scenario start)."""

    start: float
    end: float | None
    detail: dict[str, Any] = field(default_factory=dict)


# Data-path faults (issue 23) that change what a rank's DataLoaderSamples report.
_LOADER_FAULTS = frozenset(
    {
        "slow_reads", "slow_reads_node", "slow_reads_blip", "cache_collapse", "cache_dip", "file_open_stall",
        "file_open_blip", "loader_workers_die", "loader_workers_blip",
    }
)  # fmt: skip
# Faults that end a rank (issue 23): the job restarts from its last verified checkpoint.
_CRASH_FAULTS = ("rank_crash", "storage_timeout")
_CRASH_TEXT = {
    "exception": "RuntimeError: shape '[4096, 32, 128]' is invalid for input of size 4194305",
    "exit": "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: exitcode -9",
    "cuda_oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total"
    " capacity of 79.10 GiB of which 1.91 GiB is free.",
    "oom": "the kernel's OOM killer took the process (host memory exhausted)",
    "storage_timeout": "data loader: TimeoutError: GET s3://datasets/shard-0417.tar: read timed out after 120 s",
}

# Faults of a node (or of one of its GPUs) that every job on the node suffers.
_SHARED_NODE_FAULTS = frozenset(
    {"xid_error", "ecc_uncorrectable", "host_oom", "ib_degradation", "storage_slowdown", "agent_silent"}
)


def _window_overlaps(a0: float, a1: float | None, b0: float, b1: float | None) -> bool:
    return (a1 is None or b0 <= a1) and (b1 is None or a0 <= b1)


def _end_of(fault: FaultSpec) -> float:
    """Where a fault's window closes (infinity when it lasts to the end)."""
    return _NEVER if fault.end is None else fault.end


def _lognormal(rng: random.Random, sigma: float) -> float:
    return math.exp(rng.gauss(0.0, sigma)) if sigma > 0 else 1.0


def _magnitude_at(fault: FaultSpec, t: float, default: float) -> float:
    """A fault's factor at `t`: its magnitude, reached linearly from 1 (no effect) over `ramp` seconds."""
    full = fault.magnitude or default
    ramp = float(fault.params.get("ramp") or 0.0)
    if ramp <= 0 or t >= fault.start + ramp:
        return full
    return 1.0 + (full - 1.0) * max(0.0, t - fault.start) / ramp


def _extra_at(fault: FaultSpec, t: float, default: float) -> float:
    """An additive fault's amount at `t` (extra data wait): 0 at the start, full after `ramp`."""
    full = fault.magnitude or default
    ramp = float(fault.params.get("ramp") or 0.0)
    if ramp <= 0 or t >= fault.start + ramp:
        return full
    return full * max(0.0, t - fault.start) / ramp
