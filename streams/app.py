"""The Faust worker: one `DetectionEngine` per partition, fed job-keyed records, state in changelog tables.

Design (docs/worker.md has the whole story):

* Co-partitioning. Every topic the worker reads has the same partition count and producers use
  the Java partitioner (librdkafka `murmur2_random`, aiokafka's murmur2), so a key lands on the
  same partition number whoever produced it, and Faust's assignor gives a worker the same
  partition numbers of every topic (and of the table changelogs).
* The detect path reads only job-keyed topics: `rs.training.steps`, `rs.training.events`, and
  `rs.telemetry.job` (telemetry the node agent attributed to jobs; its publisher writes one copy
  per job). Every record of a job meets on one partition, in ONE engine, with no hop in between.
* Unattributed telemetry (an idle GPU, an agent that knows no jobs) is the exception and takes a
  side path that never holds the detect path up: its publisher copies it, keyed by node, to
  `rs.telemetry.unattributed`; `detect` forwards each RankBound (and job end) it reads to
  `rs.internal.bindings` keyed by node; the `route` agent reads both, in event-time order, and forwards
  each sample to `rs.internal.telemetry-by-job` keyed by the job its GPU / node is bound to,
  which detect reads like any other input. The worker never reads the node-keyed
  `rs.telemetry.gpu` / `rs.telemetry.host` (the sink's): every sample is read once.
* Per partition, an `Aligner` releases records in event-time order across the input partitions
  (a partition with unread records holds the others back), and checkpoints are bounded (alert,
  every `checkpoint_interval_ms` of processing, every `checkpoint_events` records). Delivery is
  at-least-once: outputs delivered -> snapshot written -> only then the records are acked (their
  offsets committed). Faust's `exactly_once` is not used (against Apache Kafka 4.1 it committed
  offsets of aborted transactions).
* Event time moves without input too: an engine whose inputs are all read follows the newest
  event time of this worker's other engines (as the offline replay's one watermark does), and a
  wall-clock guard advances an engine silent for `guard_s` while its event time is live, so
  timeouts fire when all input stops (never for historical data).
"""

from __future__ import annotations

import asyncio
import collections
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

from infra.metrics import MetricsServer
from schemas.codec import Codec
from schemas.errors import DecodeError, EncodeError
from schemas.records import Event
from schemas.topics import (
    DEADLETTER,
    TELEMETRY_JOB,
    TELEMETRY_UNATTRIBUTED,
    TRAINING_EVENTS,
    TRAINING_STEPS,
    WORKER_SOURCES,
    deadletter_headers,
    job_keys,
    key_for,
    off_topic_reason,
    topic_for,
)
from streams.alerting.routing import load_router
from streams.aligner import Aligner, LagFn, tp_key
from streams.config import load_config
from streams.engine import MAX_EVENT_TS, MIN_EVENT_TS, event_ts
from streams.errors import StreamsError
from streams.partition import WorkerRuntime
from streams.rekey import NodeRoutes, WallClockGuard, partition_for
from streams.runtime.health import worker_metrics
from streams.transport import App

__all__ = [
    "BINDINGS",
    "COMPONENT",
    "DEFAULT_APP_ID",
    "JOB_TOPICS",
    "NODE_TOPICS",
    "SOURCE_TOPICS",
    "TELEMETRY_BY_JOB",
    "ClockRejected",
    "InFlight",
    "WorkerHealth",
    "WorkerOptions",
    "align_ts",
    "broker_credentials",
    "build_app",
    "check_record",
    "feed_engine",
    "received_ms",
    "reference_ms",
    "side_fronts",
]

log = logging.getLogger("ranksight.worker")

