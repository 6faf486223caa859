"""Platform invariants: jobs do not restart in a loop and do not wait in the queue for too long.

Rules (category `platform`, identity per job):

- `restart_loop`: at least `restart_threshold` restarts within `restart_window_s`. A restart is
  a JobStateChanged to `restarting`, an increase of `restart_count`, or a JobStarted with a new
  `run_id` for a job seen before; the signals of one restart (state, count, new run) count once.
  Resolves when the job has run `restart_resolve_s` without a restart (the count starts afresh)
  or fewer than the threshold remain within the window.
- `long_pending`: a job in state `pending` (JobStateChanged) for more than `pending_max_s`
  without running; resolves when it leaves `pending`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector, Topology
from streams.detectors.history import add_point

__all__ = ["DEFAULTS", "PlatformDetector"]

DEFAULTS: dict[str, Any] = {
    "restart_threshold": 3,  # restarts within the window that make a loop
    "restart_window_s": 1800.0,  # the window, seconds
    "restart_resolve_s": 300.0,  # a loop is over once the job has run this long without a restart
    "pending_max_s": 600.0,  # pending longer than this without running is an alert
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
}


class PlatformDetector(PerJobDetector):
    """Restart loops and long pending times, per job."""

    rules: ClassVar[tuple[str, ...]] = ("restart_loop", "long_pending")

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**DEFAULTS, **self.params}
        self._threshold = int(p["restart_threshold"])
        self._window = int(float(p["restart_window_s"]) * 1000)
        self._stable = int(float(p["restart_resolve_s"]) * 1000)
        self._pending_max = int(float(p["pending_max_s"]) * 1000)
        self._reemit = int(float(p["reemit_s"]) * 1000)

    def forget_job(self, job_id: str) -> None:
        """A run ended: drop its conditions but keep recent restarts (a failed run may be restarted)."""
        job = self._jobs.get(job_id)
        if job is None:
            return
        # The engine ends a job on `failed`, which is also how a crash loop looks between
        # restarts: the restart times and the last run id must survive; advance() drops the
        # entry once no restart is left in the window.
        job["loop"] = job["pending"] = job["pending_since"] = None
        job["in_restart"] = False

    def new_job_state(self) -> dict[str, Any]:
        """The state of a job seen for the first time."""
        return {
            "run_id": None,
            "restarts": [],
            "total": 0,
            "in_restart": False,
            "loop": None,
            "pending": None,
            "pending_since": None,
        }

    def observe(self, event: Event) -> list[Finding]:
        """Count restarts; note pending periods."""
        if event.type not in ("JobStarted", "JobStateChanged"):
            return []
        r = event.record
        job_id, ts = r["job_id"], r["ts"]
        job = self._job(job_id)
        before = len(job["restarts"])
        out: list[Finding] = []
        if event.type == "JobStarted":
            run_id = r.get("run_id") or ""
            if job["run_id"] is not None and run_id != job["run_id"] and not job["in_restart"]:
                self._count(job, ts, 1)
            job["run_id"] = run_id
            job["in_restart"] = False
            out += self._leave_pending(job_id, job, ts)
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
            if state == "pending":
                if job["pending_since"] is None:
                    job["pending_since"] = ts
            else:
                out += self._leave_pending(job_id, job, ts)
        if len(job["restarts"]) > before:
            out += self._check_loop(job_id, job, ts)
        return out

    def _count(self, job: dict[str, Any], ts: int, n: int) -> None:
        # A counter that jumps by more than the threshold (a detector that started late) adds
        # no more than the threshold: those restarts happened at unknown times.
        job["total"] += n
        job["restarts"] = [*job["restarts"], *([ts] * min(n, self._threshold))]

    def _leave_pending(self, job_id: str, job: dict[str, Any], ts: int) -> list[Finding]:
        cond = job["pending"]
        job["pending_since"] = None
        if cond is None:
            return []
        job["pending"] = None
        return [self._pending_finding(job_id, cond, ts, False)]

    def advance(self, watermark: int) -> list[Finding]:
        """Age out old restarts; check pending times."""
        out: list[Finding] = []
        for job_id in sorted(self._jobs):
            job = self._jobs[job_id]
            if job["restarts"] or job["loop"] is not None:
                out += self._check_loop(job_id, job, watermark)
            info = self.topology.jobs.get(job_id)
            if (
                not job["restarts"]
                and job["pending_since"] is None
                and (info is None or info.state != "running")
            ):
                if info is None or info.state in ("completed", "failed"):
                    del self._jobs[job_id]
                continue
            since = job["pending_since"]
            if since is not None and watermark - since > self._pending_max:
                cond = job["pending"]
                if cond is None:
                    cond = job["pending"] = {"since": since, "emit": watermark}
                elif watermark - cond["emit"] < self._reemit:
                    continue
                cond["emit"] = watermark
                out.append(self._pending_finding(job_id, cond, watermark, True))
        return out

    def _check_loop(self, job_id: str, job: dict[str, Any], now: int) -> list[Finding]:
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
            out = [self._loop_finding(job_id, job, now, False)]
            job["loop"] = None
            return out
        if len(recent) >= self._threshold:
            if loop is None:
                loop = job["loop"] = {"since": recent[0], "emit": now, "n": len(recent)}
            elif now - loop["emit"] < self._reemit and len(recent) == loop["n"]:
                return []
            loop["emit"], loop["n"] = now, len(recent)
            return [self._loop_finding(job_id, job, now, True)]
        if loop is not None:
            loop["n"] = len(recent)
            out = [self._loop_finding(job_id, job, now, False)]
            job["loop"] = None
            return out
        return []

    def _loop_finding(self, job_id: str, job: dict[str, Any], ts: int, active: bool) -> Finding:
        loop = job["loop"]
        window_min = self._window // 60_000
        summary = (
            f"job {job_id} restarted {loop['n']} times in the last {window_min} min ({job['total']} in all)"
            if active
            else f"job {job_id} is no longer restarting in a loop"
        )
        return Finding(
            rule="restart_loop",
            key=(job_id,),
            active=active,
            ts=ts,
            category="platform",
            severity="critical",
            job_id=job_id,
            since=int(loop["since"]),
            invariant=f"fewer than {self._threshold} restarts within {window_min} min",
            observed=float(loop["n"]),
            expected=float(self._threshold - 1),
            summary=summary,
            suspected_layer="scheduler",
            history_metric="restarts",
            history=tuple((int(t), float(i + 1)) for i, t in enumerate(job["restarts"][-8:])),
            sustain_ms=0,
        )

    def _pending_finding(self, job_id: str, cond: dict[str, Any], ts: int, active: bool) -> Finding:
        waited = (ts - cond["since"]) / 1000
        history = add_point(cond, ts, waited)
        summary = (
            f"job {job_id} has been pending for {waited / 60:.0f} min without running"
            if active
            else f"job {job_id} left pending after {waited / 60:.0f} min"
        )
        return Finding(
            rule="long_pending",
            key=(job_id,),
            active=active,
            ts=ts,
            category="platform",
            severity="warning",
            job_id=job_id,
            since=int(cond["since"]) + self._pending_max,
            invariant=f"a job starts running within {self._pending_max // 60_000} min of being queued",
            observed=waited,
            expected=self._pending_max / 1000,
            summary=summary,
            suspected_layer="scheduler",
            history_metric="pending_s",
            history=history,
            sustain_ms=0,
        )
