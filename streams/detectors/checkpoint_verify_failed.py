"""Rule `checkpoint_verify_failed`: reading a checkpoint back, or checking its checksum, failed.

Category `platform`, suspected layer `checkpoint`, critical. From CheckpointEvent phase
`verify_failed`: the checkpoint was written but is not a recovery point (corrupt, truncated,
checksum mismatch, unreadable). One alert per job at once, naming the checkpoint, its step and the
error; further failures update it. It resolves when a later checkpoint of the job is verified.
"""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued

__all__ = ["CheckpointVerifyFailedDetector"]

_POINTS = 10


CHECKPOINT_VERIFY_FAILED = catalogued("checkpoint_verify_failed")


class CheckpointVerifyFailedDetector(PerJobDetector, rule=CHECKPOINT_VERIFY_FAILED, stage="job"):
    """Failed checkpoint verifications, one alert per job."""

    def new_job_state(self) -> dict[str, Any]:
        """The open condition and the job's recent failures."""
        return {"cond": None, "points": []}

    def observe(self, event: Event) -> list[Finding]:
        """`verify_failed` opens (or updates) the condition; a later `verified` closes it."""
        if event.type != "CheckpointEvent":
            return []
        r = event.record
        phase = r["phase"]
        if phase == "verify_failed":
            job = self._job(r["job_id"])
            cond = job["cond"]
            if cond is None:
                cond = job["cond"] = {"since": r["ts"], "n": 0}
            cond["n"] += 1
            cond.update(
                cid=r["checkpoint_id"], step=r["step"], error=(r.get("error") or "")[:400], rank=r.get("rank")
            )
            points: list[list[Any]] = job["points"]
            points.append([r["ts"], float(cond["n"])])
            del points[:-_POINTS]
            return [self._finding(r["job_id"], job, r["ts"], active=True)]
        if phase == "verified":
            known = self._jobs.get(r["job_id"])
            if known is not None and known["cond"] is not None and r["step"] >= known["cond"]["step"]:
                out = [self._finding(r["job_id"], known, r["ts"], active=False, by=r["checkpoint_id"])]
                known["cond"] = None
                return out
        return []

    def _finding(self, job_id: str, job: dict[str, Any], ts: int, *, active: bool, by: str = "") -> Finding:
        cond = job["cond"]
        error = f": {cond['error']}" if cond["error"] else ""
        more = f" ({cond['n']} failed verifications)" if cond["n"] > 1 else ""
        summary = (
            f"checkpoint {cond['cid']} of job {job_id} (step {cond['step']}) failed verification{error}{more}: "
            "it is no recovery point"
            if active
            else f"checkpoint {by} of job {job_id} verified after failed verification(s)"
        )
        return CHECKPOINT_VERIFY_FAILED.for_job(
            job_id,
            active,
            ts,
            rank=cond.get("rank"),
            since=cond["since"],
            observed=float(cond["n"]),
            expected=0.0,
            summary=summary,
            history_metric="failed_verifications",
            history=tuple((int(t), float(v)) for t, v in job["points"]),
            sustain_ms=0,
        )
