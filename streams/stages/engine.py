"""The stage engine: one stage's detectors over one event at a time, alerts and derived statistics out.

`StageEngine.process(event, received_ts=...)` first bounds the event's time: a record stamped
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
give byte-identical outputs and snapshots, so the worker snapshots it into a changelog table and
an offline replay (`streams.offline.detection`) reproduces production alerts.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import logging
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from schemas.eventtime import MAX_EVENT_TS, MIN_EVENT_TS, event_ts
from schemas.records import Event
from streams.alerting.grouping import AlertGrouper
from streams.alerting.lifecycle import AlertTracker
from streams.alerting.routing import Router, load_router
from streams.config import EngineConfig, state_key
from streams.detectors import ALL_DETECTORS
from streams.detectors.base import LEADER_RANK, Detector, Finding, Topology, dumps_state, loads_state
from streams.detectors.clock import ClockDetector, source_of
from streams.detectors.validate import clean
from streams.errors import StreamsError
from streams.overrides import build_detector, detector_class
from streams.stages.instant import INSTANT_RULES, Lookahead, early_key, may_page
from streams.stages.order import FORWARDED, JOB_LEVEL, tiebreak
from streams.stages.summary import RankSummarizer

__all__ = [
    "INSTANT_RULES",
    "JOB_LEVEL",
    "JUMP_RECORDS",
    "LEADER_RANK",
    "SNAPSHOT_VERSION",
    "StageEngine",
    "empty_stats",
    "pack_snapshot",
    "stage_of",
    "tiebreak",
    "unpack_snapshot",
]

log = logging.getLogger("ranksight.worker")

# 3: a job's step is the topology's pace, rank placements its bindings (no "progress", no
# summarizer "placed"); 2: one engine per stage (rank / job); 1 was one engine for everything.
SNAPSHOT_VERSION = 3
# Versions `restore` reads: a version 2 snapshot's extra fields are what version 3 reads elsewhere
# (the pace and the bindings travel in its topology), so it restores as it is.
_READABLE = frozenset({2, SNAPSHOT_VERSION})
_DERIVED = ("RankWindowStats", "JobWindowStats")


# Offline, this many records in a row ahead of every accepted time (nothing believable between
# them, all within the skew of each other) confirm a jump even from one source: the stream moved.
JUMP_RECORDS = 64


# Offline (no Kafka timestamps), one engine judges every record's time against the newest accepted
# one, as the single engine did, before the stages see it: the "gate". It raises clock_skew.
_GATE_RULES = frozenset({"clock_skew"})


def stage_of(cls: type[Detector]) -> str:
    """The stage a detector class runs in (its `stage`)."""
    if cls.stage not in ("rank", "job"):
        raise StreamsError(f"detector {cls.__name__} names no stage (stage = 'rank' or 'job')")
    return cls.stage


class StageEngine:
    """One stage's detectors over one shared topology, an alert tracker and a router.

    `stage` "rank" runs the rules of a job's node (and summarises its ranks for the job stage),
    "job" the job-level rules on those summaries; None runs every detector on raw records in one
    engine (detectors that read summaries then see none: only for tools that need no job rules).
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        router: Router | None = None,
        stage: str | None = None,
        holds: Callable[[str, str | None], bool] | None = None,
    ) -> None:
        self.config = config if config is not None else EngineConfig.default()
        self.router = router if router is not None else load_router()
        self.stage = stage
        # Rank stage: whether this engine holds a job's records from a node (its partition is the
        # one `shard_key(job, node)` lands on). A node's host or GPU fault reaches every partition
        # with a job on that node; each reports it only for the jobs it holds there.
        self.holds = holds
        self.topology = Topology()
        self.detectors: list[Detector] = [
            build_detector(cls, self.topology, self.config)
            for cls in ALL_DETECTORS
            if stage is None
            or (stage == "gate" and set(cls.rules) <= _GATE_RULES)
            or (stage != "gate" and stage_of(cls) == stage)
        ]
        # record type -> the detectors that read it, in the engine's order (`_reading`).
        self._readers: dict[str, list[Detector]] = {}
        # Detectors that produce derived events (window statistics) expose `drain_derived()`.
        self._drainers = [d.drain_derived for d in self.detectors if hasattr(d, "drain_derived")]
        # Detectors that learn from completed runs (baselines) share what they learn through
        # `BaselineRun` records: `drain_learned()` gives them, `adopt()` takes another's.
        self._learners: list[Any] = [d for d in self.detectors if hasattr(d, "drain_learned")]
        self.tracker = AlertTracker(
            self.router.runbook_base_url or self.config.runbook_base_url,
            refresh_every_ms=self.config.alert_refresh_ms,
            refresh_min_change=self.config.alert_refresh_min_change,
        )
        self.grouper = AlertGrouper(self.router.inhibit_rules, self.topology)
        self.max_ts: int | None = None
        self.watermark: int | None = None
        self._advanced_to: int | None = None  # last watermark bucket the detectors advanced to
        self._released_to: int | None = None  # rank stage: watermark of the last release to the job stage
        self._disabled = frozenset(self.config.disabled_rules)
        self._clock = next((d for d in self.detectors if isinstance(d, ClockDetector)), None)
        # The job stage reads what the rank stage already checked, in event-time order.
        self._checks_time = stage != "job"
        self._lateness_ms = 0 if stage == "job" else self.config.allowed_lateness_ms
        self._advance_ms = self.config.advance_every_ms
        self._skew_ms = self.config.max_clock_skew_ms
        # 0 switches the "too old for its Kafka time" check off (the default: see detectors.yaml).
        self._max_age_ms = self.config.max_record_age_ms or 10**15
        # Offline: a run of records ahead of every accepted time ({"first": ts, "sources": [...]}).
        self._jump: dict[str, Any] | None = None
        self.stats: dict[str, Any] = empty_stats()
        # Why the last `process` call rejected its record (one of REJECT_REASONS), None if it did not.
        self.rejection: str | None = None
        self.accepted: Event | None = None  # the last record taken, as the detectors read it (cleaned)
        # Rank stage: summaries, and what the job stage reads, released in event-time order once
        # the watermark passes them (`drain_forwarded`).
        self.summarizer = (
            RankSummarizer(self.topology, self.config.summary_bucket_ms) if stage == "rank" else None
        )
        self._forward: list[tuple[int, tuple[Any, ...], int, Event]] = []
        self._forward_seq = 0
        self._forwarded: list[Event] = []
        # (node, gpu_uuid) of GPUs this engine knows only from a fault shared with a co-located job
        # it holds: of their alerts it raises only that job's (see `owns`).
        self.foreign: set[tuple[Any, Any]] = set()
        # Job stage: alerts the rank stage raised (for inhibition and healthy windows): fingerprint ->
        # [job, firing, last change ts].
        self._external: dict[str, list[Any]] = {}
        # Every job this engine holds state of -> event time last heard, least recently heard first:
        # past `config.max_jobs` the first is evicted (any publisher can make up job ids).
        self._jobs_heard: dict[str, int] = {}
        # The ranks each job's records named (any publisher can name rank 2,000,000,000 or a million
        # ranks): past `config.max_ranks` in all, the job holding the most is evicted.
        self._job_ranks: dict[str, set[int]] = {}
        self._ranks_held = 0
        # Every node this engine holds per-node state of -> event time last heard (node names are
        # claims too): past `config.max_nodes` the least recently heard eighth is evicted.
        self._nodes_heard: dict[str, int] = {}
        # Rank stage: the detectors of the instant rules, what they paged ahead of the ordered pass
        # ((alert_id, status, inhibited_by, team, receiver) -> event time), and the fingerprints paged
        # ahead that the ordered pass has not raised yet (fingerprint -> event time).
        self._instant = (
            [d for d in self.detectors if set(detector_class(d).rules) <= INSTANT_RULES]
            if stage == "rank"
            else []
        )
        self._early: dict[tuple[Any, ...], list[Any]] = {}  # key -> [event time, the record sent]
        self._early_fps: dict[str, int] = {}
        self._lookahead = Lookahead()  # which instant alerts a record may raise
        # Jobs that failed within `config.late_cause_grace_ms` -> when: their causes may still page.
        self._failed_at: dict[str, int] = {}

    # -- the per-event path ------------------------------------------------------------
    def process(
        self,
        event: Event,
        *,
        received_ts: int | None = None,
        forward: bool = True,
        shared: bool = False,
        cleaned: bool = False,
    ) -> list[Event]:
        """Take one event; return the Alert and derived events it caused, in order.

        `received_ts` is when the record reached Kafka (its record timestamp, UTC ms), if known.
        A record whose time is impossible is rejected: nothing happens but counting it, and
        `self.rejection` says why (None after an accepted or late record). Rank stage: `forward`
        False for a job-level event another engine forwards to the job stage (a broadcast copy);
        `shared` True for a GPU sample of a co-located job's GPU (a fault it shares). `cleaned`:
        the record is another engine's `accepted` (offline: the gate's), already through `clean`.
        """
        if event.type == "Alert" and self.stage == "job":
            return self._observe_external(event.record)
        if event.type == "BaselineRun":
            # Another job-stage partition's completed run: knowledge, not a record of this time.
            for det in self._learners:
                det.adopt(event.record)
            return []
        if not self._checks_time:
            self.rejection = None
            return self._accepted(event, event_ts(event), forward)
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
            if self._clock is not None:
                self._clock.rejected(event, received_ts if received_ts is not None else self.max_ts)
            return []
        if shared and event.type == "GpuSample":
            r = event.record
            self.foreign.add((r["node"], r.get("gpu_uuid")))
        return self._accepted(event, ts, forward, cleaned)

    def _accepted(self, event: Event, ts: int, forward: bool, cleaned: bool = False) -> list[Event]:
        """A record whose time is believable (`cleaned`: through `clean` already) into the topology,
        the detectors, the summaries. Every record in every stage: the common checks inline."""
        watermark, stats = self.watermark, self.stats
        if watermark is not None and ts < watermark:
            stats["late_dropped"] += 1
            return []
        stats["events"] += 1
        max_ts = self.max_ts
        if max_ts is None or ts > max_ts:
            self.max_ts = max_ts = ts
        kind = event.type
        if not cleaned:
            event, fixed = clean(event)
            if fixed:
                invalid = stats["invalid_values"]
                for name in fixed:
                    field_key = f"{kind}.{name}"
                    invalid[field_key] = invalid.get(field_key, 0) + 1
        self.accepted = event
        r = event.record
        out: list[Event] = []
        job_id = r.get("job_id")
        if job_id:
            heard = self._jobs_heard
            if heard.pop(job_id, None) is None and len(heard) >= self.config.max_jobs:
                self._evict(next(iter(heard)), ts, out)
            heard[job_id] = ts
            rank = r.get("rank")
            if rank is not None:
                held = self._job_ranks.get(job_id)
                if held is None or rank not in held:
                    self._hold_rank(job_id, rank, ts, out)
        node = r.get("node")
        if node:
            nodes = self._nodes_heard
            if nodes.pop(node, None) is None and len(nodes) >= self.config.max_nodes:
                self._evict_nodes(ts, out)
            nodes[node] = ts
        self.topology.observe(event)  # bindings, jobs and their pace (the step every alert carries)
        if self.summarizer is not None:
            self.summarizer.observe(event)
            if forward and (
                kind in FORWARDED or (kind == "StepCompleted" and r.get("rank") == LEADER_RANK)
            ):  # `to_job_stage`
                self._queue(event)
        readers = self._readers.get(kind)
        if readers is None:  # (an empty list is an answer: the gate's, for every type)
            readers = self._reading(kind)
        findings: list[Finding] = []
        for det in readers:
            found = det.observe(event)
            if found:
                findings.extend(found)
        if findings:
            self._handle(findings, out)
        if kind == "JobStateChanged" and r["state"] in self.config.job_end_states:
            self._end_job(r["job_id"], ts, out)
            if r["state"] == "failed" and self.config.late_cause_grace_ms > 0:
                self._failed_at[r["job_id"]] = ts
            for det in self._learners:
                out += [Event("BaselineRun", learned) for learned in det.drain_learned()]
        # `_move_watermark`'s common case: the watermark moves within the bucket last advanced to.
        watermark = max_ts - self._lateness_ms
        if self.watermark is None or watermark > self.watermark:
            if self._advanced_to is not None and watermark // self._advance_ms <= self._advanced_to:
                self.watermark = watermark
            else:
                self._move_watermark(watermark, out)
        return out

    # -- the instant rules (rank stage) ---------------------------------------------------
    def instant(self, event: Event, *, received_ts: int | None = None) -> list[Event]:
        """The alerts of the instant rules (`INSTANT_RULES`) a record raises, as it is read.

        The record is judged on a copy of those rules' state and of their alerts, as if it came
        next (this engine's state does not change): what it raises is returned, to be sent now, and
        remembered, so that the ordered pass (`process`, once event-time alignment releases the
        record) does not send its own copy of the same alert again. The ordered pass stays the
        truth: an alert paged here that it never raises (a record before it in event time changed
        the verdict) is withdrawn (resolved) once the watermark passes its time, and counted
        (`stats["instant_withdrawn"]`). Only live input is looked at ahead: a record within the
        allowed lateness of the newest the engine took, about a job whose start it took (its team
        and labels route the page); a backlog read ahead of its turn waits for it. Offline nothing
        reads ahead: the same alerts, only later.
        """
        likely = self._lookahead.likely(event) if self.may_page(event) else ()
        if not likely or all(
            self._early_fps.get(fp) is not None or self.tracker.is_firing(fp) for fp in likely
        ):
            return []  # nothing it could raise now (or already raised): the ordered pass judges it
        ts = event_ts(event)
        if received_ts is None or not (
            received_ts - self._max_age_ms <= ts <= received_ts + self._skew_ms
            and MIN_EVENT_TS <= ts < MAX_EVENT_TS
        ):
            return []  # a time to judge first (the ordered pass rejects it or raises clock_skew)
        if self.watermark is not None and ts < self.watermark:
            return []  # late: the ordered pass drops it
        if self.max_ts is None or ts - self.max_ts > self._lateness_ms:
            # Far ahead of what the engine took (a backlog read ahead of its turn, or the engine's
            # first record): the state it would be judged on is not the one its turn will see.
            return []
        event, _ = clean(event)
        memo: dict[int, Any] = {id(self.topology): self.topology}
        findings = [f for det in self._instant for f in copy.deepcopy(det, memo).observe(event)]
        findings = [
            f
            for f in findings
            if f.active
            and f.fingerprint not in self._early_fps
            and f.rule not in self._disabled
            and not self._over(f)
            and (not f.job_id or f.job_id in self.topology.jobs)  # its team and labels are known
        ]
        if not findings:
            return []
        tracker = self.tracker.lookahead(f.fingerprint for f in findings)
        records = [
            r for f in sorted(findings, key=self.grouper.order) for r in tracker.observe(f, self.topology)
        ]
        if self.holds is not None:
            records = [r for r in records if self.owns(r)]
        if not records:
            return []
        raised = len(records)
        copy.deepcopy(self.grouper, memo).annotate(records)  # mutes of other alerts it adds: sent in order
        out: list[Event] = []
        for record in records[:raised]:
            self._early_fps[record["fingerprint"]] = ts
            for team, receiver in self.router.route_all(record):
                routed = {**record, "team": team, "receiver": receiver}
                self._early[early_key(routed)] = [ts, routed]
                out.append(Event("Alert", routed))
        self.stats["instant_paged"] = self.stats.get("instant_paged", 0) + len(out)
        return out

    def may_page(self, event: Event) -> bool:
        """Whether a record may raise an instant rule's alert (rank stage; `instant.may_page`)."""
        return bool(self._instant) and may_page(event)

    def _over(self, finding: Finding) -> bool:
        """Whether a finding is about a job that has ended (nothing left to alert on)."""
        if not finding.job_id:
            return False
        job = self.topology.jobs.get(finding.job_id)
        return job is not None and job.state in self.config.job_end_states

    def _withdraw(self, watermark: int, out: list[Event]) -> None:
        """The ordered pass is past these early pages' time without raising them: resolve them."""
        for key in [k for k, (ts, _) in self._early.items() if ts < watermark]:
            ts, record = self._early.pop(key)
            self._early_fps.pop(record["fingerprint"], None)
            self.stats["instant_withdrawn"] = self.stats.get("instant_withdrawn", 0) + 1
            log.warning(
                "rank stage: %s paged on arrival was not raised in event-time order; resolving it",
                record["fingerprint"],
            )
            if record["status"] == "firing":
                out.append(Event("Alert", {**record, "status": "resolved", "ts": watermark, "ends_at": ts}))
        for fp in [fp for fp, ts in self._early_fps.items() if ts < watermark]:
            del self._early_fps[fp]

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
        self._release(None)
        if self.summarizer is not None:
            self._released_to = max(self.max_ts, self.watermark or self.max_ts) + 1  # everything is out
        return out

    # -- the job stage's input (rank stage) ---------------------------------------------
    def _queue(self, event: Event) -> None:
        self._forward_seq += 1
        heapq.heappush(self._forward, (event_ts(event), tiebreak(event), self._forward_seq, event))

    def _release(self, watermark: int | None) -> None:
        """Move what the job stage may read now (up to `watermark`; None: everything) to the outbox."""
        heap = self._forward
        while heap and (watermark is None or heap[0][0] <= watermark):
            self._forwarded.append(heapq.heappop(heap)[3])

    def drain_forwarded(self) -> list[Event]:
        """What the job stage reads, in event-time order, released since the last call (rank stage):
        rank summaries, job-level records, bindings, faults, the leader rank's steps, its alerts."""
        out, self._forwarded = self._forwarded, []
        return out

    def holds_forwards(self) -> bool:
        """Whether records for the job stage wait here for the watermark (rank stage)."""
        return bool(self._forward)

    def release_front(self) -> int | None:
        """Event time through which everything for the job stage has been released (rank stage;
        None before the first release). Releases happen when the detectors advance (once per
        `advance_every`, when the summaries of the buckets passed are made), and a record accepted
        after one may carry the watermark's own time: hence one millisecond before it."""
        return None if self._released_to is None else self._released_to - 1

    def owns(self, alert: dict[str, Any]) -> bool:
        """Whether this engine raises `alert`. Not when it is a node-level alert of a job whose records
        from that node another engine holds, nor, for a GPU this engine knows only from a fault shared
        with it, anything but the alert of a job it holds on that node (the GPU's own job and the
        platform's are raised where the GPU's samples go)."""
        job, node = alert.get("job_id"), alert.get("node")
        if self.holds is None:
            return True
        if (node, alert.get("gpu_uuid")) in self.foreign:
            return bool(job) and alert.get("rank") is None and self.holds(str(job), str(node))
        if not job or not node or alert.get("rank") is not None:
            return True  # a rank's alert is raised only where its records are
        return self.holds(str(job), str(node))

    # -- alerts of the rank stage (job stage) --------------------------------------------
    def _observe_external(self, record: dict[str, Any]) -> list[Event]:
        """An alert the rank stage raised: a cause the grouper may mute symptoms with, and a
        reason its job's windows are not healthy (baselines learn from healthy windows only).

        Inhibition is decided when it happens, and published then: the symptoms of this stage
        that a cause from the rank stage mutes as it fires (a straggler under a throttled GPU),
        and a rank-stage symptom that a cause of this stage mutes (an exit after a hang), are
        re-sent muted now, not only marked in their resolved records."""
        fp = str(record.get("fingerprint"))
        firing = record.get("status") == "firing"
        ts = int(record.get("ts") or 0)
        entry = self._external.get(fp)
        if entry is not None and entry[1] == firing:
            # Another routed copy of the same state, or a refresh of a firing alert: a refresh of a
            # symptom that a cause of this stage mutes goes out muted again (the rank stage never
            # learns of that mute, and a page must not show the symptom unmuted by its update).
            if not firing:
                return []
            batch = [dict(record)]
            self.grouper.annotate(batch)  # its newest values, for a cause that mutes it later
            return self._remute(record, batch[0])
        self._external[fp] = [record.get("job_id"), firing, ts]
        batch = [dict(record)]
        self.grouper.annotate(batch)
        late = batch[1:]
        if firing and batch[0].get("inhibited_by") and not record.get("inhibited_by"):
            late.insert(0, {k: v for k, v in batch[0].items() if k not in ("team", "receiver")})
        if not firing:
            job = record.get("job_id")
            self._external = {k: v for k, v in self._external.items() if v[1] or v[0] != job or k == fp}
        out: list[Event] = []
        for muted in late:
            for team, receiver in self.router.route_all(muted):
                out.append(Event("Alert", {**muted, "team": team, "receiver": receiver}))
        return out

    def _remute(self, record: dict[str, Any], annotated: dict[str, Any]) -> list[Event]:
        """The routed copies of a rank-stage alert's newer firing record (`annotated`: with this
        stage's group and muting) when this stage mutes it and the record does not say so."""
        if not annotated.get("inhibited_by") or record.get("inhibited_by"):
            return []
        muted = {k: v for k, v in annotated.items() if k not in ("team", "receiver")}
        return [
            Event("Alert", {**muted, "team": team, "receiver": receiver})
            for team, receiver in self.router.route_all(muted)
        ]

    def _job_healthy(self, job_id: str, window_start: int) -> bool:
        if not self.tracker.job_healthy(job_id, window_start):
            return False
        return not any(
            job == job_id and (firing or ts >= window_start) for job, firing, ts in self._external.values()
        )

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
        if self._clock is not None:
            self._clock.forget_unreported(run["sources"])
        self._jump = None
        self.stats["time_jumps"] += 1
        return None

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
        if self._early_fps or self._early:
            self._withdraw(wm, out)
        findings: list[Finding] = []
        for det in self.detectors:
            findings.extend(det.advance(wm))
        self._handle(findings, out)
        self._emit_alerts(self.tracker.advance(wm, self.topology), out)
        if self._failed_at:
            self._close_late_causes(wm, out)
        if self.summarizer is not None:
            for summary in self.summarizer.advance(wm):
                self._queue(summary)
            self._release(wm)
            self._released_to = wm

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
                    ended = job is not None and job.state in self.config.job_end_states
                    if ended and not self._late_cause(finding):
                        continue  # the job is over: nothing left to alert on (but a late cause)
                self._emit_alerts(self.tracker.observe(finding, self.topology), out)
            derived = self._drain_derived()
            if not derived:
                return
            pending = []
            for event in derived:
                if event.type == "JobWindowStats":
                    r = event.record
                    r["healthy"] = self._job_healthy(r["job_id"], r["window_start"])
                self.stats["derived"] += 1
                out.append(event)
                for det in self._readers.get(event.type) or self._reading(event.type):
                    pending.extend(det.observe(event))
            pending.sort(key=self.grouper.order)

    def _reading(self, kind: str) -> list[Detector]:
        """The detectors that read records of type `kind` (their `reads`), in the engine's order. (A
        `Profiled` wrapper reads every type: it declares none.)"""
        readers = self._readers.get(kind)
        if readers is None:
            readers = self._readers[kind] = [d for d in self.detectors if d.reads is None or kind in d.reads]
        return readers

    def _late_cause(self, finding: Finding) -> bool:
        """A cause of a failure reported within the grace after its job's `failed` state (a killed
        rank's fault often arrives after a peer's error ended the job): it still pages."""
        failed = self._failed_at.get(finding.job_id or "")
        return (
            failed is not None
            and finding.rule in self.config.late_cause_rules
            and finding.ts <= failed + self.config.late_cause_grace_ms
        )

    def _close_late_causes(self, watermark: int, out: list[Event]) -> None:
        """Past a failed job's grace nothing can clear its late causes: they resolve then, and the
        state their detectors took up again goes (unless the job runs again)."""
        grace = self.config.late_cause_grace_ms
        for job_id, failed in list(self._failed_at.items()):
            if watermark >= failed + grace:
                del self._failed_at[job_id]
                job = self.topology.jobs.get(job_id)
                if job is not None and job.state == "failed":
                    self._end_job(job_id, failed + grace, out)

    def _drain_derived(self) -> list[Event]:
        derived: list[Event] = []
        for drain in self._drainers:
            derived.extend(drain())
        return derived

    def _emit_alerts(self, records: list[dict[str, Any]], out: list[Event]) -> None:
        if self.holds is not None:
            records = [r for r in records if self.owns(r)]
        # A refresh updates an alert already counted as firing (asked before the grouper adds copies).
        refreshes = {id(r) for r in records if self.tracker.is_refresh(r)}
        self.grouper.annotate(records)
        for record in records:
            if id(record) in refreshes:
                self.stats["alerts_refreshed"] = self.stats.get("alerts_refreshed", 0) + 1
            else:
                by_rule = self.stats["by_rule"].setdefault(record["rule"], {"firing": 0, "resolved": 0})
                by_rule[record["status"]] += 1
                self.stats["alerts_firing" if record["status"] == "firing" else "alerts_resolved"] += 1
            for team, receiver in self.router.route_all(record):
                routed = {**record, "team": team, "receiver": receiver}
                if self._early and self._early.pop(early_key(routed), None) is not None:
                    self.stats["instant_confirmed"] = self.stats.get("instant_confirmed", 0) + 1
                    continue  # paged as its record was read (`instant`)
                out.append(Event("Alert", routed))
            if self._early:
                # Raised in order with another mute than paged: its own copies went out above. A
                # page to a receiver the ordered pass does not route it to is withdrawn now.
                routes = set(self.router.route_all(record))
                for key in [
                    k for k in self._early if k[0] == record["alert_id"] and k[1] == record["status"]
                ]:
                    _, paged = self._early.pop(key)
                    if (key[3], key[4]) not in routes and paged["status"] == "firing":
                        self.stats["instant_withdrawn"] = self.stats.get("instant_withdrawn", 0) + 1
                        log.warning(
                            "rank stage: %s paged on arrival to %s/%s is routed elsewhere in event-time order; resolving it there",
                            record["fingerprint"],
                            key[3],
                            key[4],
                        )
                        out.append(Event("Alert", {**paged, "status": "resolved", "ends_at": paged["ts"]}))
            if self._early_fps:
                self._early_fps.pop(record["fingerprint"], None)
            if self.summarizer is not None:
                self._queue(Event("Alert", dict(record)))

    def _end_job(self, job_id: str, ts: int, out: list[Event]) -> None:
        self._emit_alerts(self.tracker.end_job(job_id, ts, self.topology), out)
        for det in self.detectors:
            det.forget_job(job_id)
        if self.summarizer is not None:
            self.summarizer.forget_job(job_id)
        self.tracker.forget_job(job_id)

    def _hold_rank(self, job_id: str, rank: int, ts: int, out: list[Event]) -> None:
        """Count a (job, rank) held; past `config.max_ranks`, evict the job naming the most ranks."""
        ranks = self._job_ranks.get(job_id)
        if ranks is not None and rank in ranks:
            return
        if self._ranks_held >= self.config.max_ranks:
            biggest = max(self._job_ranks, key=lambda j: len(self._job_ranks[j]))
            self._evict(biggest, ts, out)
            self._jobs_heard[job_id] = ts  # this record's job is held again, even if it was the one
            ranks = self._job_ranks.get(job_id)
        if ranks is None:
            ranks = self._job_ranks[job_id] = set()
        ranks.add(rank)
        self._ranks_held += 1

    def _evict(self, job_id: str, ts: int, out: list[Event]) -> None:
        """Forget a job to make room (bounded state): its alerts resolve, its state goes, it is counted."""
        self._end_job(job_id, ts, out)
        self.topology.forget_job(job_id)
        self._jobs_heard.pop(job_id, None)
        self._ranks_held -= len(self._job_ranks.pop(job_id, ()))
        # Its records still queued for the job stage go too (a JobStarted's labels are held there).
        kept = [f for f in self._forward if f[3].record.get("job_id") != job_id]
        if len(kept) != len(self._forward):
            heapq.heapify(kept)
            self._forward = kept
        self._forwarded = [e for e in self._forwarded if e.record.get("job_id") != job_id]
        self.stats["evicted_jobs"] = self.stats.get("evicted_jobs", 0) + 1
        log.warning(
            "%s stage: evicted the state of job %r, the least recently heard", self.stage or "single", job_id
        )

    def _evict_nodes(self, ts: int, out: list[Event]) -> None:
        """Forget the least recently heard eighth of the nodes held (bounded state, amortised: one
        pass over each per-node table per eviction): their alerts resolve, their state goes."""
        count = max(1, self.config.max_nodes // 8)
        victims = frozenset(itertools.islice(self._nodes_heard, count))
        for node in victims:
            del self._nodes_heard[node]
        self._emit_alerts(self.tracker.end_nodes(victims, ts, self.topology), out)
        for det in self.detectors:
            det.forget_nodes(victims)
        self.topology.forget_nodes(victims)
        self.stats["evicted_nodes"] = self.stats.get("evicted_nodes", 0) + len(victims)
        log.warning(
            "%s stage: evicted the state of %d nodes, the least recently heard (engine.max_nodes %d)",
            self.stage or "single",
            len(victims),
            self.config.max_nodes,
        )

    def shed(self, count: int) -> list[Event]:
        """Evict the `count` least recently heard jobs (a snapshot over the changelog's limit); their outputs."""
        out: list[Event] = []
        ts = self.max_ts or 0
        for job_id in list(self._jobs_heard)[:count]:
            self._evict(job_id, ts, out)
        return out

    @property
    def jobs_held(self) -> int:
        """How many distinct jobs this engine holds state of."""
        return len(self._jobs_heard)

    @property
    def ranks_held(self) -> int:
        """How many distinct (job, rank) this engine holds state of."""
        return self._ranks_held

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
            "max_ts": self.max_ts,
            "watermark": self.watermark,
            "advanced_to": self._advanced_to,
            "released_to": self._released_to,
            "jump": self._jump,
            "stats": self.stats,
            "topology": self.topology.state(),
            "tracker": self.tracker.state(),
            "grouper": self.grouper.state(),
            "detectors": {state_key(detector_class(d)): d.state() for d in self.detectors},
            "summarizer": self.summarizer.state() if self.summarizer is not None else None,
            "forward": [[ts, list(tb), seq, [e.type, e.record]] for ts, tb, seq, e in sorted(self._forward)],
            "forward_seq": self._forward_seq,
            # Released but not sent yet (a checkpoint may come between): sent again after a restore.
            "forwarded": [[e.type, e.record] for e in self._forwarded],
            "foreign": sorted([list(f) for f in self.foreign], key=str),
            "external": {k: self._external[k] for k in sorted(self._external)},
            "jobs_heard": list(self._jobs_heard.items()),  # in eviction order
            "job_ranks": {j: sorted(r) for j, r in sorted(self._job_ranks.items())},
            "nodes_heard": list(self._nodes_heard.items()),  # in eviction order
            # Paged on arrival, not yet raised in order (a restart must not page them again).
            "early": [
                [list(k), ts, r] for k, (ts, r) in sorted(self._early.items(), key=lambda kv: str(kv[0]))
            ],
            "early_fps": dict(sorted(self._early_fps.items())),
            "failed_at": sorted(self._failed_at.items()),
        }
        return pack_snapshot(state)

    @classmethod
    def restore(
        cls,
        data: bytes,
        config: EngineConfig | None = None,
        router: Router | None = None,
        stage: str | None = None,
        holds: Callable[[str, str | None], bool] | None = None,
    ) -> StageEngine:
        """An engine continuing exactly where `snapshot()` left off."""
        state = unpack_snapshot(data)
        engine = cls(config, router, stage, holds)
        engine.max_ts = state["max_ts"]
        engine.watermark = state["watermark"]
        engine._advanced_to = state["advanced_to"]
        engine._released_to = state.get("released_to")
        engine._jump = state.get("jump")
        engine.stats = {**empty_stats(), **state["stats"]}
        # Detectors hold a reference to the topology: load it in place.
        engine.topology.load_state(state["topology"])
        engine.tracker.load_state(state["tracker"])
        engine.grouper.load_state(state.get("grouper", {}))
        for det in engine.detectors:
            key = state_key(detector_class(det))
            if key in state["detectors"]:
                det.load_state(state["detectors"][key])
        if engine.summarizer is not None and state.get("summarizer"):
            engine.summarizer.load_state(state["summarizer"])
        engine._forward = [
            (int(ts), tuple(tb), int(seq), Event(t, r)) for ts, tb, seq, (t, r) in state.get("forward", [])
        ]
        heapq.heapify(engine._forward)
        engine._forward_seq = int(state.get("forward_seq", 0))
        engine._forwarded = [Event(t, r) for t, r in state.get("forwarded", [])]
        engine.foreign = {tuple(f) for f in state.get("foreign", [])}
        engine._external = {k: list(v) for k, v in state.get("external", {}).items()}
        heard = state.get("jobs_heard")
        if heard is None:  # a snapshot from before the cap: every job it holds, oldest start first
            heard = sorted(
                ((j, info.started_ts) for j, info in engine.topology.jobs.items()), key=lambda x: x[1]
            )
        engine._jobs_heard = {str(j): int(t) for j, t in heard}
        engine._job_ranks = {j: set(r) for j, r in state.get("job_ranks", {}).items()}
        engine._ranks_held = sum(len(r) for r in engine._job_ranks.values())
        # A snapshot from before the node cap: nodes are counted again as they are heard.
        engine._nodes_heard = {str(n): int(t) for n, t in state.get("nodes_heard", [])}
        engine._early = {tuple(k): [int(ts), dict(r)] for k, ts, r in state.get("early", [])}
        engine._early_fps = {str(k): int(v) for k, v in state.get("early_fps", {}).items()}
        engine._failed_at = {str(j): int(t) for j, t in state.get("failed_at", [])}
        return engine


