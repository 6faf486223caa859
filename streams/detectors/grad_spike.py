"""Rule `grad_spike`: a job's gradient norm jumped far above its rolling median.

Category `model`, warning, one identity per job (the rank that reported the spiking step is
named). The gradient norm is global (every rank reports the same value), so one value per step:
it is a spike when the norm is above `grad_spike_factor` x the median of the previous
`grad_window_steps` steps for `grad_spike_steps` steps in a row, or a single value is above
`grad_extreme_factor` x that median, once `grad_min_history` steps are known. Resolves after
`grad_resolve_steps` normal steps in a row; an active spike is re-reported at most every
`reemit_s`.
"""

from __future__ import annotations

import math
from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued
from streams.detectors.placement import rank_place
from streams.detectors.stats import median

__all__ = ["DEFAULTS", "GradSpikeDetector"]

DEFAULTS: dict[str, Any] = {
    "grad_window_steps": 50,  # rolling median of the gradient norm over this many steps
    "grad_min_history": 10,  # steps of history before a spike can be judged
    "grad_spike_factor": 10.0,  # spike: norm above this x the rolling median ...
    "grad_spike_steps": 2,  # ... for this many steps in a row
    "grad_extreme_factor": 25.0,  # a single norm above this x the median is a spike at once
    "grad_resolve_steps": 5,  # normal steps in a row before a spike resolves
    "reemit_s": 30.0,  # re-report an active condition at most this often (event time)
}

_POINTS = 8  # gradient norms carried on a finding


GRAD_SPIKE = catalogued("grad_spike")


class GradSpikeDetector(PerJobDetector, rule=GRAD_SPIKE, stage="job", section="numerical"):
    """Gradient-norm spikes against the rolling median, per job."""

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._grad_k = int(p["grad_window_steps"])
        self._grad_min = int(p["grad_min_history"])
        self._spike_factor = float(p["grad_spike_factor"])
        self._spike_steps = int(p["grad_spike_steps"])
        self._extreme = float(p["grad_extreme_factor"])
        self._grad_resolve = int(p["grad_resolve_steps"])
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)

    def new_job_state(self) -> dict[str, Any]:
        """The rolling history of the norm, the runs of spiking and normal steps, the open spike."""
        return {
            "grad_hist": [],
            "grad_last_step": -1,
            "grad_points": [],
            "spike_run": 0,
            "ok_run": 0,
            "spike": None,
        }

    def observe(self, event: Event) -> list[Finding]:
        """Judge the gradient norm of a StepCompleted against the job's rolling median."""
        if event.type != "StepCompleted":
            return []
        r = event.record
        job = self._job(r["job_id"])
        grad = r.get("grad_norm")
        if grad is None or not math.isfinite(grad):
            return []
        return self._grad(job, r, float(grad))

    def _grad(self, job: dict[str, Any], r: dict[str, Any], grad: float) -> list[Finding]:
        # The norm is global: every rank reports the same value, so one value per step.
        if r["step"] <= job["grad_last_step"]:
            return []
        job["grad_last_step"] = r["step"]
        hist: list[float] = job["grad_hist"]
        ref = median(hist) if len(hist) >= self._grad_min else None
        job["grad_points"] = [*job["grad_points"], [r["ts"], grad]][-_POINTS:]
        hist.append(grad)
        if len(hist) > self._grad_k:
            del hist[: len(hist) - self._grad_k]
        if ref is None or ref <= 0.0:
            return []
        ratio = grad / ref
        out: list[Finding] = []
        spike = job["spike"]
        if ratio > self._spike_factor:
            job["spike_run"] += 1
            job["ok_run"] = 0
            if spike is None and (job["spike_run"] >= self._spike_steps or ratio > self._extreme):
                spike = {"since": r["ts"], "rank": r["rank"], "step": r["step"], "ref": ref, "emit": r["ts"]}
                job["spike"] = spike
                out.append(self._finding(r["job_id"], spike, r["ts"], True, grad))
            elif spike is not None and r["ts"] - spike["emit"] >= self._reemit_ms:
                spike["emit"] = r["ts"]
                out.append(self._finding(r["job_id"], spike, r["ts"], True, grad))
        else:
            job["spike_run"] = 0
            job["ok_run"] += 1
            if spike is not None and job["ok_run"] >= self._grad_resolve:
                job["spike"] = None
                out.append(self._finding(r["job_id"], spike, r["ts"], False, grad))
        return out

    def _finding(self, job_id: str, spike: dict[str, Any], ts: int, active: bool, grad: float) -> Finding:
        job = self._jobs[job_id]
        ref = float(spike["ref"])
        place = rank_place(self.topology, job_id, spike["rank"])
        summary = (
            f"gradient norm of job {job_id} jumped to {grad:.4g}, {grad / ref:.1f}x its rolling median {ref:.4g} "
            f"(step {spike['step']})"
            if active
            else f"gradient norm of job {job_id} is back to normal ({grad:.4g})"
        )
        return GRAD_SPIKE.for_job(
            job_id,
            active,
            ts,
            rank=spike["rank"],
            place=place,
            since=spike["since"],
            invariant=GRAD_SPIKE.says(spike_factor=self._spike_factor, grad_k=self._grad_k),
            observed=grad,
            expected=ref,
            summary=summary,
            history_metric="grad_norm",
            history=tuple((int(t), float(v)) for t, v in job["grad_points"]),
            sustain_ms=0,
        )
