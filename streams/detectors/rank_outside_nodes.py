"""Rule `rank_outside_nodes`: ranks of a job run on a node that is not in the job's node list.

Category `platform`, suspected layer `platform`. JobStarted lists the nodes allocated to the job
(the scheduler's list); RankBound says where each rank runs. A rank of the current run (bound at
or after the run's JobStarted) on a node missing from the list is running outside the allocation:
a launcher given a stale host file, a rank placed by hand, or a node name the scheduler does not
know. Host names are compared without their domain and case (`node-02.dc1` is `node-02`). Jobs
without a node list are not checked. One alert per job and node, at once, naming the ranks on it;
resolves when no rank of the job is bound there any more, or a JobStarted lists the node.
"""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector, Topology
from streams.detectors.catalogue import catalogued
from streams.detectors.placement import rank_place, ranks_text, short_host

__all__ = ["RankOutsideNodesDetector"]


RANK_OUTSIDE_NODES = catalogued("rank_outside_nodes")


class RankOutsideNodesDetector(PerJobDetector, rule=RANK_OUTSIDE_NODES, stage="job"):
    """Ranks bound on nodes outside the job's node list, one alert per job and node."""

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        # job -> (its JobStarted's node list, those nodes' short names): derived, not state.
        self._listed_cache: dict[str, tuple[list[str], set[str]]] = {}

    def new_job_state(self) -> dict[str, Any]:
        """Open conditions by node, and how many checks found each (for the history)."""
        return {"open": {}}

    def observe(self, event: Event) -> list[Finding]:
        """A JobStarted re-checks every rank of the job; a RankBound checks its rank."""
        r = event.record
        if event.type == "JobStarted":
            return self._check(r["job_id"], r["ts"], None)
        if event.type == "RankBound":
            return self._check(r["job_id"], r["ts"], int(r["rank"]))
        return []

    def _listed(self, job_id: str, nodes: list[str]) -> set[str]:
        """The job's allocation by short host name (made once per JobStarted: a 16k-rank job binds
        16k ranks against the same 2k nodes)."""
        known = self._listed_cache.get(job_id)
        if known is None or known[0] is not nodes:
            known = self._listed_cache[job_id] = (nodes, {short_host(n) for n in nodes})
        return known[1]

    def _check(self, job_id: str, ts: int, only: int | None) -> list[Finding]:
        """Bring the open conditions in line with the bindings (all of them, or rank `only`'s)."""
        info = self.topology.jobs.get(job_id)
        if info is None or (not info.nodes and job_id not in self._jobs):
            return []
        listed = self._listed(job_id, info.nodes)
        job = self._job(job_id)
        # node -> ranks outside, as wanted after this check
        wanted: dict[str, list[int]] = {n: list(c["ranks"]) for n, c in job["open"].items()}
        if only is None:
            wanted = {}
            bindings = self.topology.ranks_of(job_id)
        else:
            for ranks in wanted.values():
                if only in ranks:
                    ranks.remove(only)
            binding = self.topology.bindings.get((job_id, only))
            bindings = [binding] if binding is not None else []
        for b in bindings:
            if listed and b.ts >= info.started_ts and short_host(b.node) not in listed:
                wanted.setdefault(b.node, []).append(b.rank)
        wanted = {n: sorted(rs) for n, rs in wanted.items() if rs}
        out: list[Finding] = []
        for node in sorted(set(job["open"]) - set(wanted)):
            out.append(self._finding(job_id, node, job["open"].pop(node), ts, active=False))
        for node in sorted(wanted):
            ranks = wanted[node]
            cond = job["open"].get(node)
            if cond is not None and cond["ranks"] == ranks:
                continue
            if cond is None:
                cond = job["open"][node] = {"since": ts, "points": []}
            cond["ranks"] = ranks
            cond["listed"] = sorted(info.nodes)
            cond["points"] = [*cond["points"], [ts, float(len(ranks))]][-10:]
            out.append(self._finding(job_id, node, cond, ts, active=True))
        return out

    def _finding(self, job_id: str, node: str, cond: dict[str, Any], ts: int, *, active: bool) -> Finding:
        ranks: list[int] = cond["ranks"]
        rank = ranks[0] if len(ranks) == 1 else None
        place = rank_place(self.topology, job_id, rank, node)
        listed = cond["listed"]
        shown = ", ".join(listed[:6]) + (f" and {len(listed) - 6} more" if len(listed) > 6 else "")
        summary = (
            f"rank(s) {ranks_text(ranks)} of job {job_id} run on node {node}, which is not among the job's "
            f"nodes ({shown})"
            if active
            else f"no rank of job {job_id} runs outside its nodes on {node} any more"
        )
        return RANK_OUTSIDE_NODES.finding(
            key=(job_id, node),
            active=active,
            ts=ts,
            job_id=job_id,
            node=node,
            rank=rank,
            gpu_uuid=place.gpu_uuid if rank is not None else None,
            gpu_index=place.gpu_index if rank is not None else None,
            since=cond["since"],
            observed=float(len(ranks)),
            expected=0.0,
            summary=summary,
            history_metric="ranks_outside_nodes",
            history=tuple((int(t), float(v)) for t, v in cond["points"]),
            sustain_ms=0,
        )
