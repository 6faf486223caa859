"""Rule `nonfinite_loss`: a job's training loss is NaN or infinite.

Category `model`, critical, one identity per job, judged on the leader rank's steps (rank stage). Fires
at once on a StepCompleted whose `loss` is NaN or infinite; resolves when finite losses have
resumed for `nonfinite_resolve_steps` steps past the last non-finite one. Steps without a loss are
not judged. See `nonfinite.py` for the condition.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding
from streams.detectors.catalogue import catalogued
from streams.detectors.nonfinite import NONFINITE_DEFAULTS, NonfiniteDetector

__all__ = ["DEFAULTS", "NonfiniteLossDetector"]

DEFAULTS: dict[str, Any] = {**NONFINITE_DEFAULTS}


NONFINITE_LOSS = catalogued("nonfinite_loss")


class NonfiniteLossDetector(NonfiniteDetector, rule=NONFINITE_LOSS, stage="rank", section="numerical"):
    """A non-finite loss, per job."""

    what: ClassVar[str] = "loss"
    history_metric: ClassVar[str] = "nonfinite_loss_steps"

    def observe(self, event: Event) -> list[Finding]:
        """Check the loss of a StepCompleted."""
        r = self.leader_step(event)
        if r is None:
            return []
        job = self._job(r["job_id"])
        loss = r.get("loss")
        return self.check(job, r, loss) if loss is not None else []
