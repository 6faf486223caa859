"""Resource invariant: a job's GPUs run only that job's processes.

Rule `foreign_process` (category `infra`, identity node + GPU uuid): a GpuSample of a GPU bound
(RankBound) to job J lists a pid that is neither the bound rank's pid nor any pid bound to J on
that node. Reported after `min_samples` samples in a row show a foreign pid (a rank that restarts
shows its new pid a moment before its new RankBound arrives); resolves on the first sample
without one. GPUs bound to no job are not checked.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Detector, Finding, drop_nodes
from streams.detectors.catalogue import catalogued

__all__ = ["DEFAULTS", "ResourceDetector"]

DEFAULTS: dict[str, Any] = {
    "min_samples": 2,  # samples in a row with a foreign pid before it is reported
}


FOREIGN_PROCESS = catalogued("foreign_process")


class ResourceDetector(Detector, rule=FOREIGN_PROCESS, stage="rank"):
    """Processes on a job's GPU that do not belong to the job."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"GpuSample", "RankBound"})

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._min_samples = max(1, int(p["min_samples"]))
        # "node|gpu_uuid" -> {"n": samples in a row, "since", "pids", "job_id", "rank", "active"}
        self._gpus: dict[str, dict[str, Any]] = {}
        # (job, node) -> pids bound there; derived from the topology, rebuilt on every RankBound.
        self._allowed: dict[tuple[str, str], frozenset[int]] = {}

    def state(self) -> dict[str, Any]:
        """JSON-able state: per GPU, the run of samples with foreign pids."""
        return {"gpus": {k: self._gpus[k] for k in sorted(self._gpus)}}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._gpus = dict(state.get("gpus", {}))
        self._allowed.clear()

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop evicted nodes' GPUs."""
        drop_nodes(self._gpus, nodes)

    def forget_job(self, job_id: str) -> None:
        """Drop GPU state of a finished job (a still-active condition was resolved by then)."""
        self._gpus = {k: v for k, v in self._gpus.items() if v["job_id"] != job_id}

    def observe(self, event: Event) -> list[Finding]:
        """Compare a GpuSample's pids with the processes bound to the GPU's job."""
        if event.type == "RankBound":
            self._allowed.clear()
        if event.type != "GpuSample":
            return []
        r = event.record
        node, uuid, ts = r["node"], r["gpu_uuid"], r["ts"]
        key = f"{node}|{uuid}"
        binding = self.topology.binding_for_gpu(node, uuid)
        cond = self._gpus.get(key)
        foreign: list[int] = []
        if binding is not None:
            allowed = self._allowed.get((binding.job_id, node))
            if allowed is None:
                allowed = frozenset(b.pid for b in self.topology.ranks_on_node(binding.job_id, node))
                self._allowed[(binding.job_id, node)] = allowed
            foreign = sorted({int(p) for p in r.get("pids") or []} - allowed - {binding.pid})
        if not foreign:
            if cond is None:
                return []
            del self._gpus[key]
            if not cond["active"]:
                return []
            return [self._finding(r, cond, False)]
        assert binding is not None
        if cond is None or cond["job_id"] != binding.job_id:
            cond = {
                "n": 0,
                "since": ts,
                "pids": [],
                "job_id": binding.job_id,
                "rank": binding.rank,
                "active": False,
            }
            self._gpus[key] = cond
        cond["n"] += 1
        cond["pids"] = foreign
        cond["rank"] = binding.rank
        mem = r.get("mem_used_bytes")
        points: list[list[Any]] = cond.setdefault("points", [])
        points.append([ts, float(mem or 0) / 2**30])
        del points[:-10]
        if cond["n"] < self._min_samples:
            return []
        cond["active"] = True
        return [self._finding(r, cond, True)]

    def _finding(self, r: dict[str, Any], cond: dict[str, Any], active: bool) -> Finding:
        node, uuid, job_id = r["node"], r["gpu_uuid"], cond["job_id"]
        pids = ", ".join(str(p) for p in cond["pids"])
        summary = (
            f"pid {pids} runs on GPU {r['gpu_index']} ({uuid}) of node {node}, bound to rank {cond['rank']} "
            f"of job {job_id}, and is not one of the job's processes"
            if active
            else f"GPU {r['gpu_index']} of node {node} runs only processes of job {job_id} again"
        )
        return FOREIGN_PROCESS.finding(
            key=(node, uuid),
            active=active,
            ts=r["ts"],
            job_id=job_id,
            node=node,
            rank=cond["rank"],
            gpu_uuid=uuid,
            gpu_index=r["gpu_index"],
            since=cond["since"],
            observed=float(len(cond["pids"])),
            expected=0.0,
            summary=summary,
            history_metric="gpu_mem_used_gib",  # what the foreign process takes from the job's GPU
            history=tuple((int(t), float(v)) for t, v in cond.get("points", ())),
            sustain_ms=0,
        )
