"""Rule `allocator_churn`: a rank's CUDA caching allocator keeps retrying allocations.

Category `model`, warning, suspected layer `gpu`, one identity per job and rank (rank stage). The
SDK reads `torch.cuda.memory_stats()` at most every 10 s and puts the cumulative
`alloc_retries` (plus allocated and reserved bytes) on that step's StepCompleted. A retry means the
cache could not serve an allocation, freed every cached block and called `cudaMalloc` again: a
device-wide synchronisation each time, the step slows long before a CUDA OOM. One retry now and
then is normal; retries that keep coming are not. The condition opens on a read whose counter grew
since the rank's previous read and holds while the counter keeps growing; the alert fires once it
held `sustain_s` (event time) and resolves after `quiet_reads` reads in a row without a new retry.
A counter that went down is a new process: its reads start over. Steps without the counter are not
judged. The finding carries the retries per minute over the condition and, in its summary, how
much of the reserved memory no tensor holds (fragmentation).
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector, Topology
from streams.detectors.catalogue import catalogued
from streams.detectors.placement import rank_place

__all__ = ["DEFAULTS", "AllocatorChurnDetector"]

DEFAULTS: dict[str, Any] = {
    "sustain_s": 60.0,  # retries keep growing for this long (event time) before the alert fires
    "quiet_reads": 2,  # reads in a row without a new retry resolve it
}

_POINTS = 8  # points of the cumulative retry count carried on a finding
_MAX_RANKS = 131_072  # ranks remembered per job (the engine's own cap on a job's ranks)


ALLOCATOR_CHURN = catalogued("allocator_churn")


class AllocatorChurnDetector(PerJobDetector, rule=ALLOCATOR_CHURN, stage="rank"):
    """Sustained growth of a rank's allocator retry counter."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"StepCompleted"})

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**DEFAULTS, **self.params}
        self._sustain_s = float(p["sustain_s"])
        self._sustain_ms = int(self._sustain_s * 1000)
        self._quiet = max(1, int(p["quiet_reads"]))

    def new_job_state(self) -> dict[str, Any]:
        """The run and, per rank, its last read and open condition."""
        return {"run": None, "ranks": {}}

    def observe(self, event: Event) -> list[Finding]:
        """Judge a step that carries the allocator's retry counter."""
        if event.type != "StepCompleted":
            return []
        r = event.record
        retries = r.get("alloc_retries")
        if retries is None:
            return []
        job = self._job(r["job_id"])
        out: list[Finding] = []
        run = r.get("run_id", "")
        if job["run"] != run:
            for rank, state in sorted(job["ranks"].items()):
                if state.get("cond") is not None:
                    out.append(self._finding(r["job_id"], int(rank), state, r["ts"], active=False))
            job.update(run=run, ranks={})
        ranks: dict[str, dict[str, Any]] = job["ranks"]
        key = str(r["rank"])
        state = ranks.get(key)
        if state is None:
            if len(ranks) >= _MAX_RANKS:
                return out
            ranks[key] = {"last": int(retries), "cond": None}
            return out
        last, state["last"] = state["last"], int(retries)
        state["reserved"], state["allocated"] = r.get("mem_reserved_bytes"), r.get("mem_allocated_bytes")
        cond = state["cond"]
        if retries < last:  # a new process of this rank: its counter starts over
            if cond is not None:
                out.append(self._finding(r["job_id"], int(key), state, r["ts"], active=False))
                state["cond"] = None
            return out
        if retries > last:
            if cond is None:
                cond = state["cond"] = {
                    "since": r["ts"],
                    "from": last,
                    "step": r["step"],
                    "quiet": 0,
                    "points": [],
                }
            cond["quiet"] = 0
            cond["retries"] = int(retries)
            cond["points"] = [*cond["points"], [r["ts"], float(retries)]][-_POINTS:]
            out.append(self._finding(r["job_id"], int(key), state, r["ts"], active=True))
        elif cond is not None:
            cond["quiet"] += 1
            if cond["quiet"] >= self._quiet:
                out.append(self._finding(r["job_id"], int(key), state, r["ts"], active=False))
                state["cond"] = None
        return out

    def _finding(self, job_id: str, rank: int, state: dict[str, Any], ts: int, *, active: bool) -> Finding:
        cond = state["cond"]
        new = cond.get("retries", cond["from"]) - cond["from"]
        minutes = max((ts - cond["since"]) / 60_000, 1 / 60)
        rate = new / minutes
        reserved, allocated = state.get("reserved"), state.get("allocated")
        free = (
            f"; {1 - allocated / reserved:.0%} of its {reserved / 2**30:.1f} GiB reserved holds no tensor"
            if reserved and allocated is not None and reserved >= allocated
            else ""
        )
        summary = (
            f"rank {rank} of job {job_id}: the CUDA allocator retried {new} allocation(s) since step "
            f"{cond['step']} ({rate:.1f}/min: cache flushed and cudaMalloc retried each time){free}"
            if active
            else f"rank {rank} of job {job_id}: no new allocator retries"
        )
        place = rank_place(self.topology, job_id, rank)
        return ALLOCATOR_CHURN.finding(
            key=(job_id, str(rank)),
            active=active,
            ts=ts,
            job_id=job_id,
            node=place.node,
            rank=rank,
            gpu_uuid=place.gpu_uuid,
            gpu_index=place.gpu_index,
            since=cond["since"],
            invariant=ALLOCATOR_CHURN.says(sustain_s=self._sustain_s),
            observed=round(rate, 3),
            expected=0.0,
            summary=summary,
            history_metric="alloc_retries",
            history=tuple((int(t), float(v)) for t, v in cond["points"]),
            sustain_ms=self._sustain_ms,
        )
