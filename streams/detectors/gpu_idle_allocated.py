"""Rule `gpu_idle_allocated`: a GPU allocated to a job has stayed idle for the whole run while the job trains.

Category `platform`, suspected layer `gpu`. A GPU belongs to the job's allocation when a rank of
the job is bound to it (RankBound) or the node agent attributes it to the job (GpuSample
`job_id`: the scheduler's allocation, as Slurm or the kubelet report it). It is unused when no
sample of it in the current run showed a kernel running (`gpu_util_pct` above `idle_util_pct`)
or memory in use (above `idle_mem_frac` of the device). Reported once the job has trained (its
first step of the run, and another of its GPUs in use) for `idle_min_s` while this GPU stayed
unused: a rank computing on another device (a missing `set_device`), a launcher that started
fewer ranks than GPUs, or a GPU requested and never given work. One alert per job and GPU;
resolves when the GPU is used, a new run starts, or the job ends.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector
from streams.detectors.catalogue import catalogued

__all__ = ["DEFAULTS", "GpuIdleAllocatedDetector"]

DEFAULTS: dict[str, Any] = {
    "idle_min_s": 90.0,  # the job trained this long with the GPU never used
    "idle_util_pct": 5.0,  # activity above this is use
    "idle_mem_frac": 0.25,  # device memory in use above this fraction is use (a model loaded)
}

_POINTS = 10


GPU_IDLE_ALLOCATED = catalogued("gpu_idle_allocated")


class GpuIdleAllocatedDetector(PerJobDetector, rule=GPU_IDLE_ALLOCATED, stage="rank"):
    """Allocated GPUs a job never uses during a run."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"GpuSample", "JobStarted", "StepCompleted"})

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._idle_ms = int(float(p["idle_min_s"]) * 1000)
        self._util = float(p["idle_util_pct"])
        self._mem = float(p["idle_mem_frac"])

    def new_job_state(self) -> dict[str, Any]:
        """The run, when it first stepped, whether any of its GPUs is in use, and its GPUs by node|uuid."""
        return {"run": None, "first_step": None, "any_used": False, "gpus": {}}

    def observe(self, event: Event) -> list[Finding]:
        """Steps start the idle clock; GPU samples of the job's allocation are judged."""
        r = event.record
        if event.type == "StepCompleted":
            job = self._job(r["job_id"])
            out = self._new_run(r["job_id"], job, r.get("run_id", ""), r["ts"])
            if job["first_step"] is None or r["ts"] < job["first_step"]:
                job["first_step"] = r["ts"]
            return out
        if event.type == "JobStarted":
            known = self._jobs.get(r["job_id"])
            return self._new_run(r["job_id"], known, r.get("run_id", ""), r["ts"]) if known else []
        if event.type == "GpuSample":
            return self._sample(r)
        return []

    def _new_run(self, job_id: str, job: dict[str, Any], run: str, ts: int) -> list[Finding]:
        if job["run"] == run:
            return []
        out = [
            self._finding(job_id, key, cond, ts, active=False)
            for key, cond in sorted(job["gpus"].items())
            if cond["active"]
        ]
        job.update(run=run, first_step=None, any_used=False, gpus={})
        return out

    def _sample(self, r: dict[str, Any]) -> list[Finding]:
        node, uuid = r["node"], r["gpu_uuid"]
        binding = self.topology.binding_for_gpu(node, uuid)
        job_id = binding.job_id if binding is not None else r.get("job_id")
        if not job_id:
            return []
        job = self._jobs.get(job_id)
        if job is None:
            return []
        if binding is None and r.get("pids"):
            # Attributed by its processes: if they are the job's ranks (bound to other GPUs), they strayed
            # here (gpu_outside_allocation's case); the scheduler did not allocate this GPU to the job.
            own = {b.pid for b in self.topology.ranks_on_node(job_id, node)}
            if own.intersection(int(p) for p in r["pids"]):
                return []
        key = f"{node}|{uuid}"
        cond = job["gpus"].get(key)
        if cond is None:
            cond = job["gpus"][key] = {"first": r["ts"], "used": False, "active": False, "points": []}
        util = r.get("gpu_util_pct")
        mem, total = r.get("mem_used_bytes"), r.get("mem_total_bytes")
        used = (util is not None and util > self._util) or bool(mem and total and mem > self._mem * total)
        cond["rank"] = binding.rank if binding is not None and binding.job_id == job_id else None
        cond["index"] = r["gpu_index"]
        points: list[list[Any]] = cond["points"]
        points.append([r["ts"], float(util or 0.0)])
        del points[:-_POINTS]
        if used:
            cond["used"] = True
            job["any_used"] = True
            if cond["active"]:
                cond["active"] = False
                return [self._finding(job_id, key, cond, r["ts"], active=False)]
            return []
        if cond["used"] or cond["active"] or not job["any_used"] or job["first_step"] is None:
            return []
        since = max(cond["first"], job["first_step"])
        if r["ts"] - since < self._idle_ms:
            return []
        cond["active"] = True
        cond["since"] = since
        return [self._finding(job_id, key, cond, r["ts"], active=True)]

    def _finding(self, job_id: str, key: str, cond: dict[str, Any], ts: int, *, active: bool) -> Finding:
        node, uuid = key.split("|", 1)
        rank = cond.get("rank")
        whose = f"bound to rank {rank}" if rank is not None else "allocated to it"
        idle_s = (ts - cond.get("since", ts)) / 1000
        summary = (
            f"GPU {cond['index']} ({uuid}) of node {node}, {whose}, has been idle for the whole run of job "
            f"{job_id} ({idle_s:.0f} s of training, no kernel and no memory in use)"
            if active
            else f"GPU {cond['index']} of node {node} is in use by job {job_id} now (or the run ended)"
        )
        return GPU_IDLE_ALLOCATED.finding(
            key=(job_id, node, uuid),
            active=active,
            ts=ts,
            job_id=job_id,
            node=node,
            rank=rank,
            gpu_uuid=uuid,
            gpu_index=cond["index"],
            since=cond.get("since", ts),
            observed=float(cond["points"][-1][1]) if cond["points"] else 0.0,
            expected=self._util,
            summary=summary,
            history_metric="gpu_util_pct",
            history=tuple((int(t), float(v)) for t, v in cond["points"]),
            sustain_ms=0,
        )
