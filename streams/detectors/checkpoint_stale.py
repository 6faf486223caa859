"""Rule `checkpoint_stale`: a running job has no recent verified checkpoint.

Category `platform`, warning, one identity per job. While the job runs, the latest `verified`
checkpoint (or the job start, when none is verified yet) is older than the job's
`checkpoint_max_age_s` policy (JobStarted); jobs without a policy are skipped. Re-reported at
most every `reemit_s`; resolves when a newer checkpoint is verified or the job stops running.
Checked on `advance(watermark)`, in event time.
"""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, JobInfo, PerJobDetector, Topology
from streams.detectors.catalogue import catalogued
from streams.detectors.durations import age_text
from streams.detectors.history import add_point

__all__ = ["DEFAULTS", "CheckpointStaleDetector"]

DEFAULTS: dict[str, Any] = {
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
}


CHECKPOINT_STALE = catalogued("checkpoint_stale")


class CheckpointStaleDetector(PerJobDetector, rule=CHECKPOINT_STALE, stage="job", section="recovery"):
    """The age of each running job's latest verified checkpoint against its policy."""

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        self._reemit_ms = int(float({**DEFAULTS, **self.params}["reemit_s"]) * 1000)

    def new_job_state(self) -> dict[str, Any]:
        """The latest verified checkpoint (time, step) and the open condition."""
        return {"verified": None, "verified_step": None, "stale": None}

    def observe(self, event: Event) -> list[Finding]:
        """Note the time of the job's latest `verified` checkpoint."""
        if event.type != "CheckpointEvent":
            return []
        r = event.record
        job = self._job(r["job_id"])
        if r["phase"] == "verified" and (job["verified"] is None or r["ts"] >= job["verified"]):
            job["verified"], job["verified_step"] = r["ts"], r["step"]
        return []

    def advance(self, watermark: int) -> list[Finding]:
        """Check the age of each running job's latest verified checkpoint."""
        out: list[Finding] = []
        for job_id in sorted(set(self._jobs) | set(self.topology.jobs)):
            info = self.topology.jobs.get(job_id)
            job = self._jobs.get(job_id)
            if (
                info is not None
                and info.checkpoint_max_age_s
                and (job is not None or info.state == "running")
            ):
                # Ended jobs were forgotten: only running ones get (new) state here.
                out += self._check(job_id, self._job(job_id), info, watermark)
            elif job is not None and job["stale"] is not None:
                out.append(self._finding(job_id, job, info, watermark, False))
                job["stale"] = None
        return out

    def _check(self, job_id: str, job: dict[str, Any], info: JobInfo, wm: int) -> list[Finding]:
        max_ms = float(info.checkpoint_max_age_s or 0) * 1000
        ref = job["verified"] if job["verified"] is not None else info.started_ts
        stale = info.state == "running" and wm - ref > max_ms
        cond = job["stale"]
        if stale:
            if cond is None:
                job["stale"] = {"since": int(ref + max_ms), "ref": ref, "emit": wm}
                return [self._finding(job_id, job, info, wm, True)]
            cond["ref"] = ref
            if wm - cond["emit"] >= self._reemit_ms:
                cond["emit"] = wm
                return [self._finding(job_id, job, info, wm, True)]
            return []
        if cond is not None:
            out = [self._finding(job_id, job, info, wm, False)]
            job["stale"] = None
            return out
        return []

    def _finding(
        self, job_id: str, job: dict[str, Any], info: JobInfo | None, ts: int, active: bool
    ) -> Finding:
        cond = job["stale"] or {"since": ts, "ref": ts}
        max_s = float(info.checkpoint_max_age_s or 0) if info else 0.0
        age = ts - cond["ref"]
        history = add_point(cond, ts, age / 1000)
        what = (
            f"the latest verified checkpoint (step {job['verified_step']})"
            if job["verified"] is not None
            else "no verified checkpoint since the job started; the job start"
        )
        summary = (
            f"{what} of job {job_id} is {age_text(age)} old, policy allows {max_s:g}s"
            if active
            else f"job {job_id} has a recent verified checkpoint again (or stopped running)"
        )
        return CHECKPOINT_STALE.for_job(
            job_id,
            active,
            ts,
            since=int(cond["since"]),
            invariant=CHECKPOINT_STALE.says(max_s=max_s),
            observed=age / 1000,
            expected=max_s,
            summary=summary,
            history_metric="verified_checkpoint_age_s",
            history=history,
            sustain_ms=0,
        )
