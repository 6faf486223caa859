"""The Faust app: telemetry re-keyed by job, one `DetectionEngine` per partition, state in changelog tables.

Design (see docs/worker.md):

* Co-partitioning. Every topic the worker reads has the same partition count, and producers use
  the Java partitioner (librdkafka `murmur2_random`, aiokafka's murmur2), so a key lands on the
  same partition number whoever produced it. Faust's assignor gives a worker the same partition
  numbers of every topic (and of the table changelogs).
* Three agents:
  - `bind` reads `rs.training.events` and forwards each RankBound to `rs.internal.bindings`
    keyed by node (and every job-ending JobStateChanged to all of its partitions);
  - `route` reads `rs.telemetry.gpu`, `rs.telemetry.host` and `rs.internal.bindings` (all keyed
    by node), keeps node -> {GPU -> job, jobs} in the `node-routes` table and forwards
    UNATTRIBUTED telemetry (no `job_id` / `job_ids`: an old agent, an idle GPU) to
    `rs.internal.telemetry-by-job` keyed by job (GPU samples to the job bound to the GPU, host
    samples to every job on the node, unbound telemetry thinned to the key ""); attributed
    telemetry is not forwarded: its publisher already wrote it keyed by job to `rs.telemetry.job`;
  - `detect` reads `rs.training.steps`, `rs.training.events`, `rs.telemetry.job` and
    `rs.internal.telemetry-by-job` (all keyed by job) and runs ONE engine per assigned partition, so all events of a job meet in
    one engine. Its snapshot is the table key `engine@<p>`, written with an event of partition p,
    so it lives on changelog partition p and moves with the partition on a rebalance.
* Event-time alignment per partition (`Aligner`), checkpoints bounded (alert, every
  `checkpoint_interval_ms` of event time, every `checkpoint_events` events), delivery
  at-least-once: outputs delivered -> snapshot written -> only then ack. Faust's `exactly_once`
  is not used (against Apache Kafka 4.1 it committed offsets of aborted transactions).
* A wall-clock guard advances an engine whose input has been silent for `guard_s` while its
  event time is live, so timeouts fire when all input stops; never for historical data.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import json
import logging
import os
import signal
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from faust.streams import _current_event
from faust.types import TP

from schemas.codec import Codec
from schemas.errors import DecodeError, EncodeError
from schemas.records import Event
from schemas.topics import (
    DEADLETTER,
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TELEMETRY_JOB,
    TRAINING_EVENTS,
    TRAINING_STEPS,
    deadletter_headers,
    job_keys,
    key_for,
    off_topic_reason,
    topic_for,
)
from streams.config import EngineConfig, load_config
from streams.engine import MAX_EVENT_TS, MIN_EVENT_TS, DetectionEngine, event_ts
from streams.errors import StreamsError
from streams.metrics import MetricsServer, worker_metrics
from streams.rekey import NodeRoutes, WallClockGuard, partition_for
from streams.routing import Router, load_router

__all__ = [
    "BINDINGS",
    "COMPONENT",
    "DEFAULT_APP_ID",
    "JOB_TOPICS",
    "NODE_TOPICS",
    "SOURCE_TOPICS",
    "TELEMETRY_BY_JOB",
    "Aligner",
    "ClockRejected",
    "WorkerOptions",
    "WorkerRuntime",
    "align_ts",
    "broker_credentials",
    "build_app",
    "check_record",
    "decode_snapshot",
    "decode_snapshot_meta",
    "encode_snapshot",
    "pick_latest_snapshot",
    "received_ms",
    "reference_ms",
]

log = logging.getLogger("ranksight.worker")

DEFAULT_APP_ID = "ranksight-detect"
BINDINGS = "rs.internal.bindings"
TELEMETRY_BY_JOB = "rs.internal.telemetry-by-job"
SOURCE_TOPICS: tuple[str, ...] = (TELEMETRY_GPU, TELEMETRY_HOST, TRAINING_STEPS, TRAINING_EVENTS)
NODE_TOPICS: tuple[str, ...] = (TELEMETRY_GPU, TELEMETRY_HOST, BINDINGS)
# rs.telemetry.job: telemetry the node agent attributed to jobs, published keyed by job (read
# directly); rs.internal.telemetry-by-job: only unattributed telemetry, re-keyed by `route`.
JOB_TOPICS: tuple[str, ...] = (TRAINING_STEPS, TRAINING_EVENTS, TELEMETRY_JOB, TELEMETRY_BY_JOB)
_SNAPSHOT_TABLE = "engine-snapshot"
_ROUTES_TABLE = "node-routes"
# Progress markers: the forwarding agents tell every partition of their output topic how far
# (event time, backlog) they got on each source partition, so a consumer of the re-keyed topic
# holds its other inputs back until the forwarder - on whichever worker - has caught up.
_MARKER_KEY = b"\x00progress"
_MARKER_IDLE_S = 60.0  # no marker yet from a source partition: wait this long for one (slow start-up)
_MARKER_HEARTBEAT_S = 5.0  # an unchanged marker is repeated this often
_FORWARD_BATCH = 500  # forwarded records acked together once delivered
# The `x-component` header of what the worker dead-letters. It owns only the topics no sink reads
# (its internal ones); bad records of the source topics are the sink's to dead-letter (once).
COMPONENT = "worker"
# Record types each input topic may carry (the source topics follow `schemas.topics.RECORD_TOPIC`).
_INTERNAL_TYPES: dict[str, frozenset[str]] = {
    BINDINGS: frozenset({"RankBound", "JobStateChanged"}),
    TELEMETRY_BY_JOB: frozenset({"GpuSample", "HostSample"}),
    # Not internal, but no sink reads it (the sink stores telemetry once, node-keyed): the worker
    # owns its dead letters.
    TELEMETRY_JOB: frozenset({"GpuSample", "HostSample"}),
}
_ASK_ENDS_S = 2.0  # how often the end offsets of partitions without a fetch answer are asked for
_BAD_LOG_S = 10.0
_METRICS_S = 2.0  # how often the /metrics snapshot is refreshed
# Sends Kafka has not acknowledged after this long mean a stuck producer (its own requests time
# out after 40 s and are retried): the worker stops, loudly, instead of holding everything silently.
_DELIVERY_TIMEOUT_S = 120.0  # bad input: one warning per this many seconds, with a count


@dataclass(frozen=True)
class WorkerOptions:
    """Everything the worker needs; the CLI fills it from settings and flags."""

    bootstrap: str
    workdir: Path
    app_id: str = DEFAULT_APP_ID
    topic_prefix: str = ""
    partitions: int = 6
    replication_factor: int = 1
    config_path: Path | None = None
    routing_path: Path | None = None
    checkpoint_interval_ms: int = 10_000
    checkpoint_events: int = 5_000
    store: str | None = None  # None: rocksdb:// when rocksdict imports, else memory://
    log_level: str = "warning"
    align_idle_s: float = 2.0
    align_max_buffer: int = 200_000
    stats_interval_s: float = 30.0
    schema_registry_url: str | None = None
    guard_s: float = 120.0
    guard_live_ms: int = 600_000
    unbound_interval_ms: int = 10_000
    stuck_log_s: float = 30.0  # events held this long without any leaving: log which input holds them
    metrics_port: int = 0  # Prometheus /metrics on this port (0: off)
    # The same Kafka security settings as every other command (`ranksight.settings`).
    security_protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism: str | None = None  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)


def broker_credentials(options: WorkerOptions) -> Any:
    """Faust's credentials for `options.security_protocol` (None for PLAINTEXT).

    SSL verifies the broker with the system's CA store (`SSL_CERT_FILE` points Python at another)."""
    import ssl

    protocol = options.security_protocol
    if protocol == "PLAINTEXT":
        return None
    context = ssl.create_default_context() if protocol in ("SSL", "SASL_SSL") else None
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        return faust.SASLCredentials(
            username=options.sasl_username,
            password=options.sasl_password,
            ssl_context=context,
            mechanism=options.sasl_mechanism or "PLAIN",
        )
    raise StreamsError(
        f"unknown Kafka security protocol {protocol!r}: use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
    )


