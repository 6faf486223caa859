"""Rule `long_pending`: a job waits in the queue too long without running.

Category `platform`, warning, one identity per job. A job in state `pending` (JobStateChanged) for
more than `pending_max_s` without running fires; re-reported at most every `reemit_s`; resolves
when the job leaves `pending` (another state, or a JobStarted). Checked on `advance(watermark)`,
in event time.
"""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued
from streams.detectors.history import add_point

__all__ = ["DEFAULTS", "LongPendingDetector"]

DEFAULTS: dict[str, Any] = {
    "pending_max_s": 600.0,  # pending longer than this without running is an alert
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
}


LONG_PENDING = catalogued("long_pending")


class LongPendingDetector(PerJobDetector, rule=LONG_PENDING, stage="job", section="platform"):
    """Jobs pending for too long, per job."""

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._pending_max = int(float(p["pending_max_s"]) * 1000)
        self._reemit = int(float(p["reemit_s"]) * 1000)

    def new_job_state(self) -> dict[str, Any]:
        """When the job became pending (None: it is not) and the open condition."""
        return {"pending": None, "pending_since": None}

    def observe(self, event: Event) -> list[Finding]:
        """A JobStateChanged to `pending` starts the wait; any other state or a JobStarted ends it."""
        if event.type not in ("JobStarted", "JobStateChanged"):
            return []
        r = event.record
        job = self._job(r["job_id"])
        if event.type == "JobStateChanged" and r["state"] == "pending":
            if job["pending_since"] is None:
                job["pending_since"] = r["ts"]
            return []
        cond = job["pending"]
        job["pending_since"] = None
        if cond is None:
            return []
        job["pending"] = None
        return [self._finding(r["job_id"], cond, r["ts"], False)]

    def advance(self, watermark: int) -> list[Finding]:
        """Fire for jobs pending too long; drop the state of ended jobs."""
        out: list[Finding] = []
        for job_id in sorted(self._jobs):
            job = self._jobs[job_id]
            since = job["pending_since"]
            if since is None:
                info = self.topology.jobs.get(job_id)
                if info is None or info.state in ("completed", "failed"):
                    del self._jobs[job_id]
                continue
            if watermark - since > self._pending_max:
                cond = job["pending"]
                if cond is None:
                    cond = job["pending"] = {"since": since, "emit": watermark}
                elif watermark - cond["emit"] < self._reemit:
                    continue
                cond["emit"] = watermark
                out.append(self._finding(job_id, cond, watermark, True))
        return out

    def _finding(self, job_id: str, cond: dict[str, Any], ts: int, active: bool) -> Finding:
        waited = (ts - cond["since"]) / 1000
        history = add_point(cond, ts, waited)
        summary = (
            f"job {job_id} has been pending for {waited / 60:.0f} min without running"
            if active
            else f"job {job_id} left pending after {waited / 60:.0f} min"
        )
        return LONG_PENDING.for_job(
            job_id,
            active,
            ts,
            since=int(cond["since"]) + self._pending_max,
            invariant=LONG_PENDING.says(pending_min=self._pending_max // 60000),
            observed=waited,
            expected=self._pending_max / 1000,
            summary=summary,
            history_metric="pending_s",
            history=history,
            sustain_ms=0,
        )
