"""Recovery readiness: checkpoints are proven restorable, recently, and a failed proof is loud.

"Checkpoint started" is not a recovery point, and neither is "verified" alone: teams restore a
checkpoint in a controlled environment and resume a few steps (a RestoreTest record). Rules
(category `platform`, identity per job):

- `restore_test_failed`: a RestoreTest with `passed` false (what failed is in the summary); it
  fires at once, critical, for the owning team, and resolves with the job's next passing test.
- `restore_test_stale`: while the job runs, the newest checkpoint that passed a restore test was
  written longer ago than the job's `restore_test_max_age_s` (JobStarted policy; the
  `restore_test_max_age_s` param when the job has none). Before any passing test the job's first
  start is the reference. Resolves when a newer checkpoint passes or the job stops running.

A checkpoint's age counts from its `completed` (or `verified`) CheckpointEvent; a restore test of
a checkpoint the detector never saw written counts from the test itself.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector, Topology
from streams.detectors.history import add_point

__all__ = ["DEFAULTS", "ReadinessDetector"]

DEFAULTS: dict[str, Any] = {
    "restore_test_max_age_s": 604800.0,  # a restore-tested checkpoint must be younger than this (7 days)
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
    "checkpoints_kept": 256,  # write times remembered per job (bounded state)
}


def _age(ms: int) -> str:
    s = ms // 1000
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


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


class ReadinessDetector(PerJobDetector):
    """Failed and stale restore tests per job."""

    rules: ClassVar[tuple[str, ...]] = ("restore_test_failed", "restore_test_stale")

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**DEFAULTS, **self.params}
        self._max_age_s = float(p["restore_test_max_age_s"])
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)
        self._kept = int(p["checkpoints_kept"])

    def new_job_state(self) -> dict[str, Any]:
        """The state of a job seen for the first time."""
        return {
            "policy_s": None,
            "started": None,
            "written": {},
            "passed": None,
            "failed": None,
            "stale": None,
        }

    def observe(self, event: Event) -> list[Finding]:
        """Note policies, checkpoint write times and restore tests; a failed test fires at once."""
        r = event.record
        if event.type == "JobStarted":
            job = self._job(r["job_id"])
            job["policy_s"] = r.get("restore_test_max_age_s")
            job["started"] = job["started"] if job["started"] is not None else r["ts"]
        elif event.type == "CheckpointEvent" and r["phase"] in ("completed", "verified"):
            seen = self._jobs.get(r["job_id"])
            if seen is not None and r["checkpoint_id"] not in seen["written"]:
                written = seen["written"]
                written[r["checkpoint_id"]] = r["ts"]
                if len(written) > self._kept:
                    del written[min(written, key=lambda c: (written[c], c))]
        elif event.type == "RestoreTest":
            return self._restore_test(r)
        return []

    def _restore_test(self, r: dict[str, Any]) -> list[Finding]:
        job_id, ts = r["job_id"], r["ts"]
        job = self._job(job_id)
        if not r["passed"]:
            failed = job["failed"]
            n = failed["n"] + 1 if failed else 1
            job["failed"] = {
                "since": failed["since"] if failed else ts,
                "n": n,
                "cid": r["checkpoint_id"],
                "step": r.get("step"),
                "why": _what_failed(r),
            }
            return [self._failed_finding(job_id, job["failed"], ts, True)]
        written = job["written"].get(r["checkpoint_id"], ts)
        passed = job["passed"]
        if passed is None or written >= passed["written"]:
            job["passed"] = {"cid": r["checkpoint_id"], "step": r.get("step"), "written": written, "ts": ts}
        out: list[Finding] = []
        if job["failed"] is not None:
            out.append(self._failed_finding(job_id, job["failed"], ts, False, r["checkpoint_id"]))
            job["failed"] = None
        return out

    def advance(self, watermark: int) -> list[Finding]:
        """Check the age of each running job's newest restore-tested checkpoint."""
        out: list[Finding] = []
        for job_id in sorted(self._jobs):
            job = self._jobs[job_id]
            info = self.topology.jobs.get(job_id)
            running = info is not None and info.state == "running"
            ref = job["passed"]["written"] if job["passed"] is not None else job["started"]
            max_s = float(job["policy_s"] or self._max_age_s)
            cond = job["stale"]
            if running and ref is not None and watermark - ref > max_s * 1000:
                if cond is None:
                    cond = job["stale"] = {"since": int(ref + max_s * 1000), "emit": watermark}
                elif watermark - cond["emit"] < self._reemit_ms:
                    continue
                cond["emit"] = watermark
                out.append(self._stale_finding(job_id, job, watermark, ref, max_s, True))
            elif cond is not None:
                out.append(self._stale_finding(job_id, job, watermark, ref or watermark, max_s, False))
                job["stale"] = None
        return out

    def _failed_finding(
        self, job_id: str, failed: dict[str, Any], ts: int, active: bool, resolved_by: str = ""
    ) -> Finding:
        step = f" (step {failed['step']})" if failed.get("step") is not None else ""
        history = add_point(failed, ts, failed["n"] if active else 0)
        summary = (
            f"restore test of checkpoint {failed['cid']}{step} of job {job_id} failed: {failed['why']}"
            + (f" ({failed['n']} failed tests in a row)" if failed["n"] > 1 else "")
            if active
            else f"checkpoint {resolved_by} of job {job_id} passed a restore test"
        )
        return Finding(
            rule="restore_test_failed",
            key=(job_id,),
            active=active,
            ts=ts,
            category="platform",
            severity="critical",
            job_id=job_id,
            since=failed["since"],
            invariant="a checkpoint restores (model, optimizer, scheduler, data position) and training resumes",
            observed=float(failed["n"]),
            expected=0.0,
            summary=summary,
            suspected_layer="checkpoint",
            history_metric="failed_restore_tests",
            history=history,
            sustain_ms=0,
        )

    def _stale_finding(
        self, job_id: str, job: dict[str, Any], ts: int, ref: int, max_s: float, active: bool
    ) -> Finding:
        passed = job["passed"]
        history = (
            add_point(job["stale"], ts, (ts - ref) / 1000) if job["stale"] else ((ts, (ts - ref) / 1000),)
        )
        what = (
            f"the newest restore-tested checkpoint ({passed['cid']}) of job {job_id} was written"
            if passed is not None
            else f"job {job_id} has no checkpoint that passed a restore test; it started"
        )
        summary = (
            f"{what} {_age(ts - ref)} ago, policy allows {_age(int(max_s * 1000))}"
            if active
            else f"job {job_id} has a recently restore-tested checkpoint again (or stopped running)"
        )
        return Finding(
            rule="restore_test_stale",
            key=(job_id,),
            active=active,
            ts=ts,
            category="platform",
            severity="warning",
            job_id=job_id,
            since=int(job["stale"]["since"]) if job["stale"] else ts,
            invariant=f"the newest restore-tested checkpoint is younger than {max_s:g}s",
            observed=(ts - ref) / 1000,
            expected=max_s,
            summary=summary,
            suspected_layer="checkpoint",
            history_metric="restore_tested_checkpoint_age_s",
            history=history,
            sustain_ms=0,
        )
