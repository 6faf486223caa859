"""The instant rules' look at a record as it is read (issue 37.4): whether it may page at all, and
which alerts it may raise, before event-time alignment releases it to the ordered pass."""

from __future__ import annotations

import math
from typing import Any

from schemas.records import Event
from streams.detectors.base import LEADER_RANK

__all__ = ["INSTANT_RULES", "Lookahead", "early_key", "may_page"]

# Rules one record of one rank or one GPU decides alone, needing no peers (issue 37.4): the rank
# stage pages them as the record is read (`StageEngine.instant`), not once event-time alignment
# releases it; the ordered pass still decides every alert, and its copy of a paged one is not sent.
INSTANT_RULES = frozenset(
    {"xid_error", "ecc_uncorrectable", "nonfinite_loss", "nonfinite_grad", "rank_failed"}
)
# How many GPUs' uncorrectable-error counters the instant path remembers (a forged flood of GPU
# names clears it: at worst a few more looks ahead).
_MAX_COUNTERS = 100_000


def may_page(event: Event) -> bool:
    """Whether a record may raise an instant rule's alert (a look at a few fields): an XID or
    uncorrectable-error counters, a leader rank's non-finite loss or gradient norm, a rank fault.
    Most records are none of these."""
    kind, r = event.type, event.record
    if kind == "StepCompleted":
        return r.get("rank") == LEADER_RANK and (_bad(r.get("loss")) or _bad(r.get("grad_norm")))
    if kind == "GpuSample":
        return (
            r.get("xid") is not None
            or bool(r.get("ecc_uncorrected"))
            or bool(r.get("remapped_rows_uncorrectable"))
        )
    return kind == "RankFault"


class Lookahead:
    """Which instant alerts a record that `may_page` may raise; remembers each GPU's uncorrectable
    counters (bounded), since only an increase is news."""

    def __init__(self) -> None:
        self._counters: dict[tuple[Any, Any], tuple[Any, Any]] = {}  # GPU -> ECC counters last read

    def likely(self, event: Event) -> tuple[str, ...]:
        """The fingerprints of the instant alerts the record may raise."""
        kind, r = event.type, event.record
        if kind == "RankFault":
            return (f"rank_failed/{r.get('job_id')}/{r.get('rank')}",)
        if kind == "StepCompleted":
            if r.get("rank") != LEADER_RANK:
                return ()
            job = r.get("job_id")
            return tuple(
                f"nonfinite_{what}/{job}"
                for what, name in (("loss", "loss"), ("grad", "grad_norm"))
                if _bad(r.get(name))
            )
        if kind != "GpuSample":
            return ()
        gpu = f"{r.get('node')}/{r.get('gpu_uuid')}"
        out: tuple[str, ...] = (f"xid_error/{gpu}",) if r.get("xid") is not None else ()
        counters = (r.get("ecc_uncorrected"), r.get("remapped_rows_uncorrectable"))
        if any(counters):
            # Only an increase is news: look ahead when the counters changed since the last read.
            key = (r.get("node"), r.get("gpu_uuid"))
            if self._counters.get(key) != counters:
                if len(self._counters) >= _MAX_COUNTERS:
                    self._counters.clear()
                self._counters[key] = counters
                out += (f"ecc_uncorrectable/{gpu}",)
        return out


def early_key(routed: dict[str, Any]) -> tuple[Any, ...]:
    """What makes a routed alert record the same page: its firing, state, mute and receiver."""
    return (
        routed["alert_id"],
        routed["status"],
        routed.get("inhibited_by"),
        routed["team"],
        routed["receiver"],
    )


def _bad(value: Any) -> bool:
    """A value present and NaN or infinite."""
    return value is not None and not math.isfinite(value)
