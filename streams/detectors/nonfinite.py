"""The condition shared by the non-finite rules: a value of a job's steps is NaN or infinite.

Not a rule itself: `nonfinite_loss` and `nonfinite_grad` subclass `NonfiniteDetector` and say
which value of a StepCompleted they check. One identity per job: the leader rank's steps carry the
job's global values, so only they are judged. The rules run in the rank stage, where the leader's
steps are read: a critical page at once, not after the stage boundary's lateness and alignment
(10 s live at 1,024 GPUs when they ran in the job stage). It fires at once on the first
non-finite value and resolves when finite values have resumed for `nonfinite_resolve_steps` steps
past the last non-finite one; an active condition is re-reported at most every `reemit_s` of
event time.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import LEADER_RANK, Finding, PerJobDetector, Topology
from streams.detectors.placement import rank_place

__all__ = ["NONFINITE_DEFAULTS", "NonfiniteDetector", "is_finite"]

NONFINITE_DEFAULTS: dict[str, Any] = {
    "nonfinite_resolve_steps": 10,  # finite steps after the last non-finite one before resolving
    "reemit_s": 30.0,  # re-report an active condition at most this often (event time)
}

_POINTS = 8  # points of the running count of non-finite values carried on a finding


def is_finite(value: Any) -> bool:
    """A number that is neither missing, NaN nor infinite."""
    return value is not None and math.isfinite(value)


def _fmt(value: Any) -> str:
    return "null" if value is None else repr(float(value))


class NonfiniteDetector(PerJobDetector):
    """One value of a job's steps that must stay finite; see the module doc."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"StepCompleted"})
    what: ClassVar[str] = ""  # the value in words: "loss", "gradient norm"
    history_metric: ClassVar[str] = ""  # the running count of non-finite values, e.g. `nonfinite_loss_steps`

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**NONFINITE_DEFAULTS, **self.params}
        self._resolve_steps = int(p["nonfinite_resolve_steps"])
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)

    @staticmethod
    def leader_step(event: Event) -> dict[str, Any] | None:
        """The record of a StepCompleted of a job's leader rank (None for anything else)."""
        if event.type != "StepCompleted" or event.record.get("rank") != LEADER_RANK:
            return None
        return event.record

    def new_job_state(self) -> dict[str, Any]:
        """The job's open condition (None while every value is finite)."""
        return {"cond": None}

    def check(self, job: dict[str, Any], r: dict[str, Any], value: Any) -> list[Finding]:
        """Judge one step's value (a StepCompleted record `r` of the job)."""
        cond = job["cond"]
        if not is_finite(value):
            if cond is not None:
                _count_bad(cond, r["ts"])
            if cond is None:
                cond = {
                    "since": r["ts"],
                    "rank": r["rank"],
                    "step": r["step"],
                    "bad_step": r["step"],
                    "emit": r["ts"],
                    "bad": 0,
                    "points": [],
                }
                job["cond"] = cond
                cond["value"] = _fmt(value)
                _count_bad(cond, r["ts"])
                return [self._finding(r["job_id"], cond, r["ts"], True)]
            cond["bad_step"] = max(cond["bad_step"], r["step"])
            if r["ts"] - cond["emit"] >= self._reemit_ms:
                cond["emit"] = r["ts"]
                return [self._finding(r["job_id"], cond, r["ts"], True)]
            return []
        if cond is not None and r["step"] >= cond["bad_step"] + self._resolve_steps:
            job["cond"] = None
            return [self._finding(r["job_id"], cond, r["ts"], False)]
        return []

    def _finding(self, job_id: str, cond: dict[str, Any], ts: int, active: bool) -> Finding:
        what = self.what
        summary = (
            f"{what} of job {job_id} is {cond['value']} (first on rank {cond['rank']} at step {cond['step']})"
            if active
            else f"{what} of job {job_id} is finite again after step {cond['bad_step']}"
        )
        place = rank_place(self.topology, job_id, cond["rank"])
        return self.declared.for_job(
            job_id,
            active,
            ts,
            rank=cond["rank"],
            place=place,
            since=cond["since"],
            summary=summary,
            # The non-finite values themselves are no numbers to plot: their running count is.
            history_metric=self.history_metric,
            history=tuple((int(t), float(v)) for t, v in cond.get("points", ())),
            sustain_ms=0,
        )


def _count_bad(cond: dict[str, Any], ts: int) -> None:
    """One more non-finite value in a condition: its running count is the alert's history."""
    cond["bad"] = cond.get("bad", 0) + 1
    points: list[list[Any]] = cond.setdefault("points", [])
    if points and points[-1][0] == ts:
        points[-1][1] = float(cond["bad"])
    else:
        points.append([ts, float(cond["bad"])])
    del points[:-_POINTS]
