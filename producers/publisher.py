"""Publish events to Kafka (with a disk spool for outages) or to an Avro container file.

`open_publisher("kafka", kafka_conf={...})` returns a `KafkaPublisher`: an idempotent
`confluent_kafka.Producer` (acks=all, lz4) fed by `publish(event)`, which never blocks and never
raises for broker trouble. While the broker is unreachable (all brokers down, or deliveries timing
out when a finite `message_timeout_ms` is set) or librdkafka's queue is full, events go to a `Spool`
on disk; a background thread polls delivery reports, probes the broker with a metadata request, and
drains the spool oldest first once the broker answers. Until the spool is empty new events are
appended behind it, so the order of events per key is kept, except for an event whose delivery
failed after it had been handed to librdkafka (message.timeout.ms): it is re-sent from the spool
behind newer ones.

Delivery guarantee: exactly once while the process lives (the idempotent producer retries inside
librdkafka, which by default never times a message out; a failed event is re-sent exactly once
from the spool). With a finite `message_timeout_ms`, an event whose delivery timed out while its
request was in flight may have been written by the broker before the connection failed
(librdkafka cannot tell), and its re-send may double it. At least once across a crash or
`close()` with undelivered in-flight messages (the spool is drained again on the next start).

`open_publisher("file:///path/events.avro")` returns a `FilePublisher`: events buffered into a
temporary Avro container file, renamed into place on `close()`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

from fastavro.validation import ValidationError
from fastavro.write import Writer

from infra.kafka.quiet import quiet_logger
from producers.errors import DestinationError, PublisherClosedError, SpoolError, SpoolLockedError
from producers.spool import DEFAULT_MAX_BYTES, DEFAULT_SEGMENT_BYTES, Spool, list_spools
from schemas.codec import Codec
from schemas.errors import EncodeError, RanksightError
from schemas.records import NAMESPACE, Event, default_schemas
from schemas.topics import SCHEDULER_RECORD_TOPIC, key_for, telemetry_copies, topic_for

__all__ = [
    "DEFAULT_PRODUCER_CONF",
    "SCHEDULER_SPOOL_PREFIX",
    "FilePublisher",
    "KafkaPublisher",
    "MemoryPublisher",
    "Publisher",
    "RateLimitedLog",
    "SpoolDrain",
    "drain_spools",
    "open_publisher",
]

log = logging.getLogger(__name__)

# Measured with bench/bench_publisher.py: lz4 + 20 ms linger gives large batches at little latency.
DEFAULT_PRODUCER_CONF: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": "lz4",
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 100_000,
    "queue.buffering.max.kbytes": 256 * 1024,
    # Never time out what librdkafka holds: a message that timed out while its request was in
    # flight may already be in the log (librdkafka cannot tell), so re-sending it from the spool
    # could double it; held, it is retried by the idempotent producer, which the broker dedupes.
    # While the broker is away new events go to the spool, and `close()` spools what is left.
    "message.timeout.ms": 0,
    "socket.keepalive.enable": True,
    "reconnect.backoff.max.ms": 2_000,
    # The Java client's partitioner (murmur2; random for null keys), which aiokafka (the Faust
    # worker's sends) also uses: a key lands on the same partition number whoever produces it,
    # so job-keyed topics stay co-partitioned with the worker's internal topics.
    "partitioner": "murmur2_random",
}


class RateLimitedLog:
    """Logs a message at most once per `period_s` per key, with the count of suppressed repeats."""

    def __init__(self, logger: logging.Logger, period_s: float = 10.0) -> None:
        self._logger = logger
        self._period = period_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, level: int, key: str, msg: str, *args: Any) -> None:
        """Log unless the same key was logged less than `period_s` ago."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._period:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        self._last[key] = now
        repeats = self._suppressed.pop(key, 0)
        if repeats:
            msg += f" ({repeats} similar messages suppressed)"
        self._logger.log(level, msg, *args)