DEFAULT_APP_ID = "ranksight-detect"
BINDINGS = "rs.internal.bindings"
TELEMETRY_BY_JOB = "rs.internal.telemetry-by-job"
SOURCE_TOPICS: tuple[str, ...] = WORKER_SOURCES  # what producers write that the worker reads
NODE_TOPICS: tuple[str, ...] = (TELEMETRY_UNATTRIBUTED, BINDINGS)
JOB_TOPICS: tuple[str, ...] = (TRAINING_STEPS, TRAINING_EVENTS, TELEMETRY_JOB, TELEMETRY_BY_JOB)
_SNAPSHOT_TABLE = "engine-snapshot"
_ROUTES_TABLE = "node-routes"
_FORWARD_BATCH = 500  # forwarded records acked together once delivered
_SIDE_FRONT_S = 0.05  # how often route recomputes how far it has forwarded (it looks at every partition)
_FORWARD_HOP_S = 0.5  # a forwarded sample counts as pending this long after it was sent (to detect)
# The `x-component` header of what the worker dead-letters. It owns only the topics no sink reads
# (its internal ones); bad records of the source topics are the sink's to dead-letter (once).
COMPONENT = "worker"
# Record types each input topic may carry (the source topics follow `schemas.topics.RECORD_TOPIC`).
_INTERNAL_TYPES: dict[str, frozenset[str]] = {
    BINDINGS: frozenset({"RankBound", "JobStateChanged"}),
    TELEMETRY_BY_JOB: frozenset({"GpuSample", "HostSample"}),
    # Not internal, but no sink reads them (the sink stores telemetry once, node-keyed): the worker
    # owns their dead letters.
    TELEMETRY_JOB: frozenset({"GpuSample", "HostSample"}),
    TELEMETRY_UNATTRIBUTED: frozenset({"GpuSample", "HostSample"}),
}
_ASK_ENDS_S = 0.5  # how often the end offsets of partitions without a fetch answer are asked for
_BAD_LOG_S = 10.0  # bad input: one warning per this many seconds, with a count
_METRICS_S = 2.0  # how often the /metrics snapshot is refreshed
# Sends Kafka has not acknowledged after this long mean a stuck producer (its own requests time
# out after 40 s and are retried): the worker stops, loudly, instead of holding everything silently.
_DELIVERY_TIMEOUT_S = 120.0


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
    # A partition at its end still holds the others this long after its last record (the next
    # records of a backlog being published may be in flight): bounds out-of-order release.
    align_end_grace_s: float = 0.5
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


def feed_engine(
    rt: WorkerRuntime,
    tp: str,
    offset: int,
    event: Event,
    key: bytes | None,
    kafka_ms: int | None,
    totals: dict[str, int],
) -> tuple[list[Event], ClockRejected | None]:
    """One record the aligner released into its partition's engine: marked as part of the state,
    counted, deduplicated, processed. Returns the engine's outputs, and for a record the engine
    rejected for its time the error to dead-letter it with (the worker owns that dead letter)."""
    rt.mark(tp, offset)
    if tp.startswith(TELEMETRY_JOB):
        # One source record, one count: a HostSample of N jobs has N copies; count the first.
        keys = job_keys(event.type, event.record)
        if keys and bytes(key or b"") == keys[0].encode():
            totals["telemetry_in"] += 1
    elif not tp.startswith(TELEMETRY_BY_JOB):
        totals["training_in"] += 1
    if rt.duplicate(event):
        rt.counts["duplicates"] += 1
        return [], None
    engine = rt.engine
    assert engine is not None
    reference = reference_ms(kafka_ms, int(time.time() * 1000))
    try:
        outputs = engine.process(event, received_ts=reference)
    except Exception:
        # A record that breaks a detector must not crash-loop the worker (it would be redelivered
        # forever): log it with the traceback and go on without it.
        rt.remember(event)
        rt.counts["engine_errors"] += 1
        log.exception("the engine failed on %s at %s@%d; skipped", event.type, tp, offset)
        return [], None
    if engine.rejection is not None:
        # Valid for the sink (it stores the record), wrong in time for detection: the engine raises
        # clock_skew, the worker dead-letters the record.
        rt.counts["clock_rejected"] += 1
        return [], ClockRejected(engine.rejection, event_ts(event), reference)
    rt.remember(event)
    rt.counts["processed"] += 1
    return outputs, None


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


