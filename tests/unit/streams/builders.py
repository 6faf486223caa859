"""Hand-built event sequences for detector and engine tests (plain records, schema field names)."""

from __future__ import annotations

from typing import Any

from schemas.records import Event

__all__ = [
    "T0",
    "checkpoint",
    "collective",
    "gpu_sample",
    "host_sample",
    "job_started",
    "job_state",
    "rank_bound",
    "step",
    "training_job",
    "validation",
]

T0 = 1_780_000_020_000  # a UTC ms origin aligned to 30 s windows


def job_started(
    job: str = "job-1", ts: int = T0, *, world_size: int = 4, nodes: int = 1, **extra: Any
) -> Event:
    """JobStarted with sensible identity fields."""
    rec = {
        "ts": ts,
        "job_id": job,
        "run_id": extra.pop("run_id", f"{job}-run-1"),
        "owner": "alice",
        "team": extra.pop("team", "team-a"),
        "cluster": "c1",
        "model_name": "llama",
        "model_version": "v1",
        "dataset_version": "ds1",
        "workload_family": extra.pop("workload_family", "llama-pretrain"),
        "world_size": world_size,
        "nodes": [f"node-{i:02d}" for i in range(1, nodes + 1)],
        "data_parallel": world_size,
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
        "global_batch_size": 512,
        "seq_len": 4096,
        "gpu_class": "H100-80GB",
        "checkpoint_max_age_s": 1800.0,
        "checkpoint_timeout_s": 900.0,
        "labels": {},
    }
    rec.update(extra)
    return Event("JobStarted", rec)


def job_state(job: str, ts: int, state: str, **extra: Any) -> Event:
    """JobStateChanged."""
    rec = {
        "ts": ts,
        "job_id": job,
        "run_id": f"{job}-run-1",
        "state": state,
        "reason": None,
        "exit_code": None,
        "restart_count": 0,
    }
    rec.update(extra)
    return Event("JobStateChanged", rec)


def rank_bound(job: str, rank: int, ts: int, *, gpus_per_node: int = 8) -> Event:
    """RankBound: rank r on node-(r // gpus_per_node + 1), GPU r % gpus_per_node."""
    node = f"node-{rank // gpus_per_node + 1:02d}"
    idx = rank % gpus_per_node
    return Event(
        "RankBound",
        {
            "ts": ts,
            "job_id": job,
            "run_id": f"{job}-run-1",
            "rank": rank,
            "local_rank": idx,
            "node": node,
            "gpu_index": idx,
            "gpu_uuid": f"GPU-{node}-{idx}",
            "pid": 1000 + rank,
        },
    )


def step(
    job: str,
    rank: int,
    n: int,
    ts: int,
    *,
    step_time: float = 1.0,
    data_wait: float | None = 0.03,
    compute: float | None = 0.85,
    comm: float | None = 0.12,
    loss: float | None = 2.5,
    grad_norm: float | None = 1.0,
    tokens: int | None = 65536,
    run_id: str | None = None,
    node: str | None = None,
    gpus_per_node: int = 8,
) -> Event:
    """StepCompleted; compute is split 1/3 forward, 1/2 backward, 1/6 optimizer. Its node (the
    SDK's) defaults to `rank_bound`'s: node-(rank // gpus_per_node + 1)."""
    return Event(
        "StepCompleted",
        {
            "ts": ts,
            "job_id": job,
            "run_id": run_id or f"{job}-run-1",
            "rank": rank,
            "node": node if node is not None else f"node-{rank // gpus_per_node + 1:02d}",
            "step": n,
            "samples": 16,
            "tokens": tokens,
            "loss": loss,
            "lr": 3e-4,
            "grad_norm": grad_norm,
            "step_time_s": step_time,
            "data_wait_s": data_wait,
            "forward_s": None if compute is None else compute / 3,
            "backward_s": None if compute is None else compute / 2,
            "optimizer_s": None if compute is None else compute / 6,
            "comm_s": comm,
            "checkpoint_s": None,
            "skipped": False,
        },
    )


