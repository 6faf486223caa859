"""Where unattributed telemetry goes: node -> job routes.

Telemetry the node agent could not attribute to a job is keyed by node. The side path re-keys it
by job: `NodeRoutes` remembers, per node, which job each GPU is bound to (from RankBound) and which
jobs run there, and says where a GpuSample / HostSample goes. Pure: no Kafka here, so the decisions
are unit-tested without a broker; the partition a key lands on is `schemas.topics.partition_for`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.records import Event
from schemas.topics import shard_key

__all__ = ["UNBOUND_KEY", "NodeRoutes", "gpu_fault"]

# Telemetry of a GPU / node bound to no job goes to this job key, so node-only alerts still fire.
UNBOUND_KEY = ""


def gpu_fault(record: dict[str, Any]) -> bool:
    """A GpuSample carrying an XID or an uncorrectable ECC error (shared with the node's other jobs)."""
    return bool(record.get("xid")) or bool(record.get("ecc_uncorrected"))


@dataclass
class _Node:
    gpus: dict[str, list[Any]] = field(default_factory=dict)  # gpu_uuid -> [job_id, ts of binding]
    jobs: dict[str, int] = field(default_factory=dict)  # job_id -> ts of its latest binding here
    named: list[str] = field(default_factory=list)  # jobs the node's last HostSample named (job_ids)


class NodeRoutes:
    """Node -> {GPU -> job, jobs on node}; where each telemetry sample goes (job keys).

    A GpuSample goes to the job its GPU is bound to; a HostSample to every job on its node: bound
    there, or named by the node's last HostSample (`job_ids`: the agent knows the node's jobs even
    when their ranks send no RankBound). Those names are kept with the node's state but only
    written down with a binding change; after a restart the node's next HostSample brings them back.

    `unbound_interval_ms` thins telemetry of GPUs / nodes with no job (one sample per GPU or node
    per interval of event time; samples carrying an XID, an uncorrectable ECC error or an OOM kill
    always pass), so idle nodes cannot flood the one partition of the unbound key.
    """

    def __init__(self, unbound_interval_ms: int = 10_000) -> None:
        self.unbound_interval_ms = unbound_interval_ms
        self.nodes: dict[str, _Node] = {}
        self._unbound_last: dict[str, int] = {}  # "node|uuid" or "node|" -> ts of last forwarded

    # -- state -------------------------------------------------------------------------
    def bind(self, record: dict[str, Any]) -> str:
        """Apply a RankBound; return its node (whose state changed)."""
        node = self.nodes.setdefault(record["node"], _Node())
        job, ts = record["job_id"], int(record["ts"])
        uuid = record.get("gpu_uuid")
        if uuid is not None:
            old = node.gpus.get(uuid)
            if old is None or ts >= old[1]:  # a binding redelivered late never overrides a newer one
                node.gpus[uuid] = [job, ts]
        node.jobs[job] = max(ts, node.jobs.get(job, ts))
        return str(record["node"])

    def end_job(self, job_id: str, nodes: list[str] | None = None) -> list[str]:
        """Drop a job that ended from `nodes` (default: every node); return the nodes that changed."""
        changed = []
        for name in sorted(self.nodes) if nodes is None else nodes:
            node = self.nodes.get(name)
            if node is None or (job_id not in node.jobs and job_id not in node.named):
                continue
            node.jobs.pop(job_id, None)
            node.named = [j for j in node.named if j != job_id]
            node.gpus = {u: b for u, b in node.gpus.items() if b[0] != job_id}
            changed.append(name)
        return changed

    def state_of(self, node: str) -> dict[str, Any] | None:
        """JSON-able state of one node (None: nothing known)."""
        n = self.nodes.get(node)
        if n is None or not (n.gpus or n.jobs or n.named):
            return None
        return {"gpus": dict(sorted(n.gpus.items())), "jobs": dict(sorted(n.jobs.items())), "named": n.named}

    def load(self, node: str, state: dict[str, Any] | None) -> None:
        """Restore one node from `state_of`."""
        if state is None:
            self.nodes.pop(node, None)
            return
        self.nodes[node] = _Node(
            {k: list(v) for k, v in state["gpus"].items()},
            {k: int(v) for k, v in state["jobs"].items()},
            [str(j) for j in state.get("named", ())],
        )

    def forget_nodes(self, keep: Any) -> None:
        """Drop nodes for which `keep(node)` is false (their partitions were revoked)."""
        for name in [n for n in self.nodes if not keep(n)]:
            del self.nodes[name]

    # -- routing -----------------------------------------------------------------------
    def route(self, event: Event) -> list[str]:
        """Keys (job, or job and node: `shard_key`) this GpuSample / HostSample goes to (empty:
        dropped by the unbound thinning); `jobs` gives the bare job ids."""
        return [shard_key(job, event.record["node"]) if job else job for job in self.jobs(event)]

    def jobs(self, event: Event) -> list[str]:
        """Jobs this GpuSample / HostSample belongs to (empty: dropped by the unbound thinning)."""
        r = event.record
        node = self.nodes.get(r["node"])
        if event.type == "GpuSample":
            bound = node.gpus.get(r.get("gpu_uuid") or "") if node is not None else None
            if bound is not None:
                return [bound[0]]
            return self._unbound(f"{r['node']}|{r.get('gpu_uuid')}", r, gpu_fault(r))
        if r.get("job_ids"):
            if node is None:
                node = self.nodes[r["node"]] = _Node()
            node.named = sorted({str(j) for j in r["job_ids"] if j})
        jobs = self._on(node) if node is not None else []
        if jobs:
            return jobs
        return self._unbound(f"{r['node']}|", r, bool(r.get("oom_kills")))

    @staticmethod
    def _on(node: _Node) -> list[str]:
        """Jobs running on a node: bound there, or named by its agent's last HostSample."""
        return sorted(set(node.jobs) | set(node.named))

    def holder(self, event: Event) -> str | None:
        """The job a GpuSample's GPU is bound to, if any."""
        r = event.record
        node = self.nodes.get(r["node"])
        bound = node.gpus.get(r.get("gpu_uuid") or "") if node is not None else None
        return str(bound[0]) if bound is not None else None

    def with_holder(self, event: Event) -> Event:
        """A GpuSample shared with a co-located job, naming its GPU's job: the sample's own
        attribution, else the GPU's binding (which the co-located job's engine does not hold)."""
        job = event.record.get("job_id") or self.holder(event)
        if not job or job == event.record.get("job_id"):
            return event
        return Event(event.type, {**event.record, "job_id": job})

    def colocated(self, event: Event) -> list[str]:
        """Keys of the other jobs running on the node of a GpuSample: those its GPU fault is shared with."""
        r = event.record
        node = self.nodes.get(r["node"])
        if node is None:
            return []
        own = r.get("job_id")
        bound = node.gpus.get(r.get("gpu_uuid") or "")
        mine = {own, bound[0] if bound is not None else None}
        return [shard_key(job, r["node"]) for job in self._on(node) if job not in mine]

    def _unbound(self, ident: str, r: dict[str, Any], notable: bool) -> list[str]:
        ts = int(r["ts"])
        last = self._unbound_last.get(ident)
        if notable or last is None or ts - last >= self.unbound_interval_ms or ts < last:
            self._unbound_last[ident] = ts
            return [UNBOUND_KEY]
        return []
