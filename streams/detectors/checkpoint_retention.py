"""Rule `checkpoint_retention`: retention would delete, or has deleted, the job's latest verified checkpoint.

Category `platform`, suspected layer `checkpoint`. Retention keeps the newest `retention_keep`
checkpoints (CheckpointEvent `retention_keep`) and reports what it removed (`deleted`). The latest
verified checkpoint is the job's recovery point; checkpoints completed after it are only recovery
points once they are verified too. A checkpoint's verification is *overdue* once a later
checkpoint has started while it is still unverified, or it failed verification.

- **At risk** (warning): at least `retention_keep - 1` checkpoints (and at least one) completed
  after the latest verified one, and one of them is overdue: the next completion deletes the
  recovery point while nothing newer is verified.
- **Deleted** (critical): retention deleted the latest verified checkpoint and a checkpoint newer
  than it is overdue: no verified checkpoint exists any more.

Evaluated on every checkpoint event; resolves when a newer checkpoint is verified. Jobs whose
checkpoints carry no retention policy are judged only on what was deleted. A tight policy whose
checkpoints are verified before the next one starts (`retention_keep: 1`) raises nothing: the
window between a completion and its verification is the policy's own.
"""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued

__all__ = ["CheckpointRetentionDetector"]

_KEEP = 64  # checkpoints remembered per job (bounded state)


CHECKPOINT_RETENTION = catalogued("checkpoint_retention")


class CheckpointRetentionDetector(PerJobDetector, rule=CHECKPOINT_RETENTION, stage="job"):
    """Whether retention leaves the job a verified checkpoint."""

    def new_job_state(self) -> dict[str, Any]:
        """Checkpoints by id in completion order, the latest verified one, the policy, the condition."""
        return {"ckpts": {}, "order": [], "verified": None, "keep": None, "cond": None, "points": []}

    def observe(self, event: Event) -> list[Finding]:
        """Track completions, verifications, deletions and later starts; re-judge the job."""
        if event.type != "CheckpointEvent":
            return []
        r = event.record
        job = self._job(r["job_id"])
        cid, phase, ts = r["checkpoint_id"], r["phase"], r["ts"]
        ckpts: dict[str, dict[str, Any]] = job["ckpts"]
        if r.get("retention_keep") is not None:
            job["keep"] = int(r["retention_keep"])
        for gone in r.get("deleted") or ():
            if gone in ckpts:
                ckpts[gone]["deleted"] = ts
            elif gone == (job["verified"] or {}).get("cid"):
                job["verified"]["deleted"] = ts
        if phase == "started":
            for c in ckpts.values():
                if c["state"] == "completed" and c["cid"] != cid:
                    c["overdue"] = True  # a later checkpoint started before it was verified
        elif phase == "completed" and cid not in ckpts:
            ckpts[cid] = {"cid": cid, "step": r["step"], "ts": ts, "state": "completed", "overdue": False}
            job["order"].append(cid)
        elif phase == "verify_failed" and cid in ckpts:
            ckpts[cid]["state"] = "verify_failed"
            ckpts[cid]["overdue"] = True
        elif phase == "verified":
            entry = ckpts.get(cid) or {"cid": cid, "step": r["step"], "ts": ts}
            latest = job["verified"]
            if latest is None or r["step"] >= latest["step"]:
                job["verified"] = {"cid": cid, "step": r["step"], "ts": ts, "deleted": entry.get("deleted")}
                # Everything up to the verified checkpoint is history now.
                job["order"] = [c for c in job["order"] if ckpts[c]["step"] > r["step"]]
                job["ckpts"] = ckpts = {c: ckpts[c] for c in job["order"]}
        if len(job["order"]) > _KEEP:
            for old in job["order"][:-_KEEP]:
                ckpts.pop(old, None)
            del job["order"][:-_KEEP]
        return self._judge(r["job_id"], job, ts)

    def _judge(self, job_id: str, job: dict[str, Any], ts: int) -> list[Finding]:
        latest = job["verified"]
        cond = job["cond"]
        verdict: str | None = None
        newer: list[dict[str, Any]] = []
        if latest is not None:
            newer = [job["ckpts"][c] for c in job["order"] if job["ckpts"][c].get("deleted") is None]
            overdue = any(c["overdue"] for c in newer)
            keep = job["keep"]
            if latest.get("deleted") is not None and overdue:
                verdict = "deleted"
            elif keep is not None and len(newer) >= max(1, keep - 1) and overdue:
                verdict = "at_risk"
        if verdict is None:
            if cond is None:
                return []
            job["cond"] = None
            return [self._finding(job_id, job, cond, ts, newer, active=False)]
        if cond is not None and cond["verdict"] == verdict and cond["newer"] == len(newer):
            return []
        if cond is None:
            cond = job["cond"] = {"since": ts}
        cond.update(verdict=verdict, newer=len(newer))
        points: list[list[Any]] = job["points"]
        points.append([ts, float(len(newer))])
        del points[:-10]
        return [self._finding(job_id, job, cond, ts, newer, active=True)]

    def _finding(
        self,
        job_id: str,
        job: dict[str, Any],
        cond: dict[str, Any],
        ts: int,
        newer: list[dict[str, Any]],
        *,
        active: bool,
    ) -> Finding:
        latest = job["verified"] or {"cid": "?", "step": -1}
        keep = job["keep"]
        pending = ", ".join(f"{c['cid']} (step {c['step']})" for c in newer[:4]) or "none"
        deleted = cond.get("verdict") == "deleted"
        if not active:
            summary = f"job {job_id} has a verified checkpoint that retention keeps again ({latest['cid']})"
        elif deleted:
            summary = (
                f"retention deleted the latest verified checkpoint of job {job_id} ({latest['cid']}, step "
                f"{latest['step']}) and no newer one is verified (unverified: {pending}): no recovery point"
            )
        else:
            summary = (
                f"retention keeps {keep} checkpoint(s) of job {job_id}: the next one to complete deletes its "
                f"latest verified checkpoint ({latest['cid']}, step {latest['step']}) while the newer ones are "
                f"not verified ({pending})"
            )
        return CHECKPOINT_RETENTION.finding(
            key=(job_id,),
            active=active,
            ts=ts,
            severity="critical" if deleted else "warning",
            job_id=job_id,
            since=cond["since"],
            observed=float(len(newer)),
            expected=float(max(0, (keep or 1) - 1)),
            summary=summary,
            history_metric="unverified_newer_checkpoints",
            history=tuple((int(t), float(v)) for t, v in job["points"]),
            sustain_ms=0,
        )