class Publisher(ABC):
    """Where producers send events; `publish` never blocks the caller."""

    @abstractmethod
    def publish(self, event: Event) -> None:
        """Send one event (asynchronously)."""

    @abstractmethod
    def flush(self, timeout: float = 30) -> int:
        """Wait up to `timeout` s for delivery; returns how many events are still not delivered."""

    @abstractmethod
    def close(self, timeout: float = 30) -> None:
        """Flush, then release everything; undelivered Kafka events stay in the spool on disk."""

    @property
    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counters: published, delivered, failed, spooled, spool_dropped, queue_full, ..."""

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class MemoryPublisher(Publisher):
    """Keeps events in a list (checked against their schema, like Kafka would): for tests and dry runs."""

    def __init__(self, *, validate: bool = True) -> None:
        self.events: list[Event] = []
        self.closed = False
        self._codec = Codec() if validate else None

    def publish(self, event: Event) -> None:
        """Append the event to `events`; raises `EncodeError` for a record its schema rejects."""
        if self._codec is not None:
            self._codec.encode(event)
        self.events.append(event)

    def flush(self, timeout: float = 30) -> int:
        """Nothing is ever pending."""
        return 0

    def close(self, timeout: float = 30) -> None:
        """Mark closed; the events stay readable."""
        self.closed = True

    @property
    def stats(self) -> dict[str, Any]:
        """published and delivered are the number of events kept."""
        return {"published": len(self.events), "delivered": len(self.events), "failed": 0}


class FilePublisher(Publisher):
    """Writes events to an Avro container file of `Event`s, renamed into place on close."""

    def __init__(self, path: str | Path, *, codec: str = "deflate") -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        except OSError as exc:
            raise DestinationError(f"cannot write events to {self.path}: {exc.strerror}") from exc
        self._tmp = Path(tmp)
        self._fh: IO[bytes] | None = os.fdopen(fd, "wb")
        # validator=True checks a record before writing it: a rejected record must not tear the block.
        self._writer = Writer(self._fh, default_schemas().event_parsed, codec=codec, validator=True)
        self._lock = threading.Lock()
        self._count = 0

    def publish(self, event: Event) -> None:
        """Buffer one event into the file (checked against its schema)."""
        with self._lock:
            if self._fh is None:
                raise PublisherClosedError(f"publish after close of the file publisher for {self.path}")
            try:
                self._writer.write({"event": (f"{NAMESPACE}.{event.type}", event.record)})
            except (ValidationError, ValueError, TypeError, KeyError, AttributeError) as exc:
                raise EncodeError(event.type, str(exc).replace("\n", " ")) from exc
            self._count += 1

    def flush(self, timeout: float = 30) -> int:
        """Write buffered blocks to the temporary file; nothing stays undelivered."""
        with self._lock:
            if self._fh is not None:
                self._writer.flush()
                self._fh.flush()
        return 0

    def close(self, timeout: float = 30) -> None:
        """Finish the file and rename it into place (atomic)."""
        with self._lock:
            if self._fh is None:
                return
            self._writer.flush()
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None
            os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Drop the partial file without publishing anything at `path`."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            self._tmp.unlink(missing_ok=True)

    @property
    def stats(self) -> dict[str, Any]:
        """Events written so far (all are `delivered` to the file)."""
        return {"published": self._count, "delivered": self._count, "failed": 0, "path": str(self.path)}


def _kafka_errors() -> tuple[Any, Any, Any]:
    from confluent_kafka import KafkaError, KafkaException, Producer

    return KafkaError, KafkaException, Producer


class _LibrdkafkaLog:
    """librdkafka's log lines through `logging`, one line per state change (`infra.kafka.quiet`)."""

    def __init__(self) -> None:
        self._logger = quiet_logger("producers.publisher.librdkafka")

    def log(self, level: int, msg: str, *args: Any) -> None:
        """Called by confluent-kafka for each librdkafka log line."""
        text = msg % args if args else msg
        if "Coordinator load in progress" in text:
            # A fresh broker loading its transaction coordinator: librdkafka retries by itself.
            level = logging.DEBUG
        self._logger.log(min(level, logging.WARNING), "%s", text)


_librdkafka_log = _LibrdkafkaLog()
_kafka_errors_log = quiet_logger("producers.publisher.kafka")