class _Backlogs:
    """How many records each input partition has left unread: the consumer's high watermark from
    its fetch answers, or, for a partition without one yet (an empty partition may have none for
    long), its end offset asked of the broker. An unknown backlog holds the other inputs back for
    `align_idle_s`, so the worker asks every `_ASK_ENDS_S`."""

    def __init__(self, app: Any, prefix: str) -> None:
        self.app = app
        self.prefix = prefix
        self.asked: dict[TP, int] = {}

    def _fetched(self, ktp: TP) -> int | None:
        try:
            hw = self.app.consumer.highwater(ktp)
        except Exception:  # not known yet (no fetch answered for this partition)
            return None
        return None if hw is None or hw < 0 else int(hw)

    async def ask_ends(self, partitions: set[int]) -> None:
        """Ask the broker for the end offsets of the assigned partitions no fetch has answered for."""
        tps = [TP(self.prefix + t, p) for t in (*NODE_TOPICS, *JOB_TOPICS) for p in sorted(partitions)]
        unknown = [tp for tp in tps if self._fetched(tp) is None]
        if not unknown:
            return
        try:
            ends = await self.app.consumer.highwaters(*unknown)
        except Exception as exc:  # the broker will answer a later tick
            log.debug("end offsets of %d partitions not known yet: %s", len(unknown), exc)
            return
        self.asked.update({tp: int(end) for tp, end in ends.items() if end is not None})

    def lag(self, tp: str, last_offset: int | None) -> int | None:
        """Records of partition `tp` ("topic:n", unprefixed) after `last_offset` (None: unknown yet)."""
        topic, _, partition = tp.rpartition(":")
        ktp = TP(self.prefix + topic, int(partition))
        hw = self._fetched(ktp)
        if hw is None:
            hw = self.asked.get(ktp)
        if hw is None:
            return None
        if last_offset is None:
            # Nothing delivered yet: the backlog starts at the committed offset.
            committed = getattr(self.app.consumer, "_committed_offset", {}).get(ktp)
            last_offset = -1 if committed is None else int(committed) - 1
        return max(0, hw - (last_offset + 1))


