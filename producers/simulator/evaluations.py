"""A job's evaluation pauses: when they run, their EvaluationEvents and ValidationResult, validation faults."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from producers.simulator.common import (
    _EVAL,
    _Effect,
    _end_of,
    _lognormal,
)

if TYPE_CHECKING:
    from producers.simulator.jobrun import JobRun


__all__ = ["evaluate", "evaluation_due"]


def evaluation_due(run: JobRun, t: float) -> bool:
    """Whether an evaluation runs after this step: every `every_steps`, unless a validation fault says otherwise."""
    every = run.job.evaluation.every_steps
    late_at = getattr(run, "_late_at", None)
    if late_at is not None and run.step >= late_at:
        run._late_at = None
        return True
    if run.step % every:
        return False
    for i, f in run.e._faults(run.job.id, "validation_missing", "validation_late"):
        if t < f.start or not t < _end_of(f):
            continue
        if f.type == "validation_missing":
            run.e.effects.setdefault(i, _Effect(t, f.end, {"skipped_from_step": run.step - 1}))
            return False
        if i not in run.e.effects:
            delay = max(1, int(every * (f.magnitude or 0.3)))
            run._late_at = run.step + delay
            run.e.effects[i] = _Effect(t, None, {"delayed_steps": delay})
            return False
    return True


def _validation_faults(run: JobRun, t: float, val: float) -> float:
    """The validation loss under validation_divergence (rises, compounding) and validation_noise."""
    for i, f in run.e._faults(run.job.id, "validation_divergence", "validation_noise"):
        if not f.start <= t < _end_of(f) or not math.isfinite(val):
            continue
        run.e.effects.setdefault(i, _Effect(f.start, f.end, {}))
        if f.type == "validation_divergence":
            val *= math.exp((f.magnitude or 0.1) * (t - f.start) / 60.0)
        else:
            rng = getattr(run, "_val_rng", None)
            if rng is None:
                rng = run._val_rng = run.e._rng(f"validation/{run.job.id}")
            val *= 1 + rng.gauss(0, f.magnitude or 0.005)
    return round(val, 5)


def evaluate(run: JobRun, t: float) -> float:
    job, e = run.job, run.e
    dur = job.evaluation.duration * _lognormal(run.rng, 0.05)
    for r in run.layout:
        e._spread(r.node, r.gpu_index, _EVAL, t, dur)
    loss, *_ = run._model(t, run.step)
    # An evaluation still running when the job's recording ends reports no end: its result
    # would come minutes after every other stream stopped (a co-located job looks stalled).
    finished = t + dur <= run.limit
    if e.sc.telemetry.evaluation_events:
        _evaluation_events(run, t, dur, finished)
    if not finished:
        return t + dur
    val = loss * 1.03 if math.isfinite(loss) else loss
    val = _validation_faults(run, t, val)
    e.emit(
        t + dur,
        "ValidationResult",
        job_id=job.id,
        run_id=run.run_id,
        step=run.step - 1,
        metrics={"val_loss": round(val, 5), "val_ppl": round(math.exp(min(val, 50.0)), 3)},
        duration_s=round(dur, 3),
    )
    return t + dur


def _evaluation_events(run: JobRun, t: float, dur: float, finished: bool = True) -> None:
    """EvaluationEvent started/completed around one evaluation pause (the SDK's evaluation context)."""
    common = {
        "job_id": run.job.id,
        "run_id": run.run_id,
        "rank": None,
        "evaluation_id": f"{run.run_id}-eval{run.step - 1:07d}",
        "step": run.step - 1,
        "name": "val",
    }
    # The producer expects the pass to take as long as the previous one (the configured length first).
    expected = run.last_eval_s if run.last_eval_s is not None else run.job.evaluation.duration
    run.e.emit(t, "EvaluationEvent", **common, phase="started", expected_duration_s=round(expected, 3))
    if finished:
        run.e.emit(t + dur - 0.001, "EvaluationEvent", **common, phase="completed", duration_s=round(dur, 3))
    run.last_eval_s = dur
