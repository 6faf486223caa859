"""Rule `step_skip_rate`: a sustained share of a job's optimizer steps is skipped.

Category `model`, suspected layer `model`. A skipped step (StepCompleted `skipped`, e.g. a
loss-scale overflow under mixed precision) costs a whole step of compute and teaches nothing. The
`nonfinite_*` rules catch a burst (non-finite values, skips in a row); this rule catches the
steady leak: over the job's last `window_steps` steps (one verdict per step: the first rank to
report it), at least `min_fraction` were skipped and the skips are spread over the window (skips
in at least `min_quarters` of its four quarters, and no run of more than `max_run` skipped steps in
a row: a burst is the non-finite rules' case, not a rate). Resolves when the share falls below `resolve_fraction`; a new run starts a
fresh window.
"""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued

__all__ = ["DEFAULTS", "StepSkipRateDetector"]

DEFAULTS: dict[str, Any] = {
    "window_steps": 100,  # the rate is judged over this many latest steps of the job
    "min_fraction": 0.1,  # at least this share of them skipped...
    "min_quarters": 3,  # ...with skips in at least this many of the window's four quarters...
    "max_run": 5,  # ...and no run of consecutive skipped steps longer than this (a burst is not a rate)
    "resolve_fraction": 0.05,  # the alert resolves below this share
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
}

_POINTS = 10


STEP_SKIP_RATE = catalogued("step_skip_rate")


class StepSkipRateDetector(PerJobDetector, rule=STEP_SKIP_RATE, stage="job"):
    """The share of skipped steps over a window of the job's steps."""

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._window = max(8, int(p["window_steps"]))
        self._min = float(p["min_fraction"])
        self._quarters = max(1, min(4, int(p["min_quarters"])))
        self._max_run = max(1, int(p["max_run"]))
        self._resolve = float(p["resolve_fraction"])
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)

    def new_job_state(self) -> dict[str, Any]:
        """The window of step verdicts (1 skipped, 0 applied), the last step judged, the condition."""
        return {"run": None, "last": -1, "window": [], "cond": None, "points": []}

    def observe(self, event: Event) -> list[Finding]:
        """One verdict per step of the job; judge the window."""
        if event.type != "StepCompleted":
            return []
        r = event.record
        job = self._job(r["job_id"])
        out: list[Finding] = []
        run = r.get("run_id", "")
        if job["run"] != run:
            if job["cond"] is not None:
                out.append(self._finding(r["job_id"], job, r["ts"], 0.0, active=False))
            job.update(run=run, last=-1, window=[], cond=None, points=[])
        step = int(r["step"])
        if step <= job["last"]:
            return out  # another rank's report of a step already judged
        job["last"] = step
        window: list[int] = job["window"]
        window.append(1 if r.get("skipped") else 0)
        if len(window) > self._window:
            del window[0]
        if len(window) < self._window:
            return out
        fraction = sum(window) / len(window)
        if step % 10 == 0:
            points: list[list[Any]] = job["points"]
            points.append([r["ts"], fraction])
            del points[:-_POINTS]
        quarter = len(window) // 4
        spread = sum(1 for q in range(4) if any(window[q * quarter : (q + 1) * quarter]))
        cond = job["cond"]
        if (
            cond is None
            and fraction >= self._min
            and spread >= self._quarters
            and _longest_run(window) <= self._max_run
        ):
            job["cond"] = {"since": r["ts"], "emit": r["ts"], "step": step}
            out.append(self._finding(r["job_id"], job, r["ts"], fraction, active=True))
        elif cond is not None and fraction < self._resolve:
            out.append(self._finding(r["job_id"], job, r["ts"], fraction, active=False))
            job["cond"] = None
        elif cond is not None and r["ts"] - cond["emit"] >= self._reemit_ms:
            cond["emit"] = r["ts"]
            out.append(self._finding(r["job_id"], job, r["ts"], fraction, active=True))
        return out

    def _finding(
        self, job_id: str, job: dict[str, Any], ts: int, fraction: float, *, active: bool
    ) -> Finding:
        cond = job["cond"] or {"since": ts, "step": job["last"]}
        n = len(job["window"])
        summary = (
            f"{fraction:.0%} of the last {n} steps of job {job_id} were skipped (up to step {job['last']}): "
            "the optimizer throws that compute away (loss-scale overflows?)"
            if active
            else f"job {job_id} skips {fraction:.0%} of its steps again"
        )
        return STEP_SKIP_RATE.for_job(
            job_id,
            active,
            ts,
            since=cond["since"],
            invariant=STEP_SKIP_RATE.says(min=self._min, window=self._window),
            observed=fraction,
            expected=self._min,
            summary=summary,
            history_metric="skipped_step_fraction",
            history=tuple((int(t), float(v)) for t, v in job["points"]),
            sustain_ms=0,
        )


def _longest_run(window: list[int]) -> int:
    """The longest run of consecutive skipped steps (1s) in the window."""
    best = run = 0
    for skipped in window:
        run = run + 1 if skipped else 0
        best = max(best, run)
    return best