# The spool folder of `ranksight scheduler` is named `scheduler-<source>`.
SCHEDULER_SPOOL_PREFIX = "scheduler-"


class KafkaPublisher(Publisher):
    """Idempotent Kafka producer with a disk spool for outages and a full queue; never blocks `publish`."""

    def __init__(
        self,
        kafka_conf: dict[str, Any],
        *,
        codec: Codec | None = None,
        topic_prefix: str = "",
        topics: Mapping[str, str] | None = None,
        spool_dir: Path | None = None,
        spool_max_bytes: int = DEFAULT_MAX_BYTES,
        spool_segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        probe_interval_s: float = 1.0,
        linger_ms: int | None = None,
        message_timeout_ms: int | None = None,
        queue_max_messages: int | None = None,
        compression: str | None = None,
    ) -> None:
        KafkaError, KafkaException, Producer = _kafka_errors()
        self._KafkaError = KafkaError
        self._KafkaException = KafkaException
        if not kafka_conf or not kafka_conf.get("bootstrap.servers"):
            raise DestinationError(
                "no Kafka bootstrap servers: set KAFKA_BOOTSTRAP or run `ranksight kafka up`"
            )
        conf = {**DEFAULT_PRODUCER_CONF, **kafka_conf}
        for key, value in (
            ("linger.ms", linger_ms),
            ("message.timeout.ms", message_timeout_ms),
            ("queue.buffering.max.messages", queue_max_messages),
            ("compression.type", compression),
        ):
            if value is not None:
                conf[key] = value
        conf["error_cb"] = self._on_error
        conf.setdefault("logger", _librdkafka_log)
        conf["on_delivery"] = self._on_delivery
        self._codec = codec or Codec()
        self._prefix = topic_prefix
        # Record type -> topic where this producer's role writes elsewhere than `topic_for` says
        # (the scheduler watcher's JobStateChanged -> rs.scheduler.states), keyed like that topic.
        self._roles = dict(topics or {})
        self._topics: dict[str, str] = {}
        self._log = RateLimitedLog(log)
        self._owns_spool_dir = spool_dir is None
        if spool_dir is None:
            spool_dir = Path(tempfile.mkdtemp(prefix="ranksight-spool-"))
        self._spool = Spool(spool_dir, max_bytes=spool_max_bytes, segment_bytes=spool_segment_bytes)
        try:
            self._producer = Producer(conf)
        except KafkaException as exc:
            self._spool.close()
            raise DestinationError(f"invalid Kafka producer settings: {exc.args[0]}") from exc
        self._probe_interval = probe_interval_s
        self._counts = dict.fromkeys(
            (
                "published",
                "delivered",
                "failed",
                "spooled",
                "respooled",
                "drained",
                "rejected",
                "queue_full",
                "encode_errors",
                "outages",
            ),
            0,
        )
        # Events go to the spool while `_spooling` (the spool holds older events) or `_outage`.
        self._spooling = len(self._spool) > 0
        self._outage = False
        self._fatal = False
        self._closed = False
        self._stop = threading.Event()
        self._state_lock = threading.Lock()
        # Messages handed to librdkafka and not yet reported on; len(producer) also counts requests.
        self._count_lock = threading.Lock()
        self._in_flight = 0
        self._thread = threading.Thread(target=self._run, name="ranksight-publisher", daemon=True)
        self._thread.start()

    # -- caller side -------------------------------------------------------------------------

    def _topic(self, record_type: str) -> str:
        topic = self._topics.get(record_type)
        if topic is None:
            topic = self._topics[record_type] = self._prefix + self._canonical(record_type)
        return topic

    def _canonical(self, record_type: str) -> str:
        return self._roles.get(record_type) or topic_for(record_type)

    def publish(self, event: Event) -> None:
        """Encode and enqueue one event; to the spool during an outage. Raises only `EncodeError`."""
        if self._closed:
            raise PublisherClosedError("publish after close: create a new publisher")
        value = self._codec.encode(event)
        self._counts["published"] += 1
        if self._spooling or self._outage:
            self._spool_or_produce(event, value)
            return
        self._produce(event, value)

    def _messages(self, event: Event) -> list[tuple[str, bytes | None, Any]]:
        """(topic, key, delivery callback) of each record an event becomes.

        Telemetry goes node-keyed to its own topic (the sink stores that one) and again for the
        worker, which reads only these copies: once per job keyed by job to `rs.telemetry.job` (its
        detect path, no re-key hop), or, attributed to no job, keyed by node to
        `rs.telemetry.unattributed` (its node-level side path). Copies do not count as delivered
        events in `stats()`.
        """
        out: list[tuple[str, bytes | None, Any]] = [
            (self._topic(event.type), key_for(self._canonical(event.type), event.record), None)
        ]
        for topic, key in telemetry_copies(event.type, event.record):
            out.append((self._prefix + topic, key, self._on_copy_delivery))
        return out

    def _produce(self, event: Event, value: bytes) -> None:
        messages = self._messages(event)
        # An event with job-keyed copies is re-spooled once however many of its messages fail
        # (the spool re-sends all of them): one flag shared by its delivery callbacks.
        failed = [False] if len(messages) > 1 else None
        try:
            for topic, key, callback in messages:
                if failed is None:
                    self._producer.produce(topic, value, key)
                else:
                    on_delivery = partial(callback or self._on_delivery, failed=failed)
                    self._producer.produce(topic, value, key, on_delivery=on_delivery)
                self._produced()
        except BufferError:
            self._counts["queue_full"] += 1
            self._log(logging.WARNING, "queue_full", "Kafka producer queue is full; spooling events to disk")
            self._spooling = True
            self._to_spool(event)
        except self._KafkaException as exc:
            self._log(logging.WARNING, "produce", "Kafka produce failed (%s); spooling events to disk", exc)
            self._spooling = True
            self._to_spool(event)

    def _produced(self) -> None:
        with self._count_lock:
            self._in_flight += 1

    def _settled(self) -> None:
        with self._count_lock:
            self._in_flight -= 1

    def _spool_or_produce(self, event: Event, value: bytes) -> None:
        with self._state_lock:
            # Re-checked under the lock: the drain thread may have just emptied the spool.
            if self._spooling or self._outage:
                self._to_spool(event)
                return
        self._produce(event, value)

    def _to_spool(self, event: Event) -> None:
        # Once anything is spooled, newer events queue behind it until the drain catches up.
        self._spooling = True
        try:
            self._spool.append(event)
            self._counts["spooled"] += 1
        except SpoolError as exc:
            self._counts["failed"] += 1
            self._log(logging.ERROR, "spool", "event lost: %s", exc)

    def flush(self, timeout: float = 30) -> int:
        """Wait until librdkafka's queue and the spool are empty or `timeout` passes; returns what is left."""
        deadline = time.monotonic() + timeout
        while True:
            pending = self._in_flight + len(self._spool)
            remaining = deadline - time.monotonic()
            if pending == 0 or remaining <= 0 or self._fatal:
                return pending
            self._producer.flush(min(0.1, remaining))
            if self._outage:
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def close(self, timeout: float = 30) -> None:
        """Flush; what is still undelivered goes to the spool on disk for the next publisher."""
        if self._closed:
            return
        # During an outage nothing can be delivered: do not hold the caller for the whole timeout.
        left = self.flush(min(timeout, 2.0) if self._outage else timeout)
        self._closed = True
        self._stop.set()
        self._thread.join(timeout=max(5.0, timeout))
        if self._in_flight:
            # Purged messages come back through the delivery callback and are spooled.
            self._producer.purge(in_queue=True, in_flight=True, blocking=False)
            self._producer.poll(0)
            self._producer.flush(1.0)
        self._spool.close()
        kept = len(self._spool)
        if kept:
            log.warning(
                "%d events not delivered; kept in the spool %s for the next run", kept, self._spool.directory
            )
        elif self._owns_spool_dir:
            shutil.rmtree(self._spool.directory, ignore_errors=True)
        if left and not kept:
            log.warning("%d events were not delivered", left)

    @property
    def stats(self) -> dict[str, Any]:
        """Counters since start, plus `in_queue` (librdkafka), `spool_events`, `spool_bytes`, `outage`."""
        return {
            **self._counts,
            "spool_dropped": self._spool.dropped,
            "spool_events": len(self._spool),
            "spool_bytes": self._spool.size_bytes,
            "in_queue": self._in_flight,
            "outage": self._outage,
        }

    @property
    def spool(self) -> Spool:
        """The disk spool (for inspection)."""
        return self._spool

    # -- librdkafka callbacks (run on whichever thread polls) ----------------------------------

    def _on_error(self, err: Any) -> None:
        code = err.code()
        if err.fatal():
            self._fatal = True
            self._outage = True
            self._log(logging.ERROR, "fatal", "Kafka producer fatal error, spooling everything: %s", err)
            return
        if code == self._KafkaError._ALL_BROKERS_DOWN:
            self._enter_outage(f"all brokers down ({err.str()})")
        else:
            # Repeats of the same error (a broker refusing every backoff) print once: infra.kafka.quiet.
            _kafka_errors_log.warning("%s [error_cb]: Kafka: %s", err.name(), err.str())

    def _enter_outage(self, why: str) -> None:
        if not self._outage:
            self._outage = True
            self._counts["outages"] += 1
            self._log(
                logging.WARNING,
                "outage",
                "Kafka unreachable (%s); spooling events to %s",
                why,
                self._spool.directory,
            )

    def _on_copy_delivery(self, err: Any, msg: Any, failed: list[bool] | None = None) -> None:
        # A job-keyed copy: settles like any message; a failure re-sends the whole event.
        if err is None:
            self._settled()
            return
        self._on_delivery(err, msg, failed)

    def _on_delivery(self, err: Any, msg: Any, failed: list[bool] | None = None) -> None:
        self._settled()
        if err is None:
            self._counts["delivered"] += 1
            if self._outage and not self._fatal:
                self._outage = False
            return
        self._counts["failed"] += 1
        code = err.code()
        retry = err.retriable() or code in (
            self._KafkaError._MSG_TIMED_OUT,
            self._KafkaError._PURGE_QUEUE,
            self._KafkaError._PURGE_INFLIGHT,
            self._KafkaError._TIMED_OUT,
            self._KafkaError._TRANSPORT,
            self._KafkaError._ALL_BROKERS_DOWN,
        )
        if code == self._KafkaError._MSG_TIMED_OUT:
            self._enter_outage("deliveries timing out")
        if not retry:
            self._counts["rejected"] += 1
            self._log(
                logging.ERROR, f"rejected-{code}", "Kafka rejected an event on %s: %s", msg.topic(), err.str()
            )
            return
        if failed is not None:
            if failed[0]:
                return  # another message of the same event already sent it back to the spool
            failed[0] = True
        try:
            event = self._codec.decode(msg.value())
        except RanksightError as exc:  # cannot happen for bytes we encoded; never lose silently
            self._log(logging.ERROR, "respool", "cannot re-spool a failed event: %s", exc)
            return
        self._log(
            logging.WARNING,
            f"failed-{code}",
            "Kafka delivery failed (%s); re-sending from the spool",
            err.str(),
        )
        self._spooling = True
        self._counts["respooled"] += 1
        self._to_spool(event)

    # -- background thread -------------------------------------------------------------------

    def _run(self) -> None:
        next_probe = 0.0
        next_sync = 0.0
        while not self._stop.is_set():
            try:
                self._producer.poll(0.05)
                now = time.monotonic()
                if now >= next_sync:
                    self._spool.sync()
                    next_sync = now + 0.5
                if self._outage and not self._fatal and now >= next_probe:
                    next_probe = now + self._probe_interval
                    self._probe()
                if self._spooling and not self._outage:
                    self._drain_one_segment()
            except Exception:  # the thread must survive anything; the caller never sees it
                log.exception("publisher background thread error")
                time.sleep(0.5)

    def _probe(self) -> None:
        try:
            self._producer.list_topics(timeout=max(0.5, self._probe_interval))
        except self._KafkaException:
            return
        if self._outage:
            log.info("Kafka reachable again; draining %d spooled events", len(self._spool))
            self._outage = False

    def _drain_one_segment(self) -> None:
        segment = self._spool.oldest()
        if segment is None:
            with self._state_lock:
                if len(self._spool) == 0:
                    self._spooling = False
            return
        events = segment.events()
        for index, event in enumerate(events):
            value = self._codec.encode(event)
            for topic, key, callback in self._messages(event):
                while True:
                    try:
                        if callback is None:
                            self._producer.produce(topic, value, key)
                        else:
                            self._producer.produce(topic, value, key, on_delivery=callback)
                        self._produced()
                        break
                    except BufferError:
                        # This thread may wait: librdkafka frees room as deliveries complete or time out.
                        self._producer.poll(0.1)
                        if self._stop.is_set() and self._closed:
                            # Closing: keep the rest on disk rather than block close(). An event
                            # whose node-keyed record already went out is sent again (at least once).
                            self._respool_rest(events[index:])
                            self._spool.remove(segment)
                            return
        self._counts["drained"] += len(events)
        self._spool.remove(segment)

    def _respool_rest(self, events: list[Event]) -> None:
        for event in events:
            self._to_spool(event)


