"""The direct worker: `streams.app`'s detection, consumed with librdkafka batches instead of Faust agents.

Same topics, same state, same guarantees as the Faust worker (docs/worker.md), at about twice its
rate: a Faust agent costs ~80 µs per record before any work is done (bench/bench_worker.py prints
that limit), a `confluent_kafka` batch a few. `ranksight worker --runtime direct` runs it.

* One consumer in group `<prefix><group>` reads the node-keyed side path (`rs.telemetry.unattributed`,
  `rs.internal.bindings`) and the job-keyed topics. Every topic has the same partition count and the
  `range` assignor gives a member the same partition numbers of each: partition p of every job topic
  meets in one `WorkerRuntime` (aligner + engine), exactly as in the Faust worker.
* State lives where the Faust worker keeps it, so a group can move from one runtime to the other:
  the compacted changelog topics `<group>-engine-snapshot-changelog` (key `engine@p` on partition p)
  and `<group>-node-routes-changelog` (key = node, on the partition of the binding). A newly
  assigned partition is restored from them before any of its records is processed.
* Offsets are committed explicitly, only after what covers them is durable: a partition's outputs
  delivered -> its snapshot delivered -> the offsets in that snapshot committed; forwarded side-path
  records delivered -> their offsets committed. A graceful revocation or stop checkpoints first; a
  crash repeats at most what followed the last checkpoint (and the snapshot's offsets skip what it
  already holds).

The per-record logic (alignment, bindings, the side path's fronts, the engine, checkpoints when
due, event time without input) is the Faust worker's, one synchronous loop instead of two agents.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from infra.kafka.topics import DEFAULT_TOPIC_SPECS, TopicSpec, create_topics
from schemas.codec import Codec
from schemas.errors import DecodeError, EncodeError
from schemas.records import Event
from schemas.topics import (
    DEADLETTER,
    TRAINING_EVENTS,
    deadletter_headers,
    key_for,
    topic_for,
)
from streams.alerting.routing import load_router
from streams.aligner import Aligner, tp_key
from streams.app import (
    _ASK_ENDS_S,
    _BAD_LOG_S,
    _DELIVERY_TIMEOUT_S,
    _INTERNAL_TYPES,
    _METRICS_S,
    _ROUTES_TABLE,
    _SIDE_FRONT_S,
    _SNAPSHOT_TABLE,
    BINDINGS,
    COMPONENT,
    JOB_TOPICS,
    NODE_TOPICS,
    TELEMETRY_BY_JOB,
    ClockRejected,
    InFlight,
    WorkerHealth,
    WorkerOptions,
    align_ts,
    check_record,
    feed_engine,
    side_fronts,
)
from streams.config import load_config
from streams.engine import MIN_EVENT_TS, event_ts
from streams.errors import StreamsError
from streams.partition import WorkerRuntime
from streams.rekey import NodeRoutes, WallClockGuard, partition_for

__all__ = ["DirectWorker", "changelog_topic", "kafka_config", "run_direct"]

log = logging.getLogger("ranksight.worker")

_BATCH = 2_000  # records taken from librdkafka's queue per call
_POLL_S = 0.05  # how long one call waits when nothing is queued
_DAY_MS = 24 * 60 * 60 * 1000
# Answers of a partition whose leader is not elected yet (a topic created a moment ago).
_NO_LEADER_YET = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
    }
)


def kafka_config(options: WorkerOptions) -> dict[str, Any]:
    """librdkafka settings for the worker's cluster: bootstrap and the same security settings as every command."""
    conf: dict[str, Any] = {
        "bootstrap.servers": options.bootstrap,
        "security.protocol": options.security_protocol,
    }
    if options.sasl_mechanism:
        conf["sasl.mechanism"] = options.sasl_mechanism
        conf["sasl.username"] = options.sasl_username or ""
        conf["sasl.password"] = options.sasl_password or ""
    return conf


def changelog_topic(options: WorkerOptions, table: str) -> str:
    """The changelog topic of one of the worker's state tables (the name Faust gives it)."""
    return f"{options.topic_prefix}{options.app_id}-{table}-changelog"


