"""Rule `nonfinite_grad`: a job's gradient norm is NaN or infinite.

Category `model`, critical, one identity per job, judged on the leader rank's steps (rank stage). Fires
at once on a StepCompleted whose `grad_norm` is NaN or infinite; resolves when finite norms have
resumed for `nonfinite_resolve_steps` steps past the last non-finite one. A non-finite norm on a
step the optimizer *skipped* (loss-scale overflow under dynamic loss scaling) is normal once in a
while, so it counts only after `skipped_overflow_steps` such steps in a row. See `nonfinite.py`
for the condition.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, Topology
from streams.detectors.catalogue import catalogued
from streams.detectors.nonfinite import NONFINITE_DEFAULTS, NonfiniteDetector, is_finite

__all__ = ["DEFAULTS", "NonfiniteGradDetector"]

DEFAULTS: dict[str, Any] = {
    **NONFINITE_DEFAULTS,
    "skipped_overflow_steps": 3,  # skipped steps with a non-finite grad norm in a row before it counts
}


NONFINITE_GRAD = catalogued("nonfinite_grad")


class NonfiniteGradDetector(NonfiniteDetector, rule=NONFINITE_GRAD, stage="rank", section="numerical"):
    """A non-finite gradient norm, per job; overflow-skipped steps count only in a run."""

    what: ClassVar[str] = "gradient norm"
    history_metric: ClassVar[str] = "nonfinite_grad_steps"

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        self._skip_steps = int({**DEFAULTS, **self.params}["skipped_overflow_steps"])

    def new_job_state(self) -> dict[str, Any]:
        """The open condition and the run of overflow-skipped steps."""
        return {**super().new_job_state(), "skip_run": 0, "skip_last_step": -1}

    def observe(self, event: Event) -> list[Finding]:
        """Check the gradient norm of a StepCompleted."""
        r = self.leader_step(event)
        if r is None:
            return []
        job = self._job(r["job_id"])
        grad = r.get("grad_norm")
        counts = grad is not None
        if grad is not None and not math.isfinite(grad) and bool(r.get("skipped")):
            if r["step"] > job["skip_last_step"]:
                job["skip_run"] += 1
                job["skip_last_step"] = r["step"]
            counts = job["skip_run"] >= self._skip_steps
        elif is_finite(grad):
            job["skip_run"] = 0
        return self.check(job, r, grad) if counts else []
