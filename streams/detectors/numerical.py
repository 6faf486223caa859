"""Numerical invariants of training: finite loss and gradients, no divergence, no gradient spikes.

Rules: `nonfinite_loss`, `nonfinite_grad`, `loss_divergence`, `grad_spike` (category `model`),
one identity per job (the first rank that showed the problem is named in the finding).

- Non-finite loss / gradient norm: fires at once; resolves when finite values have resumed for
  `nonfinite_resolve_steps` steps. A non-finite gradient norm on a step the optimizer *skipped*
  (loss-scale overflow under dynamic loss scaling) is normal once in a while, so it counts only
  after `skipped_overflow_steps` such steps in a row.
- Divergence: per job, event-time windows of `window_s`; the median loss of a window over all
  ranks and steps; the running minimum of the rolling median of the last `divergence_smooth_windows`
  window medians (a floor that noise does not drag down). Diverging when the latest median is
  above `running_min * (1 + divergence_tol)` (and at least `divergence_min_rise` nats above it)
  and the medians did not fall over the last `divergence_windows` windows, the last one rising. Medians make isolated one-step
  loss spikes irrelevant; the tolerance makes slow late-training drift (a few percent) irrelevant.
  Resolves when a window median is back within the tolerance of the running minimum.
- Gradient spike: the gradient norm (one value per step) above `grad_spike_factor` x the median
  of the previous `grad_window_steps` steps for `grad_spike_steps` steps in a row, or a single
  value above `grad_extreme_factor` x that median. Resolves after `grad_resolve_steps` normal steps.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector, Topology
from streams.detectors.placement import rank_place
from streams.detectors.stats import median

__all__ = ["DEFAULTS", "NumericalDetector"]

DEFAULTS: dict[str, Any] = {
    "window_s": 60.0,  # event-time window of the divergence check
    "nonfinite_resolve_steps": 10,  # finite steps after the last non-finite one before resolving
    "skipped_overflow_steps": 3,  # skipped steps with a non-finite grad norm in a row before it counts
    "divergence_tol": 0.05,  # window median must exceed running min by this fraction
    "divergence_min_rise": 0.05,  # ... and by at least this many nats (losses near 0)
    "divergence_windows": 2,  # medians must not fall over this many windows, the last one rising
    "divergence_min_samples": 3,  # windows with fewer finite losses are ignored
    "divergence_smooth_windows": 5,  # the running minimum is taken over medians of this many window medians
    "grad_window_steps": 50,  # rolling median of the gradient norm over this many steps
    "grad_min_history": 10,  # steps of history before a spike can be judged
    "grad_spike_factor": 10.0,  # spike: norm above this x the rolling median ...
    "grad_spike_steps": 2,  # ... for this many steps in a row
    "grad_extreme_factor": 25.0,  # a single norm above this x the median is a spike at once
    "grad_resolve_steps": 5,  # normal steps in a row before a spike resolves
    "reemit_s": 30.0,  # re-report an active condition at most this often (event time)
}

_HISTORY = 8


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(value)


def _fmt(value: Any) -> str:
    return "null" if value is None else repr(float(value))


class NumericalDetector(PerJobDetector):
    """Finite loss and gradient norm, loss divergence and gradient-norm spikes, per job."""

    rules: ClassVar[tuple[str, ...]] = ("nonfinite_loss", "nonfinite_grad", "loss_divergence", "grad_spike")

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**DEFAULTS, **self.params}
        self._window_ms = int(float(p["window_s"]) * 1000)
        self._nf_resolve = int(p["nonfinite_resolve_steps"])
        self._skip_steps = int(p["skipped_overflow_steps"])
        self._tol = float(p["divergence_tol"])
        self._min_rise = float(p["divergence_min_rise"])
        self._div_windows = int(p["divergence_windows"])
        self._div_min_samples = int(p["divergence_min_samples"])
        self._smooth = max(1, int(p["divergence_smooth_windows"]))
        self._grad_k = int(p["grad_window_steps"])
        self._grad_min = int(p["grad_min_history"])
        self._spike_factor = float(p["grad_spike_factor"])
        self._spike_steps = int(p["grad_spike_steps"])
        self._extreme = float(p["grad_extreme_factor"])
        self._grad_resolve = int(p["grad_resolve_steps"])
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)

    # -- state -------------------------------------------------------------------------------

    def new_job_state(self) -> dict[str, Any]:
        """The state of a job seen for the first time."""
        return {
            "nf_loss": None,
            "nf_grad": None,
            "skip_run": 0,
            "skip_last_step": -1,
            "windows": {},
            "medians": [],
            "run_min": None,
            "div": None,
            "grad_hist": [],
            "grad_last_step": -1,
            "grad_points": [],
            "spike_run": 0,
            "ok_run": 0,
            "spike": None,
        }

    # -- events ------------------------------------------------------------------------------

    def observe(self, event: Event) -> list[Finding]:
        """Check loss and gradient norm of a StepCompleted; collect the loss for its window."""
        if event.type != "StepCompleted":
            return []
        r = event.record
        job = self._job(r["job_id"])
        out: list[Finding] = []
        loss, grad = r.get("loss"), r.get("grad_norm")
        out += self._nonfinite(job, r, "nonfinite_loss", "nf_loss", loss, "loss", counts=loss is not None)
        skipped = bool(r.get("skipped"))
        grad_counts = grad is not None
        if grad is not None and not math.isfinite(grad) and skipped:
            if r["step"] > job["skip_last_step"]:
                job["skip_run"] += 1
                job["skip_last_step"] = r["step"]
            grad_counts = job["skip_run"] >= self._skip_steps
        elif _finite(grad):
            job["skip_run"] = 0
        if grad_counts or _finite(grad):
            out += self._nonfinite(job, r, "nonfinite_grad", "nf_grad", grad, "gradient norm", counts=True)
        if loss is not None and math.isfinite(loss):
            start = r["ts"] - r["ts"] % self._window_ms
            if not job["medians"] or start + self._window_ms > job["medians"][-1][0]:
                job["windows"].setdefault(str(start), []).append(float(loss))
        if grad is not None and math.isfinite(grad):
            out += self._grad(job, r, float(grad))
        return out

    def _nonfinite(
        self,
        job: dict[str, Any],
        r: dict[str, Any],
        rule: str,
        slot: str,
        value: Any,
        what: str,
        counts: bool,
    ) -> list[Finding]:
        if not counts:
            return []
        cond = job[slot]
        if not _finite(value):
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
                job[slot] = cond
                cond["value"] = _fmt(value)
                _count_bad(cond, r["ts"])
                return [self._nf_finding(r["job_id"], rule, cond, r["ts"], True, what)]
            cond["bad_step"] = max(cond["bad_step"], r["step"])
            if r["ts"] - cond["emit"] >= self._reemit_ms:
                cond["emit"] = r["ts"]
                return [self._nf_finding(r["job_id"], rule, cond, r["ts"], True, what)]
            return []
        if cond is not None and r["step"] >= cond["bad_step"] + self._nf_resolve:
            job[slot] = None
            return [self._nf_finding(r["job_id"], rule, cond, r["ts"], False, what)]
        return []

    def _nf_finding(
        self, job_id: str, rule: str, cond: dict[str, Any], ts: int, active: bool, what: str
    ) -> Finding:
        summary = (
            f"{what} of job {job_id} is {cond['value']} (first on rank {cond['rank']} at step {cond['step']})"
            if active
            else f"{what} of job {job_id} is finite again after step {cond['bad_step']}"
        )
        place = rank_place(self.topology, job_id, cond["rank"])
        return Finding(
            rule=rule,
            key=(job_id,),
            active=active,
            ts=ts,
            category="model",
            severity="critical",
            job_id=job_id,
            node=place.node,
            rank=cond["rank"],
            gpu_uuid=place.gpu_uuid,
            gpu_index=place.gpu_index,
            since=cond["since"],
            invariant=f"the {what} is finite on every step",
            summary=summary,
            suspected_layer="model",
            # The non-finite values themselves are no numbers to plot: their running count is.
            history_metric="nonfinite_loss_steps" if rule == "nonfinite_loss" else "nonfinite_grad_steps",
            history=tuple((int(t), float(v)) for t, v in cond.get("points", ())),
            sustain_ms=0,
        )

    # -- gradient spikes ---------------------------------------------------------------------

    def _grad(self, job: dict[str, Any], r: dict[str, Any], grad: float) -> list[Finding]:
        # The norm is global: every rank reports the same value, so one value per step.
        if r["step"] <= job["grad_last_step"]:
            return []
        job["grad_last_step"] = r["step"]
        hist: list[float] = job["grad_hist"]
        ref = median(hist) if len(hist) >= self._grad_min else None
        job["grad_points"] = [*job["grad_points"], [r["ts"], grad]][-_HISTORY:]
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
                out.append(self._spike_finding(r["job_id"], spike, r["ts"], True, grad))
            elif spike is not None and r["ts"] - spike["emit"] >= self._reemit_ms:
                spike["emit"] = r["ts"]
                out.append(self._spike_finding(r["job_id"], spike, r["ts"], True, grad))
        else:
            job["spike_run"] = 0
            job["ok_run"] += 1
            if spike is not None and job["ok_run"] >= self._grad_resolve:
                job["spike"] = None
                out.append(self._spike_finding(r["job_id"], spike, r["ts"], False, grad))
        return out

    def _spike_finding(
        self, job_id: str, spike: dict[str, Any], ts: int, active: bool, grad: float
    ) -> Finding:
        job = self._jobs[job_id]
        ref = float(spike["ref"])
        place = rank_place(self.topology, job_id, spike["rank"])
        summary = (
            f"gradient norm of job {job_id} jumped to {grad:.4g}, {grad / ref:.1f}x its rolling median {ref:.4g} "
            f"(step {spike['step']})"
            if active
            else f"gradient norm of job {job_id} is back to normal ({grad:.4g})"
        )
        return Finding(
            rule="grad_spike",
            key=(job_id,),
            active=active,
            ts=ts,
            category="model",
            severity="warning",
            job_id=job_id,
            node=place.node,
            rank=spike["rank"],
            gpu_uuid=place.gpu_uuid,
            gpu_index=place.gpu_index,
            since=spike["since"],
            invariant=f"gradient norm stays below {self._spike_factor:g}x its rolling median of {self._grad_k} steps",
            observed=grad,
            expected=ref,
            summary=summary,
            suspected_layer="model",
            history_metric="grad_norm",
            history=tuple((int(t), float(v)) for t, v in job["grad_points"]),
            sustain_ms=0,
        )

    # -- divergence --------------------------------------------------------------------------

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
        del medians[: max(0, len(medians) - max(_HISTORY, self._div_windows + 1, self._smooth))]
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
            return [self._div_finding(job_id, job, end, True, med, run_min)]
        if div is not None and med <= bound:
            job["div"] = None
            return [self._div_finding(job_id, job, end, False, med, run_min)]
        if div is not None:
            # Still above the tolerance (rising or on a plateau): the run has not recovered.
            return [self._div_finding(job_id, job, end, True, med, run_min)]
        return []

    def _div_finding(
        self, job_id: str, job: dict[str, Any], ts: int, active: bool, med: float, run_min: float
    ) -> Finding:
        div = job["div"] or {"since": ts}
        summary = (
            f"loss of job {job_id} is rising: window median {med:.4g} is {100 * (med / run_min - 1):.1f}% above "
            f"its running minimum {run_min:.4g}"
            if active
            else f"loss of job {job_id} is back near its running minimum ({med:.4g} vs {run_min:.4g})"
        )
        return Finding(
            rule="loss_divergence",
            key=(job_id,),
            active=active,
            ts=ts,
            category="model",
            severity="critical",
            job_id=job_id,
            since=int(div["since"]),
            invariant=(
                f"the median loss of a {self._window_ms // 1000}s window stays within {100 * self._tol:g}% "
                "of its running minimum"
            ),
            observed=med,
            expected=run_min,
            summary=summary,
            suspected_layer="model",
            history_metric="loss_window_median",
            history=tuple((int(t), float(m)) for t, m in job["medians"][-_HISTORY:]),
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
    del points[:-_HISTORY]
