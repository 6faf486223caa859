"""Rule `gpu_throttling`: a GPU is slowed by a thermal or power limit.

Category `infra`, warning, identity node + GPU. A clock-event reason in `throttle_mask` (SW power
cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power brake 0x80; GPU idle 0x1 and
application clocks 0x2 are ignored) with the SM clock below `throttle_clock_ratio` x its maximum;
the alert fires once that lasts `throttle_sustain_s` and resolves on the first sample without it.

Learned per GPU class (issue 35.1, `class_normals.py`): a class run under a power cap by design
(an L4, a capped H100 fleet) reports a counted reason at a lower clock on every healthy run. The
median over healthy completed runs of the class of each run's 5th-percentile SM clock ratio while a
counted reason was set, less `throttle_learn_margin` (at least `throttle_learn_min`), replaces
`throttle_clock_ratio` for that class once `throttle_learn_runs` runs taught it, when it is lower
and `throttle_clock_ratio` is at its shipped value (no config or override set it).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from streams.detectors.base import Finding, Topology
from streams.detectors.catalogue import catalogued
from streams.detectors.class_normals import LearningGpuDetector

__all__ = ["DEFAULTS", "THROTTLE_REASONS", "GpuThrottlingDetector"]

DEFAULTS: dict[str, Any] = {
    "throttle_mask": 0xEC,  # clock-event reason bits that count as throttling (0x4|0x8|0x20|0x40|0x80)
    "throttle_clock_ratio": 0.85,  # ... and only while the SM clock is below this x its maximum
    "throttle_sustain_s": 120.0,  # throttling must last this long to fire
    "throttle_learn_runs": 3,  # healthy completed runs of a GPU class before its learned clock ratio is used
    "throttle_learn_margin": 0.03,  # learned ratio: healthy runs' low clock ratio less this...
    "throttle_learn_min": 0.5,  # ...never below this
}

# Clock-event reason bits, from NVML's nvmlClocksEventReason* constants.
THROTTLE_REASONS: dict[int, str] = {
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake",
}

_POINTS = 8  # SM clock ratios carried on a finding


GPU_THROTTLING = catalogued("gpu_throttling")


class GpuThrottlingDetector(LearningGpuDetector, rule=GPU_THROTTLING, stage="rank", section="infrastructure"):
    """Thermal and power throttling per GPU."""

    learned_knob: ClassVar[str] = "throttle_clock_ratio"  # throttled: the SM clock below this ratio
    learns: ClassVar[Literal["max", "low"]] = "low"  # healthy runs' low clock ratio less the margin
    learn_prefix: ClassVar[str] = "throttle"
    history_metric: ClassVar[str] = "sm_clock_ratio"

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        self._mask = int(self.p["throttle_mask"])

    def new_gpu(self) -> dict[str, Any]:
        """The condition and the recent SM clock ratios."""
        return {"thr": None, "clock": []}

    def sample(self, node: str, uuid: str, g: dict[str, Any], r: dict[str, Any]) -> list[Finding]:
        """Throttled: a counted reason and the SM clock below the ratio (reported on every such sample)."""
        ts = r["ts"]
        reasons = int(r.get("clock_event_reasons") or 0) & self._mask
        clock, clock_max = r.get("sm_clock_mhz"), r.get("sm_clock_max_mhz")
        ratio = clock / clock_max if clock is not None and clock_max else None
        if ratio is not None:
            g["clock"] = [*g["clock"], [ts, round(ratio, 4)]][-_POINTS:]
        job_id = self.gpu_identity(node, uuid)[0]
        job = self.topology.jobs.get(job_id) if job_id else None
        if reasons and ratio is not None and job is not None and job.state == "running":
            self.normals.add(job_id, ratio)
        limit, why = self.limit(job.gpu_class if job is not None else "")
        throttled = bool(reasons) and ratio is not None and ratio < limit
        cond = g["thr"]
        if throttled:
            if cond is None:
                cond = g["thr"] = {"since": ts}
            cond.update(reasons=reasons, ratio=ratio, clock=clock, clock_max=clock_max, limit=limit, why=why)
            return [self._finding(node, uuid, g, ts, True)]
        if cond is not None:
            out = [self._finding(node, uuid, g, ts, False)]
            g["thr"] = None
            return out
        return []

    def _finding(self, node: str, uuid: str, g: dict[str, Any], ts: int, active: bool) -> Finding:
        cond = g["thr"]
        names = ", ".join(name for bit, name in sorted(THROTTLE_REASONS.items()) if cond["reasons"] & bit)
        summary = (
            f"{self.where(node, g)} is throttled ({names}): SM clock {cond['clock']} of {cond['clock_max']} MHz"
            if active
            else f"{self.where(node, g)} is no longer throttled"
        )
        history = tuple((int(t), float(v)) for t, v in g["clock"])
        return self.limit_finding(node, uuid, g, ts, active, cond, summary=summary, history=history)
