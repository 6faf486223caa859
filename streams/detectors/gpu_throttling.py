"""Rule `gpu_throttling`: a GPU is slowed by a thermal or power limit.

Category `infra`, warning, identity node + GPU. A clock-event reason in `throttle_mask` (SW power
cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power brake 0x80; GPU idle 0x1 and
application clocks 0x2 are ignored) with the SM clock below `throttle_clock_ratio` x its maximum;
the alert fires once that lasts `throttle_sustain_s` and resolves on the first sample without it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from streams.detectors.base import Finding, Topology
from streams.detectors.catalogue import Rule
from streams.detectors.infra_signal import GpuDetector

__all__ = ["DEFAULTS", "THROTTLE_REASONS", "GpuThrottlingDetector"]

DEFAULTS: dict[str, Any] = {
    "throttle_mask": 0xEC,  # clock-event reason bits that count as throttling (0x4|0x8|0x20|0x40|0x80)
    "throttle_clock_ratio": 0.85,  # ... and only while the SM clock is below this x its maximum
    "throttle_sustain_s": 120.0,  # throttling must last this long to fire
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


GPU_THROTTLING = Rule(
    "gpu_throttling",
    category="infra",
    severity="warning",
    invariant="no thermal or power throttling with the SM clock below {ratio_pct:g}% of max",
    suspected_layer="gpu",
)


class GpuThrottlingDetector(GpuDetector):
    """Thermal and power throttling per GPU."""

    section: ClassVar[str] = "infrastructure"
    stage: ClassVar[str] = "rank"
    rules: ClassVar[tuple[str, ...]] = ("gpu_throttling",)

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        self._mask = int(self.p["throttle_mask"])
        self._ratio = float(self.p["throttle_clock_ratio"])
        self._sustain = int(float(self.p["throttle_sustain_s"]) * 1000)

    defaults: ClassVar[dict[str, Any]] = DEFAULTS

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
        throttled = bool(reasons) and ratio is not None and ratio < self._ratio
        cond = g["thr"]
        if throttled:
            if cond is None:
                cond = g["thr"] = {"since": ts}
            cond.update(reasons=reasons, ratio=ratio, clock=clock, clock_max=clock_max)
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
        return self.gpu_finding(
            GPU_THROTTLING,
            node,
            uuid,
            g,
            ts,
            active=active,
            since=cond["since"],
            invariant=GPU_THROTTLING.says(ratio_pct=100 * self._ratio),
            observed=cond["ratio"],
            expected=self._ratio,
            summary=summary,
            history_metric="sm_clock_ratio",
            history=tuple((int(t), float(v)) for t, v in g["clock"]),
            sustain_ms=self._sustain,
        )
