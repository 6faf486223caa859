"""What the training SDK reports per live rank and interval: DataLoaderSamples and CollectiveSamples.

The data path's faults (issue 23: slow reads, lost caches, throttled opens, dying workers, read
errors) show here with their own signature.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from producers.simulator.common import (
    _BLOCKED,
    _COMM,
    _DATA,
    _GRAD_BYTES,
    _LOADER_FAULTS,
    _SLOTS,
    _SPIN,
    _STEPS,
    _Effect,
    _end_of,
    _lognormal,
)
from producers.simulator.faults import FAULTS
from producers.simulator.scenario import FaultSpec, JobSpec

if TYPE_CHECKING:
    from producers.simulator.engine import Engine


__all__ = ["sdk_samples"]


def sdk_samples(engine: Engine) -> None:
    """DataLoaderSample / CollectiveSample per live rank per interval (from the training SDK)."""
    tel = engine.sc.telemetry
    if not (tel.dataloader_samples or tel.collective_samples):
        return
    iv = engine.iv
    for (node, g), holds in sorted(engine.holdings.items()):
        for h in holds:
            if h.rank is None:
                continue
            rng = engine._rng(f"sdk/{h.run_id}/{h.rank}")
            job = next(j for j in engine.sc.jobs if j.id == h.job_id)
            phase = engine.phase[node]
            k = max(1, int((h.start - phase) // iv) + 2)
            while True:
                tick = phase + k * iv
                if tick >= min(h.end, engine.sc.duration):
                    break
                vec = engine.acc.get((node, g, k - 1)) or [0.0] * _SLOTS
                k += 1
                t = tick + 0.1 + h.rank * 0.001
                steps = int(vec[_STEPS])
                if tel.dataloader_samples:
                    starving = vec[_DATA] / iv > 0.1
                    engine.emit(
                        t,
                        "DataLoaderSample",
                        job_id=h.job_id,
                        run_id=h.run_id,
                        rank=h.rank,
                        node=node,
                        interval_s=iv,
                        batches=steps,
                        wait_s=round(vec[_DATA], 4),
                        queue_depth=rng.randint(0, 1)
                        if starving
                        else max(0, 2 * job.dataloader_workers - rng.randint(0, 3)),
                        workers=_live_workers(engine, job, h.rank, node, t),
                        workers_expected=job.dataloader_workers,
                        **(
                            _loader_io(engine, job, h.run_id, h.rank, steps, vec[_DATA], node, t)
                            | _loader_errors(engine, h.job_id, h.rank, t)
                        ),
                    )
                if tel.collective_samples:
                    time_s = vec[_COMM] + vec[_SPIN] + vec[_BLOCKED]
                    nbytes = steps * _GRAD_BYTES
                    world = job.world_size
                    bus = nbytes / time_s / 1e9 * 2 * (world - 1) / world if time_s > 0 and nbytes else None
                    engine.emit(
                        t + 0.0005,
                        "CollectiveSample",
                        job_id=h.job_id,
                        run_id=h.run_id,
                        rank=h.rank,
                        node=node,
                        op="allreduce",
                        interval_s=iv,
                        count=steps * 48,
                        bytes=nbytes,
                        time_s=round(time_s, 4),
                        bus_bw_gbps=None if bus is None else round(bus, 2),
                    )


def _loader_faults(
    engine: Engine, job: JobSpec, rank: int, node: str, t: float
) -> list[tuple[int, FaultSpec]]:
    """The data-path faults (issue 23) acting on a rank's loader at `t` (rank ones by rank, node ones by node)."""
    found = []
    for i, f in enumerate(engine.sc.faults):
        if f.type not in _LOADER_FAULTS or f.job != job.id or not f.start <= t < _end_of(f):
            continue
        scope = FAULTS[f.type].scope
        if (scope == "rank" and f.rank == rank) or (scope == "node" and engine.targets[i][0] == node):
            engine.effects.setdefault(i, _Effect(f.start, f.end, {}))
            found.append((i, f))
    return found