class WorkerHealth:
    """The worker's own health: its counters, the progress line and the `/metrics` snapshot."""

    TOTALS = (
        "telemetry_in",
        "training_in",
        "forwarded",
        "unbound_thinned",
        "bindings",
        "bad_input",
        "deadletter",
    )

    def __init__(
        self,
        runtimes: dict[int, WorkerRuntime],
        node_aligner: Aligner,
        assigned: set[int],
        lag: LagFn,
        metrics_port: int,
    ) -> None:
        self.runtimes = runtimes
        self.node_aligner = node_aligner
        self.assigned = assigned
        self.lag = lag
        self.totals = dict.fromkeys(self.TOTALS, 0)
        # Per topic (unprefixed): read by route/detect, produced; dead letters per reason.
        self.consumed: collections.Counter[str] = collections.Counter()
        self.produced: collections.Counter[str] = collections.Counter()
        self.dead_letters: collections.Counter[str] = collections.Counter()
        self.metrics_server = MetricsServer(metrics_port) if metrics_port else None
        self._last_line = (time.monotonic(), 0)  # when the last progress line went out, events then

    def counters(self) -> dict[str, int]:
        """The worker's totals plus every partition runtime's counters, summed."""
        # Every counter present even before any partition's engine exists (the first progress line).
        out = {**dict.fromkeys(WorkerRuntime.COUNTS, 0), **self.totals}
        for rt in self.runtimes.values():
            for k, v in rt.counts.items():
                out[k] = out.get(k, 0) + v if k != "snapshot_bytes" else max(out.get(k, 0), v)
        # Source records (telemetry + training) this worker has fully handled: the bench's progress.
        out["source_events"] = out["telemetry_in"] + out["training_in"]
        return out

    def source_lag(self) -> dict[str, int | None]:
        """Per source topic: records of the assigned partitions not read yet (None while unknown)."""
        left: dict[str, int | None] = dict.fromkeys(SOURCE_TOPICS, 0)
        for p in sorted(self.assigned):
            rt = self.runtimes.get(p)
            read = [(TELEMETRY_UNATTRIBUTED, self.node_aligner)]
            read += [(t, rt.aligner) for t in (TRAINING_STEPS, TRAINING_EVENTS, TELEMETRY_JOB)] if rt else []
            for topic, aligner in read:
                tp = tp_key(topic, p)
                lag, so_far = self.lag(tp, aligner.last_offset(tp)), left[topic]
                left[topic] = None if lag is None or so_far is None else so_far + lag
        return left

    def watermark_delay_s(self) -> float | None:
        """Wall clock minus the oldest engine watermark."""
        marks = [rt.engine.watermark for rt in self.runtimes.values() if rt.engine and rt.engine.watermark]
        return (time.time() * 1000 - min(marks)) / 1000 if marks else None

    def publish_metrics(self) -> None:
        if self.metrics_server is None:
            return
        firing: collections.Counter[str] = collections.Counter()
        for rt in self.runtimes.values():
            if rt.engine is not None:
                firing.update(fp.split("/", 1)[0] for fp in rt.engine.tracker.firing())
        self.metrics_server.publish(
            worker_metrics(
                consumed=self.consumed,
                produced=self.produced,
                totals=self.counters(),
                dead_letters=self.dead_letters,
                lag={t: n for t, n in self.source_lag().items() if n is not None},
                watermark_delay_s=self.watermark_delay_s(),
                firing_by_rule=firing,
            )
        )

    def log_progress(self) -> None:
        """One readable line: events, rate, alerts, dead letters, lag, watermark delay, held, partitions."""
        t = self.counters()
        now = time.monotonic()
        rate = (t["source_events"] - self._last_line[1]) / max(now - self._last_line[0], 1e-9)
        self._last_line = (now, t["source_events"])
        lags = list(self.source_lag().values())
        lag = None if None in lags else sum(n or 0 for n in lags)
        delay_s = self.watermark_delay_s()
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
            f"{sum(len(rt.aligner) for rt in self.runtimes.values()):,}",
            f"{len(self.node_aligner):,}",
            sorted(self.runtimes),
        )
        log.debug("worker counters: %s", t)
        for p, rt in sorted(self.runtimes.items()):
            log.debug("partition %d: %s", p, rt.aligner.describe(time.monotonic(), self.lag))


class InFlight:
    """Records one stage of a worker sent to a topic its other stage reads, until that stage has
    read them: [sent at, event time, partition, offset once delivered]. Progress, not time: a send
    is pending until delivered and the reader's last offset of its partition is past it. Only a
    partition this worker does not hold (another worker reads it) falls back to a time bound,
    `_FORWARD_HOP_S`."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.sent: collections.deque[list[Any]] = collections.deque()

    def add(self, ts: int, partition: int) -> list[Any]:
        """Note one send; pass the entry to `delivered` when Kafka acknowledged it."""
        entry = [time.monotonic(), ts, partition, None]
        self.sent.append(entry)
        return entry

    @staticmethod
    def delivered(entry: list[Any], offset: int | None) -> None:
        """The send's offset (None: it failed; the worker stops on failed sends anyway)."""
        entry[3] = -1 if offset is None else offset

    def oldest(self, read: Callable[[str], int | None], assigned: set[int], now: float) -> int | None:
        """The oldest event time among the sends not read yet (None: all read); `read(tp)` is the
        reader's last offset of a partition, asked once per partition."""
        last: dict[int, int | None] = {}

        def done(entry: list[Any]) -> bool:
            sent_at, _, part, offset = entry
            if part not in assigned:
                return bool(now - sent_at > _FORWARD_HOP_S)
            if offset is None:
                return False
            if part not in last:
                last[part] = read(tp_key(self.topic, part))
            seen = last[part]
            return offset < 0 or (seen is not None and seen >= offset)

        while self.sent and done(self.sent[0]):
            self.sent.popleft()
        return min((entry[1] for entry in self.sent if not done(entry)), default=None)

    def clear(self) -> None:
        self.sent.clear()


