"""Kafka -> ClickHouse sink consumer: offsets are committed only after the rows are durably inserted.

`SinkConsumer` polls in batches with a plain `confluent_kafka.Consumer` (auto commit and auto
offset store off), decodes each message with the Avro codec, hands it to `ClickHouseSink`, and
flushes a partition's batch when it is full or old. After the inserts returned it commits exactly
the flushed offsets. Messages that cannot be decoded or stored, records whose type does not
belong to their topic (`schemas.topics.off_topic_reason`), and records of the raw topics whose
event time fails the pipeline's time bound (`schemas.eventtime`, the worker's
`engine.max_clock_skew_s` / `max_record_age_s`, against the record's Kafka timestamp capped at
the time the sink read it) go to the dead-letter topic (with `x-component: sink`, `x-error*`,
`x-source-*` and, for a time, `x-reject-reason` headers), delivered before their offsets are
committed. The sink owns the dead letters of the topics it stores; the worker only counts them. A failed
insert pauses its partition, seeks back to the batch's first offset and retries with backoff;
nothing past it is committed meanwhile.

Run it as a module for an entry point that needs no CLI: `python -m sinks.consumer --help`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from schemas.codec import Codec
from schemas.errors import DecodeError
from schemas.eventtime import TimeBound, record_time, reference_ms, time_verdict
from schemas.records import RECORD_TYPES
from schemas.topics import (
    DEADLETTER,
    SCHEDULER_STATES,
    SINK_TOPICS,
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TRAINING_EVENTS,
    TRAINING_STEPS,
    canonical_topic,
    deadletter_headers,
    off_topic_reason,
)
from sinks.errors import (
    ImplausibleTimeError,
    InvalidRecordError,
    KafkaUnavailableError,
    SinkBackpressureError,
    SinkError,
    SinkWriteError,
)
from sinks.writer import ClickHouseSink

__all__ = ["COMPONENT", "SINK_TOPICS", "TIME_BOUNDED_TOPICS", "SinkConsumer"]

log = logging.getLogger(__name__)

# librdkafka consumer properties a producer built from the same settings must not get.
_CONSUMER_ONLY = frozenset(
    {
        "session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms", "auto.offset.reset",
        "enable.auto.commit", "enable.auto.offset.store", "auto.commit.interval.ms", "group.instance.id",
        "group.protocol", "partition.assignment.strategy", "isolation.level", "fetch.min.bytes",
        "fetch.wait.max.ms", "fetch.max.bytes", "max.partition.fetch.bytes", "queued.min.messages",
    }
)  # fmt: skip

# Topics whose producers stamp event times from their own clocks: records there must pass the time bound.
# (Derived windows and alerts are stamped by the worker from records that already passed it.)
TIME_BOUNDED_TOPICS: tuple[str, ...] = (
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TRAINING_STEPS,
    TRAINING_EVENTS,
    SCHEDULER_STATES,
)

# The `x-component` header of what this consumer dead-letters: it owns the topics it stores.
COMPONENT = "sink"
_MAX_BACKOFF_S = 30.0
# How long idle-exit waits for a first assignment beyond idle_exit_s: a member that died without leaving
# holds its partitions until its session times out (librdkafka default 45 s).
_JOIN_GRACE_S = 15.0
TP = tuple[str, int]


class SinkConsumer:
    """Consumes ranksight topics and stores every record in its ClickHouse table, at least once, deduplicated."""

    def __init__(
        self,
        kafka_conf: dict[str, Any],
        client: Client,
        topics: list[str],
        group_id: str,
        *,
        codec: Codec | None = None,
        deadletter_topic: str = DEADLETTER,
        batch_size: int = 5000,
        batch_interval_s: float = 1.0,
        poll_batch: int = 1000,
        poll_timeout_s: float = 0.2,
        progress_interval_s: float = 10.0,
        progress: Callable[[dict[str, Any]], None] | None = None,
        max_write_attempts: int = 8,
        clock: Callable[[], float] = time.monotonic,
        on_health: Callable[[dict[str, Any]], None] | None = None,
        health_interval_s: float = 2.0,
        time_bound: TimeBound | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`time_bound`: the worker's bound on event times (the CLI reads it from the detector config);
        None checks only that times lie in 2000..2200."""
        if not topics:
            raise ValueError("no topics to consume")
        self.topics = list(topics)
        self.group_id = group_id
        self.deadletter_topic = deadletter_topic
        self.sink = ClickHouseSink(
            client, batch_size=batch_size, batch_interval_s=batch_interval_s, clock=clock
        )
        self._codec = codec or Codec()
        self._clock = clock
        self._wall_clock = wall_clock
        self._time_bound = time_bound
        self._topic_rules: dict[str, tuple[frozenset[str], bool]] = {}  # topic -> `_rules(topic)`
        self.time_rejected: dict[str, int] = {}  # reason -> records dead-lettered for their time
        self._poll_batch = poll_batch
        self._poll_timeout_s = poll_timeout_s
        self._progress_interval_s = progress_interval_s
        self._progress = progress
        # /metrics: `health()` handed to `on_health` every `health_interval_s`, from the polling thread.
        self._on_health = on_health
        self._health_interval_s = health_interval_s
        self._last_health = clock()
        self.consumed_by_topic: dict[str, int] = {}
        self._max_write_attempts = max_write_attempts
        self._kafka_conf = {k: v for k, v in kafka_conf.items() if k != "group.id"}
        self._bootstrap = str(kafka_conf.get("bootstrap.servers", "?"))
        conf = {
            "auto.offset.reset": "earliest",  # a new sink group must not skip what was produced before it
            **self._kafka_conf,
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "error_cb": self._on_kafka_error,
            "logger": logging.getLogger("sinks.kafka"),
        }
        self._join_grace_s = float(conf.get("session.timeout.ms", 45_000)) / 1000 + _JOIN_GRACE_S
        self._consumer = Consumer(conf)
        self._producer: Producer | None = None
        self._retry_at: dict[TP, float] = {}
        self._attempts: dict[TP, int] = {}
        self._unflushed_dlq: set[TP] = set()
        self._dlq_failures: list[str] = []
        self._warned_topics: set[str] = set()
        self._last_kafka_error_log = 0.0
        self._assigned = False
        self._started = clock()
        self._last_activity = self._started
        self._last_progress = self._started
        self._closed = False
        self.counters: dict[str, Any] = {
            "consumed": 0,
            "deadlettered": 0,
            "commits": 0,
            "retries": 0,
            "commit_failures": 0,
        }
        self._consumer.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

    # --- public API --------------------------------------------------------------------------------

    def check_kafka(self, timeout_s: float = 10.0) -> list[str]:
        """Raise `KafkaUnavailableError` when the cluster does not answer; returns subscribed topics it lacks."""
        try:
            metadata = self._consumer.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise KafkaUnavailableError(self._bootstrap, _kafka_reason(exc)) from exc
        return [t for t in self.topics if t not in metadata.topics]

    def run(self, stop: threading.Event | None = None, idle_exit_s: float | None = None) -> dict[str, Any]:
        """Consume until `stop` is set (or nothing arrived for `idle_exit_s`), then flush, commit and close."""
        try:
            for topic in self.check_kafka():
                log.warning("topic %s does not exist yet; the sink will read it once it is created", topic)
            self._started = self._last_activity = self._last_progress = self._clock()
            while stop is None or not stop.is_set():
                self.poll_once()
                if idle_exit_s is not None and self._idle(idle_exit_s):
                    break
        finally:
            self.close()
        return self.stats()

    def poll_once(self) -> int:
        """Poll one batch of messages, store them, flush what is due; returns how many messages were handled."""
        handled = 0
        messages = self._consumer.consume(num_messages=self._poll_batch, timeout=self._poll_timeout_s)
        # The arrival time of the batch: a record's time reference is never later than this.
        now_ms = int(self._wall_clock() * 1000)
        # Per record, only what the bare consume + decode + insert loop does too, plus the checks
        # (bench/bench_sink.py measures both): locals, no repeated lookups.
        # The writer's pending batches by topic-partition, read here to test fullness without a call.
        retry_at, batches, batch_size = self._retry_at, self.sink._batches, self.sink.batch_size
        consumed = self.consumed_by_topic
        handle = self._handle
        for msg in messages:
            error = msg.error()
            if error is not None:
                self._on_message_error(error)
                continue
            topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
            tp = (topic, partition)
            if retry_at and tp in retry_at:
                continue  # fetched before the partition was paused; it is read again after the retry
            handled += 1
            consumed[topic] = consumed.get(topic, 0) + 1
            handle(msg, topic, partition, offset, now_ms)
            batch = batches.get(tp)
            if batch is not None and batch.messages >= batch_size and not (retry_at and tp in retry_at):
                self._flush([tp])
        now = self._clock()
        if handled:
            self.counters["consumed"] += handled
            self._last_activity = now
        self._flush(self.sink.ready())
        self._resume_due(now)
        if now - self._last_progress >= self._progress_interval_s:
            self._last_progress = now
            self._report()
        if self._on_health is not None and now - self._last_health >= self._health_interval_s:
            self._last_health = now
            self._on_health(self.health())
        return handled

    def assignment(self) -> list[tuple[str, int]]:
        """The topic-partitions this member is assigned now (empty before it joined its group)."""
        try:
            return sorted((tp.topic, tp.partition) for tp in self._consumer.assignment())
        except (KafkaException, RuntimeError):
            return []  # closed

    def health(self) -> dict[str, Any]:
        """What `/metrics` shows: `stats()` plus records read and lag per topic (assigned partitions)."""
        lag: dict[str, int] = {}
        try:
            assigned = self._consumer.assignment()
            positions = self._consumer.position(assigned) if assigned else []
            for tp in positions:
                _, high = self._consumer.get_watermark_offsets(tp, cached=True)
                if high is not None and high >= 0 and tp.offset >= 0:
                    lag[tp.topic] = lag.get(tp.topic, 0) + max(0, high - tp.offset)
        except (KafkaException, RuntimeError):
            pass  # not assigned yet, the broker is away, or the sink is closed: no lag this time
        return {**self.stats(), "consumed_by_topic": dict(self.consumed_by_topic), "lag_by_topic": lag}

    def stats(self) -> dict[str, Any]:
        """Counters: consumed, inserted rows (total and per table), dead-lettered, batches, insert seconds, ..."""
        s = self.sink.stats
        return {
            **self.counters,
            "inserted_rows": sum(s.rows_by_table.values()),
            "inserted_by_table": dict(sorted(s.rows_by_table.items())),
            "batches": s.batches,
            "inserts": s.inserts,
            "insert_s": round(s.insert_s, 3),
            "skipped_stored": s.skipped_stored,
            "time_rejected": dict(sorted(self.time_rejected.items())),
            "elapsed_s": round(self._clock() - self._started, 3),
        }

    def close(self) -> None:
        """Flush and commit what is pending, deliver dead letters, leave the group (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._flush(self.sink.pending(), final=True)
        finally:
            if self._producer is not None:
                self._producer.flush(10)
            self._consumer.close()
            self._report()

    # --- message handling --------------------------------------------------------------------------

    def _handle(self, msg: Message, topic: str, partition: int, offset: int, now_ms: int) -> None:
        value = msg.value()
        try:
            event = self._codec.decode(value)
            rules = self._topic_rules.get(topic)
            if rules is None:
                rules = self._rules(topic)
            allowed, bounded = rules
            if event.type not in allowed:
                # The topic map is the contract: a record on another type's topic is not stored.
                wrong = off_topic_reason(event.type, topic)
                if wrong is not None:
                    raise InvalidRecordError(event.type, wrong)
            bound = self._time_bound
            if bound is not None and bounded:
                ts = record_time(event.record)
                if ts is not None:
                    kind, kafka_ms = msg.timestamp()
                    reference = reference_ms(kafka_ms if kind else None, now_ms)
                    verdict = time_verdict(ts, reference, bound.max_skew_ms, bound.max_age_ms)
                    if verdict is not None:
                        raise ImplausibleTimeError(event.type, verdict, ts, reference)
            self.sink.add(topic, partition, offset, event)
        except DecodeError as exc:
            self._deadletter(msg, exc.located(topic, partition, offset))
            self.sink.skip(topic, partition, offset)
        except InvalidRecordError as exc:
            if isinstance(exc, ImplausibleTimeError):
                self.time_rejected[exc.verdict] = self.time_rejected.get(exc.verdict, 0) + 1
            self._deadletter(msg, exc)
            self.sink.skip(topic, partition, offset)
        except (SinkBackpressureError, SinkWriteError) as exc:
            # The stored-offset lookup failed: read this partition again from its batch start.
            batch = self.sink.batch(topic, partition)
            first = batch.first_offset if batch is not None and batch.first_offset >= 0 else offset
            self._defer((topic, partition), first, exc)

    def _deadletter(self, msg: Message, exc: Exception) -> None:
        if self._producer is None:
            self._producer = Producer(
                {
                    # Consumer-only settings (the sink's session timeout) would each cost a
                    # librdkafka CONFWARN line on this producer.
                    **{k: v for k, v in self._kafka_conf.items() if k not in _CONSUMER_ONLY},
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 5,
                    "error_cb": self._on_kafka_error,
                    "logger": logging.getLogger("sinks.kafka"),
                }
            )
        headers: list[tuple[str, str | bytes | None]] = [(str(h[0]), h[1]) for h in msg.headers() or []]
        headers += deadletter_headers(
            exc, msg.topic() or "", msg.partition() or 0, msg.offset() or 0, component=COMPONENT
        )
        if isinstance(exc, ImplausibleTimeError):
            headers.append(("x-reject-reason", exc.verdict.encode()))
        self._producer.produce(
            self.deadletter_topic,
            key=msg.key(),
            value=msg.value(),
            headers=headers,
            on_delivery=self._on_delivery,
        )
        self._producer.poll(0)
        self._unflushed_dlq.add((msg.topic() or "", msg.partition() or 0))
        self.counters["deadlettered"] += 1
        log.warning("dead-lettered %s[%s]@%s: %s", msg.topic(), msg.partition(), msg.offset(), exc)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._dlq_failures.append(str(err))

    def _deadletters_delivered(self) -> bool:
        if self._producer is None or not self._unflushed_dlq:
            return True
        remaining = self._producer.flush(30)
        ok = remaining == 0 and not self._dlq_failures
        if not ok:
            log.error(
                "dead-letter topic %s did not take %d message(s): %s",
                self.deadletter_topic,
                remaining,
                "; ".join(self._dlq_failures[:3]) or "timeout",
            )
        self._dlq_failures.clear()
        if ok:
            self._unflushed_dlq.clear()
        return ok

    def _rules(self, topic: str) -> tuple[frozenset[str], bool]:
        """(record types that belong on the topic, does the time bound apply), worked out once per topic."""
        allowed = frozenset(t for t in RECORD_TYPES if off_topic_reason(t, topic) is None)
        rules = self._topic_rules[topic] = (allowed, canonical_topic(topic) in TIME_BOUNDED_TOPICS)
        return rules

    # --- flush, commit, retry ----------------------------------------------------------------------

    def _flush(self, tps: list[TP], *, final: bool = False) -> None:
        commits: list[TopicPartition] = []
        firsts: dict[TP, int] = {}
        for tp in tps:
            batch = self.sink.batch(*tp)
            if batch is None or tp in self._retry_at:
                continue
            first = batch.first_offset
            try:
                done = self.sink.flush(*tp)
            except (SinkBackpressureError, SinkWriteError) as exc:
                if final:
                    log.warning("not committing %s[%s] on shutdown: %s", tp[0], tp[1], exc)
                else:
                    self._defer(tp, first, exc)
                continue
            self._attempts.pop(tp, None)
            if done is not None and done.last_offset >= 0:
                commits.append(TopicPartition(tp[0], tp[1], done.last_offset + 1))
                firsts[tp] = done.first_offset
        if not commits:
            return
        if (
            self._unflushed_dlq & {(c.topic, c.partition) for c in commits}
            and not self._deadletters_delivered()
        ):
            if not final:
                # The rows are stored (re-reading skips them); the dead letters are produced again.
                for c in commits:
                    tp = (c.topic, c.partition)
                    reason = "dead-letter delivery failed"
                    self._defer(tp, firsts[tp], SinkBackpressureError(1.0, c.topic, c.partition, reason))
            return
        try:
            self._consumer.commit(offsets=commits, asynchronous=False)
            self.counters["commits"] += 1
        except KafkaException as exc:
            # Rows are stored; whoever reads these offsets again skips them by their stored offsets.
            self.counters["commit_failures"] += 1
            log.warning(
                "offset commit failed (%s); the stored rows will be skipped when re-read", _kafka_reason(exc)
            )

    def _defer(self, tp: TP, first_offset: int, exc: SinkError) -> None:
        attempts = self._attempts[tp] = self._attempts.get(tp, 0) + 1
        if isinstance(exc, SinkWriteError) and attempts >= self._max_write_attempts:
            raise exc
        base = exc.retry_after if isinstance(exc, SinkBackpressureError) else 1.0
        delay = min(base * 2 ** (attempts - 1), _MAX_BACKOFF_S)
        self.sink.drop(*tp)
        partition = TopicPartition(tp[0], tp[1])
        self._consumer.pause([partition])
        self._consumer.seek(TopicPartition(tp[0], tp[1], first_offset))
        self._retry_at[tp] = self._clock() + delay
        self.counters["retries"] += 1
        log.warning("%s; retrying %s[%s] from offset %d in %.1f s", exc, tp[0], tp[1], first_offset, delay)

    def _resume_due(self, now: float) -> None:
        due = [tp for tp, at in self._retry_at.items() if now >= at]
        for tp in due:
            del self._retry_at[tp]
            self._consumer.resume([TopicPartition(tp[0], tp[1])])

    # --- callbacks ---------------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned = True
        self._last_activity = self._clock()
        log.info("assigned %s", ", ".join(f"{p.topic}[{p.partition}]" for p in partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        self._flush(tps, final=True)
        self._forget(tps)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget([(p.topic, p.partition) for p in partitions])

    def _forget(self, tps: list[TP]) -> None:
        for tp in tps:
            self.sink.forget(*tp)
            self._retry_at.pop(tp, None)
            self._attempts.pop(tp, None)

    def _on_message_error(self, error: KafkaError) -> None:
        code = error.code()
        if code == KafkaError._PARTITION_EOF:
            return
        if error.fatal():
            raise SinkError(f"Kafka consumer failed: {error.str()}")
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            if error.str() not in self._warned_topics:
                self._warned_topics.add(error.str())
                log.warning("%s (the sink keeps polling)", error.str())
            return
        log.warning("Kafka: %s", error.str())

    def _on_kafka_error(self, error: KafkaError) -> None:
        now = time.monotonic()
        if now - self._last_kafka_error_log >= 30:  # librdkafka repeats these every few seconds
            self._last_kafka_error_log = now
            log.warning("Kafka at %s: %s", self._bootstrap, error.str())

    # --- progress ----------------------------------------------------------------------------------

    def _idle(self, idle_exit_s: float) -> bool:
        if self.sink.pending() or self._retry_at:
            return False
        now = self._clock()
        if not self._assigned:
            return now - self._started >= idle_exit_s + self._join_grace_s
        return now - self._last_activity >= idle_exit_s

    def _report(self) -> None:
        stats = self.stats()
        log.info(
            "sink: consumed %d, inserted %d rows in %d batches (%.1f s inserting), dead-lettered %d, retries %d",
            stats["consumed"],
            stats["inserted_rows"],
            stats["batches"],
            stats["insert_s"],
            stats["deadlettered"],
            stats["retries"],
        )
        if self._progress is not None:
            self._progress(stats)


def _kafka_reason(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)
