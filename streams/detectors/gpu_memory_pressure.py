"""Rule `gpu_memory_pressure`: a GPU's device memory is nearly full.

Category `infra`, warning, identity node + GPU. Used / total device memory above `gpu_mem_ratio`;
the alert fires once that lasts `gpu_mem_sustain_s` and resolves on the first sample below it.

Learned per GPU class (issue 35.1, `class_normals.py`): the median over healthy completed runs of
the job's GPU class of each run's highest memory ratio, plus `gpu_mem_learn_margin` (at most `gpu_mem_learn_max`),
replaces `gpu_mem_ratio` for that class once `gpu_mem_learn_runs` runs taught it, when it is
looser and `gpu_mem_ratio` is at its shipped value (no config or override set it): a class whose
healthy runs fill 98.5 % of memory by design is not paged at 97 %.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from streams.detectors.base import Finding
from streams.detectors.catalogue import catalogued
from streams.detectors.class_normals import LearningGpuDetector

__all__ = ["DEFAULTS", "GpuMemoryPressureDetector"]

DEFAULTS: dict[str, Any] = {
    "gpu_mem_ratio": 0.97,  # device memory used / total above this is pressure
    "gpu_mem_sustain_s": 60.0,  # ... for this long
    "gpu_mem_learn_runs": 3,  # healthy completed runs of a GPU class before its learned limit is used
    "gpu_mem_learn_margin": 0.01,  # learned limit: the highest healthy peak plus this...
    "gpu_mem_learn_max": 0.995,  # ...never above this
}

_POINTS = 8  # memory ratios carried on a finding


GPU_MEMORY_PRESSURE = catalogued("gpu_memory_pressure")


class GpuMemoryPressureDetector(
    LearningGpuDetector, rule=GPU_MEMORY_PRESSURE, stage="rank", section="infrastructure"
):
    """Device memory pressure per GPU."""

    learned_knob: ClassVar[str] = "gpu_mem_ratio"
    learns: ClassVar[Literal["max", "low"]] = "max"  # the highest healthy peak plus the margin
    learn_prefix: ClassVar[str] = "gpu_mem"
    history_metric: ClassVar[str] = "gpu_mem_used_ratio"

    def new_gpu(self) -> dict[str, Any]:
        """No condition yet."""
        return {"mem": None}

    def sample(self, node: str, uuid: str, g: dict[str, Any], r: dict[str, Any]) -> list[Finding]:
        """Memory in use above the ratio (reported on every such sample)."""
        used, total = r.get("mem_used_bytes"), r.get("mem_total_bytes")
        if used is None or not total:
            return []
        ratio = used / total
        job_id = self.gpu_identity(node, uuid)[0]
        job = self.topology.jobs.get(job_id) if job_id else None
        gpu_class = job.gpu_class if job is not None else ""
        if job is not None and job.state == "running":
            self.normals.add(job_id, ratio)
        limit, why = self.limit(gpu_class)
        cond = g["mem"]
        if ratio > limit:
            if cond is None:
                cond = g["mem"] = {"since": r["ts"], "points": []}
            cond["ratio"] = ratio
            cond["limit"], cond["why"] = limit, why
            cond["points"] = [*cond["points"], [r["ts"], round(ratio, 4)]][-_POINTS:]
            return [self._finding(node, uuid, g, r["ts"], True)]
        if cond is not None:
            cond["ratio"] = ratio
            out = [self._finding(node, uuid, g, r["ts"], False)]
            g["mem"] = None
            return out
        return []

    def _finding(self, node: str, uuid: str, g: dict[str, Any], ts: int, active: bool) -> Finding:
        cond = g["mem"]
        summary = (
            f"{self.where(node, g)} has {100 * cond['ratio']:.1f}% of its memory in use"
            if active
            else f"{self.where(node, g)} memory use is back to {100 * cond['ratio']:.1f}%"
        )
        history = tuple((int(t), float(v)) for t, v in cond["points"])
        return self.limit_finding(node, uuid, g, ts, active, cond, summary=summary, history=history)