def side_fronts(
    forwards: InFlight,
    bindings: InFlight,
    node_aligner: Aligner,
    runtimes: dict[int, WorkerRuntime],
    assigned: set[int],
    lag: LagFn,
) -> int | None:
    """How far each stage of a worker got, for the other to wait on (neither waits when the other
    has nothing pending, as live). Sets the side path's upstream front and returns detect's:

    - detect holds its engines at the oldest event time the side path has not forwarded yet and
      detect has not read: records held in the side path's aligner, unread unattributed partitions,
      forwards not read back (`forwards`); so a re-keyed sample is not late for its job;
    - the side path holds at the oldest event time whose bindings it may not have yet: unread
      `rs.training.events` partitions, bindings it has not read back (`bindings`); so a sample does
      not overtake the RankBound that names its job (it would go to the unbound key).
    """
    now = time.monotonic()

    def detect_read(tp: str) -> int | None:
        rt = runtimes.get(int(tp.rpartition(":")[2]))
        return rt.aligner.last_offset(tp) if rt is not None else None

    pending = [
        ts
        for ts in (forwards.oldest(detect_read, assigned, now), node_aligner.oldest_held())
        if ts is not None
    ]
    waiting = [ts for ts in (bindings.oldest(node_aligner.last_offset, assigned, now),) if ts is not None]
    for p in assigned:
        tp = tp_key(TELEMETRY_UNATTRIBUTED, p)
        left = lag(tp, node_aligner.last_offset(tp))
        if left is None or left > 0:
            pending.append(node_aligner.last_ts(tp) or MIN_EVENT_TS)
        rt = runtimes.get(p)
        tp = tp_key(TRAINING_EVENTS, p)
        left = lag(tp, rt.aligner.last_offset(tp) if rt else None)
        if left is None or left > 0:
            waiting.append((rt.aligner.last_ts(tp) if rt else None) or MIN_EVENT_TS)
    node_aligner.set_upstream_front(min(waiting) if waiting else None)
    return min(pending) if pending else None


def _track(flight: InFlight, ts: int, partition: int, fut: Any) -> None:
    """Tell `flight` the offset of a Faust send once it is delivered."""
    entry = flight.add(ts, partition)

    def done(f: Any) -> None:
        try:
            InFlight.delivered(entry, int(f.result().offset))
        except BaseException:  # failed or cancelled: `_delivered` stops the worker on it
            InFlight.delivered(entry, None)

    fut.add_done_callback(done)


