"""Failures in a row: a job's failures of one kind fire at once, each next one updates the alert, and
the job's next success resolves it (`checkpoint_failed`, `restore_test_failed`).

Helper for the rules, not a rule: the state is the job's open failure (`failed`: since when, how
many in a row, what the rule keeps of the latest); the finding counts them against none, with the
count as its history.
"""

from __future__ import annotations

from typing import Any, ClassVar

from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.history import add_point

__all__ = ["FailuresInARow"]


class FailuresInARow(PerJobDetector):
    """A job's open failure of one kind, until it succeeds; a subclass says what failed (`summary`)."""

    history_metric: ClassVar[str]

    def new_job_state(self) -> dict[str, Any]:
        """The job's open failure (None while it succeeds)."""
        return {"failed": None}

    def summary(self, job_id: str, failed: dict[str, Any], active: bool, resolved_by: str) -> str:
        """What failed (or, resolved, what succeeded)."""
        raise NotImplementedError

    def _succeeded(self, job_id: str, job: dict[str, Any], ts: int, by: str) -> list[Finding]:
        """A success (`by`) resolves the job's open failure, if any."""
        failed, job["failed"] = job["failed"], None
        return [] if failed is None else [self._finding(job_id, failed, ts, False, by)]

    def _finding(
        self, job_id: str, failed: dict[str, Any], ts: int, active: bool, resolved_by: str = ""
    ) -> Finding:
        history = add_point(failed, ts, failed["n"] if active else 0)
        return self.declared.for_job(
            job_id,
            active,
            ts,
            since=failed["since"],
            observed=float(failed["n"]),
            expected=0.0,
            summary=self.summary(job_id, failed, active, resolved_by),
            history_metric=self.history_metric,
            history=history,
            sustain_ms=0,
        )
