"""Rule `gpu_outside_allocation`: a process of a job runs on a GPU that is not one of the job's.

Category `platform`, suspected layer `gpu`. The job's allocation is the set of GPUs its ranks are
bound to (RankBound). A GpuSample of a node lists a pid that one of the job's ranks is bound with
on that node, and the GPU is not bound to any rank of that job: the rank created a CUDA context
(memory, maybe kernels) on another GPU, typically because it never called
`torch.cuda.set_device(local_rank)` and touched `cuda:0`, or because a library picked a device of
its own. The GPU may be free (its memory is silently taken) or another job's (whose
`foreign_process` alert names the victim; this one names the culprit). Reported after
`min_samples` samples in a row; one alert per job and GPU, naming the rank, its own GPU and the
GPU it is on; resolves on the first sample without the job's processes there.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Binding, Detector, Finding
from streams.detectors.catalogue import catalogued

__all__ = ["DEFAULTS", "GpuOutsideAllocationDetector"]

DEFAULTS: dict[str, Any] = {
    "min_samples": 2,  # samples in a row showing the job's pid on the GPU before it is reported
}

_POINTS = 10


GPU_OUTSIDE_ALLOCATION = catalogued("gpu_outside_allocation")


class GpuOutsideAllocationDetector(Detector, rule=GPU_OUTSIDE_ALLOCATION, stage="rank"):
    """A job's bound processes on GPUs no rank of the job is bound to."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"GpuSample", "RankBound"})

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._min_samples = max(1, int(p["min_samples"]))
        # "job|node|gpu_uuid" -> {"n", "since", "active", "rank", "pids", "points"}
        self._gpus: dict[str, dict[str, Any]] = {}
        # node -> pid -> binding; derived from the topology, rebuilt after every RankBound.
        self._pids: dict[str, dict[int, Binding]] = {}

    def state(self) -> dict[str, Any]:
        """JSON-able state: per job and GPU, the run of samples showing the job there."""
        return {"gpus": {k: self._gpus[k] for k in sorted(self._gpus)}}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._gpus = dict(state.get("gpus", {}))
        self._pids.clear()

    def forget_job(self, job_id: str) -> None:
        """Drop a finished job's conditions (already resolved by then)."""
        self._gpus = {k: v for k, v in self._gpus.items() if not k.startswith(f"{job_id}|")}

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop evicted nodes' cached bindings (their conditions go with their jobs)."""
        for node in nodes:
            self._pids.pop(node, None)

    def _bound_pids(self, node: str) -> dict[int, Binding]:
        pids = self._pids.get(node)
        if pids is None:
            pids = self._pids[node] = {b.pid: b for b in self.topology.bindings_on_node(node)}
        return pids

    def observe(self, event: Event) -> list[Finding]:
        """Match the pids of a GpuSample against the job bindings of its node."""
        if event.type == "RankBound":
            self._pids.clear()
            return []
        if event.type != "GpuSample":
            return []
        r = event.record
        node, uuid = r["node"], r["gpu_uuid"]
        owner = self.topology.binding_for_gpu(node, uuid)
        bound = self._bound_pids(node)
        here: dict[str, list[Binding]] = {}
        for pid in r.get("pids") or ():
            b = bound.get(int(pid))
            if b is None or (owner is not None and owner.job_id == b.job_id):
                continue
            if any(x.gpu_uuid == uuid for x in self.topology.ranks_on_node(b.job_id, node)):
                continue  # another rank of the job is bound to this GPU: it is the job's
            here.setdefault(b.job_id, []).append(b)
        out: list[Finding] = []
        prefix = f"|{node}|{uuid}"
        for key in sorted(k for k in self._gpus if k.endswith(prefix)):
            job_id = key[: -len(prefix)]
            if job_id not in here:
                cond = self._gpus.pop(key)
                if cond["active"]:
                    out.append(self._finding(job_id, r, cond, active=False))
        for job_id in sorted(here):
            key = f"{job_id}{prefix}"
            ranks = sorted(here[job_id], key=lambda b: b.rank)
            cond = self._gpus.setdefault(key, {"n": 0, "since": r["ts"], "active": False, "points": []})
            cond["n"] += 1
            cond["rank"] = ranks[0].rank
            cond["pids"] = [b.pid for b in ranks]
            cond["ranks"] = [b.rank for b in ranks]
            cond["own"] = [ranks[0].gpu_index, ranks[0].gpu_uuid]
            points: list[list[Any]] = cond["points"]
            points.append([r["ts"], float(r.get("mem_used_bytes") or 0) / 2**30])
            del points[:-_POINTS]
            if cond["n"] >= self._min_samples and not cond["active"]:
                cond["active"] = True
                out.append(self._finding(job_id, r, cond, active=True))
        return out

    def _finding(self, job_id: str, r: dict[str, Any], cond: dict[str, Any], *, active: bool) -> Finding:
        node, uuid, index = r["node"], r["gpu_uuid"], r["gpu_index"]
        own_index = cond["own"][0]
        owner = self.topology.binding_for_gpu(node, uuid)
        whose = (
            f"bound to rank {owner.rank} of job {owner.job_id}"
            if owner is not None
            else "not bound to any job"
        )
        ranks = ", ".join(str(x) for x in cond["ranks"])
        pids = ", ".join(str(p) for p in cond["pids"])
        summary = (
            f"rank {ranks} of job {job_id} (pid {pids}, bound to GPU {own_index}) also runs on GPU {index} "
            f"({uuid}) of node {node}, which is {whose}: outside the job's allocation (a missing "
            "torch.cuda.set_device?)"
            if active
            else f"job {job_id} no longer runs on GPU {index} of node {node}"
        )
        return GPU_OUTSIDE_ALLOCATION.finding(
            key=(job_id, node, uuid),
            active=active,
            ts=r["ts"],
            job_id=job_id,
            node=node,
            rank=int(cond["rank"]),
            gpu_uuid=uuid,
            gpu_index=index,
            since=cond["since"],
            observed=float(len(cond["pids"])),
            expected=0.0,
            summary=summary,
            history_metric="gpu_mem_used_gib",
            history=tuple((int(t), float(v)) for t, v in cond["points"]),
            sustain_ms=0,
        )
