"""Rule `restore_test_stale`: a running job's newest restore-tested checkpoint is too old.

Category `platform`, warning, one identity per job. While the job runs, the newest checkpoint
that passed a restore test (RestoreTest `passed`) was written longer ago than the job's
`restore_test_max_age_s` (JobStarted policy; the `restore_test_max_age_s` knob when the job has
none). Before any passing test the job's first start is the reference. Re-reported at most every
`reemit_s`; resolves when a newer checkpoint passes or the job stops running.

A checkpoint's age counts from its `completed` (or `verified`) CheckpointEvent (the last
`checkpoints_kept` write times of a job are remembered); a restore test of a checkpoint the
detector never saw written counts from the test itself.

Recovery is tested when it matters, not only on a timer (issue 35.4): the condition also holds
while the running job's code version, runtime version, configuration hash or checkpoint format
(JobStarted) differs from what its newest passing restore test restored with (RestoreTest): a
restore proven for yesterday's code or format proves nothing for today's. A field is compared
only when both the job and the test name it; the summary says which changed, from what to what.
A passing test with the job's current values resolves it.
"""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, JobInfo, PerJobDetector
from streams.detectors.catalogue import catalogued
from streams.detectors.durations import age_text
from streams.detectors.history import add_point

__all__ = ["DEFAULTS", "RestoreTestStaleDetector"]

DEFAULTS: dict[str, Any] = {
    "restore_test_max_age_s": 604800.0,  # a restore-tested checkpoint must be younger than this (7 days)
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
    "checkpoints_kept": 256,  # write times remembered per job (bounded state)
}


# What a restore test must match of the running job: (JobInfo field, RestoreTest field, in words).
_TESTED_WITH = (
    ("code_version", "code_version", "code version"),
    ("runtime_version", "runtime_version", "runtime"),
    ("config_hash", "config_hash", "configuration"),
    ("checkpoint_format", "checkpoint_format", "checkpoint format"),
)


def _changes(info: JobInfo | None, passed: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """(what, tested with, running with) for each identity the job changed since its passing test."""
    if info is None or passed is None:
        return []
    tested = passed.get("with") or {}
    out = []
    for job_field, test_field, what in _TESTED_WITH:
        now, then = getattr(info, job_field, ""), tested.get(test_field) or ""
        if now and then and now != then:
            out.append((what, then, now))
    return out


RESTORE_TEST_STALE = catalogued("restore_test_stale")


class RestoreTestStaleDetector(PerJobDetector, rule=RESTORE_TEST_STALE, stage="job", section="readiness"):
    """The age of each running job's newest restore-tested checkpoint against its policy."""

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._max_age_s = float(p["restore_test_max_age_s"])
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)
        self._kept = int(p["checkpoints_kept"])

    def new_job_state(self) -> dict[str, Any]:
        """Policy, first start, checkpoint write times, the newest passing test, the open condition."""
        return {"policy_s": None, "started": None, "written": {}, "passed": None, "stale": None}

    def observe(self, event: Event) -> list[Finding]:
        """Note policies, checkpoint write times and passing restore tests."""
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
            # A failed test makes the job known too: its later checkpoint write times are kept.
            job = self._job(r["job_id"])
            if r["passed"]:
                written = job["written"].get(r["checkpoint_id"], r["ts"])
                passed = job["passed"]
                if passed is None or written >= passed["written"]:
                    job["passed"] = {
                        "cid": r["checkpoint_id"],
                        "step": r.get("step"),
                        "written": written,
                        "ts": r["ts"],
                        "with": {t: r.get(t) or "" for _, t, _ in _TESTED_WITH},
                    }
        return []

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
            old = ref is not None and watermark - ref > max_s * 1000
            changed = _changes(info, job["passed"]) if running else []
            if running and ref is not None and (old or changed):
                if cond is None:
                    since = int(ref + max_s * 1000) if old else watermark
                    cond = job["stale"] = {"since": since, "emit": watermark}
                elif watermark - cond["emit"] < self._reemit_ms:
                    continue
                cond["emit"] = watermark
                out.append(self._finding(job_id, job, watermark, ref, max_s, True, changed))
            elif cond is not None:
                out.append(self._finding(job_id, job, watermark, ref or watermark, max_s, False))
                job["stale"] = None
        return out

    def _finding(
        self,
        job_id: str,
        job: dict[str, Any],
        ts: int,
        ref: int,
        max_s: float,
        active: bool,
        changed: list[tuple[str, str, str]] | None = None,
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
            f"{what} {age_text(ts - ref, days=True)} ago, policy allows {age_text(int(max_s * 1000), days=True)}"
            if active
            else f"job {job_id} has a recently restore-tested checkpoint again (or stopped running)"
        )
        if active and changed:
            moved = "; ".join(f"{what} {then!r} -> {now!r}" for what, then, now in changed)
            summary = (
                f"job {job_id} changed since its newest passing restore test ({passed['cid']}): {moved}; "
                "a restore with what it runs now is untested"
            )
        return RESTORE_TEST_STALE.for_job(
            job_id,
            active,
            ts,
            since=int(job["stale"]["since"]) if job["stale"] else ts,
            invariant=RESTORE_TEST_STALE.says(max_s=max_s),
            observed=(ts - ref) / 1000,
            expected=max_s,
            summary=summary,
            history_metric="restore_tested_checkpoint_age_s",
            history=history,
            sustain_ms=0,
        )
