"""Rule `loss_divergence`: a job's loss is rising above its running minimum.

Category `model`, critical, one identity per job. Per job, event-time windows of `window_s`; the
median loss of a window over all ranks and steps (windows with fewer than
`divergence_min_samples` finite losses are ignored); the running minimum of the rolling median
of the last `divergence_smooth_windows` window medians (a floor that noise does not drag down).
Diverging when the latest median is above `running_min * (1 + divergence_tol)` (and at least
`divergence_min_rise` nats above it) and the medians did not fall over the last
`divergence_windows` windows, the last one rising. Medians make isolated one-step loss spikes
irrelevant; the tolerance makes slow late-training drift (a few percent) irrelevant. Resolves
when a window median is back within the tolerance of the running minimum. Windows close on
`advance(watermark)`, in event time.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued
from streams.detectors.stats import median

__all__ = ["DEFAULTS", "LossDivergenceDetector"]

DEFAULTS: dict[str, Any] = {
    "window_s": 60.0,  # event-time window of the divergence check
    "divergence_tol": 0.05,  # window median must exceed running min by this fraction
    "divergence_min_rise": 0.05,  # ... and by at least this many nats (losses near 0)
    "divergence_windows": 2,  # medians must not fall over this many windows, the last one rising
    "divergence_min_samples": 3,  # windows with fewer finite losses are ignored
    "divergence_smooth_windows": 5,  # the running minimum is taken over medians of this many window medians
}

_POINTS = 8  # window medians kept (at least) and carried on a finding


LOSS_DIVERGENCE = catalogued("loss_divergence")


class LossDivergenceDetector(PerJobDetector, rule=LOSS_DIVERGENCE, stage="job", section="numerical"):
    """The median loss of event-time windows rising above its running minimum, per job."""

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._window_ms = int(float(p["window_s"]) * 1000)
        self._tol = float(p["divergence_tol"])
        self._min_rise = float(p["divergence_min_rise"])
        self._div_windows = int(p["divergence_windows"])
        self._div_min_samples = int(p["divergence_min_samples"])
        self._smooth = max(1, int(p["divergence_smooth_windows"]))

    def new_job_state(self) -> dict[str, Any]:
        """Open windows (start -> losses), closed window medians, the running minimum, the open condition."""
        return {"windows": {}, "medians": [], "run_min": None, "div": None}

    def observe(self, event: Event) -> list[Finding]:
        """Collect the finite loss of a StepCompleted into its window (a closed window takes no more)."""
        if event.type != "StepCompleted":
            return []
        r = event.record
        job = self._job(r["job_id"])
        loss = r.get("loss")
        if loss is not None and math.isfinite(loss):
            start = r["ts"] - r["ts"] % self._window_ms
            if not job["medians"] or start + self._window_ms > job["medians"][-1][0]:
                job["windows"].setdefault(str(start), []).append(float(loss))
        return []

    def advance(self, watermark: int) -> list[Finding]:
        """Close the loss windows that ended before `watermark`; re-check divergence."""
        out: list[Finding] = []
        for job_id in sorted(self._jobs):
            job = self._jobs[job_id]
            if not job["windows"]:
                continue
            for start in sorted(job["windows"], key=int):
                end = int(start) + self._window_ms
                if end > watermark:
                    break
                losses = job["windows"].pop(start)
                if len(losses) >= self._div_min_samples:
                    out += self._close_window(job_id, job, end, median(losses) or 0.0)
        return out

    def _close_window(self, job_id: str, job: dict[str, Any], end: int, med: float) -> list[Finding]:
        run_min = job["run_min"]
        medians: list[list[Any]] = job["medians"]
        medians.append([end, med])
        del medians[: max(0, len(medians) - max(_POINTS, self._div_windows + 1, self._smooth))]
        # The floor is the running minimum of *smoothed* medians: the minimum of raw window
        # medians sits a few noise widths below the typical level of a noisy run, which would
        # make ordinary noise look like a rise above it.
        floor = median([m for _, m in medians[-self._smooth :]]) or med
        if run_min is None or floor < run_min:
            job["run_min"] = run_min = floor
        bound = max(run_min * (1.0 + self._tol), run_min + self._min_rise)
        recent = [m for _, m in medians[-(self._div_windows + 1) :]]
        rising = (
            med > bound
            and len(recent) == self._div_windows + 1
            and recent[-1] > recent[-2]
            and all(b >= a for a, b in itertools.pairwise(recent))
        )
        div = job["div"]
        if div is None and rising:
            job["div"] = div = {"since": int(medians[-self._div_windows - 1][0]), "emit": end}
            return [self._finding(job_id, job, end, True, med, run_min)]
        if div is not None and med <= bound:
            job["div"] = None
            return [self._finding(job_id, job, end, False, med, run_min)]
        if div is not None:
            # Still above the tolerance (rising or on a plateau): the run has not recovered.
            return [self._finding(job_id, job, end, True, med, run_min)]
        return []

    def _finding(
        self, job_id: str, job: dict[str, Any], ts: int, active: bool, med: float, run_min: float
    ) -> Finding:
        div = job["div"] or {"since": ts}
        summary = (
            f"loss of job {job_id} is rising: window median {med:.4g} is {100 * (med / run_min - 1):.1f}% above "
            f"its running minimum {run_min:.4g}"
            if active
            else f"loss of job {job_id} is back near its running minimum ({med:.4g} vs {run_min:.4g})"
        )
        return LOSS_DIVERGENCE.for_job(
            job_id,
            active,
            ts,
            since=int(div["since"]),
            invariant=LOSS_DIVERGENCE.says(window_s=self._window_ms // 1000, tol_pct=100 * self._tol),
            observed=med,
            expected=run_min,
            summary=summary,
            history_metric="loss_window_median",
            history=tuple((int(t), float(m)) for t, m in job["medians"][-_POINTS:]),
            sustain_ms=0,
        )
