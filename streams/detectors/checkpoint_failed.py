"""Rule `checkpoint_failed`: a checkpoint of a job failed.

Category `platform`, critical, one identity per job. A CheckpointEvent with phase `failed` fires
at once (further failures update it: how many in a row, the latest error); the next `completed`
or `verified` checkpoint of the job resolves it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding
from streams.detectors.catalogue import catalogued
from streams.detectors.failures import FailuresInARow

__all__ = ["DEFAULTS", "CheckpointFailedDetector"]

DEFAULTS: dict[str, Any] = {}  # no knobs: every failure counts at once


CHECKPOINT_FAILED = catalogued("checkpoint_failed")


class CheckpointFailedDetector(FailuresInARow, rule=CHECKPOINT_FAILED, stage="job", section="recovery"):
    """Failed checkpoints per job, until one completes."""

    history_metric: ClassVar[str] = "failed_checkpoints"

    def observe(self, event: Event) -> list[Finding]:
        """A `failed` checkpoint fires; a `completed` or `verified` one resolves."""
        if event.type != "CheckpointEvent":
            return []
        r = event.record
        job_id, cid, phase, ts = r["job_id"], r["checkpoint_id"], r["phase"], r["ts"]
        job = self._job(job_id)
        if phase == "failed":
            if job["failed"] is None:
                job["failed"] = {
                    "since": ts,
                    "cid": cid,
                    "step": r["step"],
                    "error": r.get("error") or "",
                    "n": 0,
                }
            failed = job["failed"]
            failed["n"] += 1
            failed["cid"], failed["error"] = cid, r.get("error") or failed["error"]
            return [self._finding(job_id, failed, ts, True)]
        if phase in ("completed", "verified"):
            return self._succeeded(job_id, job, ts, cid)
        return []

    def summary(self, job_id: str, failed: dict[str, Any], active: bool, resolved_by: str) -> str:
        """The checkpoint that failed, its error and how many in a row; or the one that completed."""
        return (
            f"checkpoint {failed['cid']} of job {job_id} failed"
            + (f": {failed['error']}" if failed["error"] else "")
            + (f" ({failed['n']} failures in a row)" if failed["n"] > 1 else "")
            if active
            else f"checkpoint {resolved_by} of job {job_id} completed after {failed['n']} failed one(s)"
        )
