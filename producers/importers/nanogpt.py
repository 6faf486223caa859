"""modded-nanogpt speedrun logs -> ranksight events.

A log has a header (PyTorch version, an `nvidia-smi` table with its date) and then only
`step:N/T train_loss:X train_time:Tms step_avg:Ams` and `step:N/T val_loss:X train_time:...`
lines. Mapping:

- JobStarted at the nvidia-smi date (a fixed date when absent): world size = GPUs in the table
  (8 for these logs), workload family `modded-nanogpt`, model from the file name.
- One RankBound and one StepCompleted per train line for rank 0 only (the log is rank 0's):
  loss = train_loss, step time = the `train_time` delta to the previous train line. The run
  resets `train_time` after the compile warm-up (step 11); a delta that goes negative means a
  reset, and the step time is then `train_time` itself. `step_avg:nanms` is ignored.
- Timestamps: the start plus the cumulative step times (validation time is not in the log, so
  a ValidationResult shares its step's timestamp); one ValidationResult (`val_loss`) per val line.
- A final JobStateChanged `completed`. No telemetry, no gradient norm (the logs have none).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from producers.importers._records import make_event
from producers.importers.errors import ImportFormatError
from schemas.files import parse_ts
from schemas.records import Event

__all__ = ["DEFAULT_START_MS", "convert_nanogpt"]

DEFAULT_START_MS = parse_ts("2024-10-01T00:00:00Z")

_STEP = re.compile(
    r"^step:(?P<step>\d+)/(?P<total>\d+) (?P<kind>train_loss|val_loss):(?P<loss>\S+) "
    r"train_time:(?P<time>\d+)ms step_avg:(?P<avg>\S+)ms\s*$"
)
_DATE = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) \w{3} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4}\s*$")
_GPU_ROW = re.compile(r"^\|\s+\d+\s+NVIDIA ")


def _float(text: str, src: Path, line: int) -> float:
    try:
        return float(text)
    except ValueError as exc:
        raise ImportFormatError(str(src), line, f"not a number: {text!r}") from exc


def convert_nanogpt(
    path: str | Path,
    *,
    job_id: str | None = None,
    team: str = "nanogpt",
    world_size: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[Event]:
    """Events of one modded-nanogpt log, in event-time order (see the module docstring)."""
    src = Path(path)
    job_id = job_id or f"nanogpt-{src.stem[:8]}"
    common = {"job_id": job_id, "run_id": f"{job_id}-run1"}
    start: int | None = None
    gpus = 0
    ts = 0
    prev_time = 0
    started = False
    total = 0
    last_step = -1
    with src.open(encoding="utf-8") as fh:
        for line_no, raw in enumerate(fh, 1):
            if progress is not None and line_no % 10_000 == 0:
                progress(line_no)
            m = _STEP.match(raw)
            if m is None:
                if started and raw.strip():
                    raise ImportFormatError(
                        str(src),
                        line_no,
                        f"expected a 'step:N/T train_loss:X train_time:Tms ...' line, got {raw.strip()[:60]!r}",
                    )
                if start is None and _DATE.match(raw):
                    start = int(
                        datetime.strptime(raw.strip(), "%a %b %d %H:%M:%S %Y").replace(tzinfo=UTC).timestamp()
                        * 1000
                    )
                if _GPU_ROW.match(raw):
                    gpus += 1
                continue
            step, total = int(m["step"]), int(m["total"])
            loss = _float(m["loss"], src, line_no)
            train_time = int(m["time"])
            if not started:
                started = True
                ts = start if start is not None else DEFAULT_START_MS
                world = world_size or gpus or 8
                yield make_event(
                    "JobStarted",
                    ts=ts,
                    **common,
                    owner="modded-nanogpt",
                    team=team,
                    cluster="speedrun-8xH100",
                    model_name=f"modded-nanogpt-{src.stem[:8]}",
                    workload_family="modded-nanogpt",
                    dataset_version="fineweb10B",
                    world_size=world,
                    nodes=[f"{job_id}-node0"],
                    data_parallel=world,
                    gpu_class="H100-80GB",
                    labels={"source": "modded-nanogpt", "file": src.name},
                )
                yield make_event(
                    "RankBound",
                    ts=ts,
                    **common,
                    rank=0,
                    local_rank=0,
                    node=f"{job_id}-node0",
                    gpu_index=0,
                    pid=1,
                )
            if m["kind"] == "val_loss":
                yield make_event("ValidationResult", ts=ts, **common, step=step, metrics={"val_loss": loss})
                continue
            if step <= last_step:
                raise ImportFormatError(
                    str(src), line_no, f"step {step} after step {last_step}: steps must increase"
                )
            last_step = step
            delta = train_time - prev_time
            # train_time restarts after the compile warm-up: the new value is the time since then.
            step_ms = delta if delta >= 0 else train_time
            prev_time = train_time
            ts += max(step_ms, 1)
            yield make_event(
                "StepCompleted", ts=ts, **common, rank=0, step=step, loss=loss, step_time_s=step_ms / 1000.0
            )
    if not started:
        raise ImportFormatError(
            str(src), None, "no 'step:N/T ...' lines; expected a modded-nanogpt training log"
        )
    if last_step < total:
        # A truncated log: the job did not finish; leave it running rather than claim completion.
        return
    yield make_event("JobStateChanged", ts=ts + 1, **common, state="completed", reason="end of log")
