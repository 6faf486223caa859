"""Pythia per-step training loss (`70m-0.csv`, `step,train/lm_loss`) -> ranksight events.

The CSV has a loss per optimizer step and nothing else, so the step time is synthetic: a
constant `step_time_s` (default 0.5 s); timestamps are a fixed start plus `step x step_time_s`.
`every=K` keeps every K-th step (the timeline is unchanged: the kept steps keep their times).
Events: JobStarted (world size 1: the loss is one global series, reported as rank 0), one
RankBound, one StepCompleted per kept step (loss, step time), a final JobStateChanged
`completed`. No telemetry, no gradient norm.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from pathlib import Path

from producers.importers._records import make_event
from producers.importers.errors import ImportFormatError
from schemas.files import parse_ts
from schemas.records import Event

__all__ = ["DEFAULT_START_MS", "HEADER", "convert_pythia"]

HEADER = ["step", "train/lm_loss"]
DEFAULT_START_MS = parse_ts("2023-01-01T00:00:00Z")


def convert_pythia(
    path: str | Path,
    *,
    every: int = 1,
    step_time_s: float = 0.5,
    job_id: str | None = None,
    team: str = "pythia",
    start_ms: int = DEFAULT_START_MS,
    progress: Callable[[int], None] | None = None,
) -> Iterator[Event]:
    """Events of one Pythia loss CSV, in event-time order (see the module docstring)."""
    if every < 1:
        raise ValueError("every must be at least 1")
    if step_time_s <= 0:
        raise ValueError("step_time_s must be positive")
    src = Path(path)
    job_id = job_id or f"pythia-{src.stem}"
    common = {"job_id": job_id, "run_id": f"{job_id}-run1"}
    step_ms = step_time_s * 1000.0
    last = -1
    with src.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header] != HEADER:
            raise ImportFormatError(str(src), 1, f"expected the header {','.join(HEADER)!r}")
        yield make_event(
            "JobStarted",
            ts=start_ms,
            **common,
            owner="eleutherai",
            team=team,
            cluster="pythia",
            model_name=f"pythia-{src.stem}",
            workload_family=f"pythia-{src.stem.split('-')[0]}",
            dataset_version="the-pile",
            world_size=1,
            nodes=[f"{job_id}-node0"],
            labels={"source": "pythia", "file": src.name},
        )
        yield make_event(
            "RankBound", ts=start_ms, **common, rank=0, local_rank=0, node=f"{job_id}-node0", pid=1
        )
        for row in reader:
            line = reader.line_num
            if progress is not None and line % 10_000 == 0:
                progress(line)
            if not row:
                continue
            if len(row) != 2:
                raise ImportFormatError(str(src), line, f"expected 2 columns (step, loss), found {len(row)}")
            try:
                step, loss = int(row[0]), float(row[1])
            except ValueError as exc:
                raise ImportFormatError(str(src), line, f"not a number: {exc}") from exc
            if step <= last:
                raise ImportFormatError(str(src), line, f"step {step} after step {last}: steps must increase")
            last = step
            if step % every:
                continue
            yield make_event(
                "StepCompleted",
                ts=start_ms + round((step + 1) * step_ms),
                **common,
                rank=0,
                step=step,
                loss=loss,
                step_time_s=step_time_s,
            )
    if last < 0:
        raise ImportFormatError(str(src), None, "no data rows; expected 'step,train/lm_loss' rows")
    yield make_event(
        "JobStateChanged",
        ts=start_ms + round((last + 1) * step_ms) + 1,
        **common,
        state="completed",
        reason="end of data",
    )
