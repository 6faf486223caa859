"""Rule `ecc_uncorrectable`: a GPU counted new uncorrectable ECC errors or row remappings.

Category `infra`, critical, identity node + GPU (plus one copy per other job on the node: see
`infra_signal.py`). The volatile counters `ecc_uncorrected` and `remapped_rows_uncorrectable` of
a GPU's samples: only an increase between two samples is news; it fires at once (further
increases update it). Resolves after `ecc_quiet_s` without a new error.
"""

from __future__ import annotations

from typing import Any, ClassVar

from streams.detectors.base import Finding
from streams.detectors.catalogue import catalogued
from streams.detectors.history import add_point, points_of
from streams.detectors.infra_signal import CHECK_DEFAULTS, GpuFaultDetector

__all__ = ["DEFAULTS", "EccUncorrectableDetector"]

DEFAULTS: dict[str, Any] = {
    "ecc_quiet_s": 300.0,  # an uncorrectable-ECC condition resolves after this long without a new error
    **CHECK_DEFAULTS,
}


ECC_UNCORRECTABLE = catalogued("ecc_uncorrectable")


class EccUncorrectableDetector(
    GpuFaultDetector, rule=ECC_UNCORRECTABLE, stage="rank", section="infrastructure"
):
    """New uncorrectable ECC errors per GPU."""

    slot: ClassVar[str] = "ecc"
    quiet_knob: ClassVar[str] = "ecc_quiet_s"

    def new_gpu(self) -> dict[str, Any]:
        """The counters of the last sample and the condition."""
        return {"ecc_last": None, "rows_last": None, "ecc": None}

    def sample(self, node: str, uuid: str, g: dict[str, Any], r: dict[str, Any]) -> list[Finding]:
        """Compare the counters with the GPU's previous sample."""
        ts = r["ts"]
        ecc, rows = r.get("ecc_uncorrected"), r.get("remapped_rows_uncorrectable")
        inc = 0
        if ecc is not None and g["ecc_last"] is not None and ecc > g["ecc_last"]:
            inc += int(ecc - g["ecc_last"])
        if rows is not None and g["rows_last"] is not None and rows > g["rows_last"]:
            inc += int(rows - g["rows_last"])
        g["ecc_last"] = ecc if ecc is not None else g["ecc_last"]
        g["rows_last"] = rows if rows is not None else g["rows_last"]
        if not inc:
            return []
        cond = g["ecc"]
        if cond is None:
            cond = g["ecc"] = {"since": ts, "n": 0, "emit": ts}
        cond["n"] += inc
        cond["last"] = cond["emit"] = ts
        cond["total"] = ecc
        return self.shared(self.finding(node, uuid, g, ts, True), node, cond)

    def finding(self, node: str, uuid: str, g: dict[str, Any], ts: int, active: bool) -> Finding:
        """The ECC finding of GPU `g`."""
        cond = g["ecc"]
        history = add_point(cond, ts, float(cond["n"])) if active else points_of(cond)
        summary = (
            f"{self.where(node, g)} had {cond['n']} new uncorrectable ECC error(s) or row remapping(s)"
            if active
            else f"{self.where(node, g)} had no new uncorrectable ECC error for {self.quiet_ms // 1000}s"
        )
        return self.gpu_finding(
            ECC_UNCORRECTABLE,
            node,
            uuid,
            g,
            ts,
            active=active,
            since=cond["since"],
            observed=float(cond["n"]),
            expected=0.0,
            summary=summary,
            history_metric="ecc_uncorrected",
            history=history,
            sustain_ms=0,
        )
