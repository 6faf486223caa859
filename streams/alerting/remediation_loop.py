"""`ranksight remediate`'s Kafka loop: rebuild from three topics, then decide every tick and publish every decision.

On start it reads `rs.actions` whole (its own earlier decisions: what was acted on, the hourly
budget), `rs.alerts` and `rs.training.events` from their oldest records kept (or a lookback), up
to the end offsets of the moment it started. It decides nothing before all three are caught up,
so no decision rests on a partial picture of a job. Then, every `tick_s`, the core decides (asking
the scheduler about each job through its own `lookup`); the shell asks the scheduler for the
actions (through `act`) and publishes one `ActionTaken` per decision on `rs.actions`, keyed by
job, flushed before the next tick.

The remediator keeps no offsets: its state is rebuilt from the topics at every start (they are
small next to telemetry; records of other types on the events topic are decoded and dropped).
Run one remediator per scheduler: two would each act within their own hourly budget.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from schemas.codec import Codec
from schemas.errors import DecodeError
from schemas.records import Event
from streams.alerting.remediation import Decision, Outcome, Remediator, relevant_event_types

__all__ = ["RemediationStats", "RemediationTopics", "event_filter", "follow_remediation"]

_BATCH = 500
_POLL_S = 0.2


@dataclass(frozen=True)
class RemediationTopics:
    """The three topics (prefixed names)."""

    alerts: str
    events: str
    actions: str


@dataclass
class RemediationStats:
    """What a run did."""

    restored_actions: int = 0
    alerts: int = 0
    events: int = 0
    decisions: dict[str, int] = field(default_factory=dict)  # decision kind -> count
    caught_up: bool = False


# What would be done to the decision's scheduler job, in words (dry runs record it).
Describe = Callable[[Decision], str]
# Do it; the scheduler's answer (never raises for a refusal: Outcome(False, sentence)).
Act = Callable[[Decision], Outcome]


def follow_remediation(
    conf: dict[str, Any],
    topics: RemediationTopics,
    remediator: Remediator,
    codec: Codec,
    *,
    describe: Describe,
    act: Act,
    lookback_s: float | None = None,
    tick_s: float = 1.0,
    idle_exit_s: float | None = None,
    stop: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.time,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    on_caught_up: Callable[[RemediationStats], None] | None = None,
    warn: Callable[[str], None] = lambda message: None,
) -> RemediationStats:
    """Rebuild, then decide and publish until `stop()` (or `idle_exit_s` without new records)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    consumer = Consumer(
        {
            **conf,
            "group.id": f"ranksight-remediate-{uuid.uuid4().hex[:8]}",  # assigned, never committed
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    producer = Producer({**conf, "enable.idempotence": True, "log_level": 0})
    stats = RemediationStats()
    errors: list[str] = []
    keep_event = event_filter(codec)

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err.str())

    try:
        since_ms = int((clock() - lookback_s) * 1000) if lookback_s is not None else None
        boundary, assign = _assign_rebuild(consumer, topics, since_ms)
        behind = {(tp.topic, tp.partition) for tp in assign if tp.offset < boundary[(tp.topic, tp.partition)]}
        last_tick = 0.0
        last_activity = time.monotonic()
        while not stop():
            msgs = consumer.consume(num_messages=_BATCH, timeout=_POLL_S)
            for msg in msgs:
                error = msg.error()
                if error is not None:
                    warn(error.str())
                    continue
                topic, p, offset = str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0)
                if offset + 1 >= boundary[(topic, p)]:
                    behind.discard((topic, p))
                if topic == topics.actions and offset >= boundary[(topic, p)]:
                    continue  # our own decisions coming back: already applied
                if topic == topics.events and not keep_event(msg.value()):
                    continue
                try:
                    event = codec.decode(msg.value() or b"")
                except DecodeError as exc:
                    warn(f"skipped: {exc.located(topic, p, offset)}")
                    continue
                _apply(remediator, topics, topic, event, stats)
            if msgs:
                last_activity = time.monotonic()
            if behind:
                positions = consumer.position([TopicPartition(t, p) for t, p in sorted(behind)])
                for tp in positions:
                    if tp.offset >= boundary[(tp.topic, tp.partition)]:
                        behind.discard((tp.topic, tp.partition))
                continue
            if not stats.caught_up:
                stats.caught_up = True
                if on_caught_up is not None:
                    on_caught_up(stats)
            now = clock()
            if now - last_tick >= tick_s:
                last_tick = now
                _tick(
                    remediator,
                    topics,
                    codec,
                    producer,
                    delivered,
                    describe,
                    act,
                    int(now * 1000),
                    stats,
                    on_record,
                )
                for lost in errors:
                    warn(f"an ActionTaken record was not delivered: {lost}")
                errors.clear()
                remediator.forget_ended_jobs()
            if idle_exit_s is not None and time.monotonic() - last_activity > idle_exit_s:
                break
    finally:
        consumer.close()
        left = producer.flush(5)
        if left:
            warn(f"{left} ActionTaken records were not delivered before the stop")
    return stats


