"""Rule `restore_test_failed`: a restore test of a job's checkpoint failed.

Category `platform`, critical, one identity per job. "Checkpoint started" is not a recovery point,
and neither is "verified" alone: teams restore a checkpoint in a controlled environment and resume
a few steps (a RestoreTest record). A RestoreTest with `passed` false fires at once for the owning
team, saying what failed (the error, the parts not restored, no step resumed); further failures
update it; the job's next passing test resolves it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding
from streams.detectors.catalogue import catalogued
from streams.detectors.failures import FailuresInARow

__all__ = ["DEFAULTS", "RestoreTestFailedDetector"]

DEFAULTS: dict[str, Any] = {}  # no knobs: a failed restore test counts at once


def _what_failed(r: dict[str, Any]) -> str:
    missing = [
        name
        for name, field in (
            ("model", "restored_model"),
            ("optimizer", "restored_optimizer"),
            ("scheduler", "restored_scheduler"),
            ("data position", "restored_data_position"),
        )
        if not r.get(field)
    ]
    parts = []
    if r.get("error"):
        parts.append(str(r["error"]))
    if missing:
        parts.append("not restored: " + ", ".join(missing))
    if not r.get("steps_resumed"):
        parts.append("no step resumed")
    return "; ".join(parts) or "reported as failed"


RESTORE_TEST_FAILED = catalogued("restore_test_failed")


class RestoreTestFailedDetector(FailuresInARow, rule=RESTORE_TEST_FAILED, stage="job", section="readiness"):
    """Failed restore tests per job, until one passes."""

    history_metric: ClassVar[str] = "failed_restore_tests"

    def observe(self, event: Event) -> list[Finding]:
        """A failed RestoreTest fires (or updates); a passing one resolves."""
        if event.type != "RestoreTest":
            return []
        r = event.record
        job_id, ts = r["job_id"], r["ts"]
        job = self._job(job_id)
        failed = job["failed"]
        if not r["passed"]:
            n = failed["n"] + 1 if failed else 1
            job["failed"] = {
                "since": failed["since"] if failed else ts,
                "n": n,
                "cid": r["checkpoint_id"],
                "step": r.get("step"),
                "why": _what_failed(r),
            }
            return [self._finding(job_id, job["failed"], ts, True)]
        return self._succeeded(job_id, job, ts, r["checkpoint_id"])

    def summary(self, job_id: str, failed: dict[str, Any], active: bool, resolved_by: str) -> str:
        """The checkpoint whose restore test failed and what failed; or the one that passed."""
        step = f" (step {failed['step']})" if failed.get("step") is not None else ""
        return (
            f"restore test of checkpoint {failed['cid']}{step} of job {job_id} failed: {failed['why']}"
            + (f" ({failed['n']} failed tests in a row)" if failed["n"] > 1 else "")
            if active
            else f"checkpoint {resolved_by} of job {job_id} passed a restore test"
        )