def open_publisher(
    destination: str = "kafka",
    *,
    kafka_conf: dict[str, Any] | None = None,
    codec: Codec | None = None,
    topic_prefix: str = "",
    spool_dir: Path | None = None,
    topics: Mapping[str, str] | None = None,
    **knobs: Any,
) -> Publisher:
    """A publisher for `"kafka"` (librdkafka settings in `kafka_conf`; `topics` maps record types
    this producer writes elsewhere than their usual topic) or `"file:///path/events.avro"`."""
    if destination == "kafka":
        return KafkaPublisher(
            kafka_conf or {},
            codec=codec,
            topic_prefix=topic_prefix,
            topics=topics,
            spool_dir=spool_dir,
            **knobs,
        )
    if destination.startswith("file://"):
        path = destination[len("file://") :]
        if not path:
            raise DestinationError("file destination needs a path: file:///path/events.avro")
        return FilePublisher(path, **knobs)
    raise DestinationError(f"unknown destination {destination!r}: use 'kafka' or 'file:///path/events.avro'")


@dataclass(frozen=True)
class SpoolDrain:
    """The outcome of draining one spool directory."""

    directory: Path
    waiting: int
    left: int
    in_use: bool = False

    @property
    def delivered(self) -> int:
        """Events the broker acknowledged."""
        return self.waiting - self.left


