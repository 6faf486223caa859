"""A simulated job with known answers for the efficiency views: queueing, a failed run, a restart,
checkpoints, an evaluation, skipped steps, energy counters attributed both ways, and a
single-node baseline of the same workload family."""

from __future__ import annotations

import time
from typing import Any

from schemas.records import Event

S = 1000
T = (int(time.time()) - 3 * 3600) * S  # recent: the raw tables keep 30 days


def job_started(
    job: str, run: str, ts: int, *, world: int, nodes: list[str], family: str = "llm-7b"
) -> Event:
    return Event("JobStarted", {
        "ts": ts, "job_id": job, "run_id": run, "owner": "ann", "team": "nlp", "cluster": "c1",
        "workload_family": family, "world_size": world, "nodes": nodes, "gpu_class": "H100-80GB",
    })  # fmt: skip


def state(job: str, ts: int, st: str, **extra: Any) -> Event:
    return Event("JobStateChanged", {"ts": ts, "job_id": job, "run_id": "", "state": st, **extra})


def steps(job: str, run: str, first: int, last: int, t0: int, *, ranks: int, step_s: float = 1.0,
          tokens: int = 1000, skipped: tuple[int, ...] = ()) -> list[Event]:  # fmt: skip
    out = []
    for n, step in enumerate(range(first, last + 1)):
        for rank in range(ranks):
            out.append(Event("StepCompleted", {
                "ts": t0 + int((n + 1) * step_s * S), "job_id": job, "run_id": run, "rank": rank, "step": step,
                "samples": 4, "tokens": tokens, "step_time_s": step_s - 0.01 * rank, "skipped": step in skipped,
            }))  # fmt: skip
    return out


def checkpoint(
    job: str, run: str, cid: str, step: int, ts: int, write_s: float, *, verify: bool
) -> list[Event]:
    base = {"job_id": job, "run_id": run, "checkpoint_id": cid, "step": step}
    out = [
        Event("CheckpointEvent", {**base, "ts": ts, "phase": "started"}),
        Event(
            "CheckpointEvent",
            {**base, "ts": ts + int(write_s * S), "phase": "completed", "duration_s": write_s},
        ),
    ]
    if verify:
        out.append(Event("CheckpointEvent", {**base, "ts": ts + int(write_s * S) + 500, "phase": "verified"}))
    return out


def evaluation(job: str, run: str, eid: str, step: int, ts: int, dur_s: float) -> list[Event]:
    base = {"job_id": job, "run_id": run, "evaluation_id": eid, "step": step}
    return [
        Event("EvaluationEvent", {**base, "ts": ts, "phase": "started"}),
        Event(
            "EvaluationEvent", {**base, "ts": ts + int(dur_s * S), "phase": "completed", "duration_s": dur_s}
        ),
    ]


def gpu(node: str, uuid: str, ts: int, energy_mj: int, job: str | None = None) -> Event:
    return Event("GpuSample", {
        "ts": ts, "cluster": "c1", "node": node, "gpu_index": int(uuid[-1]), "gpu_uuid": uuid, "energy_mj": energy_mj,
        "pids": [], "job_id": job, "run_id": None,
    })  # fmt: skip


def bound(job: str, run: str, rank: int, node: str, uuid: str, ts: int) -> Event:
    return Event("RankBound", {"ts": ts, "job_id": job, "run_id": run, "rank": rank, "node": node,
                               "gpu_uuid": uuid, "gpu_index": int(uuid[-1]), "pid": 100 + rank})  # fmt: skip


def scenario() -> list[Event]:
    """Job `big` (2 nodes x 2 GPUs): queued 60 s, run r1 fails after a verified checkpoint, r2 completes.
    Job `solo` (1 node x 2 GPUs, same family): the single-node baseline."""
    ev: list[Event] = []
    # --- big, run r1: queued 60 s, 10 steps (step 3 skipped), checkpoint at step 6 verified, fails.
    ev += [state("big", T, "pending", submit_ts=T, source="slurm"),
           state("big", T + 60 * S, "running", submit_ts=T, source="slurm")]  # fmt: skip
    r1 = T + 70 * S
    ev.append(job_started("big", "r1", r1, world=4, nodes=["n1", "n2"]))
    ev += [bound("big", "r1", i, f"n{i // 2 + 1}", f"GPU-{i // 2}{i % 2}", r1 + 100) for i in range(4)]
    ev += steps("big", "r1", 1, 6, r1, ranks=4, step_s=2.0, skipped=(3,))
    ev += checkpoint("big", "r1", "c6", 6, r1 + 12 * S, 3.0, verify=True)  # verified at r1 + 15.5 s
    ev += steps("big", "r1", 7, 10, r1 + 16 * S, ranks=4, step_s=2.0)  # last step at r1 + 24 s
    ev += checkpoint("big", "r1", "c10", 10, r1 + 24 * S, 2.0, verify=False)  # written, never verified
    # Energy: node telemetry without attribution during r1 (bound GPUs), and after it (not r1's).
    for k in range(0, 27, 3):
        ev += [
            gpu(f"n{i // 2 + 1}", f"GPU-{i // 2}{i % 2}", r1 + k * S, 1_000_000 + k * 500_000 * (i + 1))
            for i in range(4)
        ]
    ev.append(state("big", r1 + 30 * S, "failed", exit_code=1, restart_count=0, source="slurm"))
    # Requeued: queued again 20 s.
    ev += [state("big", r1 + 31 * S, "restarting", restart_count=1, source="slurm"),
           state("big", r1 + 31 * S, "pending", restart_count=1, submit_ts=r1 + 31 * S, source="slurm"),
           state("big", r1 + 51 * S, "running", restart_count=1, submit_ts=r1 + 31 * S, source="slurm")]  # fmt: skip
    # --- big, run r2: resumes at step 7, 8 steps, an evaluation of 4 s, completes.
    r2 = r1 + 60 * S
    ev.append(job_started("big", "r2", r2, world=4, nodes=["n1", "n2"]))
    ev += steps("big", "r2", 7, 10, r2, ranks=4, step_s=2.0)  # to r2 + 8 s
    ev += evaluation("big", "r2", "e1", 10, r2 + 8 * S, 4.0)  # to r2 + 12 s
    ev += steps("big", "r2", 11, 14, r2 + 12 * S, ranks=4, step_s=2.0)  # to r2 + 20 s
    # Energy: attributed at the node (job_id set) during r2.
    for k in range(0, 21, 4):
        ev += [
            gpu(f"n{i // 2 + 1}", f"GPU-{i // 2}{i % 2}", r2 + k * S, 50_000_000 + k * 1_000_000, job="big")
            for i in range(4)
        ]
    ev.append(state("big", r2 + 25 * S, "completed", exit_code=0, restart_count=1, source="slurm"))
    # --- solo: one node, two GPUs, same family, 2 000 tokens per rank-step at 1 s per step.
    s0 = T + 10 * S
    ev.append(job_started("solo", "s1", s0, world=2, nodes=["n9"]))
    ev += steps("solo", "s1", 1, 20, s0, ranks=2, step_s=1.0, tokens=2000)
    ev.append(state("solo", s0 + 21 * S, "completed", exit_code=0))
    # --- queued: only the scheduler knows it (no SDK): pending 90 s, then running.
    ev += [state("queued", T + 5 * S, "pending", submit_ts=T + 5 * S, source="slurm", team="vision", owner="bo"),
           state("queued", T + 95 * S, "running", submit_ts=T + 5 * S, source="slurm", team="vision", owner="bo")]  # fmt: skip
    return sorted(ev, key=lambda e: e.record["ts"])
