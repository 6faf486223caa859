"""Rule `validation_nonfinite`: an evaluation reported a NaN or infinite metric.

Category `model`, warning, one identity per job and metric. A ValidationResult whose metric is
NaN or infinite opens the condition for that metric (the validation rules skip such a value, so
without this rule a broken evaluation would be silent); the next ValidationResult that carries a
finite value for it resolves it. Event time only.
"""

from __future__ import annotations

import math
from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued

__all__ = ["DEFAULTS", "ValidationNonfiniteDetector"]

DEFAULTS: dict[str, Any] = {}
VALIDATION_NONFINITE = catalogued("validation_nonfinite")
_MAX_OPEN = 64  # metrics held open per job (a record cannot make the state grow without bound)


class ValidationNonfiniteDetector(PerJobDetector, rule=VALIDATION_NONFINITE, stage="job"):
    """Non-finite validation metrics, per job and metric."""

    def new_job_state(self) -> dict[str, Any]:
        """Metric -> event time it turned non-finite."""
        return {"open": {}}

    def observe(self, event: Event) -> list[Finding]:
        """Check every metric of a ValidationResult."""
        if event.type != "ValidationResult":
            return []
        r = event.record
        metrics = r.get("metrics") or {}
        job = self._job(r["job_id"])
        opened: dict[str, int] = job["open"]
        out: list[Finding] = []
        for name in sorted(metrics):
            value = metrics[name]
            if not isinstance(value, int | float):
                continue
            finite = math.isfinite(value)
            if not finite and name not in opened and len(opened) < _MAX_OPEN:
                opened[name] = int(r["ts"])
                out.append(self._finding(r, name, float(value), True, opened[name]))
            elif finite and name in opened:
                out.append(self._finding(r, name, float(value), False, opened.pop(name)))
        return out

    @staticmethod
    def _finding(r: dict[str, Any], metric: str, value: float, active: bool, since: int) -> Finding:
        job_id = r["job_id"]
        summary = (
            f"evaluation of job {job_id} at step {r['step']} reported {metric} = {value}"
            if active
            else f"evaluation of job {job_id} at step {r['step']} reported a finite {metric} again ({value:.6g})"
        )
        return VALIDATION_NONFINITE.finding(
            (job_id, metric),
            active,
            int(r["ts"]),
            job_id=job_id,
            since=since,
            invariant=VALIDATION_NONFINITE.says(metric=metric),
            observed=value if math.isfinite(value) else None,
            summary=summary,
            sustain_ms=0,
        )
