"""Rule `xid_error`: a GPU's driver reported an XID error.

Category `infra`, identity node + GPU (plus one copy per other job on the node: see
`infra_signal.py`). A GpuSample with `xid` set fires at once; critical for the XID classes in
`xid_critical` (48 DBE, 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 94/95
contained/uncontained ECC), warning otherwise. A new code, or the same one after `reemit_s`,
reports again. Resolves after `xid_quiet_s` without another XID.
"""

from __future__ import annotations

from typing import Any, ClassVar

from streams.detectors.base import Finding, Severity, Topology
from streams.detectors.catalogue import catalogued
from streams.detectors.history import add_point, points_of
from streams.detectors.infra_signal import CHECK_DEFAULTS, GpuFaultDetector

__all__ = ["DEFAULTS", "XidErrorDetector"]

DEFAULTS: dict[str, Any] = {
    "xid_critical": [48, 63, 64, 74, 79, 94, 95],  # XID codes reported as critical
    "xid_quiet_s": 300.0,  # an XID condition resolves after this long without another XID
    "reemit_s": 60.0,  # re-report an active condition at most this often
    **CHECK_DEFAULTS,
}


XID_ERROR = catalogued("xid_error")


class XidErrorDetector(GpuFaultDetector, rule=XID_ERROR, stage="rank", section="infrastructure"):
    """XID errors per GPU."""

    slot: ClassVar[str] = "xid"
    quiet_knob: ClassVar[str] = "xid_quiet_s"

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        self._critical = {int(x) for x in self.p["xid_critical"]}
        self._reemit = int(float(self.p["reemit_s"]) * 1000)

    def new_gpu(self) -> dict[str, Any]:
        """No XID condition yet."""
        return {"xid": None}

    def sample(self, node: str, uuid: str, g: dict[str, Any], r: dict[str, Any]) -> list[Finding]:
        """A sample carries the XID code at the moment of the event."""
        xid, ts = r.get("xid"), r["ts"]
        if xid is None:
            return []
        cond = g["xid"]
        if cond is None or cond["code"] != xid or ts - cond["emit"] >= self._reemit:
            if cond is None:
                cond = g["xid"] = {"since": ts, "code": xid, "n": 0, "emit": ts}
            cond.update(code=xid, last=ts, emit=ts)
            cond["n"] += 1
            return self.shared(self.finding(node, uuid, g, ts, True), node, cond)
        cond["last"] = ts
        cond["n"] += 1
        return []

    def finding(self, node: str, uuid: str, g: dict[str, Any], ts: int, active: bool) -> Finding:
        """The XID finding of GPU `g`."""
        cond = g["xid"]
        code = int(cond["code"])
        history = add_point(cond, ts, float(code)) if active else points_of(cond)
        severity: Severity = "critical" if code in self._critical else "warning"
        summary = (
            f"{self.where(node, g)} reported XID {code}"
            if active
            else f"{self.where(node, g)} reported no XID for {self.quiet_ms // 1000}s (last: XID {code})"
        )
        return self.gpu_finding(
            XID_ERROR,
            node,
            uuid,
            g,
            ts,
            active=active,
            severity=severity,
            since=cond["since"],
            observed=float(code),
            summary=summary,
            history_metric="xid",
            history=history,
            sustain_ms=0,
        )
