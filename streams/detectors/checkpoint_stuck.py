"""Rule `checkpoint_stuck`: a checkpoint started and neither completed nor failed in time.

Category `platform`, warning, one identity per job and checkpoint id (the rank that started it is
named). A checkpoint `started` (the first start of its id counts: rank-level events repeat the
phase per rank) and not `completed`, `failed` or `verified` within the job's
`checkpoint_timeout_s` (JobStarted policy; the `checkpoint_timeout_s` knob when the job has none)
fires; it is re-reported at most every `reemit_s` and resolves when the checkpoint ends. Timeouts
are checked on `advance(watermark)`, in event time.
"""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, JobInfo, PerJobDetector
from streams.detectors.catalogue import catalogued
from streams.detectors.durations import age_text
from streams.detectors.history import add_point
from streams.detectors.placement import rank_place

__all__ = ["DEFAULTS", "CheckpointStuckDetector"]

DEFAULTS: dict[str, Any] = {
    "checkpoint_timeout_s": 1800.0,  # a checkpoint must finish within this when the job spec sets none
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
}


CHECKPOINT_STUCK = catalogued("checkpoint_stuck")


class CheckpointStuckDetector(PerJobDetector, rule=CHECKPOINT_STUCK, stage="job", section="recovery"):
    """Checkpoints open past their timeout, per job and checkpoint."""

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._timeout_s = float(p["checkpoint_timeout_s"])
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)

    def new_job_state(self) -> dict[str, Any]:
        """Open checkpoints (id -> start) and the stuck ones (id -> condition)."""
        return {"open": {}, "stuck": {}}

    def observe(self, event: Event) -> list[Finding]:
        """Note a start; an end (`completed`, `failed`, `verified`) closes it and resolves a stuck one."""
        if event.type != "CheckpointEvent":
            return []
        r = event.record
        job_id, cid, phase, ts = r["job_id"], r["checkpoint_id"], r["phase"], r["ts"]
        job = self._job(job_id)
        if phase == "started":
            # Rank-level events repeat the phase per rank: the first start counts.
            job["open"].setdefault(cid, {"ts": ts, "step": r["step"], "rank": r.get("rank")})
            return []
        if phase not in ("completed", "failed", "verified"):
            return []
        job["open"].pop(cid, None)
        stuck = job["stuck"].pop(cid, None)
        if stuck is None:
            return []
        return [self._finding(job_id, cid, stuck, ts, False, f"checkpoint {cid} {phase}")]

    def advance(self, watermark: int) -> list[Finding]:
        """Check open checkpoints against their timeout."""
        out: list[Finding] = []
        for job_id in sorted(self._jobs):
            out += self._check(job_id, self._jobs[job_id], self.topology.jobs.get(job_id), watermark)
        return out

    def _check(self, job_id: str, job: dict[str, Any], info: JobInfo | None, wm: int) -> list[Finding]:
        timeout_s = (info.checkpoint_timeout_s if info else None) or self._timeout_s
        out: list[Finding] = []
        for cid in sorted(job["open"]):
            opened = job["open"][cid]
            if wm - opened["ts"] <= timeout_s * 1000:
                continue
            stuck = job["stuck"].get(cid)
            if stuck is None:
                stuck = job["stuck"][cid] = {**opened, "timeout_s": timeout_s, "emit": wm}
            elif wm - stuck["emit"] < self._reemit_ms:
                continue
            stuck["emit"] = wm
            out.append(self._finding(job_id, cid, stuck, wm, True, ""))
        return out

    def _finding(
        self, job_id: str, cid: str, stuck: dict[str, Any], ts: int, active: bool, how: str
    ) -> Finding:
        age = ts - stuck["ts"]
        history = add_point(stuck, ts, age / 1000)
        place = rank_place(self.topology, job_id, stuck.get("rank"))
        summary = (
            f"checkpoint {cid} of job {job_id} (step {stuck['step']}) started {age_text(age)} ago and has not "
            f"completed (timeout {stuck['timeout_s']:g}s)"
            if active
            else f"{how} for job {job_id} after {age_text(age)}"
        )
        return CHECKPOINT_STUCK.finding(
            key=(job_id, cid),
            active=active,
            ts=ts,
            job_id=job_id,
            rank=stuck.get("rank"),
            place=place,
            since=int(stuck["ts"] + stuck["timeout_s"] * 1000),
            invariant=CHECKPOINT_STUCK.says(timeout_s=stuck["timeout_s"]),
            observed=age / 1000,
            expected=float(stuck["timeout_s"]),
            summary=summary,
            history_metric="checkpoint_age_s",
            history=history,
            sustain_ms=0,
        )
