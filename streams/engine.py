"""The detection engine: one event in, alerts and derived window statistics out, in event time.

`DetectionEngine.process(event, received_ts=...)` first bounds the event's time: a record stamped
outside 2000..2200, or more than `max_clock_skew_s` ahead of its reference time, is *rejected*
(`engine.rejection` names the reason, `engine.stats["rejected"]` counts it, the `clock_skew` rule
names its source) and neither moves the watermark nor reaches a detector. The reference is the
record's Kafka timestamp when the caller passes one; offline it is the latest accepted event
time, and a jump beyond it is accepted only when `clock_jump_sources` sources agree on it (a gap in
a replay), never on one source's word (a node whose clock jumped). An accepted record moves the
watermark (max event time - allowed lateness); records older than it are dropped as late.
Values no producer can measure are made unknown (`streams.detectors.validate`); then the shared
topology is updated, every detector observes the event and, when the watermark moved, advances;
findings go through the alert state machine and the router.
The engine is pure (no Kafka, no clock) and deterministic: the same events in the same order
give byte-identical outputs and snapshots, so a Faust worker can snapshot it into a changelog
table and an offline replay reproduces production alerts.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

from schemas.records import Event
from streams.alerting.grouping import AlertGrouper
from streams.alerting.lifecycle import AlertTracker, JobProgress
from streams.alerting.routing import Router, load_router
from streams.config import EngineConfig, detector_section
from streams.detectors import ALL_DETECTORS
from streams.detectors.base import Detector, Finding, Topology, dumps_state, loads_state
from streams.detectors.clock import ClockDetector, source_of
from streams.detectors.validate import clean
from streams.errors import StreamsError

__all__ = [
    "JUMP_RECORDS",
    "MAX_EVENT_TS",
    "MIN_EVENT_TS",
    "REJECT_REASONS",
    "SNAPSHOT_VERSION",
    "DetectionEngine",
    "event_ts",
]

SNAPSHOT_VERSION = 1
_DERIVED = ("RankWindowStats", "JobWindowStats")

# Event times outside 2000-01-01 .. 2200-01-01 are clocks reset to the epoch or seconds sent as
# milliseconds; the sink refuses the same range (`sinks.rows`).
MIN_EVENT_TS = 946_684_800_000
MAX_EVENT_TS = 7_258_118_400_000

# Offline, this many records in a row ahead of every accepted time (nothing believable between
# them, all within the skew of each other) confirm a jump even from one source: the stream moved.
JUMP_RECORDS = 64

# Why `process` rejected a record (`engine.rejection`); the caller dead-letters it with the reason.
REJECT_REASONS = ("out_of_range", "clock_ahead", "clock_behind")


def event_ts(event: Event) -> int:
    """Event time of any ranksight record (window records: the window end)."""
    r = event.record
    ts = r.get("ts")
    if ts is None:
        ts = r.get("window_end", 0)
    return int(ts)


class DetectionEngine:
    """Every detector over one shared topology, an alert tracker and a router."""

    def __init__(self, config: EngineConfig | None = None, router: Router | None = None) -> None:
        self.config = config if config is not None else EngineConfig.default()
        self.router = router if router is not None else load_router()
        self.topology = Topology()
        self.detectors: list[Detector] = [
            cls(self.topology, self.config.params_for(cls)) for cls in ALL_DETECTORS
        ]
        # Detectors that produce derived events (window statistics) expose `drain_derived()`.
        self._drainers = [d.drain_derived for d in self.detectors if hasattr(d, "drain_derived")]
        self.tracker = AlertTracker(self.router.runbook_base_url or self.config.runbook_base_url)
        self.grouper = AlertGrouper(self.router.inhibit_rules, self.topology)
        self.progress: dict[str, JobProgress] = {}
        self.max_ts: int | None = None
        self.watermark: int | None = None
        self._advanced_to: int | None = None  # last watermark bucket the detectors advanced to
        self._disabled = frozenset(self.config.disabled_rules)
        self._clock = next(d for d in self.detectors if isinstance(d, ClockDetector))
        self._skew_ms = self.config.max_clock_skew_ms
        # 0 switches the "too old for its Kafka time" check off (the default: see detectors.yaml).
        self._max_age_ms = self.config.max_record_age_ms or 10**15
        # Offline: a run of records ahead of every accepted time ({"first": ts, "sources": [...]}).
        self._jump: dict[str, Any] | None = None
        self.stats: dict[str, Any] = _empty_stats()
        # Why the last `process` call rejected its record (one of REJECT_REASONS), None if it did not.
        self.rejection: str | None = None

    # -- the per-event path ------------------------------------------------------------
    def process(self, event: Event, *, received_ts: int | None = None) -> list[Event]:
        """Take one event; return the Alert and derived events it caused, in order.

        `received_ts` is when the record reached Kafka (its record timestamp, UTC ms), if known.
        A record whose time is impossible is rejected: nothing happens but counting it, and
        `self.rejection` says why (None after an accepted or late record).
        """
        ts = event_ts(event)
        if received_ts is not None and received_ts < MIN_EVENT_TS:
            received_ts = None  # Kafka's "no timestamp" (-1) or a producer's own broken clock
        # The common case inline (this runs for every record); `_time_verdict` decides the rest.
        if received_ts is not None:
            believable = received_ts - self._max_age_ms <= ts <= received_ts + self._skew_ms
        else:
            believable = self._jump is None and self.max_ts is not None and ts <= self.max_ts + self._skew_ms
        if believable and MIN_EVENT_TS <= ts < MAX_EVENT_TS:
            reason = None
        else:
            reason = self._time_verdict(event, ts, received_ts)
        self.rejection = reason
        if reason is not None:
            rejected = self.stats["rejected"]
            rejected[reason] = rejected.get(reason, 0) + 1
            self._clock.rejected(event, received_ts if received_ts is not None else self.max_ts)
            return []
        if self.watermark is not None and ts < self.watermark:
            self.stats["late_dropped"] += 1
            return []
        self.stats["events"] += 1
        if self.max_ts is None or ts > self.max_ts:
            self.max_ts = ts
        event, fixed = clean(event)
        if fixed:
            invalid = self.stats["invalid_values"]
            for name in fixed:
                field_key = f"{event.type}.{name}"
                invalid[field_key] = invalid.get(field_key, 0) + 1
        out: list[Event] = []
        self.topology.observe(event)
        if event.type == "StepCompleted":
            self._progress(event.record)
        findings: list[Finding] = []
        for det in self.detectors:
            found = det.observe(event)
            if found:
                findings.extend(found)
        if findings:
            self._handle(findings, out)
        if event.type == "JobStateChanged" and event.record["state"] in self.config.job_end_states:
            self._end_job(event.record["job_id"], ts, out)
        self._move_watermark(self.max_ts - self.config.allowed_lateness_ms, out)
        return out

    def advance(self, watermark: int) -> list[Event]:
        """Move event time forward without an event (e.g. a wall-clock guard); return what it caused."""
        out: list[Event] = []
        self._move_watermark(watermark, out)
        return out

    def finish(self) -> list[Event]:
        """End of a finite input: advance to the last event time (no resolutions are invented)."""
        if self.max_ts is None:
            return []
        out: list[Event] = []
        self._move_watermark(self.max_ts, out, force=True)
        return out

    def run(self, events: Iterable[Event]) -> list[Event]:
        """Process every event and finish; every output event, in order."""
        out: list[Event] = []
        for event in events:
            out.extend(self.process(event))
        out.extend(self.finish())
        return out

    # -- internals ---------------------------------------------------------------------
    def _time_verdict(self, event: Event, ts: int, received_ts: int | None) -> str | None:
        """None when the event time is believable, else the reason to reject the record."""
        if not MIN_EVENT_TS <= ts < MAX_EVENT_TS:
            return "out_of_range"
        skew = self.config.max_clock_skew_ms
        if received_ts is not None:
            if ts > received_ts + skew:
                return "clock_ahead"
            return "clock_behind" if ts < received_ts - self._max_age_ms else None
        if self.max_ts is None or ts <= self.max_ts + skew:
            self._jump = None  # a believable record ends any run of records from the future
            return None
        # Ahead of everything accepted: one bad clock, or the stream itself jumped (a gap in a
        # replay). Only several sources (or many records) ahead in a row, agreeing within the
        # skew, make a jump.
        source = source_of(event, self.topology)[0]
        run = self._jump
        if run is None or abs(ts - run["first"]) > skew:
            run = self._jump = {"first": ts, "sources": [], "records": 0}
        if source not in run["sources"]:
            run["sources"].append(source)
        run["records"] += 1
        if len(run["sources"]) < self.config.clock_jump_sources and run["records"] < JUMP_RECORDS:
            return "clock_ahead"
        # The jump is genuine: its first records were rejected (and counted) but are no clock fault.
        self._clock.forget_unreported(run["sources"])
        self._jump = None
        self.stats["time_jumps"] += 1
        return None

    def _progress(self, r: dict[str, Any]) -> None:
        prog = self.progress.setdefault(r["job_id"], JobProgress())
        if prog.step is None or r["step"] >= prog.step:
            prog.step = int(r["step"])
        if prog.ts is None or r["ts"] > prog.ts:
            prog.ts = int(r["ts"])

    def _move_watermark(self, watermark: int, out: list[Event], *, force: bool = False) -> None:
        if self.watermark is not None and watermark <= self.watermark and not force:
            return
        if self.watermark is None or watermark > self.watermark:
            self.watermark = watermark
        wm = self.watermark
        # Detectors advance at most once per `advance_every_ms` of event time: a busy stream
        # moves the watermark on nearly every event, and per-second resolution is plenty.
        bucket = wm // self.config.advance_every_ms
        if not force and self._advanced_to is not None and bucket <= self._advanced_to:
            return
        self._advanced_to = bucket
        findings: list[Finding] = []
        for det in self.detectors:
            findings.extend(det.advance(wm))
        self._handle(findings, out)
        self._emit_alerts(self.tracker.advance(wm, self.topology, self.progress), out)

    def _handle(self, findings: list[Finding], out: list[Event]) -> None:
        """Findings -> alert records, plus derived events the detectors produced (fed back in)."""
        # Root causes first, so a symptom settled in the same batch is linked to its root.
        pending = sorted(findings, key=self.grouper.order)
        while True:
            for finding in pending:
                if finding.rule in self._disabled:
                    continue
                if finding.active and finding.job_id:
                    job = self.topology.jobs.get(finding.job_id)
                    if job is not None and job.state in self.config.job_end_states:
                        continue  # the job is over: nothing left to alert on
                self._emit_alerts(self.tracker.observe(finding, self.topology, self.progress), out)
            derived = self._drain_derived()
            if not derived:
                return
            pending = []
            for event in derived:
                if event.type == "JobWindowStats":
                    r = event.record
                    r["healthy"] = self.tracker.job_healthy(r["job_id"], r["window_start"])
                self.stats["derived"] += 1
                out.append(event)
                for det in self.detectors:
                    pending.extend(det.observe(event))
            pending.sort(key=self.grouper.order)

    def _drain_derived(self) -> list[Event]:
        derived: list[Event] = []
        for drain in self._drainers:
            derived.extend(drain())
        return derived

    def _emit_alerts(self, records: list[dict[str, Any]], out: list[Event]) -> None:
        self.grouper.annotate(records)
        for record in records:
            by_rule = self.stats["by_rule"].setdefault(record["rule"], {"firing": 0, "resolved": 0})
            by_rule[record["status"]] += 1
            self.stats["alerts_firing" if record["status"] == "firing" else "alerts_resolved"] += 1
            for team, receiver in self.router.route_all(record):
                out.append(Event("Alert", {**record, "team": team, "receiver": receiver}))

    def _end_job(self, job_id: str, ts: int, out: list[Event]) -> None:
        self._emit_alerts(self.tracker.end_job(job_id, ts, self.topology, self.progress), out)
        for det in self.detectors:
            det.forget_job(job_id)
        self.tracker.forget_job(job_id)
        self.progress.pop(job_id, None)

    # -- queries -----------------------------------------------------------------------
    def firing(self) -> list[str]:
        """Fingerprints of alerts firing now."""
        return self.tracker.firing()

    def baselines(self) -> list[dict[str, Any]]:
        """Performance baselines learned so far (one dict per baseline key and metric)."""
        out: list[dict[str, Any]] = []
        for det in self.detectors:
            fn = getattr(det, "baselines", None)
            if fn is not None:
                out.extend(fn())
        return out

    # -- snapshots ---------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """The whole engine state as deterministic, compressed bytes."""
        state = {
            "version": SNAPSHOT_VERSION,
            "max_ts": self.max_ts,
            "watermark": self.watermark,
            "advanced_to": self._advanced_to,
            "jump": self._jump,
            "stats": self.stats,
            "topology": self.topology.state(),
            "progress": {k: [p.step, p.ts] for k, p in sorted(self.progress.items())},
            "tracker": self.tracker.state(),
            "grouper": self.grouper.state(),
            "detectors": {detector_section(type(d)): d.state() for d in self.detectors},
        }
        return zlib.compress(dumps_state(state), 6)

    @classmethod
    def restore(
        cls, data: bytes, config: EngineConfig | None = None, router: Router | None = None
    ) -> DetectionEngine:
        """An engine continuing exactly where `snapshot()` left off."""
        try:
            state = loads_state(zlib.decompress(data))
        except (zlib.error, ValueError) as exc:
            raise StreamsError(
                f"engine snapshot is corrupt ({exc}); delete it to start from empty state"
            ) from None
        if state.get("version") != SNAPSHOT_VERSION:
            raise StreamsError(
                f"engine snapshot version {state.get('version')} is not supported (expected {SNAPSHOT_VERSION}); "
                "delete it to start from empty state"
            )
        engine = cls(config, router)
        engine.max_ts = state["max_ts"]
        engine.watermark = state["watermark"]
        engine._advanced_to = state["advanced_to"]
        engine._jump = state.get("jump")
        engine.stats = {**_empty_stats(), **state["stats"]}
        topo = Topology.from_state(state["topology"])
        # Detectors hold a reference to the topology: update it in place.
        engine.topology.jobs, engine.topology.bindings = topo.jobs, topo.bindings
        engine.topology._by_gpu = topo._by_gpu
        engine.progress = {k: JobProgress(v[0], v[1]) for k, v in state["progress"].items()}
        engine.tracker.load_state(state["tracker"])
        engine.grouper.load_state(state.get("grouper", {}))
        for det in engine.detectors:
            section = detector_section(type(det))
            if section in state["detectors"]:
                det.load_state(state["detectors"][section])
        return engine


def _empty_stats() -> dict[str, Any]:
    return {
        "events": 0,
        "late_dropped": 0,
        "rejected": {},  # reason -> records rejected for their timestamp
        "time_jumps": 0,  # offline: jumps of event time confirmed by several sources
        "invalid_values": {},  # "Type.field" -> values no producer can measure, made unknown
        "derived": 0,
        "alerts_firing": 0,
        "alerts_resolved": 0,
        "by_rule": {},
    }
