"""Rule `gpu_memory_pressure`: a GPU's device memory is nearly full.

Category `infra`, warning, identity node + GPU. Used / total device memory above `gpu_mem_ratio`;
the alert fires once that lasts `gpu_mem_sustain_s` and resolves on the first sample below it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from streams.detectors.base import Finding, Topology
from streams.detectors.catalogue import Rule
from streams.detectors.infra_signal import GpuDetector

__all__ = ["DEFAULTS", "GpuMemoryPressureDetector"]

DEFAULTS: dict[str, Any] = {
    "gpu_mem_ratio": 0.97,  # device memory used / total above this is pressure
    "gpu_mem_sustain_s": 60.0,  # ... for this long
}

_POINTS = 8  # memory ratios carried on a finding


GPU_MEMORY_PRESSURE = Rule(
    "gpu_memory_pressure",
    category="infra",
    severity="warning",
    invariant="GPU memory in use stays below {ratio_pct:g}% of total",
    suspected_layer="gpu",
)


class GpuMemoryPressureDetector(GpuDetector):
    """Device memory pressure per GPU."""

    section: ClassVar[str] = "infrastructure"
    stage: ClassVar[str] = "rank"
    rules: ClassVar[tuple[str, ...]] = ("gpu_memory_pressure",)

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        self._ratio = float(self.p["gpu_mem_ratio"])
        self._sustain = int(float(self.p["gpu_mem_sustain_s"]) * 1000)

    defaults: ClassVar[dict[str, Any]] = DEFAULTS

    def new_gpu(self) -> dict[str, Any]:
        """No condition yet."""
        return {"mem": None}

    def sample(self, node: str, uuid: str, g: dict[str, Any], r: dict[str, Any]) -> list[Finding]:
        """Memory in use above the ratio (reported on every such sample)."""
        used, total = r.get("mem_used_bytes"), r.get("mem_total_bytes")
        if used is None or not total:
            return []
        ratio = used / total
        cond = g["mem"]
        if ratio > self._ratio:
            if cond is None:
                cond = g["mem"] = {"since": r["ts"], "points": []}
            cond["ratio"] = ratio
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
        return self.gpu_finding(
            GPU_MEMORY_PRESSURE,
            node,
            uuid,
            g,
            ts,
            active=active,
            since=cond["since"],
            invariant=GPU_MEMORY_PRESSURE.says(ratio_pct=100 * self._ratio),
            observed=cond["ratio"],
            expected=self._ratio,
            summary=summary,
            history_metric="gpu_mem_used_ratio",
            history=tuple((int(t), float(v)) for t, v in cond["points"]),
            sustain_ms=self._sustain,
        )
