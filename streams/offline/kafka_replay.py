"""Kafka by time: read a time range of topics back (`record`), re-run detection on it (`replay_kafka`),
and publish an events file to Kafka paced by event time (`publish_file`).

Times are Kafka record timestamps (UTC ms; the producer's create time, which for live agents is
within a second of the event time). Reading uses `offsets_for_times` and manual assignment: it
never joins or commits to a consumer group, so live consumers are untouched. A partition ends
when its next record is past the end time or its end (the high watermark at the start) is reached.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.codec import Codec
from schemas.errors import DecodeError
from schemas.eventtime import event_ts
from schemas.files import iter_container, write_container
from schemas.records import Event
from schemas.topics import ALERTS_REPLAY, key_for
from streams.errors import StreamsError
from streams.offline.detection import DetectionEngine

__all__ = [
    "KafkaReplayError",
    "RangeStats",
    "publish_file",
    "read_range",
    "record_range",
    "replay_kafka",
]

Progress = Callable[[str], None]


class KafkaReplayError(StreamsError):
    """Kafka could not be read or written for a replay, record or publish."""


@dataclass
class RangeStats:
    """What a by-time read found."""

    events: int = 0
    undecodable: int = 0
    partitions: int = 0
    alerts: int = 0
    by_rule: dict[str, dict[str, int]] = field(default_factory=dict)


def _consumer(kafka_conf: dict[str, Any], group_id: str | None) -> Any:
    from confluent_kafka import Consumer

    conf = {
        **kafka_conf,
        # A group id is required by librdkafka even with manual assignment; nothing is committed.
        "group.id": group_id or f"ranksight-replay-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "log_level": 0,
    }
    return Consumer(conf)


def read_range(
    kafka_conf: dict[str, Any],
    topics: list[str],
    start_ms: int,
    end_ms: int,
    *,
    codec: Codec | None = None,
    group_id: str | None = None,
    stats: RangeStats | None = None,
    progress: Progress | None = None,
    timeout_s: float = 30.0,
    optional: frozenset[str] = frozenset(),
) -> Iterator[Event]:
    """Every decodable event of `topics` with a record timestamp in [start_ms, end_ms], partition by partition order.

    A topic the cluster does not have is an error, but for those in `optional` (skipped, said once).
    """
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    if end_ms < start_ms:
        raise KafkaReplayError("the end time is before the start time")
    codec = codec or Codec()
    stats = stats if stats is not None else RangeStats()
    consumer = _consumer(kafka_conf, group_id)
    try:
        try:
            metadata = consumer.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise KafkaReplayError(
                f"Kafka does not answer ({exc.args[0].str()}); check KAFKA_BOOTSTRAP"
            ) from None
        wanted: list[Any] = []
        for topic in topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                if topic in optional:
                    if progress is not None:
                        progress(f"no topic {topic} on this cluster: skipped")
                    continue
                raise KafkaReplayError(
                    f"no topic {topic!r} on this cluster (check the name and RANKSIGHT_TOPIC_PREFIX)"
                )
            wanted.extend(TopicPartition(topic, p, start_ms) for p in sorted(meta.partitions))
        if not wanted:
            return
        starts = consumer.offsets_for_times(wanted, timeout=timeout_s)
        ends: dict[tuple[str, int], int] = {}
        assign: list[Any] = []
        for tp in starts:
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=timeout_s
            )
            if tp.offset < 0 or tp.offset >= high:
                continue  # nothing at or after the start time
            ends[(tp.topic, tp.partition)] = high
            assign.append(TopicPartition(tp.topic, tp.partition, tp.offset))
        stats.partitions = len(assign)
        if not assign:
            return
        consumer.assign(assign)
        open_parts = set(ends)
        idle_since = time.monotonic()
        while open_parts:
            msg = consumer.poll(0.5)
            if msg is None:
                if time.monotonic() - idle_since > timeout_s:
                    raise KafkaReplayError(
                        f"no data from Kafka for {timeout_s:.0f} s; {len(open_parts)} partitions unread"
                    )
                continue
            idle_since = time.monotonic()
            key = (msg.topic(), msg.partition())
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    _close(consumer, open_parts, key)
                    continue
                raise KafkaReplayError(f"reading {msg.topic()}: {msg.error().str()}")
            if key not in open_parts:
                continue
            _ts_type, ts = msg.timestamp()
            if ts > end_ms:
                _close(consumer, open_parts, key)
                continue
            if msg.offset() + 1 >= ends[key]:
                _close(consumer, open_parts, key)
            try:
                event = codec.decode(msg.value())
            except DecodeError:
                stats.undecodable += 1
                continue
            stats.events += 1
            if progress is not None and stats.events % 50_000 == 0:
                progress(f"read {stats.events} events, {len(open_parts)} partitions open")
            yield event
    finally:
        consumer.close()


def _close(consumer: Any, open_parts: set[tuple[str, int]], key: tuple[str, int]) -> None:
    from confluent_kafka import TopicPartition

    if key in open_parts:
        open_parts.discard(key)
        consumer.incremental_unassign([TopicPartition(key[0], key[1])])


def _sorted_range(events: Iterator[Event]) -> list[Event]:
    # Stable sort: within a partition Kafka order breaks event-time ties.
    return sorted(events, key=event_ts)


def record_range(
    kafka_conf: dict[str, Any],
    topics: list[str],
    start_ms: int,
    end_ms: int,
    out: Path,
    *,
    codec: Codec | None = None,
    progress: Progress | None = None,
    optional: frozenset[str] = frozenset(),
) -> RangeStats:
    """Write the events of a time range to an Avro container file, sorted by event time (atomic)."""
    stats = RangeStats()
    events = read_range(
        kafka_conf, topics, start_ms, end_ms, codec=codec, progress=progress, optional=optional, stats=stats
    )
    write_container(out, _sorted_range(events))
    return stats


def replay_kafka(
    kafka_conf: dict[str, Any],
    topics: list[str],
    start_ms: int,
    end_ms: int,
    *,
    engine: DetectionEngine,
    alerts_topic: str = ALERTS_REPLAY,
    codec: Codec | None = None,
    progress: Progress | None = None,
    publish: bool = True,
    optional: frozenset[str] = frozenset(),
) -> tuple[RangeStats, list[Event]]:
    """Run `engine` over a time range (event-time order) and publish its alerts to `alerts_topic`."""
    from confluent_kafka import KafkaException, Producer

    codec = codec or Codec()
    stats = RangeStats()
    events = _sorted_range(
        read_range(
            kafka_conf,
            topics,
            start_ms,
            end_ms,
            codec=codec,
            progress=progress,
            optional=optional,
            stats=stats,
        )
    )
    alerts: list[Event] = []
    for event in events:
        alerts.extend(o for o in engine.process(event) if o.type == "Alert")
    alerts.extend(o for o in engine.finish() if o.type == "Alert")
    seen: set[tuple[str, str]] = set()
    for a in alerts:
        # Alerts, not records: routed copies and refreshes while firing count once.
        state = (str(a.record["alert_id"]), str(a.record["status"]))
        if state in seen:
            continue
        seen.add(state)
        counts = stats.by_rule.setdefault(a.record["rule"], {"firing": 0, "resolved": 0})
        counts[a.record["status"]] += 1
    stats.alerts = len(alerts)
    if publish and alerts:
        try:
            producer = Producer({**kafka_conf, "enable.idempotence": True, "log_level": 0})
        except KafkaException as exc:
            raise KafkaReplayError(f"invalid Kafka producer settings: {exc.args[0]}") from None
        for a in alerts:
            producer.produce(alerts_topic, key=key_for(ALERTS_REPLAY, a.record), value=codec.encode(a))
            producer.poll(0)
        left = producer.flush(30)
        if left:
            raise KafkaReplayError(f"{left} replay alerts were not delivered to {alerts_topic}")
    return stats, alerts


def publish_file(
    path: Path,
    publisher: Any,
    *,
    speed: float = 0.0,
    progress: Progress | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Publish every event of a container file; `speed` > 0 paces by event time (2 = twice real time)."""
    if speed < 0:
        raise KafkaReplayError("--speed must be >= 0 (0: as fast as possible)")
    count = 0
    first_ts: int | None = None
    started = clock()
    for event in iter_container(path):
        if speed > 0:
            ts = event_ts(event)
            if first_ts is None:
                first_ts = ts
            delay = (ts - first_ts) / 1000.0 / speed - (clock() - started)
            if delay > 0:
                sleep(delay)
        publisher.publish(event)
        count += 1
        if progress is not None and count % 50_000 == 0:
            progress(f"published {count} events")
    return count