def gpu_sample(
    node: str,
    idx: int,
    ts: int,
    *,
    util: float = 95.0,
    power: float = 600.0,
    sm_clock: int = 1980,
    pids: list[int] | None = None,
    mem_used: int = 60 * 2**30,
    throttle: int = 0,
) -> Event:
    """GpuSample with the fields the detectors read."""
    return Event(
        "GpuSample",
        {
            "ts": ts,
            "cluster": "c1",
            "node": node,
            "gpu_index": idx,
            "gpu_uuid": f"GPU-{node}-{idx}",
            "gpu_name": "H100",
            "gpu_util_pct": util,
            "mem_util_pct": 50.0,
            "mem_used_bytes": mem_used,
            "mem_total_bytes": 80 * 2**30,
            "power_w": power,
            "power_limit_w": 700.0,
            "energy_mj": None,
            "temp_gpu_c": 60.0,
            "temp_mem_c": 60.0,
            "sm_clock_mhz": sm_clock,
            "mem_clock_mhz": 2619,
            "sm_clock_max_mhz": 1980,
            "clock_event_reasons": throttle,
            "ecc_corrected": 0,
            "ecc_uncorrected": 0,
            "remapped_rows_correctable": 0,
            "remapped_rows_uncorrectable": 0,
            "pcie_tx_bytes_s": None,
            "pcie_rx_bytes_s": None,
            "pcie_replay_count": 0,
            "nvlink_tx_bytes_s": None,
            "nvlink_rx_bytes_s": None,
            "pids": pids or [],
            "xid": None,
        },
    )


def host_sample(node: str, ts: int, *, retrans: float = 1.0) -> Event:
    """HostSample with plenty of memory and the given TCP retransmit rate."""
    return Event(
        "HostSample",
        {
            "ts": ts,
            "cluster": "c1",
            "node": node,
            "cpu_util_pct": 30.0,
            "load1": 10.0,
            "load5": 10.0,
            "load15": 10.0,
            "mem_used_bytes": 200 * 2**30,
            "mem_available_bytes": 1800 * 2**30,
            "mem_total_bytes": 2000 * 2**30,
            "swap_used_bytes": 0,
            "disk_read_bytes_s": 1e6,
            "disk_write_bytes_s": 1e6,
            "net_rx_bytes_s": 1e9,
            "net_tx_bytes_s": 1e9,
            "tcp_retrans_segs_s": retrans,
            "open_files": 1000,
            "oom_kills": 0,
        },
    )


def checkpoint(job: str, ts: int, phase: str, *, ckpt: str = "ckpt-1", n: int = 0) -> Event:
    """CheckpointEvent of one phase."""
    return Event(
        "CheckpointEvent",
        {
            "ts": ts,
            "job_id": job,
            "run_id": f"{job}-run-1",
            "rank": None,
            "checkpoint_id": ckpt,
            "step": n,
            "phase": phase,
            "uri": "s3://x",
            "bytes": None,
            "duration_s": None,
            "version": None,
            "checksum": None,
            "error": None,
        },
    )


def validation(job: str, ts: int, n: int, duration_s: float = 20.0) -> Event:
    """ValidationResult at the end of an evaluation."""
    return Event(
        "ValidationResult",
        {
            "ts": ts,
            "job_id": job,
            "run_id": f"{job}-run-1",
            "step": n,
            "metrics": {"val_loss": 2.0},
            "duration_s": duration_s,
        },
    )


def collective(job: str, rank: int, ts: int, frac: float, *, gpus_per_node: int = 8) -> Event:
    """CollectiveSample: `frac` of a 5 s interval spent in allreduce (node as `rank_bound`'s)."""
    return Event(
        "CollectiveSample",
        {
            "ts": ts,
            "job_id": job,
            "run_id": f"{job}-run-1",
            "rank": rank,
            "node": f"node-{rank // gpus_per_node + 1:02d}",
            "op": "allreduce",
            "interval_s": 5.0,
            "count": 5,
            "bytes": None,
            "time_s": 5.0 * frac,
            "bus_bw_gbps": None,
        },
    )


def training_job(
    job: str = "job-1",
    *,
    world_size: int = 4,
    start: int = T0,
    seconds: int = 120,
    step_s: float = 1.0,
    gpus_per_node: int = 8,
) -> list[Event]:
    """A healthy job: start, bind ranks, then one step per `step_s` per rank for `seconds`."""
    events = [
        job_started(job, start, world_size=world_size, nodes=max(1, world_size // gpus_per_node)),
        job_state(job, start, "running"),
    ]
    events += [rank_bound(job, r, start, gpus_per_node=gpus_per_node) for r in range(world_size)]
    n_steps = int(seconds / step_s)
    for i in range(1, n_steps + 1):
        ts = start + int(i * step_s * 1000)
        events += [step(job, r, i, ts, gpus_per_node=gpus_per_node) for r in range(world_size)]
    return events
