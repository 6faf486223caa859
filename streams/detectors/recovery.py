"""Recovery invariants: checkpoints succeed, finish in time, and a recent verified one exists.

Rules (category `platform`, identity per job; `checkpoint_stuck` per job and checkpoint id):

- `checkpoint_failed`: a CheckpointEvent with phase `failed`; resolves with the next `completed`
  (or `verified`) checkpoint of the job.
- `checkpoint_stuck`: a checkpoint `started` and neither completed nor failed within the job's
  `checkpoint_timeout_s` (JobStarted policy; `checkpoint_timeout_s` param when the job has none);
  resolves when it completes or fails.
- `checkpoint_stale`: the latest `verified` checkpoint (or the job start, when none is verified
  yet) is older than the job's `checkpoint_max_age_s` policy while the job runs; jobs without a
  policy are skipped. Resolves when a newer checkpoint is verified or the job stops running.

Timeouts are checked on `advance(watermark)` in event time.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, JobInfo, PerJobDetector, Topology
from streams.detectors.history import add_point
from streams.detectors.placement import rank_place

__all__ = ["DEFAULTS", "RecoveryDetector"]

DEFAULTS: dict[str, Any] = {
    "checkpoint_timeout_s": 1800.0,  # a checkpoint must finish within this when the job spec sets none
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
}


def _age(ms: int) -> str:
    s = ms // 1000
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class RecoveryDetector(PerJobDetector):
    """Failed, stuck and stale checkpoints per job."""

    rules: ClassVar[tuple[str, ...]] = ("checkpoint_failed", "checkpoint_stuck", "checkpoint_stale")

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**DEFAULTS, **self.params}
        self._timeout_s = float(p["checkpoint_timeout_s"])
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)

    def new_job_state(self) -> dict[str, Any]:
        """The state of a job seen for the first time."""
        return {
            "open": {},
            "verified": None,
            "verified_step": None,
            "failed": None,
            "stuck": {},
            "stale": None,
        }

    def observe(self, event: Event) -> list[Finding]:
        """Track checkpoint phases; a failure fires at once, a completion resolves."""
        if event.type != "CheckpointEvent":
            return []
        r = event.record
        job_id, cid, phase, ts = r["job_id"], r["checkpoint_id"], r["phase"], r["ts"]
        job = self._job(job_id)
        out: list[Finding] = []
        if phase == "started":
            # Rank-level events repeat the phase per rank: the first start counts.
            job["open"].setdefault(cid, {"ts": ts, "step": r["step"], "rank": r.get("rank")})
            return out
        if phase not in ("completed", "failed", "verified"):
            return out
        job["open"].pop(cid, None)
        stuck = job["stuck"].pop(cid, None)
        if stuck is not None:
            out.append(self._stuck_finding(job_id, cid, stuck, ts, False, f"checkpoint {cid} {phase}"))
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
            out.append(self._failed_finding(job_id, failed, ts, True))
            return out
        if job["failed"] is not None:
            failed, job["failed"] = job["failed"], None
            out.append(self._failed_finding(job_id, failed, ts, False, resolved_by=cid))
        if phase == "verified" and (job["verified"] is None or ts >= job["verified"]):
            job["verified"], job["verified_step"] = ts, r["step"]
        return out

    def advance(self, watermark: int) -> list[Finding]:
        """Check open checkpoints against their timeout and the verified checkpoint's age."""
        out: list[Finding] = []
        for job_id in sorted(set(self._jobs) | set(self.topology.jobs)):
            info = self.topology.jobs.get(job_id)
            job = self._jobs.get(job_id)
            if job is not None:
                out += self._check_stuck(job_id, job, info, watermark)
            if (
                info is not None
                and info.checkpoint_max_age_s
                and (job is not None or info.state == "running")
            ):
                # Ended jobs were forgotten: only running ones get (new) state here.
                out += self._check_stale(job_id, self._job(job_id), info, watermark)
            elif job is not None and job["stale"] is not None:
                out.append(self._stale_finding(job_id, job, info, watermark, False))
                job["stale"] = None
        return out

    def _check_stuck(self, job_id: str, job: dict[str, Any], info: JobInfo | None, wm: int) -> list[Finding]:
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
            out.append(self._stuck_finding(job_id, cid, stuck, wm, True, ""))
        return out

    def _check_stale(self, job_id: str, job: dict[str, Any], info: JobInfo, wm: int) -> list[Finding]:
        max_ms = float(info.checkpoint_max_age_s or 0) * 1000
        ref = job["verified"] if job["verified"] is not None else info.started_ts
        stale = info.state == "running" and wm - ref > max_ms
        cond = job["stale"]
        if stale:
            if cond is None:
                job["stale"] = {"since": int(ref + max_ms), "ref": ref, "emit": wm}
                return [self._stale_finding(job_id, job, info, wm, True)]
            cond["ref"] = ref
            if wm - cond["emit"] >= self._reemit_ms:
                cond["emit"] = wm
                return [self._stale_finding(job_id, job, info, wm, True)]
            return []
        if cond is not None:
            out = [self._stale_finding(job_id, job, info, wm, False)]
            job["stale"] = None
            return out
        return []

    def _failed_finding(
        self, job_id: str, failed: dict[str, Any], ts: int, active: bool, resolved_by: str = ""
    ) -> Finding:
        history = add_point(failed, ts, failed["n"] if active else 0)
        summary = (
            f"checkpoint {failed['cid']} of job {job_id} failed"
            + (f": {failed['error']}" if failed["error"] else "")
            + (f" ({failed['n']} failures in a row)" if failed["n"] > 1 else "")
            if active
            else f"checkpoint {resolved_by} of job {job_id} completed after {failed['n']} failed one(s)"
        )
        return Finding(
            rule="checkpoint_failed",
            key=(job_id,),
            active=active,
            ts=ts,
            category="platform",
            severity="critical",
            job_id=job_id,
            since=failed["since"],
            invariant="every checkpoint that starts completes",
            observed=float(failed["n"]),
            expected=0.0,
            summary=summary,
            suspected_layer="checkpoint",
            history_metric="failed_checkpoints",
            history=history,
            sustain_ms=0,
        )

    def _stuck_finding(
        self, job_id: str, cid: str, stuck: dict[str, Any], ts: int, active: bool, how: str
    ) -> Finding:
        age = ts - stuck["ts"]
        history = add_point(stuck, ts, age / 1000)
        place = rank_place(self.topology, job_id, stuck.get("rank"))
        summary = (
            f"checkpoint {cid} of job {job_id} (step {stuck['step']}) started {_age(age)} ago and has not "
            f"completed (timeout {stuck['timeout_s']:g}s)"
            if active
            else f"{how} for job {job_id} after {_age(age)}"
        )
        return Finding(
            rule="checkpoint_stuck",
            key=(job_id, cid),
            active=active,
            ts=ts,
            category="platform",
            severity="warning",
            job_id=job_id,
            node=place.node,
            rank=stuck.get("rank"),
            gpu_uuid=place.gpu_uuid,
            gpu_index=place.gpu_index,
            since=int(stuck["ts"] + stuck["timeout_s"] * 1000),
            invariant=f"a checkpoint completes within {stuck['timeout_s']:g}s of its start",
            observed=age / 1000,
            expected=float(stuck["timeout_s"]),
            summary=summary,
            suspected_layer="checkpoint",
            history_metric="checkpoint_age_s",
            history=history,
            sustain_ms=0,
        )

    def _stale_finding(
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
            f"{what} of job {job_id} is {_age(age)} old, policy allows {max_s:g}s"
            if active
            else f"job {job_id} has a recent verified checkpoint again (or stopped running)"
        )
        return Finding(
            rule="checkpoint_stale",
            key=(job_id,),
            active=active,
            ts=ts,
            category="platform",
            severity="warning",
            job_id=job_id,
            since=int(cond["since"]),
            invariant=f"the latest verified checkpoint is younger than {max_s:g}s",
            observed=age / 1000,
            expected=max_s,
            summary=summary,
            suspected_layer="checkpoint",
            history_metric="verified_checkpoint_age_s",
            history=history,
            sustain_ms=0,
        )
