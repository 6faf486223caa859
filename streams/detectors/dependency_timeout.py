"""Rule `dependency_timeout`: ranks of a job gave up waiting for something outside them: a collective (its
peers, the network) or a storage call (a file system, an object store).

From RankFault records of kinds `collective_timeout` and `storage_timeout`. One alert per job and
kind, at once, critical. A collective timeout is reported by every rank that waited: the alert
lists them, names their node when they all share one, and names the ranks of the job that did
*not* time out (when only a few did not, they are the ones the others waited for; `rank_hang`
names the hung one). A storage timeout names its rank (with node and GPU) or, when several ranks
of one node timed out, the node. Category `infra` for a collective (network, peers), `data` for
storage. It resolves when the job completes a step after the last timeout (the dependency
answers again), when a new run starts, or when the job ends.
"""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued
from streams.detectors.placement import rank_place, ranks_text

__all__ = ["DependencyTimeoutDetector"]

_KINDS = {"collective_timeout": "a collective", "storage_timeout": "a storage call"}
_POINTS = 10

# A collective's timeout (the declared case) is the network's; a storage call's is data's.
DEPENDENCY_TIMEOUT = catalogued("dependency_timeout")


class DependencyTimeoutDetector(PerJobDetector, rule=DEPENDENCY_TIMEOUT, stage="job"):
    """Collective and storage timeouts, one alert per job and kind."""

    def new_job_state(self) -> dict[str, Any]:
        """Open timeouts by kind, and the job's run."""
        return {"open": {}, "run": None}

    def observe(self, event: Event) -> list[Finding]:
        """A timeout opens or widens its kind's alert; a later step or a new run closes it."""
        r = event.record
        if event.type == "RankFault" and r.get("kind") in _KINDS:
            return self._timeout(r)
        if event.type == "StepCompleted":
            job = self._jobs.get(r["job_id"])
            if job is None or not job["open"]:
                return []
            out = []
            for kind in sorted(job["open"]):
                cond = job["open"][kind]
                if r["ts"] > cond["last"]:
                    del job["open"][kind]
                    out.append(self._finding(r["job_id"], kind, cond, r["ts"], active=False))
            return out
        if event.type == "JobStarted":
            job = self._another_run(r)
            if job is None:
                return []
            out = [
                self._finding(r["job_id"], kind, cond, r["ts"], active=False)
                for kind, cond in sorted(job["open"].items())
            ]
            job["open"] = {}
            return out
        return []

    def _timeout(self, r: dict[str, Any]) -> list[Finding]:
        job = self._job_of_run(r)
        kind = r["kind"]
        cond = job["open"].get(kind)
        if cond is None:
            cond = job["open"][kind] = {"since": r["ts"], "ranks": [], "points": [], "detail": ""}
        rank = int(r["rank"])
        if rank not in cond["ranks"]:
            cond["ranks"] = sorted([*cond["ranks"], rank])
        if r.get("node") and rank_place(self.topology, r["job_id"], rank).node is None:
            cond.setdefault("nodes", {})[str(rank)] = r["node"]
        cond["last"] = r["ts"]
        cond["detail"] = (r.get("detail") or cond["detail"])[:400]
        points: list[list[Any]] = cond["points"]
        points.append([r["ts"], float(len(cond["ranks"]))])
        del points[:-_POINTS]
        return [self._finding(r["job_id"], kind, cond, r["ts"], active=True)]

    def _finding(self, job_id: str, kind: str, cond: dict[str, Any], ts: int, *, active: bool) -> Finding:
        ranks: list[int] = cond["ranks"]
        fallback = cond.get("nodes", {})
        places = {rank: rank_place(self.topology, job_id, rank, fallback.get(str(rank))) for rank in ranks}
        nodes = sorted({p.node for p in places.values() if p.node})
        node = nodes[0] if len(nodes) == 1 else None
        rank: int | None = ranks[0] if len(ranks) == 1 else None
        place = places[rank] if rank is not None else rank_place(self.topology, job_id, None, node)
        bound = sorted(b.rank for b in self.topology.ranks_of(job_id))
        silent = [b for b in bound if b not in ranks]
        what = _KINDS[kind]
        who = (
            f"rank {rank}" + (f" on {place.words()}" if place.node else "")
            if rank is not None
            else (f"{len(ranks)} ranks ({ranks_text(ranks)})" + (f" on node {node}" if node else ""))
        )
        waited_for = ""
        if kind == "collective_timeout" and silent and len(silent) <= max(1, len(bound) // 4):
            waited_for = f"; rank(s) {ranks_text(silent)} did not time out: the ones the others waited for?"
        detail = f": {cond['detail']}" if cond["detail"] else ""
        summary = (
            f"{who} of job {job_id} timed out waiting for {what}{waited_for}{detail}"
            if active
            else f"job {job_id} makes progress again after timeouts waiting for {what}"
        )
        return DEPENDENCY_TIMEOUT.finding(
            key=(job_id, kind),
            active=active,
            ts=ts,
            category="infra" if kind == "collective_timeout" else "data",
            job_id=job_id,
            node=place.node,
            rank=rank,
            gpu_uuid=place.gpu_uuid if rank is not None else None,
            gpu_index=place.gpu_index if rank is not None else None,
            since=cond["since"],
            invariant=DEPENDENCY_TIMEOUT.says(what=what),
            observed=float(len(ranks)),
            expected=0.0,
            summary=summary,
            suspected_layer="network" if kind == "collective_timeout" else "storage",
            history_metric="ranks_timed_out",
            history=tuple((int(t), float(v)) for t, v in cond["points"]),
            sustain_ms=0,
        )
