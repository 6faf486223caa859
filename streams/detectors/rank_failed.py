"""Rule `rank_failed`: a rank of a job failed: a step or the loop raised, the process exited, CUDA ran out of
memory, or the host's OOM killer took it.

From RankFault records of kinds `exception`, `exit` (with an exit code other than 0: a clean exit
is a finished worker), `cuda_oom` and `oom` (dependency timeouts have their own rule,
`dependency_timeout`). One alert per job and rank, at once, critical, with
the rank's node and GPU and the reason (the fault's kind, message and exit code). Category
`model` for an exception or a CUDA out-of-memory (the training code or its batch and model size),
`platform` for an exit or a host OOM kill (the process died under it). Further faults of the
same rank update the alert. It resolves when the rank completes a step after the fault (it
recovered, or the job restarted with it), or when a new run of the job starts; the end of the
job resolves it too.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued
from streams.detectors.placement import rank_place

__all__ = ["DEFAULTS", "RankFailedDetector"]

DEFAULTS: dict[str, Any] = {
    "kinds": ["exception", "exit", "cuda_oom", "oom"],  # RankFault kinds that are a failed rank
}

_WORDS = {
    "exception": "raised an exception",
    "exit": "exited",
    "cuda_oom": "ran out of GPU memory (CUDA out of memory)",
    "oom": "was killed by the host's OOM killer",
}
_POINTS = 10


RANK_FAILED = catalogued("rank_failed")


class RankFailedDetector(PerJobDetector, rule=RANK_FAILED, stage="rank"):
    """Failed ranks, one alert per job and rank, with the reason."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"JobStarted", "RankFault", "StepCompleted"})

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._kinds = frozenset(str(k) for k in p["kinds"])

    def new_job_state(self) -> dict[str, Any]:
        """Failed ranks (rank -> condition) and the job's recent fault times."""
        return {"failed": {}, "faults": [], "run": None}

    def observe(self, event: Event) -> list[Finding]:
        """A RankFault opens (or updates) a rank's failure; its next step or a new run closes it."""
        r = event.record
        if event.type == "RankFault" and r.get("kind") in self._kinds:
            if r["kind"] == "exit" and r.get("exit_code") == 0:
                return []  # a clean exit (a launcher reporting a finished worker) is no failure
            return self._fault(r)
        if event.type == "StepCompleted":
            job = self._jobs.get(r["job_id"])
            cond = job["failed"].get(str(r["rank"])) if job and job["failed"] else None
            if job is not None and cond is not None and r["ts"] > cond["last"]:
                del job["failed"][str(r["rank"])]
                return [self._finding(r["job_id"], job, int(r["rank"]), cond, r["ts"], active=False)]
            return []
        if event.type == "JobStarted":
            job = self._another_run(r)
            if job is None:
                return []
            out = [
                self._finding(r["job_id"], job, int(rank), cond, r["ts"], active=False)
                for rank, cond in sorted(job["failed"].items(), key=lambda kv: int(kv[0]))
            ]
            job["failed"] = {}
            return out
        return []

    def _fault(self, r: dict[str, Any]) -> list[Finding]:
        job = self._job_of_run(r)
        rank = int(r["rank"])
        faults: list[list[Any]] = job["faults"]
        faults.append([r["ts"], float(len(faults) + 1)])
        del faults[:-_POINTS]
        cond = job["failed"].get(str(rank))
        if cond is None:
            cond = job["failed"][str(rank)] = {"since": r["ts"], "n": 0}
        cond.update(
            last=r["ts"],
            kind=r["kind"],
            detail=(r.get("detail") or "")[:500],
            exit_code=r.get("exit_code"),
            node=r.get("node"),
            run=r.get("run_id", ""),
        )
        cond["n"] += 1
        return [self._finding(r["job_id"], job, rank, cond, r["ts"], active=True)]

    def _finding(
        self, job_id: str, job: dict[str, Any], rank: int, cond: dict[str, Any], ts: int, *, active: bool
    ) -> Finding:
        place = rank_place(self.topology, job_id, rank, cond.get("node"))
        where = f" on {place.words()}" if place.node else ""
        kind = cond["kind"]
        reason = _WORDS.get(kind, kind)
        code = f" (exit code {cond['exit_code']})" if cond.get("exit_code") is not None else ""
        detail = f": {cond['detail']}" if cond.get("detail") else ""
        more = f"; {cond['n']} faults of this rank" if cond["n"] > 1 else ""
        summary = (
            f"rank {rank} of job {job_id}{where} {reason}{code}{detail}{more}"
            if active
            else f"rank {rank} of job {job_id}{where} runs again after it {reason}"
        )
        return RANK_FAILED.for_rank(
            job_id,
            rank,
            place,
            active,
            ts,
            category="model" if kind in ("exception", "cuda_oom") else "platform",
            since=cond["since"],
            observed=float(cond["n"]),
            expected=0.0,
            summary=summary,
            suspected_layer="gpu"
            if kind == "cuda_oom"
            else "host"
            if kind == "oom"
            else "model"
            if kind == "exception"
            else "platform",
            history_metric="rank_faults",
            history=tuple((int(t), float(v)) for t, v in job["faults"]),
            sustain_ms=0,
        )
