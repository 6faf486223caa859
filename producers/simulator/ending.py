"""The end of a finite simulation published live: every job it ran that did not end gets an end.

A live worker cannot know that a simulation is over: its jobs simply stop sending, and after the
wall-clock guard that reads as every job stalled. `ranksight simulate --to-kafka` therefore ends
each job the scenario left running (or pending) with a `JobStateChanged` just after the last event,
as a scheduler would report a finished job; the worker resolves the job's alerts and forgets it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from schemas.records import Event

__all__ = ["END_STATES", "run_ends"]

END_STATES = ("completed", "failed")  # the worker's default `engine.job_end_states`


def run_ends(events: Iterable[Event], reason: str = "simulation ended") -> list[Event]:
    """`JobStateChanged` records (state `completed`, 1 ms after the last event, in job order) for
    every job of `events` whose last JobStarted / JobStateChanged left it running, restarting,
    preempted or pending. [] when every job already ended (or there are none)."""
    last: dict[str, dict[str, Any]] = {}  # job -> what its newest lifecycle record said
    end_ts: int | None = None
    for event in events:
        r = event.record
        ts = r.get("ts")
        if ts is not None and (end_ts is None or ts > end_ts):
            end_ts = int(ts)
        if event.type == "JobStarted":
            last[r["job_id"]] = {**last.get(r["job_id"], {}), **r, "state": "running"}
        elif event.type == "JobStateChanged":
            last[r["job_id"]] = {**last.get(r["job_id"], {}), **r}
    if end_ts is None:
        return []
    out = []
    for job_id in sorted(last):
        r = last[job_id]
        if r["state"] in END_STATES:
            continue
        out.append(
            Event(
                "JobStateChanged",
                {
                    "ts": end_ts + 1,
                    "job_id": job_id,
                    "run_id": r.get("run_id") or "",
                    "state": "completed",
                    "reason": reason,
                    "exit_code": None,
                    "restart_count": r.get("restart_count") or 0,
                    "owner": r.get("owner"),
                    "team": r.get("team"),
                },
            )
        )
    return out
