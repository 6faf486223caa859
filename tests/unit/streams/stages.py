"""What a job-stage detector reads, made from raw records the way the rank stage makes it.

Detector tests of job-level rules (progress, imbalance, throughput) write raw steps and samples;
`job_stage_input` runs them through a real rank-stage engine and returns what it passes on:
per-rank summaries (at each bucket's end; time passes one bucket beyond the last record, as it
does live), job-level records, bindings, faults and the leader rank's steps, in event-time order.
"""

from __future__ import annotations

from schemas.eventtime import event_ts
from schemas.records import Event
from streams.stages.engine import StageEngine

__all__ = ["job_stage_input"]


def job_stage_input(events: list[Event]) -> list[Event]:
    """The job stage's input for these raw records (alerts of the rank stage left out)."""
    rank = StageEngine(stage="rank")
    out: list[Event] = []
    for event in sorted(events, key=event_ts):
        rank.process(event, received_ts=event_ts(event))
        out += rank.drain_forwarded()
    if rank.max_ts is not None:
        # Time passes after the last record, as it does live: the last bucket ends and is summarised.
        config = rank.config
        rank.advance(rank.max_ts + config.summary_bucket_ms + config.allowed_lateness_ms)
    rank.finish()
    out += rank.drain_forwarded()
    return [e for e in out if e.type != "Alert"]
