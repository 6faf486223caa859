"""Alibaba PAI mini-batch times (cluster-trace-gpu-v2020, `job_N_norm.csv`) -> ranksight events.

The CSV is long format, one row per (iteration, worker): `,worker,gpu,time,batch_time_norm`,
sampled about every 10 iterations, batch time normalised to 0-1000. The trace has no absolute
times, no loss and no step segments, so:

- `step_time_s = batch_time_norm / 1000 * seconds_per_1000` (default 2.5 s per 1000 units: steps of
  about 1.1 s, so a sampled row every ~11 s gives each rank at least 5 steps in a 60 s detector
  window, and job_1's straggler episode, iterations 1811-1941, lasts about 140 s, more than two
  windows); the segments (data wait, forward, ...) stay null.
- Each sampled row stands for the iterations up to the next sampled one: the timeline advances
  by (next time - time) x the median step time of the sampled iteration across workers, from a
  fixed start. A worker's step ends at the iteration's start plus its own step time, so all
  workers of an iteration share one time region.
- One JobStarted (world size = number of workers), one RankBound per worker on a synthetic node
  and GPU, one StepCompleted per row (rank = worker, step = time), a final JobStateChanged
  `completed`. No telemetry is synthesised.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from statistics import median

from producers.importers._records import make_event
from producers.importers.errors import ImportFormatError
from schemas.files import parse_ts
from schemas.records import Event

__all__ = ["DEFAULT_START_MS", "HEADER", "convert_pai"]

HEADER = ["", "worker", "gpu", "time", "batch_time_norm"]
DEFAULT_START_MS = parse_ts("2020-07-01T00:00:00Z")


def convert_pai(
    path: str | Path,
    *,
    job_id: str | None = None,
    team: str = "pai",
    seconds_per_1000: float = 2.5,
    start_ms: int = DEFAULT_START_MS,
    progress: Callable[[int], None] | None = None,
) -> list[Event]:
    """Events of one PAI job file, in event-time order (see the module docstring for the mapping)."""
    src = Path(path)
    if seconds_per_1000 <= 0:
        raise ValueError("seconds_per_1000 must be positive")
    name = src.stem.removesuffix("_norm")
    job_id = job_id or f"pai-{name}"
    by_time: dict[int, dict[int, float]] = {}
    gpu_share: dict[int, float] = {}
    with src.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise ImportFormatError(str(src), 1, "the file is empty; expected a PAI mini-batch CSV")
        if [h.strip() for h in header] != HEADER:
            raise ImportFormatError(
                str(src), 1, f"unexpected header {','.join(header)!r}; expected {','.join(HEADER)!r}"
            )
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != len(HEADER):
                raise ImportFormatError(str(src), line, f"expected {len(HEADER)} columns, found {len(row)}")
            try:
                worker, gpu, time = int(row[1]), float(row[2]), int(row[3])
                batch = float(row[4])
            except ValueError as exc:
                raise ImportFormatError(str(src), line, f"not a number: {exc}") from exc
            if worker < 0 or time < 0 or not 0 <= batch <= 1000:
                raise ImportFormatError(
                    str(src), line, "worker and time must be >= 0 and batch_time_norm in 0..1000"
                )
            # The trace repeats a few (time, worker) rows (job_2, worker 3 at 2381): keep the first.
            by_time.setdefault(time, {}).setdefault(worker, batch)
            gpu_share.setdefault(worker, gpu)
            if progress is not None and line % 10_000 == 0:
                progress(line)
    if not by_time:
        raise ImportFormatError(str(src), None, "no data rows; expected a PAI mini-batch CSV")
    workers = sorted(gpu_share)
    world = max(workers) + 1
    nodes = [f"{job_id}-w{w}" for w in range(world)]
    common = {"job_id": job_id, "run_id": f"{job_id}-run1"}
    events = [
        make_event(
            "JobStarted",
            ts=start_ms,
            **common,
            owner="alibaba-pai",
            team=team,
            cluster="alibaba-pai-2020",
            model_name=f"pai-{name}",
            workload_family=f"pai-{name}",
            dataset_version="cluster-trace-gpu-v2020",
            world_size=world,
            nodes=nodes,
            data_parallel=world,
            gpu_class="pai-shared-gpu",
            labels={"source": "alibaba-pai-minibatch", "file": src.name},
        )
    ]
    for w in range(world):
        events.append(
            make_event(
                "RankBound",
                ts=start_ms,
                **common,
                rank=w,
                local_rank=0,
                node=nodes[w],
                gpu_index=0,
                gpu_uuid=f"GPU-{job_id}-w{w}",
                pid=10_000 + w,
            )
        )
    steps: list[Event] = []
    times = sorted(by_time)
    t0 = start_ms + 1000
    scale = seconds_per_1000 / 1000.0
    for i, time in enumerate(times):
        rows = by_time[time]
        med = float(median([b * scale for b in rows.values()]))
        for worker, batch in rows.items():
            step_time = batch * scale
            steps.append(
                make_event(
                    "StepCompleted",
                    ts=t0 + round(step_time * 1000),
                    **common,
                    rank=worker,
                    step=time,
                    step_time_s=step_time,
                )
            )
        gap = times[i + 1] - time if i + 1 < len(times) else 1
        t0 += max(1, round(gap * med * 1000))
    steps.sort(key=lambda e: (e.record["ts"], e.record["rank"], e.record["step"]))
    events += steps
    end = max(t0, steps[-1].record["ts"] + 1)
    events.append(make_event("JobStateChanged", ts=end, **common, state="completed", reason="end of trace"))
    return events
