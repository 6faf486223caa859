"""Validation behaviour: validation moving against training, and a validation that stops coming.

Rules (category `model`, identity per job):

- `validation_divergence`: at `sustain_evaluations` evaluations in a row, the validation loss rose
  by more than `noise_ratio` (relative) since the previous evaluation while the mean training loss
  of the steps in between fell by more than `train_noise_ratio`: the model fits the training data and
  gets worse on held-out data (overfitting, a train/val data mismatch, leakage that stopped).
  Resolves after `resolve_evaluations` evaluations in a row whose validation loss does not rise
  beyond the noise (a single calm evaluation is noise too).
- `validation_missing`: a job that validated at a regular period trains on for more than
  `missing_periods` periods past its last validation without another one. Resolves with the next
  ValidationResult. The period, in steps, is the median of the last `period_history` intervals
  between evaluations once `min_periods` are seen. Before that, what a loop that evaluates every N
  steps shows is enough (so evaluations that stop after the first or the second one are missed
  too): two evaluations whose interval N divides their steps (within one step: loops count from 0
  or 1, and may evaluate at step 0), or one evaluation at step s of a run the detector saw from its
  first step (0 or 1): N = the steps trained before it (at least `min_period_steps`). A job seen
  from the middle of a run with two evaluations off that grid waits for `min_periods` intervals.

The validation loss is the first metric of `val_metrics` a ValidationResult carries; training
loss is the mean finite `loss` of rank 0's steps. A new run id (restart) keeps the learned period
but forgets the loss history, since a restore moves both losses.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued
from streams.detectors.history import add_point, points_of

__all__ = ["DEFAULTS", "ValidationDetector"]

DEFAULTS: dict[str, Any] = {
    "val_metrics": [
        "val_loss",
        "eval_loss",
        "validation_loss",
        "loss",
    ],  # first one present is the validation loss
    "noise_ratio": 0.01,  # relative rise of the validation loss that counts as a move (one evaluation is noisy)
    "train_noise_ratio": 0.001,  # relative fall of the mean training loss that counts (a mean of many steps)
    "sustain_evaluations": 3,  # diverging evaluations in a row before validation_divergence fires
    "resolve_evaluations": 2,  # evaluations in a row without a rise before it resolves (one calm one is noise)
    "period_history": 5,  # evaluation intervals (steps) the period is learned from (median)
    "min_periods": 2,  # intervals seen before a period is trusted (fewer: only on the every-N-steps grid)
    "min_period_steps": 10,  # a period inferred from one evaluation is at least this many steps
    "missing_periods": 1.5,  # training this many periods past the last validation -> missing
}


def _on_grid(step: int, period: float) -> bool:
    """True when `step` is a multiple of `period` within one step (loops count steps from 0 or 1)."""
    n = round(period)
    if n < 1:
        return False
    rest = step % n
    return rest <= 1 or rest >= n - 1


def _median(values: list[int]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return float(s[mid]) if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


VALIDATION_DIVERGENCE = catalogued("validation_divergence")

VALIDATION_MISSING = catalogued("validation_missing")


class ValidationDetector(PerJobDetector):
    """Validation loss against training loss, and the validation period, per job."""

    stage: ClassVar[str] = "job"  # reads the job's validation results and its leader rank's steps

    rules: ClassVar[tuple[str, ...]] = ("validation_divergence", "validation_missing")

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._metrics = [str(m) for m in p["val_metrics"]]
        self._noise = float(p["noise_ratio"])
        self._train_noise = float(p["train_noise_ratio"])
        self._sustain = max(1, int(p["sustain_evaluations"]))
        self._resolve = max(1, int(p["resolve_evaluations"]))
        self._history = max(1, int(p["period_history"]))
        self._min_periods = max(1, int(p["min_periods"]))
        self._min_period_steps = max(1, int(p["min_period_steps"]))
        self._missing = float(p["missing_periods"])

    def new_job_state(self) -> dict[str, Any]:
        """The state of a job seen for the first time."""
        return {
            "run": None,
            "train_sum": 0.0,
            "train_n": 0,
            "prev": None,  # {"step", "val", "train"} of the previous evaluation
            "streak": [],  # [step, val, train] of the diverging evaluations in a row
            "diverging": None,
            "calm": 0,  # evaluations in a row without a rise while diverging
            "last_val_step": None,
            "intervals": [],
            "val_steps": [],  # steps of the first evaluations (until the period is learned from intervals)
            "first_step": None,  # the lowest step rank 0 reported: 0 or 1 when the detector saw the run begin
            "top_step": None,
            "missing": None,
        }

    def observe(self, event: Event) -> list[Finding]:
        """Training loss and progress from StepCompleted; the checks run at each ValidationResult."""
        r = event.record
        if event.type == "StepCompleted" and r["rank"] == 0:
            return self._step(r)
        if event.type == "ValidationResult":
            return self._validation(r)
        return []

    def _same_run(self, job: dict[str, Any], run: str) -> None:
        if job["run"] != run:
            job.update(run=run, train_sum=0.0, train_n=0, prev=None, streak=[])

    def _step(self, r: dict[str, Any]) -> list[Finding]:
        job = self._job(r["job_id"])
        self._same_run(job, r.get("run_id", ""))
        loss = r.get("loss")
        if loss is not None and math.isfinite(loss):
            job["train_sum"] += loss
            job["train_n"] += 1
        step = int(r["step"])
        job["top_step"] = step if job["top_step"] is None else max(job["top_step"], step)
        first = job.get("first_step")
        job["first_step"] = step if first is None else min(first, step)
        last = job["last_val_step"]
        if last is None or job["missing"] is not None:
            return []
        period = self._period(job)
        if period is not None and step - last > self._missing * period:
            job["missing"] = {"since": r["ts"], "period": period}
            return [self._missing_finding(r["job_id"], r["ts"], step, last, period, True)]
        return []

    def _period(self, job: dict[str, Any]) -> float | None:
        """The job's evaluation period in steps, or None while it is not known (see the module doc)."""
        intervals = job["intervals"]
        if len(intervals) >= self._min_periods:
            return _median(intervals)
        evals = job.get("val_steps") or []
        if intervals:
            period = _median(intervals)
            on_grid = all(_on_grid(e, period) for e in evals)
            return period if on_grid and period >= 1 else None
        first = job.get("first_step")
        if len(evals) == 1 and first is not None and first <= 1:
            period = float(evals[0] - first + 1)  # steps trained before the first evaluation
            return period if period >= self._min_period_steps else None
        return None

    def _validation(self, r: dict[str, Any]) -> list[Finding]:
        job_id, ts, step = r["job_id"], r["ts"], int(r["step"])
        job = self._job(job_id)
        self._same_run(job, r.get("run_id", ""))
        out: list[Finding] = []
        last = job["last_val_step"]
        if last is not None and step > last:
            job["intervals"] = [*job["intervals"], step - last][-self._history :]
        if (last is None or step > last) and len(job.get("val_steps") or []) <= self._min_periods:
            job["val_steps"] = [*(job.get("val_steps") or []), step]
        job["last_val_step"] = step
        if job["missing"] is not None:
            out.append(self._missing_finding(job_id, ts, step, last or step, job["missing"]["period"], False))
            job["missing"] = None
        val = next((r["metrics"][m] for m in self._metrics if m in r["metrics"]), None)
        if val is not None and math.isfinite(val):
            add_point(job.setdefault("val_points", {}), ts, float(val))  # the alert's history
        train = job["train_sum"] / job["train_n"] if job["train_n"] else None
        job["train_sum"], job["train_n"] = 0.0, 0
        if val is None or not math.isfinite(val) or train is None:
            return out
        prev = job["prev"]
        job["prev"] = {"step": step, "val": val, "train": train}
        if prev is None:
            return out
        rose = val - prev["val"] > self._noise * abs(prev["val"])
        fell = prev["train"] - train > self._train_noise * abs(prev["train"])
        if rose and fell:
            job["calm"] = 0
            if not job["streak"]:
                job["streak"] = [[prev["step"], prev["val"], prev["train"]]]
            job["streak"].append([step, val, train])
            if len(job["streak"]) - 1 >= self._sustain:
                if job["diverging"] is None:
                    job["diverging"] = {"since": ts}
                out.append(self._divergence_finding(job_id, ts, job, True))
            return out
        if not rose:
            if job["diverging"] is None:
                job["streak"] = []
                return out
            job["calm"] += 1
            if job["calm"] >= self._resolve:
                out.append(self._divergence_finding(job_id, ts, job, False, val))
                job.update(diverging=None, streak=[], calm=0)
        return out

    def _divergence_finding(
        self, job_id: str, ts: int, job: dict[str, Any], active: bool, val: float | None = None
    ) -> Finding:
        streak = job["streak"]
        if active:
            (s0, v0, t0), (s1, v1, t1) = streak[0], streak[-1]
            summary = (
                f"validation loss of job {job_id} rose from {v0:.4g} to {v1:.4g} over {len(streak) - 1} "
                f"evaluations (steps {s0}-{s1}) while training loss fell from {t0:.4g} to {t1:.4g}"
            )
            observed = (v1 - v0) / max(abs(v0), 1e-12)
        else:
            summary = f"validation loss of job {job_id} stopped rising ({val:.4g})"
            observed = 0.0
        return VALIDATION_DIVERGENCE.for_job(
            job_id,
            active,
            ts,
            since=job["diverging"]["since"],
            invariant=VALIDATION_DIVERGENCE.says(noise=self._noise, sustain=self._sustain),
            observed=observed,
            expected=0.0,
            summary=summary,
            history_metric="val_loss",
            history=points_of(job.get("val_points")),
            sustain_ms=0,
        )

    def _missing_finding(
        self, job_id: str, ts: int, step: int, last: int, period: float, active: bool
    ) -> Finding:
        cond = self._jobs[job_id].get("missing") or {}
        history = add_point(cond, ts, float(step - last)) if cond else ((ts, float(step - last)),)
        summary = (
            f"job {job_id} reached step {step} without a validation since step {last}; "
            f"it validated every {period:g} steps"
            if active
            else f"job {job_id} reported a validation again (step {step})"
        )
        return VALIDATION_MISSING.for_job(
            job_id,
            active,
            ts,
            invariant=VALIDATION_MISSING.says(period=period, missing=self._missing),
            observed=float(step - last),
            expected=period,
            summary=summary,
            history_metric="steps_since_validation",
            history=history,
            sustain_ms=0,
        )
