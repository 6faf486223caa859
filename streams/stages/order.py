"""The order of the job stage's input: what the rank stage passes on besides its summaries and
alerts, and how records of one event time are ordered there (whichever rank stage sent them first)."""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import LEADER_RANK

__all__ = ["FORWARDED", "JOB_LEVEL", "tiebreak", "to_job_stage"]

# What the rank stage passes to the job stage besides its summaries and alerts: job-level records
# (from the engine that owns the job's key), bindings and rank faults, and the leader rank's steps
# (the validation, skip and trend rules read one rank's loss and gradient norm: the global ones).
JOB_LEVEL = frozenset(
    {"JobStarted", "JobStateChanged", "CheckpointEvent", "EvaluationEvent", "ValidationResult", "RestoreTest"}
)
FORWARDED = JOB_LEVEL | {"RankBound", "RankFault"}
# Tie order of records of one event time in the job stage's input (then job, rank, node).
_ORDER = {
    "JobStarted": 0,
    "RankBound": 1,
    "JobStateChanged": 2,
    "StepCompleted": 3,
    "RankFault": 4,
    "CheckpointEvent": 5,
    "EvaluationEvent": 6,
    "ValidationResult": 7,
    "RestoreTest": 8,
    "RankSummary": 9,
    "Alert": 10,
    "BaselineRun": 11,
}


def to_job_stage(event: Event) -> bool:
    """Whether the rank stage passes this record on to the job stage."""
    if event.type in FORWARDED:
        return True
    return event.type == "StepCompleted" and event.record.get("rank") == LEADER_RANK


def tiebreak(event: Event) -> tuple[Any, ...]:
    """The place of a record among the job stage's input of the same event time (type, job, rank,
    node, ...): an order that does not depend on which rank stage sent it first."""
    r = event.record
    rank = r.get("rank")
    return (
        _ORDER.get(event.type, 99),
        str(r.get("job_id") or ""),
        -1 if rank is None else int(rank),
        str(r.get("node") or ""),
        str(r.get("fingerprint") or r.get("status") or ""),
    )