def _table_key(name: str) -> bytes:
    """A state table key as the Faust worker writes it (str keys JSON-encoded): the two runtimes share state."""
    return json.dumps(name).encode()


def _table_name(key: bytes) -> str:
    try:
        name = json.loads(key)
    except ValueError:
        return key.decode(errors="replace")
    return name if isinstance(name, str) else key.decode(errors="replace")


def _kafka_ms(msg: Message) -> int | None:
    kind, ms = msg.timestamp()
    return ms if kind != 0 and ms > 0 else None


class DirectWorker:
    """One process of the detection worker on librdkafka. `run()` blocks until `stop()` (or a signal)."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.config = load_config(options.config_path)
        self.router = load_router(options.routing_path)
        self.codec = Codec()
        if options.schema_registry_url:
            from schemas.codec import codec_from_settings

            self.codec = codec_from_settings(options.schema_registry_url)
        self.prefix = options.topic_prefix
        self.n = options.partitions
        self.conf = kafka_config(options)
        self.group = self.prefix + options.app_id
        self.snapshot_topic = changelog_topic(options, _SNAPSHOT_TABLE)
        self.routes_topic = changelog_topic(options, _ROUTES_TABLE)
        self.max_skew_ms = int(1000 * float(getattr(self.config, "max_clock_skew_s", 300.0)))
        self.guard = WallClockGuard(options.guard_s, options.guard_live_ms, self.config.allowed_lateness_ms)

        self.runtimes: dict[int, WorkerRuntime] = {}
        self.snapshots: dict[int, bytes] = {}  # restored at assignment, consumed by the first record
        self.routes = NodeRoutes(options.unbound_interval_ms)
        self.assigned: set[int] = set()
        self.node_aligner = Aligner(
            options.align_idle_s, options.align_max_buffer, end_grace_s=options.align_end_grace_s
        )
        # Side path: next offset per node-topic partition whose records are forwarded / applied.
        self.route_offsets: dict[str, int] = {}
        self.route_unflushed = 0
        self.side_front: int | None = MIN_EVENT_TS
        self.side_front_at = 0.0
        # Forwards detect has not read yet; bindings the side path has not read yet.
        self.forwards_in_flight = InFlight(TELEMETRY_BY_JOB)
        self.bindings_in_flight = InFlight(BINDINGS)
        # Backlogs: end offsets asked of the broker, committed offsets at assignment ("topic:p").
        self.asked: dict[str, int] = {}
        self.committed: dict[str, int] = {}
        self.committed_by_us: dict[str, int] = {}
        self._ktps: dict[str, TopicPartition] = {}
        self.health = WorkerHealth(
            self.runtimes, self.node_aligner, self.assigned, self.lag, options.metrics_port
        )
        self.totals = self.health.totals
        self.bad_log = [0.0, 0]
        self.stuck_logged: dict[int, float] = {}
        self.delivery_errors: list[str] = []
        self.stopping = False
        self._timers = dict.fromkeys(("tick", "ends", "metrics", "stats"), time.monotonic())

        self.producer = Producer(
            {
                **self.conf,
                "acks": "all",
                "enable.idempotence": True,
                # The Java partitioner, as the publisher and the Faust worker use: a key lands on
                # the same partition whichever runtime or producer wrote it.
                "partitioner": "murmur2_random",
                "linger.ms": 5,
                "compression.type": "lz4",
                "message.max.bytes": 16 * 1024 * 1024,
                "log_level": 3,
            }
        )
        self.consumer = Consumer(
            {
                **self.conf,
                "group.id": self.group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                # Same partition numbers of every topic to one member (all have `partitions`).
                "partition.assignment.strategy": "range",
                # A killed worker's membership blocks its successor until the session times out.
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 3_000,
                "fetch.wait.max.ms": 100,
                "fetch.max.bytes": 16 * 1024 * 1024,
                "log_level": 3,
            }
        )

    # -- Kafka plumbing ----------------------------------------------------------------------
    def _ktp(self, tp: str) -> TopicPartition:
        ktp = self._ktps.get(tp)
        if ktp is None:
            topic, _, part = tp.rpartition(":")
            ktp = self._ktps[tp] = TopicPartition(self.prefix + topic, int(part))
        return ktp

    def _unprefix(self, topic: str) -> str:
        return topic[len(self.prefix) :] if self.prefix and topic.startswith(self.prefix) else topic

    def lag(self, tp: str, last_offset: int | None) -> int | None:
        """Records of partition `tp` ("topic:n", unprefixed) after `last_offset` (None: unknown yet)."""
        _, hw = self.consumer.get_watermark_offsets(self._ktp(tp), cached=True)
        asked = self.asked.get(tp)
        if hw < 0:
            if asked is None:
                return None
            hw = asked
        elif asked is not None:
            hw = max(hw, asked)
        if last_offset is None:
            committed = self.committed.get(tp)
            last_offset = -1 if committed is None else committed - 1
        return max(0, hw - (last_offset + 1))

    def _ask_ends(self) -> None:
        """Ask the broker for the end offsets of the assigned partitions no fetch has answered for."""
        for p in sorted(self.assigned):
            for topic in (*NODE_TOPICS, *JOB_TOPICS):
                tp = tp_key(topic, p)
                if self.consumer.get_watermark_offsets(self._ktp(tp), cached=True)[1] >= 0:
                    continue
                try:
                    _, hw = self.consumer.get_watermark_offsets(self._ktp(tp), timeout=1.0, cached=False)
                except KafkaException as exc:  # a later tick asks again
                    log.debug("end offset of %s not known yet: %s", tp, exc)
                    continue
                self.asked[tp] = int(hw)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.delivery_errors.append(f"{msg.topic()}: {err.str()}")

    def _send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        also: list[Any] | None = None,
    ) -> None:
        """Produce one record; `also`: an `InFlight` entry told the record's offset once delivered."""
        report = self._on_delivery
        if also is not None:

            def report(err: KafkaError | None, msg: Message) -> None:
                self._on_delivery(err, msg)
                InFlight.delivered(also, None if err is not None else msg.offset())

        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": report}
        if partition is not None:
            kwargs["partition"] = partition
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        if headers:
            kwargs["headers"] = headers
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                return
            except BufferError:  # librdkafka's queue is full: let it deliver
                self.producer.poll(0.1)

    def _delivered(self, what: str) -> None:
        """Wait until Kafka acknowledged everything sent; a producer stuck past `_DELIVERY_TIMEOUT_S` or a
        refused send stops the worker (a supervisor restarts it from its last checkpoint; nothing is
        lost: offsets are committed only after the state that covers them)."""
        deadline = time.monotonic() + _DELIVERY_TIMEOUT_S
        while self.producer.flush(1.0) > 0:
            if time.monotonic() > deadline:
                raise StreamsError(
                    f"Kafka has not acknowledged {what} for {_DELIVERY_TIMEOUT_S:.0f} s: the producer is"
                    " stuck; stopping so that the worker restarts from its last checkpoint"
                )
        if self.delivery_errors:
            errors, self.delivery_errors = self.delivery_errors, []
            raise StreamsError(f"Kafka refused {len(errors)} send(s) of {what}: {errors[0]}")

    def _commit(self, offsets: dict[str, int]) -> None:
        """Commit these next offsets ("topic:p" -> offset), skipping the ones already committed."""
        todo = [(tp, off) for tp, off in offsets.items() if off > self.committed_by_us.get(tp, -1)]
        if not todo:
            return
        tps = [TopicPartition(self._ktp(tp).topic, self._ktp(tp).partition, off) for tp, off in todo]
        try:
            self.consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            # Not a loss: the records are redelivered and the snapshot's offsets skip them.
            log.warning("offset commit failed (%s); the records after the last commit will be re-read", exc)
            return
        for tp, off in todo:
            self.committed_by_us[tp] = off

    # -- state: changelog topics ---------------------------------------------------------------
    def _ensure_topics(self) -> None:
        """Create the topics the worker reads and writes unless they exist (the Faust worker declares
        the same ones): its inputs and internal topics with `partitions`, its two compacted changelogs."""
        rf = self.options.replication_factor
        defaults = {spec.name: spec for spec in DEFAULT_TOPIC_SPECS}
        specs = [defaults.get(t) or TopicSpec(t, self.n, 7 * _DAY_MS) for t in (*NODE_TOPICS, *JOB_TOPICS)]
        specs = [TopicSpec(s.name, self.n, s.retention_ms, s.cleanup_policy, s.extra) for s in specs]
        compact = {"segment.ms": "600000", "min.cleanable.dirty.ratio": "0.1"}
        specs += [
            TopicSpec(
                self.snapshot_topic[len(self.prefix) :],
                self.n,
                -1,
                "compact",
                {**compact, "max.message.bytes": str(16 * 1024 * 1024)},
            ),
            TopicSpec(self.routes_topic[len(self.prefix) :], self.n, -1, "compact", compact),
        ]
        create_topics(
            self.options.bootstrap, specs, prefix=self.prefix, conf=self.conf, replication_factor=rf
        )

    def _read_changelog(self, topic: str, parts: set[int]) -> dict[bytes, tuple[int, bytes]]:
        """The latest value of every key on these partitions of a changelog: key -> (partition, value)."""
        reader = Consumer(
            {
                **self.conf,
                "group.id": f"{self.group}-restore",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "log_level": 3,
            }
        )
        latest: dict[bytes, tuple[int, bytes]] = {}
        try:
            todo: dict[int, int] = {}  # partition -> end offset
            start: dict[int, int] = {}  # partition -> first offset kept
            for p in sorted(parts):
                low, high = self._ends(reader, TopicPartition(topic, p))
                if high > low:
                    todo[p], start[p] = high, low
            if not todo:
                return latest
            reader.assign([TopicPartition(topic, p, start[p]) for p in sorted(todo)])
            started = time.monotonic()
            while todo:
                for msg in reader.consume(1_000, 0.1):
                    p = msg.partition() or 0
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            todo.pop(p, None)
                        continue
                    if msg.key() is not None:
                        latest[msg.key() or b""] = (p, msg.value() or b"")
                    if (msg.offset() or 0) + 1 >= todo.get(p, 0):
                        todo.pop(p, None)
                if time.monotonic() - started > 120:
                    raise StreamsError(f"restoring {topic} partitions {sorted(todo)} took over 120 s")
        finally:
            reader.close()
        return latest

    @staticmethod
    def _ends(reader: Consumer, ktp: TopicPartition, timeout_s: float = 60.0) -> tuple[int, int]:
        """First and end offset of a partition, asked until its leader answers: a changelog the
        worker has just created may have no leader for a moment (NOT_LEADER_FOR_PARTITION)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                low, high = reader.get_watermark_offsets(ktp, timeout=10.0)
                return int(low), int(high)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                retriable = error is not None and (error.retriable() or error.code() in _NO_LEADER_YET)
                if not retriable or time.monotonic() > deadline:
                    raise StreamsError(
                        f"cannot read the offsets of {ktp.topic}[{ktp.partition}]: {exc}"
                    ) from exc
                log.info("%s[%d] not ready yet (%s); asking again", ktp.topic, ktp.partition, exc)
                time.sleep(0.5)

    def _restore(self, parts: set[int]) -> None:
        started = time.monotonic()
        for key, (p, value) in self._read_changelog(self.snapshot_topic, parts).items():
            if _table_name(key) == f"engine@{p}" and value:
                self.snapshots[p] = value
        loaded = 0
        for key, (_, value) in self._read_changelog(self.routes_topic, parts).items():
            node = _table_name(key)
            if value and partition_for(node.encode(), self.n) in parts:
                self.routes.load(node, json.loads(value))
                loaded += 1
        log.info(
            "partitions %s: %d engine snapshots and the routes of %d nodes read in %.2f s",
            sorted(parts),
            len(self.snapshots),
            loaded,
            time.monotonic() - started,
        )

    # -- rebalances ------------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        names = {self.prefix + t for t in (*NODE_TOPICS, *JOB_TOPICS)}
        parts = {tp.partition for tp in partitions if tp.topic in names}
        self.assigned.clear()
        self.assigned.update(parts)
        self.asked.clear()
        self.committed.clear()
        self.committed_by_us.clear()
        try:
            committed = consumer.committed(partitions, timeout=30.0)
        except KafkaException as exc:  # backlogs read as unknown until the first fetch answers
            log.warning("committed offsets not known at assignment (%s)", exc)
            committed = []
        for ktp in committed:
            if ktp.offset >= 0:
                tp = tp_key(self._unprefix(ktp.topic), ktp.partition)
                self.committed[tp] = self.committed_by_us[tp] = ktp.offset
        self._restore(parts)
        self.node_aligner.expect(sorted(tp_key(t, p) for t in NODE_TOPICS for p in parts), time.monotonic())
        log.info("assigned partitions %s", sorted(parts))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self.assigned:
            try:
                self._checkpoint_all("revocation")
            except StreamsError as exc:  # the next owner re-reads from the last checkpoint
                log.warning("no checkpoint at revocation: %s", exc)
        self._forget()

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.warning("partitions lost (session timed out): dropping their state uncommitted")
        self._forget()

    def _forget(self) -> None:
        """Unacknowledged records will be redelivered: rebuild engines and routes from the changelogs."""
        self.runtimes.clear()
        self.snapshots.clear()
        self.routes.forget_nodes(lambda node: False)
        self.node_aligner.clear()
        self.route_offsets.clear()
        self.route_unflushed = 0
        self.forwards_in_flight.clear()
        self.bindings_in_flight.clear()
        self.side_front = MIN_EVENT_TS
        self.assigned.clear()

    # -- bad input -----------------------------------------------------------------------------
    def _reject(self, msg: Message, topic: str, exc: DecodeError) -> None:
        err = exc.located(msg.topic() or "", msg.partition() or 0, msg.offset() or 0)
        self.totals["bad_input"] += 1
        now = time.monotonic()
        self.bad_log[1] += 1
        if now - self.bad_log[0] >= _BAD_LOG_S:
            owner = "dead-lettered" if topic in _INTERNAL_TYPES else "skipped (the sink dead-letters it)"
            log.warning(
                "bad input %s: %s (%d bad record(s) since the last such line)", owner, err, self.bad_log[1]
            )
            self.bad_log[0], self.bad_log[1] = now, 0
        if topic in _INTERNAL_TYPES:
            self._dead_letter(msg, err)

    def _dead_letter(self, msg: Message, err: Exception) -> None:
        headers = deadletter_headers(
            err, msg.topic() or "", msg.partition() or 0, msg.offset() or 0, component=COMPONENT
        )
        if isinstance(err, ClockRejected):
            headers.append(("x-reject-reason", err.reason.encode()))
        self.totals["deadletter"] += 1
        self.health.dead_letters[err.reason if isinstance(err, ClockRejected) else "decode"] += 1
        self.health.produced[DEADLETTER] += 1
        self._send(self.prefix + DEADLETTER, msg.value(), msg.key(), headers=headers)

    def _held_ts(self, msg: Message, event: Event) -> int:
        kafka_ms = _kafka_ms(msg)
        ts = align_ts(
            event_ts(event), kafka_ms / 1000 if kafka_ms else None, self.max_skew_ms, int(time.time() * 1000)
        )
        return MIN_EVENT_TS if ts is None else ts

    # -- the side path: unattributed node-keyed telemetry -> rs.internal.telemetry-by-job -------
    def _route_in(self, msg: Message, topic: str, now: float) -> None:
        self.health.consumed[topic] += 1
        p, offset = msg.partition() or 0, msg.offset() or 0
        tp = tp_key(topic, p)
        try:
            event = check_record(self.codec, msg.value(), topic)
        except DecodeError as exc:
            self._reject(msg, topic, exc)
            self.node_aligner.note(tp, offset, None, now)
            self._routed(tp, offset)
        else:
            self.node_aligner.push(tp, offset, self._held_ts(msg, event), (msg, event), now)

    def _routed(self, tp: str, offset: int) -> None:
        if offset + 1 > self.route_offsets.get(tp, -1):
            self.route_offsets[tp] = offset + 1
        self.route_unflushed += 1

    def _drain_nodes(self) -> None:
        """Apply bindings and forward unattributed telemetry, in event-time order."""
        for tp, offset, (msg, event) in self.node_aligner.pop_ready(time.monotonic(), self.lag):
            self._routed(tp, offset)
            if event.type in ("RankBound", "JobStateChanged"):
                self._apply_binding(msg, event)
                continue
            parts: dict[int, str] = {}
            for key in self.routes.route(event):
                parts.setdefault(partition_for(key.encode(), self.n), key)
            self.totals["telemetry_in"] += 1
            if not parts:
                self.totals["unbound_thinned"] += 1
                continue
            ts = self._held_ts(msg, event)
            for part, key in sorted(parts.items()):
                self._send(
                    self.prefix + TELEMETRY_BY_JOB,
                    msg.value(),
                    key.encode(),
                    partition=part,
                    timestamp_ms=_kafka_ms(msg),
                    also=self.forwards_in_flight.add(ts, part),
                )
                self.totals["forwarded"] += 1
                self.health.produced[TELEMETRY_BY_JOB] += 1
        if self.route_unflushed >= 500:
            self._flush_route()

    def _flush_route(self) -> None:
        """Forwarded records (and route changes) delivered -> their offsets committed."""
        if not self.route_unflushed:
            return
        self._delivered("forwarded records")
        self.route_unflushed = 0
        offsets = {}
        for tp, nxt in self.route_offsets.items():
            held = self.node_aligner.lowest_held(tp)
            offsets[tp] = nxt if held is None else min(nxt, held)
        self._commit(offsets)

    def _apply_binding(self, msg: Message, event: Event) -> None:
        """A binding read on partition p: update (and persist) the routes of p's nodes it changes."""
        p = msg.partition() or 0
        if event.type == "RankBound":
            changed = [self.routes.bind(event.record)]
        else:
            mine = [name for name in self.routes.nodes if partition_for(name.encode(), self.n) == p]
            changed = self.routes.end_job(str(event.record["job_id"]), mine)
        for node in changed:
            state = self.routes.state_of(node)
            self._send(
                self.routes_topic, json.dumps(state).encode() if state else b"", node.encode(), partition=p
            )

    def _update_side_front(self) -> None:
        """How far each stage got, for the other to wait on (`streams.app.side_fronts`)."""
        self.side_front = side_fronts(
            self.forwards_in_flight,
            self.bindings_in_flight,
            self.node_aligner,
            self.runtimes,
            self.assigned,
            self.lag,
        )
        self.side_front_at = time.monotonic()

    # -- detect: job-keyed records -> one engine per partition ----------------------------------
    def _runtime(self, p: int) -> WorkerRuntime:
        rt = self.runtimes.get(p)
        if rt is None:
            rt = WorkerRuntime(
                self.config, self.router, self.options, p, passive_topics=frozenset({TELEMETRY_BY_JOB})
            )
            value = self.snapshots.pop(p, None)
            rt.restore([value] if value else [])
            rt.aligner.expect([tp_key(t, p) for t in JOB_TOPICS], time.monotonic())
            self.runtimes[p] = rt
        return rt

    def _receive(self, msg: Message, topic: str, now: float) -> WorkerRuntime:
        self.health.consumed[topic] += 1
        p, offset = msg.partition() or 0, msg.offset() or 0
        tp = tp_key(topic, p)
        rt = self._runtime(p)
        rt.last_event = msg
        rt.last_receive = now
        if rt.already_seen(tp, offset):
            rt.counts["skipped"] += 1
            rt.aligner.note(tp, offset, None, now)
            return rt
        rt.counts["events"] += 1
        try:
            event = check_record(self.codec, msg.value(), topic)
        except DecodeError as exc:
            rt.counts["rejected"] += 1
            self._reject(msg, topic, exc)
            rt.mark(tp, offset)
            rt.pending.append(None)
            rt.aligner.note(tp, offset, None, now)
            return rt
        if topic == TRAINING_EVENTS:
            self._forward_binding(msg, event)
        rt.aligner.push(tp, offset, self._held_ts(msg, event), (msg, event), now)
        return rt

    def _forward_binding(self, msg: Message, event: Event) -> None:
        """RankBound -> rs.internal.bindings keyed by node; a job's end -> every partition of it."""
        if event.type == "RankBound":
            key = str(event.record["node"]).encode()
            part = partition_for(key, self.n)
            if part in self.assigned:
                self.routes.bind(event.record)  # local fast path; the topic copy makes it durable
            self._send(
                self.prefix + BINDINGS,
                msg.value(),
                key,
                partition=part,
                also=self.bindings_in_flight.add(self._held_ts(msg, event), part),
            )
            self.totals["bindings"] += 1
            self.health.produced[BINDINGS] += 1
        elif event.type == "JobStateChanged" and event.record["state"] in self.config.job_end_states:
            key = str(event.record["job_id"]).encode()
            for part in range(self.n):
                self._send(self.prefix + BINDINGS, msg.value(), key, partition=part)

    def _drain(self, rt: WorkerRuntime) -> None:
        """Feed the engine what the aligner releases; checkpoint when due."""
        engine = rt.engine
        assert engine is not None
        rt.aligner.set_upstream_front(self.side_front)
        for tp, offset, (msg, event) in rt.aligner.pop_ready(time.monotonic(), self.lag):
            rt.pending.append(None)
            outputs, rejected = feed_engine(rt, tp, offset, event, msg.key(), _kafka_ms(msg), self.totals)
            if rejected is not None:
                self._dead_letter(msg, rejected)
                continue
            self._send_outputs(rt, outputs)
            if rt.checkpoint_due(outputs):
                self._checkpoint(rt)

    def _send_outputs(self, rt: WorkerRuntime, outputs: list[Event]) -> None:
        for out in outputs:
            name = topic_for(out.type)
            rt.counts["outputs"] += 1
            self.health.produced[name] += 1
            if out.type == "Alert":
                rt.counts["alerts"] += 1
            try:
                value = self.codec.encode(out)
            except EncodeError as exc:
                rt.counts["unencodable"] += 1
                log.error("dropped an output the worker cannot encode: %s", exc)
                continue
            self._send(self.prefix + name, value, key_for(name, out.record))

    def _checkpoint(self, rt: WorkerRuntime) -> None:
        """1. every output delivered, 2. snapshot delivered, 3. only then its offsets committed."""
        p = rt.partition
        self._delivered(f"the outputs of partition {p}")
        value = rt.snapshot_value()
        self._send(self.snapshot_topic, value, _table_key(f"engine@{p}"), partition=p)
        self._delivered(f"the snapshot of partition {p}")
        rt.pending = []
        self._commit(rt.checkpointed_offsets)

    def _checkpoint_all(self, why: str) -> None:
        for rt in list(self.runtimes.values()):
            if rt.engine is not None and rt.pending:
                self._checkpoint(rt)
        self._flush_route()
        log.info("checkpointed every partition (%s)", why)

    def _advance(self, rt: WorkerRuntime, watermark: int) -> None:
        assert rt.engine is not None
        outputs = rt.engine.advance(watermark)
        self._send_outputs(rt, outputs)
        if any(o.type == "Alert" for o in outputs):
            self._checkpoint(rt)

    def _all_read(self, rt: WorkerRuntime) -> bool:
        if len(rt.aligner):
            return False
        for topic in JOB_TOPICS:
            tp = tp_key(topic, rt.partition)
            if self.lag(tp, rt.aligner.last_offset(tp)) != 0:
                return False
        return True

    # -- timers ------------------------------------------------------------------------------------
    def _due(self, name: str, every_s: float, now: float) -> bool:
        if now - self._timers[name] < every_s:
            return False
        self._timers[name] = now
        return True

    def _tick(self) -> None:
        """Release held records, move event time when input stops, checkpoint when input goes quiet."""
        self._update_side_front()
        if len(self.node_aligner):
            self._drain_nodes()
            self._log_if_stuck("unattributed telemetry", self.node_aligner)
        self._flush_route()
        now = time.monotonic()
        newest = max(
            (rt.engine.max_ts for rt in self.runtimes.values() if rt.engine and rt.engine.max_ts),
            default=None,
        )
        for rt in list(self.runtimes.values()):
            engine = rt.engine
            if engine is None:
                continue
            if len(rt.aligner):
                self._drain(rt)
                self._log_if_stuck(f"partition {rt.partition}", rt.aligner)
            if len(rt.aligner) or rt.last_event is None:
                continue
            silent = now - rt.last_receive
            if newest is not None and silent >= self.options.align_idle_s and self._all_read(rt):
                front = newest - self.config.allowed_lateness_ms
                if engine.watermark is None or front > engine.watermark:
                    rt.counts["front_advances"] += 1
                    self._advance(rt, front)
            wm = self.guard.watermark(int(time.time() * 1000), silent, engine.max_ts, engine.watermark)
            if wm is not None:
                rt.counts["guard_advances"] += 1
                self._advance(rt, wm)
            if silent >= self.options.align_idle_s and rt.pending:
                self._checkpoint(rt)

    def _log_if_stuck(self, what: str, aligner: Aligner) -> None:
        now = time.monotonic()
        stuck = aligner.stuck_for(now)
        if (
            stuck < self.options.stuck_log_s
            or now - self.stuck_logged.get(id(aligner), -1e18) < self.options.stuck_log_s
        ):
            return
        self.stuck_logged[id(aligner)] = now
        log.warning(
            "%s: %d events held for %.0f s, none released; waiting for %s",
            what,
            len(aligner),
            stuck,
            aligner.blocker(now, self.lag),
        )

    def _timers_due(self, now: float) -> None:
        if self._due("tick", min(0.25, self.options.align_idle_s / 4), now):
            self._tick()
        if self.assigned and self._due("ends", _ASK_ENDS_S, now):
            self._ask_ends()
        if self._due("metrics", _METRICS_S, now):
            self.health.publish_metrics()
        if self._due("stats", self.options.stats_interval_s, now):
            self.health.log_progress()

    # -- the loop ----------------------------------------------------------------------------------
    def stop(self) -> None:
        self.stopping = True

    def run(self) -> None:
        """Consume until stopped; then checkpoint every partition and leave the group."""
        self._ensure_topics()
        topics = [self.prefix + t for t in (*NODE_TOPICS, *JOB_TOPICS)]
        self.consumer.subscribe(
            topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        log.info("direct worker %s: subscribed to %s", self.group, ", ".join(topics))
        try:
            while not self.stopping:
                self._step()
            if self.assigned:
                self._checkpoint_all("stop")
        finally:
            self.consumer.close()  # leaves the group (its revocation checkpoints nothing more)
            self.producer.flush(10.0)

    def _step(self) -> None:
        msgs = self.consumer.consume(_BATCH, _POLL_S)
        now = time.monotonic()
        touched: dict[int, WorkerRuntime] = {}
        routed = False
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise StreamsError(f"Kafka consumer failed: {err.str()}")
                log.debug("consumer: %s", err.str())
                continue
            topic = self._unprefix(msg.topic() or "")
            if topic in NODE_TOPICS:
                self._route_in(msg, topic, now)
                routed = True
            else:
                rt = self._receive(msg, topic, now)
                touched[rt.partition] = rt
        self.producer.poll(0)
        if now - self.side_front_at >= _SIDE_FRONT_S:
            self._update_side_front()
        if routed:
            self._drain_nodes()
        for rt in touched.values():
            self._drain(rt)
        self._timers_due(time.monotonic())


def run_direct(options: WorkerOptions) -> None:
    """Run the direct worker in this process until SIGINT/SIGTERM (stops within `STOP_GRACE_S`)."""
    from streams.worker import install_stop_deadline

    logging.basicConfig(
        level=getattr(logging, options.log_level.upper(), logging.WARNING),
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    worker = DirectWorker(options)
    # The first signal begins the clean stop; a second one, or a stop not done in time, exits hard.
    install_stop_deadline(on_stop=worker.stop)
    worker.run()