def _assign_rebuild(
    consumer: Any, topics: RemediationTopics, since_ms: int | None
) -> tuple[dict[tuple[str, int], int], list[Any]]:
    """Assign every partition of the three topics from where the rebuild starts; returns (ends, assignment).

    The actions topic is read whole (every decision ever taken counts); alerts and events from
    `since_ms` when given. The rebuild ends at each partition's end as of now.
    """
    from confluent_kafka import TopicPartition

    from streams.alerting.delivery import retrying, topic_partitions

    boundary: dict[tuple[str, int], int] = {}
    assign = []
    for topic in (topics.actions, topics.alerts, topics.events):
        parts = topic_partitions(consumer, topic)
        starts: dict[int, int] = {}
        if since_ms is not None and topic != topics.actions:
            wanted = [TopicPartition(topic, p, since_ms) for p in parts]
            found = retrying(
                partial(consumer.offsets_for_times, wanted, timeout=10),
                f"look up offsets of {topic} by time",
            )
            starts = {tp.partition: tp.offset for tp in found}
        for p in parts:
            low, high = retrying(
                partial(consumer.get_watermark_offsets, TopicPartition(topic, p), timeout=10),
                f"read the offsets of {topic}[{p}]",
            )
            start = starts.get(p, low)
            start = high if start < 0 else max(start, low)
            boundary[(topic, p)] = high
            assign.append(TopicPartition(topic, p, start))
    consumer.assign(assign)
    return boundary, assign


def event_filter(codec: Codec) -> Callable[[bytes | None], bool]:
    """False for training events remediation does not read, told from the single-object header alone.

    Steps, data-loader and collective samples are most of `rs.training.events`; skipping them
    without decoding keeps a rebuild over days of events short (bench/bench_remediate.py).
    Registry-framed records (a schema id, not a fingerprint) are decoded and dropped after.
    """
    relevant = frozenset(relevant_event_types())
    skip = frozenset(fp for fp, schema in codec.schemas.by_fingerprint.items() if schema.name not in relevant)

    def wanted(value: bytes | None) -> bool:
        return not (value is not None and value[:2] == b"\xc3\x01" and value[2:10] in skip)

    return wanted


def _apply(
    remediator: Remediator, topics: RemediationTopics, topic: str, event: Event, stats: RemediationStats
) -> None:
    if topic == topics.actions:
        if event.type == "ActionTaken":
            remediator.observe_action(event.record)
            stats.restored_actions += 1
    elif topic == topics.alerts:
        if event.type == "Alert":
            remediator.observe_alert(event.record)
            stats.alerts += 1
    else:
        remediator.observe_event(event)
        stats.events += 1


def _tick(
    remediator: Remediator,
    topics: RemediationTopics,
    codec: Codec,
    producer: Any,
    delivered: Callable[[Any, Any], None],
    describe: Describe,
    act: Act,
    now_ms: int,
    stats: RemediationStats,
    on_record: Callable[[dict[str, Any]], None] | None,
) -> None:
    """Decide, act, publish; the records are flushed before the next tick."""
    decisions = remediator.decide(now_ms)
    for decision in decisions:
        detail = None
        if decision.kind == "dry_run":
            detail = describe(decision)
        elif decision.kind == "acted":
            outcome = act(decision)
            decision = remediator.settle(decision, outcome)
            detail = outcome.detail
        record = remediator.record(decision, now_ms, detail=detail)
        producer.produce(
            topics.actions,
            key=record["job_id"].encode(),
            value=codec.encode(Event("ActionTaken", record)),
            on_delivery=delivered,
        )
        stats.decisions[decision.kind] = stats.decisions.get(decision.kind, 0) + 1
        if on_record is not None:
            on_record(record)
    if decisions:
        producer.flush(10)
