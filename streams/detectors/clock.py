"""Bad clocks: `clock_skew` names the node (or job rank) whose records carry impossible timestamps.

The engine rejects a record stamped more than `engine.max_clock_skew_s` ahead of its reference
time (its Kafka timestamp, or the latest accepted event time offline) or outside 2000..2200, so
that it can neither move the watermark nor reach a detector. It reports every rejection here.
A source (the record's node; for training records without a node, the rank's bound node, else
the job's rank) with rejected records has its clock off: the condition holds while such records
keep arriving and resolves once none came for `quiet_s` of event time.

Findings are stamped with the watermark, never with the bogus timestamp, so the alert's own times
are ones the pipeline really reached.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Detector, Finding, drop_nodes
from streams.detectors.catalogue import catalogued

__all__ = ["DEFAULTS", "ClockDetector", "source_of"]

DEFAULTS: dict[str, Any] = {
    "quiet_s": 300.0,  # the condition resolves after this much event time without a rejected record
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
}


def source_of(event: Event, topology: Any) -> tuple[str, str | None, str, int | None]:
    """(source key, node, job id, rank) of a record: whose clock stamped it."""
    r = event.record
    node = r.get("node")
    job_id = r.get("job_id") or ""
    rank = r.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool):
        rank = None
    if not node and job_id and rank is not None:
        binding = topology.bindings.get((job_id, rank))
        node = binding.node if binding is not None else None
    if node:
        return f"node:{node}", str(node), str(job_id), rank
    if job_id:
        return f"job:{job_id}:{rank if rank is not None else '-'}", None, str(job_id), rank
    return "unknown", None, "", None


def _span(ms: float) -> str:
    """An offset in words a person reads at a glance: 42 s, 3.5 h, 12.0 days, 172.9 years."""
    s = abs(ms) / 1000.0
    if s < 120:
        return f"{s:.0f} s"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    if s < 365 * 86400:
        return f"{s / 86400:.1f} days"
    return f"{s / (365.25 * 86400):,.1f} years"


def _iso(ts: int) -> str:
    try:
        return dt.datetime.fromtimestamp(ts / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{ts} ms"


CLOCK_SKEW = catalogued("clock_skew")


class ClockDetector(Detector, rule=CLOCK_SKEW, stage="rank"):
    """Tracks sources whose records the engine rejected for their timestamps."""

    reads: ClassVar[frozenset[str] | None] = frozenset()  # told of rejected records (`rejected`), no others

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self._quiet_ms = int(float(p["quiet_s"]) * 1000)
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)
        # source -> {node, job_id, rank, ts, offset_ms, count, last, since, emit}
        self._sources: dict[str, dict[str, Any]] = {}

    def rejected(self, event: Event, reference: int | None) -> None:
        """The engine rejected `event` for its timestamp; `reference` is the time it held it against."""
        key, node, job_id, rank = source_of(event, self.topology)
        ts = int(event.record.get("ts", event.record.get("window_end", 0)))
        src = self._sources.get(key)
        if src is None:
            src = self._sources[key] = {
                "node": node,
                "job_id": job_id,
                "rank": rank,
                "count": 0,
                "since": None,
                "emit": None,
            }
        src["count"] += 1
        src["ts"] = ts
        src["offset_ms"] = ts - reference if reference is not None else None
        src["last"] = reference  # None: stamped at the next advance

    def forget_unreported(self, keys: list[str]) -> None:
        """Those sources' rejected records were the start of a genuine jump of event time."""
        for key in keys:
            src = self._sources.get(key)
            if src is not None and src["since"] is None:
                del self._sources[key]

    def advance(self, watermark: int) -> list[Finding]:
        """Report sources with fresh rejections; resolve those quiet for `quiet_s`."""
        out: list[Finding] = []
        for key in sorted(self._sources):
            src = self._sources[key]
            if src["last"] is None or src["last"] > watermark:
                src["last"] = watermark
            if src["since"] is not None and watermark - src["last"] >= self._quiet_ms:
                out.append(self._finding(key, src, watermark, False))
                del self._sources[key]
                continue
            if src["since"] is None:
                src["since"] = watermark
            elif src["emit"] is not None and watermark - src["emit"] < self._reemit_ms:
                continue
            src["emit"] = watermark
            out.append(self._finding(key, src, watermark, True))
        return out

    def _finding(self, key: str, src: dict[str, Any], wm: int, active: bool) -> Finding:
        who = f"node {src['node']}" if src["node"] else f"job {src['job_id']} rank {src['rank']}"
        if src["node"] and src["job_id"]:
            who += f" (job {src['job_id']})"
        offset = src["offset_ms"]
        if active:
            when = _iso(src["ts"])
            if offset is not None:
                direction = "ahead of" if offset > 0 else "behind"
                summary = (
                    f"{who} sends records stamped {when}, {_span(offset)} {direction} "
                    f"the time they arrived; {src['count']} record(s) rejected: check its clock (NTP/chrony)"
                )
            else:
                summary = (
                    f"{who} sends records stamped {when}, outside the event time of its peers; "
                    f"{src['count']} record(s) rejected: check its clock (NTP/chrony)"
                )
        else:
            summary = f"{who}: no record with an impossible timestamp for {self._quiet_ms // 1000} s"
        return CLOCK_SKEW.finding(
            key=(key,),
            active=active,
            ts=wm,
            job_id=src["job_id"],
            node=src["node"],
            rank=src["rank"],
            since=src["since"],
            observed=round(offset / 1000.0, 3) if offset is not None and active else None,
            expected=0.0 if active else None,
            summary=summary,
        )

    def forget_nodes(self, nodes: frozenset[str]) -> None:
        """Drop evicted nodes' clocks."""
        drop_nodes(self._sources, nodes, prefix="node:")

    def state(self) -> dict[str, Any]:
        """JSON-able state: the sources with rejected records."""
        return {"sources": {k: self._sources[k] for k in sorted(self._sources)}}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._sources = {k: dict(v) for k, v in state.get("sources", {}).items()}
