"""Scheduler observations -> JobStateChanged events, each state change published once.

A source (Slurm, Kubernetes) reports what it sees on every poll as `JobObservation`s. The
tracker keeps the last published (state, restart count) per job and turns a poll into the
events that changed: a job seen for the first time publishes its current state only, so a
restarted `ranksight scheduler` re-publishes at most the current state of each job, which the
detectors treat as no change. Event time comes from the scheduler's own timestamps (submit,
start, end), never later than the poll and never earlier than the job's previous event.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from schemas.records import Event

__all__ = ["TERMINAL_STATES", "JobObservation", "StateTracker"]

TERMINAL_STATES = frozenset({"completed", "failed"})


@dataclass(frozen=True)
class JobObservation:
    """One job as the scheduler reports it at one poll, in ranksight's terms."""

    job_id: str
    state: str  # a ranksight JobState symbol
    native_state: str  # the scheduler's own word, e.g. Slurm's REQUEUED, a Kubernetes condition
    reason: str | None = None
    exit_code: int | None = None
    restart_count: int = 0
    owner: str | None = None
    account: str | None = None
    submit_ts: int | None = None  # ms; when this attempt was queued
    start_ts: int | None = None  # ms; when it started running
    end_ts: int | None = None  # ms; when it ended (or was preempted)
    cluster: str | None = None  # the cluster the job is queued on, when the scheduler names it


def _state_ts(obs: JobObservation) -> int | None:
    if obs.state == "pending":
        return obs.submit_ts
    if obs.state == "running":
        return obs.start_ts
    if obs.state in ("completed", "failed", "preempted"):
        return obs.end_ts
    return None


class StateTracker:
    """Last published state per job; `update` returns the JobStateChanged events of one poll."""

    def __init__(self, source: str, team_for: Any = None, cluster: str | None = None) -> None:
        self.source = source
        self._team_for = team_for
        # The cluster of jobs whose observation names none (Kubernetes has no cluster name).
        self.cluster = cluster or None
        self._jobs: dict[str, dict[str, Any]] = {}

    def update(self, observations: Iterable[JobObservation], now_ms: int) -> list[Event]:
        """Events for the jobs whose state or restart count changed since the last poll."""
        out: list[Event] = []
        for obs in sorted(observations, key=lambda o: o.job_id):
            prev = self._jobs.get(obs.job_id)
            last_ts = prev["ts"] if prev else 0
            restarts = prev["restart_count"] if prev else obs.restart_count
            if prev is not None and obs.restart_count > restarts and obs.state != "restarting":
                # The scheduler requeued the job between two polls: the restart itself is a state.
                ts = self._clamp(obs.submit_ts if obs.state == "pending" else None, last_ts, now_ms)
                out.append(
                    self._event(
                        obs, "restarting", ts, f"requeued by {self.source} (restart {obs.restart_count})"
                    )
                )
                last_ts = ts
            if prev is None or (prev["state"], prev["restart_count"]) != (obs.state, obs.restart_count):
                ts = self._clamp(_state_ts(obs), last_ts, now_ms)
                out.append(self._event(obs, obs.state, ts, None))
                last_ts = ts
            self._jobs[obs.job_id] = {
                "state": obs.state,
                "restart_count": max(obs.restart_count, restarts),
                "ts": last_ts,
            }
        return out

    @staticmethod
    def _clamp(ts: int | None, last_ts: int, now_ms: int) -> int:
        # A pending job's start time is an estimate in the future; a running job's end time is its limit.
        return max(min(ts if ts else now_ms, now_ms), last_ts)

    def _event(self, obs: JobObservation, state: str, ts: int, reason: str | None) -> Event:
        team = self._team_for(obs.owner, obs.account) if self._team_for else None
        native = obs.native_state + (f": {obs.reason}" if obs.reason else "")
        return Event(
            "JobStateChanged",
            {
                "ts": int(ts),
                "job_id": obs.job_id,
                "run_id": "",
                "state": state,
                "reason": reason or native,
                "exit_code": obs.exit_code if state in ("failed", "completed", "preempted") else None,
                "restart_count": int(obs.restart_count),
                "owner": obs.owner,
                "team": team,
                "submit_ts": obs.submit_ts,
                "source": self.source,
                "cluster": obs.cluster or self.cluster,
            },
        )

    def missing(self, seen: Iterable[str]) -> list[str]:
        """Jobs not listed by this poll that had not reached an end state (the scheduler purged them)."""
        listed = set(seen)
        return [
            j for j in sorted(self._jobs) if j not in listed and self._jobs[j]["state"] not in TERMINAL_STATES
        ]

    def forget_unlisted(self, seen: Iterable[str]) -> None:
        """Drop jobs the scheduler no longer lists (bounded memory)."""
        listed = set(seen)
        self._jobs = {k: v for k, v in self._jobs.items() if k in listed}

    def state(self) -> dict[str, Any]:
        """JSON-able state (saved between runs of the command)."""
        return {"source": self.source, "jobs": {k: dict(v) for k, v in sorted(self._jobs.items())}}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`; a state saved by another source is ignored."""
        if state.get("source") == self.source:
            self._jobs = {k: dict(v) for k, v in state.get("jobs", {}).items()}
