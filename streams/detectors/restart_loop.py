"""Rule `restart_loop`: a job restarts again and again.

Category `platform`, critical, one identity per job. At least `restart_threshold` restarts within
`restart_window_s`. A restart is a JobStateChanged to `restarting`, an increase of
`restart_count`, or a JobStarted with a new `run_id` for a job seen before; the signals of one
restart (state, count, new run) count once, and a counter that jumps by more than the threshold
(a detector that started late) adds no more than the threshold. Re-reported at most every
`reemit_s` (at once when the count grows). Resolves when the job has run `restart_resolve_s`
without a restart (the count starts afresh) or fewer than the threshold remain within the window.
The restarts of a job outlive the end of one run (a crash loop ends each run as `failed`).
"""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued

__all__ = ["DEFAULTS", "RestartLoopDetector"]

DEFAULTS: dict[str, Any] = {
    "restart_threshold": 3,  # restarts within the window that make a loop
    "restart_window_s": 1800.0,  # the window, seconds
    "restart_resolve_s": 300.0,  # a loop is over once the job has run this long without a restart
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
}


RESTART_LOOP = catalogued("restart_loop")


class RestartLoopDetector(PerJobDetector, rule=RESTART_LOOP, stage="job", section="platform"):
    """Restart loops, per job."""

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._threshold = int(p["restart_threshold"])
        self._window = int(float(p["restart_window_s"]) * 1000)
        self._stable = int(float(p["restart_resolve_s"]) * 1000)
        self._reemit = int(float(p["reemit_s"]) * 1000)

    def forget_job(self, job_id: str) -> None:
        """A run ended: drop its condition but keep recent restarts (a failed run may be restarted)."""
        job = self._jobs.get(job_id)
        if job is None:
            return
        # The engine ends a job on `failed`, which is also how a crash loop looks between
        # restarts: the restart times and the last run id must survive; advance() drops the
        # entry once no restart is left in the window.
        job["loop"] = None
        job["in_restart"] = False

    def new_job_state(self) -> dict[str, Any]:
        """The last run id, recent restart times, the restart counter, the open loop."""
        return {"run_id": None, "restarts": [], "total": 0, "in_restart": False, "loop": None}

    def observe(self, event: Event) -> list[Finding]:
        """Count restarts (once per restart, whichever signals it)."""
        if event.type not in ("JobStarted", "JobStateChanged"):
            return []
        r = event.record
        job_id, ts = r["job_id"], r["ts"]
        job = self._job(job_id)
        before = len(job["restarts"])
        if event.type == "JobStarted":
            run_id = r.get("run_id") or ""
            if job["run_id"] is not None and run_id != job["run_id"] and not job["in_restart"]:
                self._count(job, ts, 1)
            job["run_id"] = run_id
            job["in_restart"] = False
        else:
            state = r["state"]
            if state == "restarting" and not job["in_restart"]:
                self._count(job, ts, 1)
                job["in_restart"] = True
            count = int(r.get("restart_count") or 0)
            if count > job["total"]:
                self._count(job, ts, count - job["total"])
                job["in_restart"] = job["in_restart"] or state == "restarting"
            if r.get("run_id") and job["run_id"] is None:
                job["run_id"] = r["run_id"]
        if len(job["restarts"]) > before:
            return self._check(job_id, job, ts)
        return []

    def _count(self, job: dict[str, Any], ts: int, n: int) -> None:
        # A counter that jumps by more than the threshold (a detector that started late) adds
        # no more than the threshold: those restarts happened at unknown times.
        job["total"] += n
        job["restarts"] = [*job["restarts"], *([ts] * min(n, self._threshold))]

    def advance(self, watermark: int) -> list[Finding]:
        """Age out old restarts (resolving a loop); drop the state of ended jobs without restarts."""
        out: list[Finding] = []
        for job_id in sorted(self._jobs):
            job = self._jobs[job_id]
            if job["restarts"] or job["loop"] is not None:
                out += self._check(job_id, job, watermark)
            if not job["restarts"]:
                info = self.topology.jobs.get(job_id)
                if info is None or info.state in ("completed", "failed"):
                    del self._jobs[job_id]
        return out

    def _check(self, job_id: str, job: dict[str, Any], now: int) -> list[Finding]:
        job["restarts"] = [t for t in job["restarts"] if now - t < self._window]
        recent = job["restarts"]
        loop = job["loop"]
        info = self.topology.jobs.get(job_id)
        stable = (
            loop is not None
            and recent
            and now - recent[-1] >= self._stable
            and info is not None
            and info.state == "running"
        )
        if stable:
            # Running without a restart for a while: the loop is over; counting starts afresh.
            job["restarts"] = []
            loop["n"] = len(recent)
            out = [self._finding(job_id, job, now, False)]
            job["loop"] = None
            return out
        if len(recent) >= self._threshold:
            if loop is None:
                loop = job["loop"] = {"since": recent[0], "emit": now, "n": len(recent)}
            elif now - loop["emit"] < self._reemit and len(recent) == loop["n"]:
                return []
            loop["emit"], loop["n"] = now, len(recent)
            return [self._finding(job_id, job, now, True)]
        if loop is not None:
            loop["n"] = len(recent)
            out = [self._finding(job_id, job, now, False)]
            job["loop"] = None
            return out
        return []

    def _finding(self, job_id: str, job: dict[str, Any], ts: int, active: bool) -> Finding:
        loop = job["loop"]
        window_min = self._window // 60_000
        summary = (
            f"job {job_id} restarted {loop['n']} times in the last {window_min} min ({job['total']} in all)"
            if active
            else f"job {job_id} is no longer restarting in a loop"
        )
        return RESTART_LOOP.for_job(
            job_id,
            active,
            ts,
            since=int(loop["since"]),
            invariant=RESTART_LOOP.says(threshold=self._threshold, window_min=window_min),
            observed=float(loop["n"]),
            expected=float(self._threshold - 1),
            summary=summary,
            history_metric="restarts",
            history=tuple((int(t), float(i + 1)) for i, t in enumerate(job["restarts"][-8:])),
            sustain_ms=0,
        )