def build_app(options: WorkerOptions) -> faust.App:
    """A Faust app: `detect` (one engine per assigned partition) and the unattributed-telemetry side path."""
    config = load_config(options.config_path)
    router = load_router(options.routing_path)
    codec = Codec() if not options.schema_registry_url else _registry_codec(options.schema_registry_url)
    prefix = options.topic_prefix
    n = options.partitions
    options.workdir.mkdir(parents=True, exist_ok=True)
    app = App(
        prefix + options.app_id,
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
        consumer_max_fetch_size=8 * 1024 * 1024,
        # Table keys are short strings, values bytes: no JSON around either.
        key_serializer="raw",
        value_serializer="raw",
        **options.extra,
    )
    raw: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}
    # internal=True: Faust declares these at start (existing topics are left as they are); the
    # broker does not auto-create the two internal ones.
    internal: dict[str, Any] = {**raw, "partitions": n, "internal": True}
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
    # Node-keyed records of the side path (unattributed telemetry and bindings), in event-time order.
    node_aligner = Aligner(
        options.align_idle_s, options.align_max_buffer, end_grace_s=options.align_end_grace_s
    )
    route_fw = _Forwarder()
    # Event time through which this worker's side path has forwarded every unattributed sample (None:
    # nothing pending); `detect` holds its engines there, so in a catch-up a re-keyed sample is not
    # late for its job. Held (MIN) until first computed.
    side_front: list[Any] = [MIN_EVENT_TS, 0.0]  # [front, monotonic time computed]
    forwards_in_flight = InFlight(TELEMETRY_BY_JOB)  # forwards detect has not read yet
    bindings_in_flight = InFlight(BINDINGS)  # bindings route has not read yet
    backlogs = _Backlogs(app, prefix)
    _lag = backlogs.lag  # one bound method: the aligners reuse their frontier while it is the same
    health = WorkerHealth(runtimes, node_aligner, assigned, _lag, options.metrics_port)
    totals, consumed, produced, dead_letters = (
        health.totals,
        health.consumed,
        health.produced,
        health.dead_letters,
    )
    bad_log = [0.0, 0]  # when a bad record was last logged, how many since
    lock = asyncio.Lock()
    streams: dict[str, Any] = {}
    app.ranksight_runtimes = runtimes  # type: ignore[attr-defined]

    def unprefix(topic: str) -> str:
        return topic[len(prefix) :] if prefix and topic.startswith(prefix) else topic

    # Event time counts for alignment only up to the record's Kafka timestamp plus the engine's
    # clock-skew bound: one record from a node whose clock jumped ahead cannot drag every other
    # partition's records out of the aligner early.
    max_skew_ms = int(1000 * float(getattr(config, "max_clock_skew_s", 300.0)))

    def _align_ts(fevent: Any, event: Event) -> int | None:
        return align_ts(event_ts(event), fevent.message.timestamp, max_skew_ms, int(time.time() * 1000))

    def _held_ts(fevent: Any, event: Event) -> int:
        # A record that moves no event time leaves the aligner at once (the engine rejects it).
        ts = _align_ts(fevent, event)
        return MIN_EVENT_TS if ts is None else ts

    # -- bad input ---------------------------------------------------------------------------
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

    # -- route: unattributed node-keyed telemetry -> rs.internal.telemetry-by-job -------------
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
        tp, now = tp_key(topic, msg.partition), time.monotonic()
        _load_routes(msg.partition)
        try:
            event = check_record(codec, fevent.value, topic)
        except DecodeError as exc:
            fut = await _reject(fevent, topic, exc)
            if fut is not None:
                route_fw.futures.append(fut)
            # Read: otherwise a bad last record leaves its partition a backlog of 1 forever.
            node_aligner.note(tp, msg.offset, None, now)
            route_fw.pending.append(fevent)
        else:
            node_aligner.push(tp, msg.offset, _held_ts(fevent, event), (fevent, event), now)
        await _drain_nodes(stream)

    async def _drain_nodes(stream: Any) -> None:
        """Apply bindings and forward unattributed telemetry, in event-time order."""
        for _tp, _offset, (fevent, event) in node_aligner.pop_ready(time.monotonic(), _lag):
            route_fw.pending.append(fevent)
            if event.type in ("RankBound", "JobStateChanged"):
                _apply_binding(fevent, event)
                continue
            parts: dict[int, str] = {}
            for key in routes.route(event):
                parts.setdefault(partition_for(key.encode(), n), key)
            totals["telemetry_in"] += 1
            if not parts:
                totals["unbound_thinned"] += 1
            for part, key in sorted(parts.items()):
                fut = await by_job_out.send(
                    key=key.encode(),
                    value=fevent.value,
                    partition=part,
                    timestamp=fevent.message.timestamp,
                    force=True,
                )
                _track(forwards_in_flight, _held_ts(fevent, event), part, fut)
                route_fw.futures.append(fut)
                totals["forwarded"] += 1
                produced[TELEMETRY_BY_JOB] += 1
        if len(route_fw.pending) >= _FORWARD_BATCH:
            await route_fw.flush(stream, app)
        if time.monotonic() - side_front[1] >= _SIDE_FRONT_S:
            _update_side_front()

    def _update_side_front() -> None:
        side_front[0], side_front[1] = (
            side_fronts(forwards_in_flight, bindings_in_flight, node_aligner, runtimes, assigned, _lag),
            time.monotonic(),
        )

    def _apply_binding(fevent: Any, event: Event) -> None:
        """A binding read on partition p: update (and persist) the routes of p's nodes it changes."""
        p = fevent.message.partition
        if event.type == "RankBound":
            changed = [routes.bind(event.record)]
        else:
            mine = [name for name in routes.nodes if partition_for(name.encode(), n) == p]
            changed = routes.end_job(str(event.record["job_id"]), mine)
        with _current(fevent):
            for node in changed:
                state = routes.state_of(node)
                routes_table[node] = json.dumps(state).encode() if state else b""

    # -- detect: job-keyed records -> one engine per partition --------------------------------
    def _runtime(p: int) -> WorkerRuntime:
        rt = runtimes.get(p)
        if rt is None:
            # Unattributed telemetry re-keyed by `route` never holds the job's own records back.
            rt = WorkerRuntime(config, router, options, p, passive_topics=frozenset({TELEMETRY_BY_JOB}))
            value = snapshots.get(f"engine@{p}")
            rt.restore([bytes(value)] if value else [])
            rt.aligner.expect([tp_key(t, p) for t in JOB_TOPICS], time.monotonic())
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
        tp = tp_key(topic, msg.partition)
        rt = _runtime(msg.partition)
        rt.last_event = fevent
        now = rt.last_receive = time.monotonic()
        if rt.already_seen(tp, msg.offset):
            rt.counts["skipped"] += 1
            rt.aligner.note(tp, msg.offset, None, now)  # consumed: no longer part of the backlog
            await stream.ack(fevent)
        else:
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
                if topic == TRAINING_EVENTS:
                    await _forward_binding(rt, fevent, event)
                rt.aligner.push(tp, msg.offset, _held_ts(fevent, event), (fevent, event), now)
        await _drain(stream, rt)

    async def _forward_binding(rt: WorkerRuntime, fevent: Any, event: Event) -> None:
        """RankBound -> rs.internal.bindings keyed by node; a job's end -> every partition of it.

        For the unattributed-telemetry side path (`route`), which knows nodes, not jobs. The sends
        are part of the partition's outputs: delivered before its checkpoint acks the record.
        """
        if event.type == "RankBound":
            key = str(event.record["node"]).encode()
            part = partition_for(key, n)
            if part in assigned:
                # Local fast path: the node's routes are here; the topic copy makes it durable.
                _load_routes(part)
                routes.bind(event.record)
            fut = await bindings_out.send(key=key, value=fevent.value, partition=part, force=True)
            _track(bindings_in_flight, _held_ts(fevent, event), part, fut)
            rt.futures.append(fut)
            totals["bindings"] += 1
            produced[BINDINGS] += 1
        elif event.type == "JobStateChanged" and event.record["state"] in config.job_end_states:
            # The nodes of a job are known where its bindings are: tell every partition.
            key = str(event.record["job_id"]).encode()
            for part in range(n):
                rt.futures.append(
                    await bindings_out.send(key=key, value=fevent.value, partition=part, force=True)
                )

    async def _drain(stream: Any, rt: WorkerRuntime) -> None:
        """Feed the engine what the aligner releases; checkpoint when due."""
        engine = rt.engine
        if engine is None:
            return
        rt.aligner.set_upstream_front(side_front[0])
        for tp, offset, (fevent, event) in rt.aligner.pop_ready(time.monotonic(), _lag):
            rt.pending.append(fevent)
            outputs, rejected = feed_engine(rt, tp, offset, event, fevent.key, received_ms(fevent), totals)
            if rejected is not None:
                rt.futures.append(await _dead_letter(fevent, rejected))
                continue
            await _send_outputs(rt, outputs)
            if rt.checkpoint_due(outputs):
                await _checkpoint(stream, rt)

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

    async def _advance(stream: Any, rt: WorkerRuntime, watermark: int) -> None:
        """Move an engine's event time without input; checkpoint if that changed an alert."""
        assert rt.engine is not None
        outputs = rt.engine.advance(watermark)
        await _send_outputs(rt, outputs)
        if any(o.type == "Alert" for o in outputs):
            await _checkpoint(stream, rt)

    def _all_read(rt: WorkerRuntime) -> bool:
        """Nothing held and no unread record on any input partition of this engine."""
        if len(rt.aligner):
            return False
        for topic in JOB_TOPICS:
            tp = tp_key(topic, rt.partition)
            if _lag(tp, rt.aligner.last_offset(tp)) != 0:
                return False
        return True

    # -- timers: release held records, move event time when input stops, flush forwarders ----
    @app.timer(_ASK_ENDS_S)
    async def _ends_tick() -> None:
        if assigned:
            await backlogs.ask_ends(assigned)

    @app.timer(min(0.25, options.align_idle_s / 4))
    async def _tick() -> None:
        async with lock:
            _update_side_front()
            if "route" in streams:
                if len(node_aligner):
                    await _drain_nodes(streams["route"])
                    _log_if_stuck("unattributed telemetry", node_aligner)
                if route_fw.pending:
                    await route_fw.flush(streams["route"], app)
            stream = streams.get("detect")
            if stream is None:
                return
            now = time.monotonic()
            newest = max(
                (rt.engine.max_ts for rt in runtimes.values() if rt.engine and rt.engine.max_ts),
                default=None,
            )
            for rt in list(runtimes.values()):
                engine = rt.engine
                if engine is None:
                    continue
                # Release events held for idle partitions when no new event arrives to do it.
                if len(rt.aligner):
                    await _drain(stream, rt)
                    _log_if_stuck(f"partition {rt.partition}", rt.aligner)
                if len(rt.aligner) or rt.last_event is None:
                    continue
                silent = now - rt.last_receive
                if newest is not None and silent >= options.align_idle_s and _all_read(rt):
                    # Everything of this partition is read and nothing came for a while: its event
                    # time follows this worker's newest, so a job whose input stopped times out in a
                    # catch-up or replay too. (Not sooner: a backlog being published reads "all
                    # read" between two producer batches, and records older than the advanced
                    # watermark would be dropped as late.)
                    front = newest - config.allowed_lateness_ms
                    if engine.watermark is None or front > engine.watermark:
                        rt.counts["front_advances"] += 1
                        await _advance(stream, rt, front)
                wm = guard.watermark(int(time.time() * 1000), silent, engine.max_ts, engine.watermark)
                if wm is not None:
                    # All input stopped while live: let timeouts fire on wall-clock time.
                    rt.counts["guard_advances"] += 1
                    await _advance(stream, rt, wm)
                # Input went quiet: checkpoint what was processed, so the committed offsets reach the
                # end (consumer lag reads 0 once caught up, and a restart replays nothing).
                if silent >= options.align_idle_s and rt.pending:
                    await _checkpoint(stream, rt)

    stuck_logged: dict[int, float] = {}  # id(aligner) -> when it was last reported stuck

    def _log_if_stuck(what: str, aligner: Aligner) -> None:
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
            aligner.blocker(now, _lag),
        )

    # -- the pipeline's own health: progress line and /metrics ---------------------------------
    @app.timer(_METRICS_S)
    async def _metrics() -> None:
        health.publish_metrics()

    @app.timer(options.stats_interval_s)
    async def _stats() -> None:
        health.log_progress()

    # -- rebalances ------------------------------------------------------------------------------
    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def _assigned(app_: Any, assigned_tps: Any, **kwargs: Any) -> None:
        names = {prefix + t: t for t in (*NODE_TOPICS, *JOB_TOPICS)}
        parts = {tp.partition for tp in assigned_tps if tp.topic in names}
        assigned.clear()
        assigned.update(parts)
        backlogs.asked.clear()
        node_aligner.expect(sorted(tp_key(t, p) for t in NODE_TOPICS for p in parts), time.monotonic())
        log.info("assigned partitions %s", sorted(parts))

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def _revoked(app_: Any, revoked: Any, **kwargs: Any) -> None:
        # Unacked events will be redelivered: rebuild engines and routes from the tables.
        runtimes.clear()
        routes.forget_nodes(lambda node: False)
        routes_loaded.clear()
        node_aligner.clear()
        route_fw.clear()
        forwards_in_flight.clear()
        bindings_in_flight.clear()
        side_front[0] = MIN_EVENT_TS

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
