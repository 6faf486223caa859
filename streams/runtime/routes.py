"""Where unattributed telemetry goes: node -> job routes, and the Java client's partitioner.

Telemetry the node agent could not attribute to a job is keyed by node. The side path re-keys it
by job: `NodeRoutes` remembers, per node, which job each GPU is bound to (from RankBound) and which
jobs run there, and says where a GpuSample / HostSample goes. Pure: no Kafka here, so the decisions
are unit-tested without a broker; `murmur2` is the Java client's hash, written out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.records import Event

__all__ = ["UNBOUND_KEY", "NodeRoutes", "gpu_fault", "murmur2", "partition_for"]

# Telemetry of a GPU / node bound to no job goes to this job key, so node-only alerts still fire.
UNBOUND_KEY = ""


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of a key (`org.apache.kafka.common.utils.Utils.murmur2`), unsigned 32 bits."""
    length = len(data)
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    h = (seed ^ length) & 0xFFFFFFFF
    whole = length & ~3
    for i in range(0, whole, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    left = length & 3
    if left == 3:
        h ^= data[whole + 2] << 16
    if left >= 2:
        h ^= data[whole + 1] << 8
    if left >= 1:
        h ^= data[whole]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def gpu_fault(record: dict[str, Any]) -> bool:
    """A GpuSample carrying an XID or an uncorrectable ECC error (shared with the node's other jobs)."""
    return bool(record.get("xid")) or bool(record.get("ecc_uncorrected"))


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of `key` as the Java client, librdkafka `murmur2_random` and aiokafka compute it."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass
class _Node:
    gpus: dict[str, list[Any]] = field(default_factory=dict)  # gpu_uuid -> [job_id, ts of binding]
    jobs: dict[str, int] = field(default_factory=dict)  # job_id -> ts of its latest binding here


class NodeRoutes:
    """Node -> {GPU -> job, jobs on node}; where each telemetry sample goes (job keys).

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
            if node is None or job_id not in node.jobs:
                continue
            del node.jobs[job_id]
            node.gpus = {u: b for u, b in node.gpus.items() if b[0] != job_id}
            changed.append(name)
        return changed

    def state_of(self, node: str) -> dict[str, Any] | None:
        """JSON-able state of one node (None: nothing known)."""
        n = self.nodes.get(node)
        if n is None or not (n.gpus or n.jobs):
            return None
        return {"gpus": dict(sorted(n.gpus.items())), "jobs": dict(sorted(n.jobs.items()))}

    def load(self, node: str, state: dict[str, Any] | None) -> None:
        """Restore one node from `state_of`."""
        if state is None:
            self.nodes.pop(node, None)
            return
        self.nodes[node] = _Node(
            {k: list(v) for k, v in state["gpus"].items()}, {k: int(v) for k, v in state["jobs"].items()}
        )

    def forget_nodes(self, keep: Any) -> None:
        """Drop nodes for which `keep(node)` is false (their partitions were revoked)."""
        for name in [n for n in self.nodes if not keep(n)]:
            del self.nodes[name]

    # -- routing -----------------------------------------------------------------------
    def route(self, event: Event) -> list[str]:
        """Job keys this GpuSample / HostSample goes to (empty: dropped by the unbound thinning)."""
        r = event.record
        node = self.nodes.get(r["node"])
        if event.type == "GpuSample":
            bound = node.gpus.get(r.get("gpu_uuid") or "") if node is not None else None
            if bound is not None:
                return [bound[0]]
            return self._unbound(f"{r['node']}|{r.get('gpu_uuid')}", r, gpu_fault(r))
        jobs = sorted(node.jobs) if node is not None else []
        if jobs:
            return jobs
        return self._unbound(f"{r['node']}|", r, bool(r.get("oom_kills")))

    def colocated(self, event: Event) -> list[str]:
        """The other jobs running on the node of a GpuSample: those its GPU fault is shared with."""
        r = event.record
        node = self.nodes.get(r["node"])
        if node is None:
            return []
        own = r.get("job_id")
        bound = node.gpus.get(r.get("gpu_uuid") or "")
        mine = {own, bound[0] if bound is not None else None}
        return [job for job in sorted(node.jobs) if job not in mine]

    def _unbound(self, ident: str, r: dict[str, Any], notable: bool) -> list[str]:
        ts = int(r["ts"])
        last = self._unbound_last.get(ident)
        if notable or last is None or ts - last >= self.unbound_interval_ms or ts < last:
            self._unbound_last[ident] = ts
            return [UNBOUND_KEY]
        return []