def _live_workers(engine: Engine, job: JobSpec, rank: int, node: str, t: float) -> int:
    """Loader workers alive: the configured ones, fewer under a loader_workers fault."""
    live = job.dataloader_workers
    for _, f in _loader_faults(engine, job, rank, node, t):
        if f.type in ("loader_workers_die", "loader_workers_blip"):
            live = min(live, int(f.magnitude or 0))
    return live


def _loader_io(
    engine: Engine,
    job: JobSpec,
    run_id: str,
    rank: int,
    batches: int,
    wait_s: float,
    node: str = "",
    t: float = 0.0,
) -> dict[str, Any]:
    """What `wrap_loader` and a dataset's counters report: batch prep time, reads, cache hits, opens.

    A loader keeping up prepares a batch in about half the time its workers have for it; one
    that starves the step (data wait above 10 % of the interval) takes longer than that, reads
    slower and misses its cache more. A data-path fault of issue 23 shows its own signature
    instead (slower reads, a lost cache, throttled opens), so each is told apart. Drawn from its
    own random stream (other records unchanged).
    """
    rng = engine.loader_rngs.get((run_id, rank))
    if rng is None:
        rng = engine.loader_rngs[(run_id, rank)] = engine._rng(f"loader/{run_id}/{rank}")
    if batches <= 0:
        return {}
    iv = engine.iv
    faults = _loader_faults(engine, job, rank, node, t)
    starving = wait_s / iv > 0.1 and not faults
    # The time the loop gives each batch while it trains (not the interval's: a pause for an
    # evaluation or a checkpoint leaves the workers idle, it does not make batches slower).
    per_batch = job.step_time
    budget = per_batch * job.dataloader_workers  # what the workers together have per batch
    prep = budget * (1.0 + wait_s / iv if starving else 0.5) * _lognormal(rng, 0.1)
    samples = job.global_batch_size // max(1, job.world_size) if job.global_batch_size else 4
    latency = 0.004 * (4.0 if starving else 1.0) * _lognormal(rng, 0.2)
    cache = (0.6 if starving else 0.92) * _lognormal(rng, 0.03)
    opens = batches * samples / 64 / iv  # 64 samples per shard file
    for _, f in faults:
        m = f.magnitude if f.magnitude is not None else 1.0
        if f.type.startswith("slow_reads"):
            latency *= m
            prep *= 1.0 + 0.3 * (m - 1.0)  # fetching is part of preparing a batch
        elif f.type in ("cache_collapse", "cache_dip"):
            cache *= m / 0.92
            latency *= 1.3  # misses go to remote storage
        elif f.type.startswith("file_open"):
            opens *= m
    return {
        "batch_prep_s": round(prep, 4),
        "read_bytes_s": round(batches * samples * job.seq_len * 2 / iv, 1),  # int16 token ids
        "read_latency_s": round(latency, 5),
        "cache_hit_ratio": round(min(1.0, cache), 3),
        "file_opens_s": round(opens, 2),
        "errors": 0,
        "file_open_errors": 0,
    }


def _loader_errors(engine: Engine, job_id: str, rank: int, t: float) -> dict[str, Any]:
    """errors / file_open_errors of a DataLoaderSample under the data_errors faults (none: fields stay null)."""
    for i, f in engine._faults(job_id, "data_errors", "data_errors_transient"):
        if f.rank == rank and f.start <= t < _end_of(f):
            n = max(1, int(f.magnitude or 1))
            engine.effects.setdefault(i, _Effect(f.start, f.end, {"errors_per_sample": n}))
            return {"errors": n, "file_open_errors": n}
    for i, f in engine._faults(job_id, "storage_retry"):
        # One read timed out and was retried: the sample that covers it counts one error.
        if f.rank == rank and f.start <= t < f.start + engine.iv:
            engine.effects.setdefault(i, _Effect(f.start, f.start, {"errors": 1}))
            return {"errors": 1, "file_open_errors": 0}
    return {}