def default_store() -> str:
    """`rocksdb://` when `rocksdict` is importable, else `memory://`; both recover from the changelog."""
    try:
        import rocksdict  # noqa: F401
    except ImportError:
        return "memory://"
    return "rocksdb://"


def encode_snapshot(
    seq: int, offsets: dict[str, int], engine_bytes: bytes, seen: dict[str, int] | None = None
) -> bytes:
    """Table value: one JSON header line (sequence, next offset per source partition, telemetry seen) + the snapshot."""
    meta: dict[str, Any] = {"seq": seq, "offsets": dict(sorted(offsets.items()))}
    if seen:
        meta["seen"] = dict(sorted(seen.items()))
    header = json.dumps(meta, separators=(",", ":"))
    return header.encode() + b"\n" + engine_bytes


def decode_snapshot_meta(value: bytes) -> tuple[dict[str, Any], bytes]:
    """The header dict and the engine bytes of a table value."""
    head, _, body = value.partition(b"\n")
    try:
        meta = json.loads(head)
        meta["seq"] = int(meta["seq"])
        meta["offsets"] = {str(k): int(v) for k, v in meta["offsets"].items()}
        meta["seen"] = {str(k): int(v) for k, v in meta.get("seen", {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StreamsError(
            f"engine snapshot header is corrupt ({exc}); delete the worker's changelog topic"
        ) from None
    return meta, body


def decode_snapshot(value: bytes) -> tuple[int, dict[str, int], bytes]:
    """Inverse of `encode_snapshot` (sequence, offsets, engine bytes)."""
    meta, body = decode_snapshot_meta(value)
    return meta["seq"], meta["offsets"], body


def pick_latest_snapshot(values: list[bytes]) -> tuple[int, dict[str, int], bytes] | None:
    """The snapshot with the highest sequence number among `values` (empty ones ignored)."""
    best: tuple[int, dict[str, int], bytes] | None = None
    for value in values:
        if not value:
            continue
        decoded = decode_snapshot(value)
        if best is None or decoded[0] > best[0]:
            best = decoded
    return best


def check_record(codec: Codec, value: bytes | None, topic: str) -> Event:
    """Decode a record read from `topic` (unprefixed) and check its type belongs there.

    Raises `DecodeError` for anything the worker must not process: no value, bytes that are not
    exactly one record, or a valid record of a type that does not travel on this topic.
    """
    event = codec.decode(value)
    allowed = _INTERNAL_TYPES.get(topic)
    if allowed is not None:
        wrong = None if event.type in allowed else f"a {event.type} record does not belong on {topic}"
    else:
        wrong = off_topic_reason(event.type, topic)
    if wrong is not None:
        raise DecodeError(wrong, value or b"")
    return event


def align_ts(ts: int, timestamp_s: float | None, max_skew_ms: int, now_ms: int) -> int | None:
    """Event time for alignment and progress: `ts`, or None for a record the engine will reject.

    That is a record outside 2000..2200 or more than `max_skew_ms` ahead of its reference (its
    Kafka timestamp, capped at `now_ms`: see `reference_ms`). Such a record moves no event time:
    bounding it by Kafka time + skew instead let one 2199 record of an hour-old backlog drag every
    engine's watermark an hour past the data (job_stall on every job).
    """
    kafka_ms = int(timestamp_s * 1000) if timestamp_s and timestamp_s > 0 else None
    if not MIN_EVENT_TS <= ts < MAX_EVENT_TS or ts > reference_ms(kafka_ms, now_ms) + max_skew_ms:
        return None
    return ts


def received_ms(fevent: Any) -> int | None:
    """The Kafka timestamp (ms) of a Faust event's message, if it has one."""
    timestamp = getattr(fevent.message, "timestamp", None)
    return int(timestamp * 1000) if timestamp and timestamp > 0 else None


def reference_ms(kafka_ms: int | None, now_ms: int) -> int:
    """The time a record's event time is checked against: its Kafka timestamp, never past `now_ms`.

    A producer's CreateTime comes from the same host clock as the event times it stamps, so a node
    whose clock jumped to 2199 sends records with a 2199 Kafka timestamp too; no record can come
    from the future of the process reading it, so the worker's own wall clock caps the reference.
    """
    return now_ms if kafka_ms is None else min(kafka_ms, now_ms)


class ClockRejected(StreamsError):
    """The engine refused a record for its time (`engine.rejection`): it is dead-lettered with the reason."""

    def __init__(self, reason: str, event_ts: int, reference_ts: int) -> None:
        self.reason = reason
        self.event_ts = event_ts
        self.reference_ts = reference_ts
        super().__init__(
            f"{reason}: event time {event_ts} ms is {(event_ts - reference_ts) / 1000:+.0f} s from the"
            f" record's reference time {reference_ts} ms (its Kafka timestamp, capped at the worker's clock)"
        )


def _tp_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


# (partition "topic:n", last offset delivered or None) -> records left to read, None if unknown.
LagFn = Callable[[str, "int | None"], "int | None"]


@dataclass(order=True)
class _Held:
    ts: int
    seq: int
    tp: str = field(compare=False)
    offset: int = field(compare=False)
    arrived: float = field(compare=False)
    item: Any = field(compare=False)


class Aligner:
    """Event-time alignment of many partitions before the engine (whose watermark is global).

    A consumer reads partitions at different event-time speeds (a backlog of GPU samples and
    one of steps are not drained at the same rate), and the engine drops events older than
    max event time - allowed lateness. So events wait here and leave in event-time order once
    every partition that still has unread records has delivered something at least as new
    (`frontier`); a partition at its end (or, backlog unknown, silent for `idle_s`) stops
    holding the others back. `max_buffer` bounds
    memory during a large catch-up (past it the oldest events leave, possibly too early).
    """

    def __init__(
        self,
        idle_s: float = 2.0,
        max_buffer: int = 200_000,
        stall_s: float = 30.0,
        idle_by_topic: dict[str, float] | None = None,
    ) -> None:
        self.idle_s = idle_s
        self.idle_by_topic = dict(idle_by_topic or {})
        self.stall_s = stall_s
        self.max_buffer = max_buffer
        self._heap: list[_Held] = []
        self._seq = 0
        self._last_ts: dict[str, int] = {}
        self._last_seen: dict[str, float] = {}
        self._last_offset: dict[str, int] = {}
        self._held_offsets: dict[str, list[int]] = {}
        self._released: dict[str, set[int]] = {}  # lazy deletion from `_held_offsets`
        self.moved_at: float | None = None  # when events last left (or nothing was held)

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, tp: str, offset: int, ts: int, item: Any, now: float) -> None:
        """Hold one decoded event of partition `tp`."""
        self._seq += 1
        heapq.heappush(self._heap, _Held(ts, self._seq, tp, offset, now, item))
        if ts > self._last_ts.get(tp, ts - 1):
            self._last_ts[tp] = ts
        self._last_seen[tp] = now
        if offset > self._last_offset.get(tp, -1):
            self._last_offset[tp] = offset
        heapq.heappush(self._held_offsets.setdefault(tp, []), offset)

    def note(self, tp: str, offset: int | None, ts: int | None, now: float) -> None:
        """Progress of an input that holds no event here: a forwarder's progress marker, or a
        record that was rejected or skipped. Every consumed offset must reach `push` or `note`,
        or the partition's backlog never reads 0 and it holds the others back."""
        if ts is not None and ts > self._last_ts.get(tp, ts - 1):
            self._last_ts[tp] = ts
        self._last_seen[tp] = now
        if offset is not None and offset > self._last_offset.get(tp, -1):
            self._last_offset[tp] = offset

    def forget(self, tp: str) -> None:
        """Stop waiting for `tp` (an input that went away)."""
        self._last_seen.pop(tp, None)
        self._last_ts.pop(tp, None)
        self._last_offset.pop(tp, None)

    def expect(self, tps: list[str], now: float) -> None:
        """Newly assigned partitions: hold everything back until each delivers or stays silent `idle_s`."""
        for tp in tps:
            self._last_seen.setdefault(tp, now)

    def frontier(self, now: float, lag: LagFn | None = None) -> int | None:
        """Event time every partition still delivering has reached (None: no partition holds back).

        A partition holds the others back while it has unread records (`lag(tp, last_offset)`
        says how many), for at most `stall_s` without a delivery; when its backlog is unknown,
        while it delivered (or was assigned) within `idle_s`.
        """
        blocking = [ts for _, ts, _, _ in self._holding(now, lag)]
        if not blocking:
            return None
        if None in blocking:
            return -(2**63)  # an assigned partition has not delivered yet: nothing is safe to release
        return min(t for t in blocking if t is not None)

    def _holding(self, now: float, lag: LagFn | None) -> list[tuple[str, int | None, int | None, float]]:
        """The partitions that hold the others back: (tp, event time, backlog, seconds silent)."""
        out = []
        for tp, seen in self._last_seen.items():
            quiet = now - seen
            backlog = lag(tp, self._last_offset.get(tp)) if lag is not None else None
            idle = self.idle_by_topic.get(tp.rpartition(":")[0], self.idle_s)
            holds = backlog > 0 and quiet < self.stall_s if backlog is not None else quiet < idle
            if holds:
                out.append((tp, self._last_ts.get(tp), backlog, quiet))
        return out

    def pop_ready(self, now: float, lag: LagFn | None = None) -> list[tuple[str, int, Any]]:
        """Events that may go to the engine now, oldest first, as (tp, offset, item)."""
        if not self._heap:
            self.moved_at = now  # nothing held: no frontier to compute
            return []
        out: list[tuple[str, int, Any]] = []
        frontier = self.frontier(now, lag)
        heap = self._heap
        while heap:
            top = heap[0]
            if not (
                len(heap) > self.max_buffer
                or (frontier is not None and top.ts <= frontier)
                or frontier is None
            ):
                break
            heapq.heappop(heap)
            self._released.setdefault(top.tp, set()).add(top.offset)
            out.append((top.tp, top.offset, top.item))
        if out or not heap or self.moved_at is None:
            self.moved_at = now
        return out

    def stuck_for(self, now: float) -> float:
        """Seconds events have been held without any leaving (0 when nothing is held)."""
        if not self._heap or self.moved_at is None:
            return 0.0
        return now - self.moved_at

    def blocker(self, now: float, lag: LagFn | None = None) -> str:
        """Which partition holds the held events back, and why (for a log line)."""
        holding = self._holding(now, lag)
        oldest = self._heap[0].ts if self._heap else None
        if not holding:
            return f"nothing (oldest held event time {oldest})"
        # The one furthest behind in event time (one that delivered nothing yet comes first).
        tp, ts, backlog, quiet = min(holding, key=lambda h: -(2**63) if h[1] is None else h[1])
        left = "unknown" if backlog is None else str(backlog)
        return (
            f"{tp} (event time {ts}, last offset {self._last_offset.get(tp)}, {left} records left,"
            f" silent {quiet:.0f} s; oldest held event time {oldest})"
        )

    def lowest_held(self, tp: str) -> int | None:
        """The smallest offset of `tp` still waiting here (not yet in the engine state)."""
        offsets = self._held_offsets.get(tp)
        released = self._released.get(tp, set())
        while offsets and offsets[0] in released:
            released.discard(heapq.heappop(offsets))
        return offsets[0] if offsets else None

    def describe(self, now: float, lag: LagFn | None = None) -> dict[str, Any]:
        """Per partition: last event time, last offset, backlog, seconds since the last delivery."""
        return {
            tp: (
                self._last_ts.get(tp),
                self._last_offset.get(tp),
                lag(tp, self._last_offset.get(tp)) if lag else None,
                round(now - seen, 1),
            )
            for tp, seen in sorted(self._last_seen.items())
        }

    def clear(self) -> None:
        """Forget everything held (the partitions were revoked; they will be redelivered)."""
        self._heap.clear()
        self._held_offsets.clear()
        self._released.clear()
        self._last_ts.clear()
        self._last_seen.clear()
        self._last_offset.clear()
        self.moved_at = None


def _telemetry_source(event: Event) -> str | None:
    """ "G|node|gpu" / "H|node" for telemetry (the at-least-once forwarder may repeat it), else None."""
    r = event.record
    if event.type == "GpuSample":
        return f"G|{r['node']}|{r.get('gpu_uuid')}"
    if event.type == "HostSample":
        return f"H|{r['node']}"
    return None


# Counters of one partition's engine runtime (summed over partitions in the progress line).
_RUNTIME_COUNTS: tuple[str, ...] = (
    "events",
    "skipped",
    "duplicates",
    "rejected",
    "engine_errors",
    "unencodable",
    "processed",
    "outputs",
    "alerts",
    "checkpoints",
    "snapshot_bytes",
    "guard_advances",
    "front_advances",
    "clock_rejected",
)


class WorkerRuntime:
    """One partition's engine plus what is needed to checkpoint it consistently with the consumed offsets."""

    def __init__(
        self, config: EngineConfig, router: Router, options: WorkerOptions, partition: int = 0
    ) -> None:
        self.config = config
        self.router = router
        self.options = options
        self.partition = partition
        self.engine: DetectionEngine | None = None
        self.aligner = Aligner(
            options.align_idle_s, options.align_max_buffer, idle_by_topic={"@route": _MARKER_IDLE_S}
        )
        self.seq = 0
        self.offsets: dict[str, int] = {}  # next offset per source partition already in the engine
        # Newest event time per telemetry source ("G|node|gpu", "H|node") already in the engine:
        # the forwarder is at-least-once, so a re-forwarded sample is dropped here.
        self.seen: dict[str, int] = {}
        self.marker_backlog: dict[str, int | None] = {}  # "@route:p" -> backlog reported by its forwarder
        self.marker_ts: dict[str, int | None] = {}  # "@route:p" -> event time its forwarder reached
        self.pending: list[Any] = []  # faust events processed but not yet acked
        self.futures: list[Any] = []  # output sends not yet known delivered
        self.last_checkpoint_ts: int | None = None
        self.last_event: Any = None  # a faust event of this partition (table writes need one)
        self.last_receive = time.monotonic()  # when the agent last got an event (wall clock: idleness only)
        self.counts = dict.fromkeys(_RUNTIME_COUNTS, 0)

    def restore(self, values: list[bytes]) -> None:
        """Load the newest snapshot among `values` (this partition's), or start an empty engine."""
        self.pending, self.futures = [], []
        best: tuple[dict[str, Any], bytes] | None = None
        for value in values:
            if value:
                meta, body = decode_snapshot_meta(value)
                if best is None or meta["seq"] > best[0]["seq"]:
                    best = (meta, body)
        if best is None:
            self.engine = DetectionEngine(self.config, self.router)
            self.seq, self.offsets, self.seen = 0, {}, {}
            log.info("partition %d: no engine snapshot, starting from empty state", self.partition)
            return
        meta, body = best
        self.seq, self.offsets, self.seen = meta["seq"], meta["offsets"], meta["seen"]
        self.engine = DetectionEngine.restore(body, self.config, self.router)
        self.last_checkpoint_ts = self.engine.max_ts
        log.warning(
            "partition %d: restored engine snapshot seq=%d (%d bytes, %d alerts firing)",
            self.partition,
            self.seq,
            len(body),
            len(self.engine.firing()),
        )

    def telemetry_front(self) -> int | None:
        """Event time every telemetry forwarder has reached (None: not every one has reported yet).

        The newest progress marker, held back by any forwarder still catching up: it moves the
        watermark of an engine whose own input stopped (a stalled job, a silent node, the
        partition of unbound telemetry) the way the global watermark of the offline replay does.
        """
        if len(self.marker_ts) < self.options.partitions:
            return None
        newest = max((ts for ts in self.marker_ts.values() if ts is not None), default=None)
        if newest is None:
            return None
        front = newest
        for vtp, backlog in self.marker_backlog.items():
            if backlog is None or backlog > 0:
                ts = self.marker_ts.get(vtp)
                if ts is None:
                    return None
                front = min(front, ts)
        return front

    def already_seen(self, tp: str, offset: int) -> bool:
        """True when the snapshot already contains this record (redelivered after a restart)."""
        return offset < self.offsets.get(tp, -1)

    def duplicate(self, event: Event) -> bool:
        """True for a telemetry sample this engine already has (re-forwarded)."""
        ident = _telemetry_source(event)
        return ident is not None and int(event.record["ts"]) <= self.seen.get(ident, -(2**63))

    def remember(self, event: Event) -> None:
        """Note a telemetry sample the engine took (not one it rejected for its time: a sample
        stamped 2199 would make every later sample of its GPU look re-forwarded)."""
        ident = _telemetry_source(event)
        if ident is not None:
            self.seen[ident] = max(int(event.record["ts"]), self.seen.get(ident, -(2**63)))

    def mark(self, tp: str, offset: int) -> None:
        """Record that this offset is now part of the engine state."""
        if offset + 1 > self.offsets.get(tp, -1):
            self.offsets[tp] = offset + 1

    def checkpoint_due(self, outputs: list[Event]) -> bool:
        """Alert transition, or enough event time / events since the last checkpoint."""
        if any(o.type == "Alert" for o in outputs):
            return True
        if len(self.pending) >= self.options.checkpoint_events:
            return True
        engine = self.engine
        if engine is None or engine.max_ts is None:
            return False
        if self.last_checkpoint_ts is None:
            self.last_checkpoint_ts = engine.max_ts
            return False
        return engine.max_ts - self.last_checkpoint_ts >= self.options.checkpoint_interval_ms

    def snapshot_value(self) -> bytes:
        """Next sequence number's table value; offsets never claim events still held by the aligner."""
        assert self.engine is not None
        self.seq += 1
        self.last_checkpoint_ts = self.engine.max_ts
        offsets = {}
        for tp, nxt in self.offsets.items():
            held = self.aligner.lowest_held(tp)
            offsets[tp] = nxt if held is None else min(nxt, held)
        body = self.engine.snapshot()
        self.counts["checkpoints"] += 1
        self.counts["snapshot_bytes"] = len(body)
        return encode_snapshot(self.seq, offsets, body, self.seen)


class _Forwarder:
    """Sends of a forwarding agent and the events they came from: acked once every send is delivered."""

    def __init__(self) -> None:
        self.pending: list[Any] = []
        self.futures: list[Any] = []

    def clear(self) -> None:
        self.pending, self.futures = [], []

    async def flush(self, stream: Any, app: Any) -> None:
        futures, self.futures = self.futures, []
        pending, self.pending = self.pending, []
        # Table changelog writes too (producer flush) when there is something to ack.
        await _delivered(app, futures, "forwarded records", flush=bool(pending))
        for done in pending:
            await stream.ack(done)


async def _delivered(app: Any, futures: list[Any], what: str, *, flush: bool = True) -> None:
    """Wait until Kafka acknowledged `futures` (and everything produced, if `flush`).

    A producer that acknowledges nothing for `_DELIVERY_TIMEOUT_S` does not recover by waiting
    longer: the worker logs why and stops (SIGTERM to itself; `streams.worker` makes that end the
    process within seconds even if the clean stop hangs too), so a supervisor restarts it from its
    last checkpoint. Nothing is lost: offsets are committed only after the state that covers them.
    """

    async def _all() -> None:
        for fut in futures:
            await fut
        if flush:
            await app.producer.flush()

    task = asyncio.ensure_future(_all())
    done, _ = await asyncio.wait({task}, timeout=_DELIVERY_TIMEOUT_S)  # never cancels the sends
    if not done:
        log.error(
            "Kafka has not acknowledged %s (%d sends) for %.0f s: the producer is stuck; stopping the"
            " worker so that it restarts from its last checkpoint",
            what,
            len(futures),
            _DELIVERY_TIMEOUT_S,
        )
        os.kill(os.getpid(), signal.SIGTERM)
    await task


def _current(fevent: Any) -> Any:
    """Context manager: make `fevent` Faust's current event (table writes go to its partition)."""

    class _Ctx:
        def __enter__(self) -> None:
            self.token = _current_event.set(weakref.ref(fevent))

        def __exit__(self, *exc: object) -> None:
            _current_event.reset(self.token)

    return _Ctx()


def build_app(options: WorkerOptions) -> faust.App:
    """A Faust app: telemetry re-keyed by job, one detection engine per assigned partition."""
    config = load_config(options.config_path)
    router = load_router(options.routing_path)
    codec = Codec() if not options.schema_registry_url else _registry_codec(options.schema_registry_url)
    prefix = options.topic_prefix
    n = options.partitions
    app_id = prefix + options.app_id
    options.workdir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        app_id,
        broker=_broker_url(options.bootstrap),
        store=options.store or default_store(),
        datadir=str(options.workdir / "faust"),
        processing_guarantee="at_least_once",
        topic_partitions=n,
        topic_replication_factor=options.replication_factor,
        broker_credentials=broker_credentials(options),
        topic_allow_declare=True,  # the broker does not auto-create: Faust declares its own topics
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        # A snapshot can be large: let the producer send it (topic-level max.message.bytes below).
        producer_max_request_size=16 * 1024 * 1024,
        broker_commit_interval=2.0,
        # A killed worker's membership blocks its successor until the session times out.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=3.0,
        stream_wait_empty=False,
        stream_buffer_maxsize=16_384,
        broker_max_poll_records=5_000,
        # Table keys are short strings, values bytes: no JSON around either.
        key_serializer="raw",
        value_serializer="raw",
        **options.extra,
    )
    raw: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}
    # internal=True: Faust declares these at start (existing topics are left as they are); the
    # broker does not auto-create the two internal ones.
    internal: dict[str, Any] = {**raw, "partitions": n, "internal": True}
    events_src = app.topic(prefix + TRAINING_EVENTS, **raw)
    node_src = app.topic(*(prefix + t for t in NODE_TOPICS), **internal)
    job_src = app.topic(*(prefix + t for t in JOB_TOPICS), **internal)
    bindings_out = app.topic(prefix + BINDINGS, **internal)
    by_job_out = app.topic(prefix + TELEMETRY_BY_JOB, **internal)
    out_topics: dict[str, Any] = {}

    def out_topic(name: str) -> Any:
        if name not in out_topics:
            out_topics[name] = app.topic(prefix + name, **raw)
        return out_topics[name]

    snapshots = app.Table(
        _SNAPSHOT_TABLE,
        default=None,
        partitions=n,
        key_type=str,
        value_type=bytes,
        # Compaction keeps one snapshot per key; small segments let it run soon.
        extra_topic_configs={
            "max.message.bytes": str(16 * 1024 * 1024),
            "segment.ms": "600000",
            "min.cleanable.dirty.ratio": "0.1",
        },
    )
    routes_table = app.Table(_ROUTES_TABLE, default=None, partitions=n, key_type=str, value_type=bytes)
    guard = WallClockGuard(options.guard_s, options.guard_live_ms, config.allowed_lateness_ms)
    runtimes: dict[int, WorkerRuntime] = {}
    routes = NodeRoutes(options.unbound_interval_ms)
    routes_loaded: set[int] = set()
    assigned: set[int] = set()
    node_aligner = Aligner(
        options.align_idle_s, options.align_max_buffer, idle_by_topic={"@bind": _MARKER_IDLE_S}
    )
    bind_markers: dict[str, int | None] = {}  # "@bind:q>p" -> backlog the bind agent of q reported
    bind_progress: dict[int, list[int | None]] = {}  # events partition -> [last ts, last offset] forwarded
    route_progress: dict[int, int] = {}  # node partition -> ts of the last telemetry forwarded
    sent_markers: dict[tuple[str, int], tuple[Any, float]] = {}  # (agent, source) -> (value, when)
    assigned_at = [time.monotonic()]
    bind_fw, route_fw = _Forwarder(), _Forwarder()
    totals = dict.fromkeys(
        (
            "telemetry_in",
            "training_in",
            "forwarded",
            "unbound_thinned",
            "attributed",
            "bindings",
            "bad_input",
            "deadletter",
        ),
        0,
    )
    bad_log = [0.0, 0]  # when a bad record was last logged, how many since
    # Per topic (unprefixed) for /metrics: read by route/detect, produced; dead letters per reason.
    consumed: collections.Counter[str] = collections.Counter()
    produced: collections.Counter[str] = collections.Counter()
    dead_letters: collections.Counter[str] = collections.Counter()
    metrics_server = MetricsServer(options.metrics_port) if options.metrics_port else None
    lock = asyncio.Lock()
    streams: dict[str, Any] = {}
    app.ranksight_runtimes = runtimes  # type: ignore[attr-defined]

    def unprefix(topic: str) -> str:
        return topic[len(prefix) :] if prefix and topic.startswith(prefix) else topic

    # End offsets asked of the broker for partitions the consumer has no fetch answer for yet (an
    # empty partition may have none for long): without them their backlog reads "unknown", and an
    # unknown backlog holds the other inputs back for up to a minute.
    asked_ends: dict[TP, int] = {}

    def _fetched_highwater(ktp: TP) -> int | None:
        try:
            hw = app.consumer.highwater(ktp)
        except Exception:  # not known yet (no fetch answered for this partition)
            return None
        return None if hw is None or hw < 0 else int(hw)

    def _highwater(ktp: TP) -> int | None:
        hw = _fetched_highwater(ktp)
        return asked_ends.get(ktp) if hw is None else hw

    async def _ask_ends() -> None:
        if not assigned:
            return
        tps = [TP(prefix + t, p) for t in (*NODE_TOPICS, *JOB_TOPICS) for p in sorted(assigned)]
        unknown = [tp for tp in tps if _fetched_highwater(tp) is None]
        if not unknown:
            return
        try:
            ends = await app.consumer.highwaters(*unknown)
        except Exception as exc:  # the broker will answer a later tick
            log.debug("end offsets of %d partitions not known yet: %s", len(unknown), exc)
            return
        asked_ends.update({tp: int(end) for tp, end in ends.items() if end is not None})

    def _lag(tp: str, last_offset: int | None) -> int | None:
        topic, _, partition = tp.rpartition(":")
        ktp = TP(prefix + topic, int(partition))
        hw = _highwater(ktp)
        if hw is None:
            return None
        if last_offset is None:
            # Nothing delivered yet: the backlog starts at the committed offset.
            committed = getattr(app.consumer, "_committed_offset", {}).get(ktp)
            last_offset = -1 if committed is None else int(committed) - 1
        return max(0, hw - (last_offset + 1))

    def _node_lag(tp: str, last_offset: int | None) -> int | None:
        # "@bind:q>p": the backlog the bind agent of events partition q reported (markers).
        return bind_markers.get(tp) if tp.startswith("@") else _lag(tp, last_offset)

    def _job_lag(rt: WorkerRuntime) -> LagFn:
        def lag(tp: str, last_offset: int | None) -> int | None:
            # "@route:p": the backlog the route agent of node partition p reported (markers).
            return rt.marker_backlog.get(tp) if tp.startswith("@") else _lag(tp, last_offset)

        return lag

    def _marker(fevent: Any) -> dict[str, Any] | None:
        if fevent.key != _MARKER_KEY:
            return None
        try:
            m = json.loads(bytes(fevent.value))
            return {"src": int(m["src"]), "ts": m.get("ts"), "backlog": m.get("backlog")}
        except (ValueError, KeyError, TypeError):
            return None

    # Event time counts for alignment and progress only up to the record's Kafka timestamp plus the
    # engine's clock-skew bound: one record from a node whose clock jumped ahead cannot drag the
    # progress of everything else along (and with it every engine's watermark).
    max_skew_ms = int(1000 * float(getattr(config, "max_clock_skew_s", 300.0)))

    def _align_ts(fevent: Any, event: Event) -> int | None:
        return align_ts(event_ts(event), fevent.message.timestamp, max_skew_ms, int(time.time() * 1000))

    def _held_ts(fevent: Any, event: Event) -> int:
        # A record that moves no event time leaves the aligner at once (the engine rejects it).
        ts = _align_ts(fevent, event)
        return MIN_EVENT_TS if ts is None else ts

    async def _reject(fevent: Any, topic: str, exc: DecodeError) -> Any:
        """Count and log a record the worker cannot use; dead-letter it if no sink owns its topic.

        Returns the dead-letter send's future, or None."""
        msg = fevent.message
        err = exc.located(msg.topic, msg.partition, msg.offset)
        totals["bad_input"] += 1
        now = time.monotonic()
        bad_log[1] += 1
        if now - bad_log[0] >= _BAD_LOG_S:
            owner = "dead-lettered" if topic in _INTERNAL_TYPES else "skipped (the sink dead-letters it)"
            log.warning(
                "bad input %s: %s (%d bad record(s) since the last such line)", owner, err, bad_log[1]
            )
            bad_log[0], bad_log[1] = now, 0
        if topic not in _INTERNAL_TYPES:
            return None
        return await _dead_letter(fevent, err)

    async def _dead_letter(fevent: Any, err: Exception) -> Any:
        """Send the record as read to `rs.deadletter` with why; returns the send's future."""
        msg = fevent.message
        headers = dict(deadletter_headers(err, msg.topic, msg.partition, msg.offset, component=COMPONENT))
        if isinstance(err, ClockRejected):
            headers["x-reject-reason"] = err.reason.encode()
        totals["deadletter"] += 1
        dead_letters[err.reason if isinstance(err, ClockRejected) else "decode"] += 1
        produced[DEADLETTER] += 1
        return await out_topic(DEADLETTER).send(
            key=fevent.key, value=fevent.value, headers=headers, force=True
        )

    async def _send_markers(agent: str, out: Any, progress: dict[int, tuple[int | None, int | None]]) -> None:
        """Tell every partition of `out` how far this agent got on each of its source partitions."""
        now = time.monotonic()
        for src, (ts, backlog) in sorted(progress.items()):
            if backlog is None and now - assigned_at[0] >= _MARKER_IDLE_S:
                backlog = 0  # still unknown long after the assignment: do not hold others forever
            value = json.dumps({"src": src, "ts": ts, "backlog": backlog}).encode()
            last = sent_markers.get((agent, src))
            if last is not None and last[0] == value and now - last[1] < _MARKER_HEARTBEAT_S:
                continue
            sent_markers[(agent, src)] = (value, now)
            for part in range(n):
                await out.send(key=_MARKER_KEY, value=value, partition=part, force=True)

    # -- bind: RankBound / job end -> rs.internal.bindings (keyed by node) ----------------
    def _load_routes(p: int) -> None:
        if p in routes_loaded:
            return
        routes_loaded.add(p)
        loaded = 0
        for key, value in list(routes_table.items()):
            node = key.decode() if isinstance(key, bytes) else str(key)
            if value and partition_for(node.encode(), n) == p:
                routes.load(node, json.loads(bytes(value)))
                loaded += 1
        log.info("partition %d: routes of %d nodes loaded", p, loaded)

    @app.agent(events_src, concurrency=1)
    async def bind(stream: Any) -> None:
        streams["bind"] = stream
        async for fevent in stream.noack().events():
            async with lock:
                await _bind(stream, fevent)

    async def _bind(stream: Any, fevent: Any) -> None:
        msg = fevent.message
        try:
            event = check_record(codec, fevent.value, TRAINING_EVENTS)
        except DecodeError:
            # `detect` reads the same record and reports it; its offset still counts as forwarded.
            bind_fw.pending.append(fevent)
            last = bind_progress.get(msg.partition)
            bind_progress[msg.partition] = [last[0] if last else None, msg.offset]
            return
        r = event.record
        if event.type == "RankBound":
            key = str(r["node"]).encode()
            part = partition_for(key, n)
            if part in assigned:
                # Local fast path: the node's routes are here; the topic copy makes it durable.
                _load_routes(part)
                routes.bind(r)
            bind_fw.futures.append(
                await bindings_out.send(key=key, value=fevent.value, partition=part, force=True)
            )
            totals["bindings"] += 1
            produced[BINDINGS] += 1
        elif event.type == "JobStateChanged" and r["state"] in config.job_end_states:
            # The nodes of a job are known where its bindings are: tell every partition.
            for part in range(n):
                bind_fw.futures.append(
                    await bindings_out.send(
                        key=str(r["job_id"]).encode(), value=fevent.value, partition=part, force=True
                    )
                )
        bind_fw.pending.append(fevent)
        ts = _align_ts(fevent, event)
        last = bind_progress.get(msg.partition)
        bind_progress[msg.partition] = [ts if ts is not None or last is None else last[0], msg.offset]
        if len(bind_fw.pending) >= _FORWARD_BATCH:
            await bind_fw.flush(stream, app)

    # -- route: node-keyed telemetry -> rs.internal.telemetry-by-job (keyed by job) --------
    @app.agent(node_src, concurrency=1)
    async def route(stream: Any) -> None:
        streams["route"] = stream
        async for fevent in stream.noack().events():
            async with lock:
                await _route(stream, fevent)

    async def _route(stream: Any, fevent: Any) -> None:
        msg = fevent.message
        topic = unprefix(msg.topic)
        consumed[topic] += 1
        p = msg.partition
        _load_routes(p)
        if topic == BINDINGS and (m := _marker(fevent)) is not None:
            vtp = f"@bind:{m['src']}>{p}"
            node_aligner.note(vtp, None, m["ts"], time.monotonic())
            bind_markers[vtp] = m["backlog"]
            await stream.ack(fevent)
            await _drain_nodes(stream)
            return
        try:
            event = check_record(codec, fevent.value, topic)
        except DecodeError as exc:
            fut = await _reject(fevent, topic, exc)
            if fut is not None:
                route_fw.futures.append(fut)
            if topic != BINDINGS:
                # Progress of its partition: otherwise a bad last record leaves a backlog of 1 forever.
                node_aligner.note(_tp_key(topic, p), msg.offset, None, time.monotonic())
            route_fw.pending.append(fevent)
            await _drain_nodes(stream)
            return
        if topic == BINDINGS:
            r = event.record
            if event.type == "RankBound":
                changed = [routes.bind(r)]
            else:
                mine = [name for name in routes.nodes if partition_for(name.encode(), n) == p]
                changed = routes.end_job(str(r["job_id"]), mine)
            with _current(fevent):
                for node in changed:
                    state = routes.state_of(node)
                    routes_table[node] = json.dumps(state).encode() if state else b""
            route_fw.pending.append(fevent)
        elif job_keys(event.type, event.record) and node_aligner.lowest_held(_tp_key(topic, p)) is None:
            # Attributed and nothing of its partition held: detect reads its job-keyed copies on
            # rs.telemetry.job, so it is only progress here (no alignment, no forward).
            totals["attributed"] += 1
            ts = _align_ts(fevent, event)
            node_aligner.note(_tp_key(topic, p), msg.offset, ts, time.monotonic())
            if ts is not None:
                route_progress[p] = max(ts, route_progress.get(p, -(2**63)))
            route_fw.pending.append(fevent)
            if len(node_aligner) == 0:
                if len(route_fw.pending) >= _FORWARD_BATCH:
                    await route_fw.flush(stream, app)
                return
        else:
            node_aligner.push(
                _tp_key(topic, p), msg.offset, _held_ts(fevent, event), (fevent, event), time.monotonic()
            )
        await _drain_nodes(stream)

    async def _drain_nodes(stream: Any) -> None:
        now = time.monotonic()
        for tp, _offset, (fevent, event) in node_aligner.pop_ready(now, _node_lag):
            parts: dict[int, str] = {}
            if job_keys(event.type, event.record):
                # Attributed: detect reads its job-keyed copies on rs.telemetry.job and counts it
                # there. It stays in the node aligner only so the progress markers stay in order.
                totals["attributed"] += 1
            else:
                for key in routes.route(event):
                    parts.setdefault(partition_for(key.encode(), n), key)
                totals["telemetry_in"] += 1
                if not parts:
                    totals["unbound_thinned"] += 1
            for part, key in sorted(parts.items()):
                route_fw.futures.append(
                    await by_job_out.send(
                        key=key.encode(),
                        value=fevent.value,
                        partition=part,
                        timestamp=fevent.message.timestamp,
                        force=True,
                    )
                )
                totals["forwarded"] += 1
                produced[TELEMETRY_BY_JOB] += 1
            route_fw.pending.append(fevent)
            part_of = int(tp.rpartition(":")[2])
            ts = _align_ts(fevent, event)
            if ts is not None:
                route_progress[part_of] = max(ts, route_progress.get(part_of, -(2**63)))
        if len(route_fw.pending) >= _FORWARD_BATCH:
            await route_fw.flush(stream, app)

    # -- detect: job-keyed events -> one engine per partition ----------------------------
    def _runtime(p: int) -> WorkerRuntime:
        rt = runtimes.get(p)
        if rt is None:
            rt = WorkerRuntime(config, router, options, p)
            value = snapshots.get(f"engine@{p}")
            rt.restore([bytes(value)] if value else [])
            now = time.monotonic()
            rt.aligner.expect([_tp_key(t, p) for t in JOB_TOPICS], now)
            rt.aligner.expect([f"@route:{src}" for src in range(n)], now)
            runtimes[p] = rt
        return rt

    @app.agent(job_src, concurrency=1)
    async def detect(stream: Any) -> None:
        streams["detect"] = stream
        async for fevent in stream.noack().events():
            async with lock:
                await _receive(stream, fevent)

    async def _receive(stream: Any, fevent: Any) -> None:
        msg = fevent.message
        topic = unprefix(msg.topic)
        consumed[topic] += 1
        tp = _tp_key(topic, msg.partition)
        rt = _runtime(msg.partition)
        rt.last_event = fevent
        if topic == TELEMETRY_BY_JOB and (m := _marker(fevent)) is not None:
            vtp = f"@route:{m['src']}"
            now = time.monotonic()
            rt.aligner.note(vtp, None, m["ts"], now)
            # The marker is a record of this partition too: read, so not part of its backlog.
            rt.aligner.note(tp, msg.offset, None, now)
            rt.marker_backlog[vtp] = m["backlog"]
            rt.marker_ts[vtp] = m["ts"]
            await stream.ack(fevent)
            await _drain(stream, rt)
            return
        # Markers repeat while all input is stopped: only records count as input (wall-clock guard).
        now = rt.last_receive = time.monotonic()
        if rt.already_seen(tp, msg.offset):
            rt.counts["skipped"] += 1
            rt.aligner.note(tp, msg.offset, None, now)  # consumed: no longer part of the backlog
            await stream.ack(fevent)
            await _drain(stream, rt)
            return
        rt.counts["events"] += 1
        try:
            event = check_record(codec, fevent.value, topic)
        except DecodeError as exc:
            rt.counts["rejected"] += 1
            fut = await _reject(fevent, topic, exc)
            if fut is not None:
                rt.futures.append(fut)
            rt.mark(tp, msg.offset)
            rt.pending.append(fevent)
            rt.aligner.note(tp, msg.offset, None, now)
        else:
            rt.aligner.push(tp, msg.offset, _held_ts(fevent, event), (fevent, event), now)
        await _drain(stream, rt)

    async def _send_outputs(rt: WorkerRuntime, outputs: list[Event]) -> None:
        for out in outputs:
            name = topic_for(out.type)
            rt.counts["outputs"] += 1
            produced[name] += 1
            if out.type == "Alert":
                rt.counts["alerts"] += 1
            try:
                value = codec.encode(out)
            except EncodeError as exc:
                # A detector produced what its schema cannot hold: lose that output, not the worker.
                rt.counts["unencodable"] += 1
                log.error("dropped an output the worker cannot encode: %s", exc)
                continue
            # force=True: send now, not when the offset commits; the checkpoint waits for delivery.
            rt.futures.append(
                await out_topic(name).send(key=key_for(name, out.record), value=value, force=True)
            )

    async def _drain(stream: Any, rt: WorkerRuntime) -> None:
        engine = rt.engine
        if engine is None:
            return
        for tp, offset, (fevent, event) in rt.aligner.pop_ready(time.monotonic(), _job_lag(rt)):
            rt.mark(tp, offset)
            rt.pending.append(fevent)
            if tp.startswith(TELEMETRY_JOB):
                # One source record, one count: a HostSample of N jobs has N copies; count the first.
                keys = job_keys(event.type, event.record)
                if keys and bytes(fevent.key or b"") == keys[0].encode():
                    totals["telemetry_in"] += 1
            elif not tp.startswith(TELEMETRY_BY_JOB):
                totals["training_in"] += 1
            if rt.duplicate(event):
                rt.counts["duplicates"] += 1
                continue
            reference = reference_ms(received_ms(fevent), int(time.time() * 1000))
            try:
                outputs = engine.process(event, received_ts=reference)
            except Exception:
                # A record that breaks a detector must not crash-loop the agent (it would be
                # redelivered forever): log it with the traceback and go on without it.
                rt.remember(event)
                rt.counts["engine_errors"] += 1
                log.exception("the engine failed on %s at %s@%d; skipped", event.type, tp, offset)
                continue
            if engine.rejection is not None:
                # Valid for the sink (it stores the record), wrong in time for detection: the engine
                # raises clock_skew, the worker owns the dead letter.
                rt.counts["clock_rejected"] += 1
                rt.futures.append(
                    await _dead_letter(fevent, ClockRejected(engine.rejection, event_ts(event), reference))
                )
                continue
            rt.remember(event)
            rt.counts["processed"] += 1
            await _send_outputs(rt, outputs)
            if rt.checkpoint_due(outputs):
                await _checkpoint(stream, rt)
        front = rt.telemetry_front()
        if front is not None and rt.last_event is not None:
            # Telemetry elsewhere moved on: so does this engine's event time (never past what the
            # aligner may still release to it).
            wm = front - config.allowed_lateness_ms
            if engine.watermark is None or wm > engine.watermark:
                held = rt.aligner.frontier(time.monotonic(), _job_lag(rt))
                if held is not None:
                    wm = min(wm, held - config.allowed_lateness_ms)
            if engine.watermark is None or wm > engine.watermark:
                outputs = engine.advance(wm)
                rt.counts["front_advances"] += 1
                await _send_outputs(rt, outputs)
                if any(o.type == "Alert" for o in outputs):
                    await _checkpoint(stream, rt)

    async def _checkpoint(stream: Any, rt: WorkerRuntime) -> None:
        # 1. every output delivered, 2. snapshot written and delivered, 3. only then ack (commit).
        futures, rt.futures = rt.futures, []
        await _delivered(app, futures, f"the outputs of partition {rt.partition}", flush=False)
        # The table writes its changelog to the partition of the current event: one of this
        # engine's partition, so `engine@p` lives on changelog partition p (moves with p).
        anchor = rt.last_event
        assert anchor is not None and anchor.message.partition == rt.partition
        with _current(anchor):
            snapshots[f"engine@{rt.partition}"] = rt.snapshot_value()
        await _delivered(app, [], f"the snapshot of partition {rt.partition}")
        pending, rt.pending = rt.pending, []
        for done in pending:
            await stream.ack(done)

    @app.timer(_ASK_ENDS_S)
    async def _ends_tick() -> None:
        await _ask_ends()

    @app.timer(options.align_idle_s / 4)
    async def _tick() -> None:
        async with lock:
            if "route" in streams:
                if len(node_aligner):
                    await _drain_nodes(streams["route"])
                    _log_if_stuck("telemetry re-keying", node_aligner, _node_lag)
                if route_fw.pending:
                    await route_fw.flush(streams["route"], app)
            if "bind" in streams and bind_fw.pending:
                await bind_fw.flush(streams["bind"], app)
            # Progress markers go out after the forwarded records are delivered (flush above).
            await _send_markers("bind", bindings_out, _bind_state())
            if "route" in streams:
                await _send_markers("route", by_job_out, _route_state())
            stream = streams.get("detect")
            if stream is None:
                return
            now = time.monotonic()
            for rt in list(runtimes.values()):
                engine = rt.engine
                if engine is None:
                    continue
                # Release events held for idle partitions when no new event arrives to do it.
                if len(rt.aligner):
                    await _drain(stream, rt)
                    _log_if_stuck(f"partition {rt.partition}", rt.aligner, _job_lag(rt))
                silent = now - rt.last_receive
                if not len(rt.aligner):
                    wm = guard.watermark(int(time.time() * 1000), silent, engine.max_ts, engine.watermark)
                    if wm is not None:
                        # All input stopped while live: let timeouts fire on wall-clock time.
                        rt.counts["guard_advances"] += 1
                        outputs = engine.advance(wm)
                        await _send_outputs(rt, outputs)
                        if outputs:
                            await _checkpoint(stream, rt)
                # Input went quiet: checkpoint what was processed, so the committed offsets reach the
                # end (consumer lag reads 0 once caught up, and a restart replays nothing).
                if silent >= options.align_idle_s and rt.pending and not len(rt.aligner):
                    await _checkpoint(stream, rt)

    stuck_logged: dict[int, float] = {}  # id(aligner) -> when it was last reported stuck

    def _log_if_stuck(what: str, aligner: Aligner, lag: LagFn) -> None:
        """A held-back aligner that does not move for long says which input holds it, and why."""
        now = time.monotonic()
        stuck = aligner.stuck_for(now)
        if stuck < options.stuck_log_s or now - stuck_logged.get(id(aligner), -1e18) < options.stuck_log_s:
            return
        stuck_logged[id(aligner)] = now
        log.warning(
            "%s: %d events held for %.0f s, none released; waiting for %s",
            what,
            len(aligner),
            stuck,
            aligner.blocker(now, lag),
        )

    def _bind_state() -> dict[int, tuple[int | None, int | None]]:
        state: dict[int, tuple[int | None, int | None]] = {}
        for q in assigned:
            ts, offset = bind_progress.get(q, (None, None))
            state[q] = (ts, _lag(_tp_key(TRAINING_EVENTS, q), offset))
        return state

    def _route_state() -> dict[int, tuple[int | None, int | None]]:
        state: dict[int, tuple[int | None, int | None]] = {}
        for p in assigned:
            backlog: int | None = len(node_aligner)
            for topic in (TELEMETRY_GPU, TELEMETRY_HOST):
                ntp = _tp_key(topic, p)
                left = _lag(ntp, node_aligner._last_offset.get(ntp))
                backlog = None if left is None or backlog is None else backlog + left
            state[p] = (route_progress.get(p), backlog)
        return state

    def _totals() -> dict[str, int]:
        # Every counter present even before any partition's engine exists (the first progress line).
        out = {**dict.fromkeys(_RUNTIME_COUNTS, 0), **totals}
        for rt in runtimes.values():
            for k, v in rt.counts.items():
                out[k] = out.get(k, 0) + v if k != "snapshot_bytes" else max(out.get(k, 0), v)
        # Source records (telemetry + training) this worker has fully handled: the bench's progress.
        out["source_events"] = out["telemetry_in"] + out["training_in"]
        return out

    def _source_lag() -> dict[str, int | None]:
        """Per source topic: records of the assigned partitions not read yet (None while unknown)."""
        left: dict[str, int | None] = dict.fromkeys((*SOURCE_TOPICS, TELEMETRY_JOB), 0)
        for p in sorted(assigned):
            rt = runtimes.get(p)
            read = [(t, node_aligner) for t in (TELEMETRY_GPU, TELEMETRY_HOST)]
            read += [(t, rt.aligner) for t in (TRAINING_STEPS, TRAINING_EVENTS, TELEMETRY_JOB)] if rt else []
            for topic, aligner in read:
                tp = _tp_key(topic, p)
                lag, so_far = _lag(tp, aligner._last_offset.get(tp)), left[topic]
                left[topic] = None if lag is None or so_far is None else so_far + lag
        return left

    def _watermark_delay_s() -> float | None:
        marks = [rt.engine.watermark for rt in runtimes.values() if rt.engine and rt.engine.watermark]
        return (time.time() * 1000 - min(marks)) / 1000 if marks else None

    @app.timer(_METRICS_S)
    async def _metrics() -> None:
        if metrics_server is None:
            return
        firing: collections.Counter[str] = collections.Counter()
        for rt in runtimes.values():
            if rt.engine is not None:
                firing.update(fp.split("/", 1)[0] for fp in rt.engine.tracker.firing())
        metrics_server.publish(
            worker_metrics(
                consumed=consumed,
                produced=produced,
                totals=_totals(),
                dead_letters=dead_letters,
                lag={t: n for t, n in _source_lag().items() if n is not None},
                watermark_delay_s=_watermark_delay_s(),
                firing_by_rule=firing,
            )
        )

    last_stats: list[Any] = [time.monotonic(), 0]  # when the last progress line went out, events then

    @app.timer(options.stats_interval_s)
    async def _stats() -> None:
        t = _totals()
        now = time.monotonic()
        rate = (t["source_events"] - last_stats[1]) / max(now - last_stats[0], 1e-9)
        last_stats[0], last_stats[1] = now, t["source_events"]
        lags = list(_source_lag().values())
        lag = None if None in lags else sum(n or 0 for n in lags)
        delay_s = _watermark_delay_s()
        delay = "none yet" if delay_s is None else f"{delay_s:,.1f} s"
        log.info(
            "worker: %s source events handled (%s/s), %s alerts, %s dead letters (%s clock-rejected),"
            " %s bad input; lag %s records; watermark delay %s (oldest partition); held %s + %s;"
            " partitions %s",
            f"{t['source_events']:,}",
            f"{rate:,.0f}",
            f"{t['alerts']:,}",
            f"{t['deadletter']:,}",
            f"{t['clock_rejected']:,}",
            f"{t['bad_input']:,}",
            "unknown" if lag is None else f"{lag:,}",
            delay,
            f"{sum(len(rt.aligner) for rt in runtimes.values()):,}",
            f"{len(node_aligner):,}",
            sorted(runtimes),
        )
        log.debug("worker counters: %s", t)
        for p, rt in sorted(runtimes.items()):
            log.debug("partition %d: %s", p, rt.aligner.describe(time.monotonic(), _job_lag(rt)))

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def _assigned(app_: Any, assigned_tps: Any, **kwargs: Any) -> None:
        names = {prefix + t: t for t in (*NODE_TOPICS, *JOB_TOPICS)}
        parts = {tp.partition for tp in assigned_tps if tp.topic in names}
        assigned.clear()
        assigned.update(parts)
        asked_ends.clear()
        assigned_at[0] = time.monotonic()
        now = time.monotonic()
        node_tps = [_tp_key(t, p) for t in (TELEMETRY_GPU, TELEMETRY_HOST) for p in parts]
        bind_tps = [f"@bind:{q}>{p}" for q in range(n) for p in parts]
        node_aligner.expect(sorted(node_tps + bind_tps), now)
        log.info("assigned partitions %s", sorted(parts))

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def _revoked(app_: Any, revoked: Any, **kwargs: Any) -> None:
        # Unacked events will be redelivered: rebuild engines and routes from the tables.
        runtimes.clear()
        routes.forget_nodes(lambda node: False)
        routes_loaded.clear()
        node_aligner.clear()
        bind_markers.clear()
        bind_progress.clear()
        route_progress.clear()
        sent_markers.clear()
        bind_fw.clear()
        route_fw.clear()

    return app


def _broker_url(bootstrap: str) -> list[str]:
    return [f"kafka://{host.strip()}" for host in bootstrap.split(",") if host.strip()]


def _registry_codec(url: str) -> Codec:
    from schemas.codec import codec_from_settings

    return codec_from_settings(url)


def env_options(**overrides: Any) -> WorkerOptions:
    """Options from `KAFKA_BOOTSTRAP` / `RANKSIGHT_TOPIC_PREFIX` (for scripts and tests)."""
    base: dict[str, Any] = {
        "bootstrap": os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        "workdir": Path(os.environ.get("RANKSIGHT_HOME", "var")) / "worker",
        "topic_prefix": os.environ.get("RANKSIGHT_TOPIC_PREFIX", ""),
    }
    base.update(overrides)
    return WorkerOptions(**base)
