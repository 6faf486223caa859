"""Rule `lr_invalid`: the learning rate a job trains with is not finite, or outside its expected range.

Category `model`, warning, one identity per job, judged on the leader rank's steps (job stage).
A StepCompleted whose `lr` is NaN, infinite, below `lr_min` or above `lr_max` opens the condition
(a scheduler bug, a warm-up that never ends, a resumed run whose schedule restarted from a wrong
step, a config typo like 3e-2 for 3e-4); it resolves at the next step whose `lr` is back in range.
Steps without an `lr` are not judged. `lr_max` is a sanity ceiling (100: LARS-style large-batch
schedules reach ~10); set a tighter range per workload with an override file.
"""

from __future__ import annotations

import math
from typing import Any

from schemas.records import Event
from streams.detectors.base import LEADER_RANK, Finding, PerJobDetector
from streams.detectors.catalogue import catalogued

__all__ = ["DEFAULTS", "LrInvalidDetector"]

DEFAULTS: dict[str, Any] = {
    "lr_min": 0.0,  # a learning rate below this is invalid (a negative one always is)
    "lr_max": 100.0,  # ... and above this (a sanity ceiling: LARS-style schedules reach ~10)
}
_POINTS = 8

LR_INVALID = catalogued("lr_invalid")


class LrInvalidDetector(PerJobDetector, rule=LR_INVALID, stage="job", section="numerical"):
    """The learning rate is finite and within [lr_min, lr_max], per job."""

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._min = float(p["lr_min"])
        self._max = float(p["lr_max"])

    def new_job_state(self) -> dict[str, Any]:
        """Recent learning rates and the open condition."""
        return {"points": [], "open": None}

    def observe(self, event: Event) -> list[Finding]:
        """Judge the `lr` of the leader rank's StepCompleted."""
        r = event.record
        if event.type != "StepCompleted" or r.get("rank") != LEADER_RANK:
            return []
        lr = r.get("lr")
        if lr is None:
            return []
        lr = float(lr)
        job = self._job(r["job_id"])
        if math.isfinite(lr):
            job["points"].append([int(r["ts"]), lr])
            del job["points"][:-_POINTS]
        bad = not math.isfinite(lr) or lr < self._min or lr > self._max
        if bad and job["open"] is None:
            job["open"] = {"since": int(r["ts"])}
            return [self._finding(r, job, True, lr)]
        if not bad and job["open"] is not None:
            out = self._finding(r, job, False, lr)
            job["open"] = None
            return [out]
        return []

    def _finding(self, r: dict[str, Any], job: dict[str, Any], active: bool, lr: float) -> Finding:
        job_id = r["job_id"]
        where = f"[{self._min:g}, {self._max:g}]"
        summary = (
            f"job {job_id} trains with learning rate {lr:g} at step {r['step']}, outside {where}"
            if active
            else f"job {job_id}'s learning rate is back in {where} ({lr:g} at step {r['step']})"
        )
        return LR_INVALID.finding(
            (job_id,),
            active,
            int(r["ts"]),
            job_id=job_id,
            since=int((job["open"] or {}).get("since", r["ts"])),
            invariant=LR_INVALID.says(lr_min=self._min, lr_max=self._max),
            observed=lr if math.isfinite(lr) else None,
            expected=self._max if math.isfinite(lr) and lr > self._max else self._min,
            summary=summary,
            history_metric="lr",
            history=tuple((int(t), float(v)) for t, v in job["points"]),
            sustain_ms=0,
        )
