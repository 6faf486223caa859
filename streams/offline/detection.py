"""Both stages of detection in one process, for replays, evaluation and tests: `DetectionEngine`.

What the worker does over Kafka (`streams.runtime`), in memory: records keyed and partitioned as
the publisher and the worker key them, each partition's rank-stage engine, the job stages fed in
event-time order. The same records give the worker's alerts.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from schemas.eventtime import MIN_EVENT_TS, event_ts
from schemas.records import Event
from streams.alerting.routing import Router, load_router
from streams.config import EngineConfig
from streams.detectors.base import Detector
from streams.stages.engine import (
    JOB_LEVEL,
    StageEngine,
    empty_stats,
    pack_snapshot,
    tiebreak,
    unpack_snapshot,
)
from streams.stages.placement import FaultCopies, Placement
from streams.stages.routes import NodeRoutes

__all__ = ["DEFAULT_PARTITIONS", "DetectionEngine"]

DEFAULT_PARTITIONS = 6  # as `ranksight worker --partitions`


class DetectionEngine:
    """Both stages of detection in one process: what the worker does over Kafka, for replays,
    evaluation and tests, with the same answers.

    Each record goes where the worker sends it, as `streams.stages.placement` answers for both: to
    the rank-stage engine of the partition its key lands on (a rank's records by job and node,
    telemetry by the job its GPU runs, unattributed telemetry through the same node -> job routes
    and thinning as the worker's side path, a GPU fault also to its node's other jobs); job-level
    records to the job's partition, JobStarted / JobStateChanged to every partition too. Every rank
    stage follows the newest event time, as the worker's idle tasks follow their worker's. What the
    rank stages pass on (summaries, job-level records, bindings, faults, the leader rank's steps,
    their alerts) reaches the job stage of the job's partition in event-time order.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        router: Router | None = None,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        unbound_interval_ms: int = 10_000,
    ) -> None:
        self.config = config if config is not None else EngineConfig.default()
        self.router = router if router is not None else load_router()
        self.partitions = partitions
        self.place = Placement(partitions)
        # Offline the gate judges each record's time (the worker judges it against its Kafka timestamp).
        self.gate = StageEngine(self.config, self.router, "gate")
        self.rank_stages = [
            StageEngine(self.config, self.router, "rank", self.place.holder(p)) for p in range(partitions)
        ]
        self.job_stages = [StageEngine(self.config, self.router, "job") for _ in range(partitions)]
        self.routes = NodeRoutes(unbound_interval_ms)
        self.faults: FaultCopies[Event] = FaultCopies()  # each GPU's last healthy sample
        self.max_ts: int | None = None
        self.watermark: int | None = None
        self.rejection: str | None = None
        self._telemetry_front = MIN_EVENT_TS  # newest telemetry time of the input
        # What the rank stages released, until every one of them has released through its time.
        self._to_job: list[tuple[int, tuple[Any, ...], int, Event]] = []
        self._to_job_seq = 0
        self._shared: list[
            tuple[int, Event]
        ] = []  # (partition, copy) of a GPU fault shared with a co-located job

    # -- views over both stages ----------------------------------------------------------
    @property
    def detectors(self) -> list[Detector]:
        """Every detector of every stage engine."""
        return [d for eng in (*self.rank_stages, *self.job_stages) for d in eng.detectors]

    @property
    def stats(self) -> dict[str, Any]:
        """Counters summed over the stages (records are counted by the gate, which judged each once)."""
        out = empty_stats()
        _add_stats(out, self.gate.stats, records=True)
        for eng in (*self.rank_stages, *self.job_stages):
            _add_stats(out, eng.stats, records=False)
        return out

    def firing(self) -> list[str]:
        """Fingerprints of alerts firing now, in both stages."""
        return sorted({fp for eng in (*self.rank_stages, *self.job_stages) for fp in eng.firing()})

    def baselines(self) -> list[dict[str, Any]]:
        """Performance baselines learned so far."""
        return [b for eng in self.job_stages for b in eng.baselines()]

    # -- records in ----------------------------------------------------------------------
    def _targets(self, event: Event) -> list[tuple[int, bool]]:
        """(partition, forward to the job stage) of each copy of a record, in partition order; a GPU
        fault's copies for the node's other jobs go to `self._shared`."""
        kind, r = event.type, event.record
        if kind in JOB_LEVEL:
            if kind == "JobStateChanged" and r["state"] in self.config.job_end_states:
                self.routes.end_job(str(r["job_id"]))
            own = self.place.source(event)[0]
            return sorted([(own, True), *((q, False) for q in self.place.copies(event, own))])
        if kind in ("StepCompleted", "CollectiveSample", "DataLoaderSample", "RankBound", "RankFault"):
            if kind == "RankBound":
                self.routes.bind(r)
            return [(p, True) for p in self.place.source(event)]
        if kind not in ("GpuSample", "HostSample"):
            return []
        parts = self.place.source(event) or sorted(self.place.routed(self.routes, event))
        if kind == "GpuSample":
            self._shared_fault(event, parts)
        return [(p, True) for p in parts]

    def _shared_fault(self, event: Event, own: list[int]) -> None:
        """A GPU fault also goes to the node's other jobs (after the sample before it), naming the
        GPU's job, as the worker's side path sends it on (attributed or not): `self._shared`."""
        copies = self.faults.copies(event.record, event)
        if not copies:
            return
        parts = sorted(self.place.shared(self.routes, event, own))
        for copy in copies if parts else ():
            named = self.routes.with_holder(copy)
            self._shared += [(p, named) for p in parts]

    def process(self, event: Event, *, received_ts: int | None = None) -> list[Event]:
        """Take one record; return the Alert and derived events it caused (both stages), in order.

        The gate judges the record's time once (against `received_ts`, its Kafka time, when known;
        else against the newest record of the whole input, where a gap is a jump only when several
        sources agree) and drops it when it is late for the input's watermark; the stages then take
        it as judged, so every count of records is the gate's.
        """
        gate = self.gate
        gate.accepted = None
        out = gate.process(event, received_ts=received_ts)
        self.rejection = gate.rejection
        taken = gate.accepted  # None: rejected or late
        if taken is None:
            return out
        ts = event_ts(event)
        if event.type in ("GpuSample", "HostSample") and ts > self._telemetry_front:
            # Each rank stage hears some nodes; whether others still report is the input's.
            self._telemetry_front = ts
            for eng in self.rank_stages:
                eng.topology.telemetry_front = ts
        self._shared = []
        # The stages read the record as the gate cleaned it (placement reads the record as sent).
        for p, forward in self._targets(event):
            out += self.rank_stages[p].process(taken, received_ts=ts, forward=forward, cleaned=True)
        for p, copy in self._shared:
            out += self.rank_stages[p].process(copy, received_ts=ts, shared=True)
        self.max_ts = max_ts = gate.max_ts
        if max_ts is not None:
            watermark = max_ts - self.config.allowed_lateness_ms
            every = self.config.advance_every_ms
            if self.watermark is None or watermark // every > self.watermark // every:
                self._follow(watermark, out)
        return out

    def advance(self, watermark: int) -> list[Event]:
        """Move event time forward without a record (e.g. a wall-clock guard)."""
        out: list[Event] = []
        self._follow(watermark, out)
        return out

    def _follow(self, watermark: int, out: list[Event]) -> None:
        every = self.config.advance_every_ms
        if self.watermark is not None and watermark // every <= self.watermark // every:
            # The stages re-check time once per `advance_every` of event time (as each engine does);
            # what a rank stage released meanwhile goes on at the next (in the same order).
            return
        self.watermark = watermark
        out += self.gate.advance(watermark)
        for eng in self.rank_stages:
            out += eng.advance(watermark)
        out += self._feed_job_stage()

    def _feed_job_stage(self, *, final: bool = False) -> list[Event]:
        """Pass what the rank stages released to the job stages in event-time order, as far as every
        rank stage has released everything (the worker's markers); then the job stages follow that
        front. `final`: the rank stages finished, everything goes."""
        for eng in self.rank_stages:
            for item in eng.drain_forwarded():
                self._to_job_seq += 1
                heapq.heappush(self._to_job, (event_ts(item), tiebreak(item), self._to_job_seq, item))
        fronts = [eng.release_front() for eng in self.rank_stages]
        front = None if final or None in fronts else min(f for f in fronts if f is not None)
        if not final and front is None:
            return []
        out: list[Event] = []
        heap = self._to_job
        while heap and (front is None or heap[0][0] <= front):
            item = heapq.heappop(heap)[3]
            p = self.place.job(item.record.get("job_id"))
            out += self._share_learned(p, self.job_stages[p].process(item))
        if front is not None:
            for p, eng in enumerate(self.job_stages):
                out += self._share_learned(p, eng.advance(front))
        return out

    def _share_learned(self, source: int, events: list[Event]) -> list[Event]:
        """A job stage's output without its `BaselineRun` records, which go to every other job
        stage at once (the worker sends them to every other job-stage partition)."""
        out: list[Event] = []
        for event in events:
            if event.type != "BaselineRun":
                out.append(event)
                continue
            shared = Event("BaselineRun", {**event.record, "source": source})
            for q in self.place.others(source):
                self.job_stages[q].process(shared)
        return out

    def finish(self) -> list[Event]:
        """End of a finite input: both stages advance to the last event time."""
        out: list[Event] = self.gate.finish()
        for eng in self.rank_stages:
            out += eng.finish()
        out += self._feed_job_stage(final=True)
        for p, eng in enumerate(self.job_stages):
            out += self._share_learned(p, eng.finish())
        self.watermark = self.max_ts
        return out

    def run(self, events: Iterable[Event]) -> list[Event]:
        """Process every event and finish; every output event, in order."""
        out: list[Event] = []
        for event in events:
            out.extend(self.process(event))
        out.extend(self.finish())
        return out

    # -- snapshots ---------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """Both stages' state as deterministic, compressed bytes (each stage engine's own snapshot)."""
        state = {
            "partitions": self.partitions,
            "max_ts": self.max_ts,
            "watermark": self.watermark,
            "routes": {node: self.routes.state_of(node) for node in sorted(self.routes.nodes)},
            "before_fault": {k: [e.type, e.record] for k, e in sorted(self.faults.before.items())},
            "telemetry_front": self._telemetry_front,
            "to_job": [[e.type, e.record] for _, _, _, e in sorted(self._to_job, key=lambda x: x[:3])],
            "gate": self.gate.snapshot().hex(),
            "rank": [eng.snapshot().hex() for eng in self.rank_stages],
            "job": [eng.snapshot().hex() for eng in self.job_stages],
        }
        return pack_snapshot(state)

    @classmethod
    def restore(
        cls, data: bytes, config: EngineConfig | None = None, router: Router | None = None
    ) -> DetectionEngine:
        """Both stages continuing exactly where `snapshot()` left off (each stage engine restores its own)."""
        state = unpack_snapshot(data)
        engine = cls(config, router, partitions=int(state["partitions"]))
        engine.max_ts, engine.watermark = state["max_ts"], state["watermark"]
        for node, node_state in state["routes"].items():
            engine.routes.load(node, node_state)
        engine.faults.before = {k: Event(t, r) for k, (t, r) in state["before_fault"].items()}
        engine._telemetry_front = int(state.get("telemetry_front", MIN_EVENT_TS))
        for t, r in state.get("to_job", []):
            item = Event(t, r)
            engine._to_job_seq += 1
            engine._to_job.append((event_ts(item), tiebreak(item), engine._to_job_seq, item))
        engine.gate = StageEngine.restore(bytes.fromhex(state["gate"]), engine.config, engine.router, "gate")
        engine.rank_stages = [
            StageEngine.restore(
                bytes.fromhex(h), engine.config, engine.router, "rank", engine.place.holder(p)
            )
            for p, h in enumerate(state["rank"])
        ]
        engine.job_stages = [
            StageEngine.restore(bytes.fromhex(h), engine.config, engine.router, "job") for h in state["job"]
        ]
        for eng in engine.rank_stages:
            eng.topology.telemetry_front = engine._telemetry_front
        return engine


def _add_stats(out: dict[str, Any], stats: dict[str, Any], *, records: bool) -> None:
    """Sum one stage engine's counters into `out` (event counts only from the stages that took records)."""
    for key, value in stats.items():
        if key in ("events", "late_dropped", "rejected", "time_jumps", "invalid_values") and not records:
            continue
        if isinstance(value, dict):
            target = out.setdefault(key, {})
            for k, v in value.items():
                if isinstance(v, dict):
                    inner = target.setdefault(k, {})
                    for kk, vv in v.items():
                        inner[kk] = inner.get(kk, 0) + vv
                else:
                    target[k] = target.get(k, 0) + v
        else:
            out[key] = out.get(key, 0) + value