def drain_spools(
    root: str | Path,
    kafka_conf: dict[str, Any],
    *,
    codec: Codec | None = None,
    topic_prefix: str = "",
    exclude: tuple[str, ...] = (),
    timeout: float = 30.0,
) -> list[SpoolDrain]:
    """Send what every spool under `root` holds (one folder per producer) to Kafka, oldest first.

    A spool held by a running producer is skipped (that producer drains it); what is not delivered
    within `timeout` stays on disk.
    """
    out: list[SpoolDrain] = []
    for info in list_spools(root):
        if info.name in exclude or info.events == 0:
            continue
        if info.in_use:
            out.append(SpoolDrain(info.directory, info.events, info.events, in_use=True))
            continue
        try:
            # A spool the scheduler watcher left holds its job states for rs.scheduler.states.
            topics = SCHEDULER_RECORD_TOPIC if info.name.startswith(SCHEDULER_SPOOL_PREFIX) else None
            publisher = KafkaPublisher(
                kafka_conf, codec=codec, topic_prefix=topic_prefix, topics=topics, spool_dir=info.directory
            )
        except SpoolLockedError:
            out.append(SpoolDrain(info.directory, info.events, info.events, in_use=True))
            continue
        try:
            publisher.flush(timeout)
        finally:
            publisher.close(timeout=2.0)
        out.append(SpoolDrain(info.directory, info.events, len(publisher.spool)))
    return out