def pack_snapshot(state: dict[str, Any]) -> bytes:
    """An engine's state as deterministic, compressed bytes, stamped with this snapshot version."""
    return zlib.compress(dumps_state({"version": SNAPSHOT_VERSION, **state}), 6)


def unpack_snapshot(data: bytes) -> dict[str, Any]:
    """The state `pack_snapshot` wrote; one sentence when the bytes are corrupt or of a version
    this code does not read."""
    try:
        state: dict[str, Any] = loads_state(zlib.decompress(data))
    except (zlib.error, ValueError) as exc:
        raise StreamsError(
            f"engine snapshot is corrupt ({exc}); delete it to start from empty state"
        ) from None
    if state.get("version") not in _READABLE:
        raise StreamsError(
            f"engine snapshot version {state.get('version')} is not supported (expected {SNAPSHOT_VERSION}); "
            "delete it to start from empty state"
        )
    return state


def empty_stats() -> dict[str, Any]:
    """A stage engine's counters, all zero."""
    return {
        "events": 0,
        "late_dropped": 0,
        "rejected": {},  # reason -> records rejected for their timestamp
        "time_jumps": 0,  # offline: jumps of event time confirmed by several sources
        "invalid_values": {},  # "Type.field" -> values no producer can measure, made unknown
        "derived": 0,
        "alerts_firing": 0,
        "alerts_resolved": 0,
        "alerts_refreshed": 0,  # firing alerts published again with their new values (not new firings)
        "by_rule": {},
    }
