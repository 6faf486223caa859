"""Alert delivery from Kafka to Alertmanager that survives restarts (the `alerts forward` adapter).

The forwarder is a consumer *group*: offsets are committed only once Alertmanager accepted
every state up to them. On start it reads each partition of the alert topic from a lookback
point (default: the oldest alert kept) up to the group's committed offset and `restore`s the
firing set from it without sending anything; once every partition is caught up, the alerts
still firing are re-sent at once (they were sent before, Alertmanager deduplicates), and the
records after the committed offset are sent as new. A group without a committed offset starts
live at the end of the topic, after the same rebuild.

An alert Alertmanager refuses as invalid (400) goes to the dead-letter topic with the reason in
its headers, once, and the forwarder goes on: the offsets are committed past it once the dead
letter is written, so a refused alert is neither re-posted every tick nor holds the others back.

Why rebuild from the alert topic rather than keep a compacted state topic: the alert topic
already is the log of every state, it is small (alerts, not telemetry), and a second topic
would be one more thing to create, retain and keep consistent with the first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from infra.kafka.retry import STARTING, ask_again
from infra.metrics import Metric
from schemas.errors import DecodeError
from schemas.records import Event
from schemas.topics import deadletter_headers
from streams.alerting.alertmanager import AlertForwarder, AlertmanagerError, alert_key
from streams.errors import StreamsError

T = TypeVar("T")

__all__ = [
    "DeliveryStats",
    "forward_file",
    "forward_topic",
    "forwarder_metrics",
    "read_alert_file",
    "retrying",
    "topic_partitions",
]

_BATCH = 500
_POLL_S = 0.5


@dataclass
class DeliveryStats:
    """What a forwarding run did."""

    restored: int = 0
    rebuilt_partitions: dict[int, tuple[int, int]] = field(default_factory=dict)  # p -> (from, to)
    received: int = 0
    sent: int = 0
    committed: dict[int, int] = field(default_factory=dict)
    deadlettered: int = 0


def _warn_default(message: str) -> None:
    """Warnings go nowhere unless the caller says where."""


def forward_topic(
    conf: dict[str, Any],
    topic: str,
    group: str,
    forwarder: AlertForwarder,
    decode: Callable[[bytes], Event],
    *,
    lookback_s: float | None = None,
    idle_exit_s: float | None = None,
    stop: Callable[[], bool] = lambda: False,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    on_rebuilt: Callable[[DeliveryStats], None] | None = None,
    warn: Callable[[str], None] = _warn_default,
    deadletter_topic: str | None = None,
) -> DeliveryStats:
    """Rebuild the firing set of `group` on `topic`, then forward new alerts until stopped or idle.

    Alerts Alertmanager refuses go to `deadletter_topic` (without one they are only warned about).
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **conf,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
            "log_level": 0,
        }
    )
    stats = DeliveryStats()
    letters = _DeadLetters(conf, topic, deadletter_topic, forwarder, warn, stats)
    try:
        parts = topic_partitions(consumer, topic)
        boundary = _assign_rebuild(consumer, topic, parts, lookback_s, stats)
        behind = {p for p in parts if stats.rebuilt_partitions[p][0] < boundary[p]}
        reported = False
        pending: dict[int, int] = {}  # partition -> next offset to commit
        last_activity = time.monotonic()
        while not stop():
            msgs = consumer.consume(num_messages=_BATCH, timeout=_POLL_S)
            live: list[dict[str, Any]] = []
            for msg in msgs:
                error = msg.error()
                if error is not None:
                    warn(error.str())
                    continue
                p, offset = int(msg.partition() or 0), int(msg.offset() or 0)
                record: dict[str, Any] | None
                try:
                    record = decode(msg.value() or b"").record
                except DecodeError as exc:
                    warn(f"skipped: {exc.located(topic, p, offset)}")
                    record = None
                if record is not None:
                    letters.sources[alert_key(record)] = (msg.value() or b"", p, offset)
                if offset < boundary[p]:
                    if record is not None:
                        forwarder.restore(record)
                        stats.restored += 1
                    if offset + 1 >= boundary[p]:
                        behind.discard(p)
                    continue
                behind.discard(p)
                pending[p] = offset + 1
                if record is not None:
                    live.append(record)
                    if on_record is not None:
                        on_record(record)
            if behind:
                # Catch-up without messages (a gap at the end of the range): ask where we are.
                for tp in consumer.position([TopicPartition(topic, p) for p in sorted(behind)]):
                    if tp.offset >= boundary[tp.partition]:
                        behind.discard(tp.partition)
            if not behind and not reported:
                reported = True
                if on_rebuilt is not None:
                    on_rebuilt(stats)
            if msgs:
                last_activity = time.monotonic()
            stats.received += len(live)
            try:
                if live:
                    stats.sent += forwarder.handle_batch(live)
                if not behind:
                    # Only once every partition is rebuilt: a restored alert may be resolved later on.
                    stats.sent += forwarder.tick()
            except AlertmanagerError as exc:
                warn(str(exc))
            letters.send()  # before the commit: a refused alert's offset passes once its dead letter is written
            if pending and forwarder.settled:
                consumer.commit(
                    offsets=[TopicPartition(topic, p, o) for p, o in sorted(pending.items())],
                    asynchronous=False,
                )
                stats.committed.update(pending)
                pending = {}
            if idle_exit_s is not None and not behind and time.monotonic() - last_activity > idle_exit_s:
                break
    finally:
        consumer.close()
    return stats


def _assign_rebuild(
    consumer: Any, topic: str, parts: list[int], lookback_s: float | None, stats: DeliveryStats
) -> dict[int, int]:
    """Assign each partition from where its rebuild starts; returns the committed offsets (the rebuild's end).

    The rebuild starts at the oldest offset (or the first within `lookback_s`) and ends where the
    group last committed (the end of the partition for a new group).
    """
    from confluent_kafka import TopicPartition

    committed = _committed(consumer, [TopicPartition(topic, p) for p in parts])
    since: dict[int, int] = {}
    if lookback_s is not None:
        at = int((time.time() - lookback_s) * 1000)
        found = retrying(
            lambda: consumer.offsets_for_times([TopicPartition(topic, p, at) for p in parts], timeout=10),
            "look up offsets by time",
        )
        since = {tp.partition: tp.offset for tp in found}
    boundary: dict[int, int] = {}
    assign = []
    for p in parts:
        tp = TopicPartition(topic, p)
        low, high = retrying(
            partial(consumer.get_watermark_offsets, tp, timeout=10), f"read the offsets of {topic}[{p}]"
        )
        boundary[p] = committed[p] if committed[p] >= 0 else high
        start = low if lookback_s is None else since.get(p, -1)
        if start < 0 or start > boundary[p]:
            start = boundary[p]  # nothing that recent: no history to read
        start = max(start, low)
        stats.rebuilt_partitions[p] = (start, boundary[p])
        assign.append(TopicPartition(topic, p, start))
    consumer.assign(assign)
    return boundary


class _DeadLetters:
    """Alerts Alertmanager refused, written to the dead-letter topic with the message they came from."""

    def __init__(
        self,
        conf: dict[str, Any],
        topic: str,
        deadletter_topic: str | None,
        forwarder: AlertForwarder,
        warn: Callable[[str], None],
        stats: DeliveryStats,
    ) -> None:
        self.conf, self.topic, self.deadletter_topic = conf, topic, deadletter_topic
        self.forwarder, self.warn, self.stats = forwarder, warn, stats
        self.producer: Any = None
        # The message each held alert came from: what a refused alert's dead letter carries.
        self.sources: dict[tuple[str, str], tuple[bytes, int, int]] = {}

    def send(self) -> None:
        """Dead-letter every alert refused since the last call (warned about either way); forget released ones."""
        from confluent_kafka import Producer

        deadletter_topic, sources = self.deadletter_topic, self.sources
        for record, refusal in self.forwarder.take_refused():
            key = alert_key(record)
            value, p, offset = sources.get(key, (b"", -1, -1))
            where = f" to {deadletter_topic}" if deadletter_topic else ""
            self.warn(
                f"Alertmanager refused alert {record.get('rule')} of job {record.get('job_id')} "
                f"({refusal.reason}); dead-lettered{where}, going on"
            )
            if deadletter_topic is None:
                continue
            if self.producer is None:
                self.producer = Producer({**self.conf, "enable.idempotence": True})
            headers = deadletter_headers(refusal, self.topic, p, offset, component="alerts-forward")
            self.producer.produce(deadletter_topic, value=value, key=key[1].encode(), headers=headers)
            self.stats.deadlettered += 1
        for key in [k for k in sources if not self.forwarder.holds(k)]:
            del sources[key]
        if self.producer is not None and self.producer.flush(30) > 0:
            raise StreamsError(f"could not write refused alerts to {deadletter_topic} within 30 s")


def topic_partitions(consumer: Any, topic: str, wait_s: float = 10.0) -> list[int]:
    """The topic's partitions; a topic created a moment ago may take a few seconds to show."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + wait_s
    while True:
        try:
            meta = consumer.list_topics(topic, timeout=10)
        except KafkaException as exc:
            raise StreamsError(f"Kafka does not answer ({exc.args[0].str()})") from None
        tmeta = meta.topics.get(topic)
        if tmeta is not None and tmeta.error is None and tmeta.partitions:
            return sorted(tmeta.partitions)
        if time.monotonic() > deadline:
            raise StreamsError(
                f"no topic {topic!r}: create topics with `ranksight kafka topics` (check RANKSIGHT_TOPIC_PREFIX)"
            )
        time.sleep(0.5)  # metadata of a new topic reaches the broker's cache shortly


def retrying(call: Callable[[], T], what: str, wait_s: float = 60.0) -> T:
    """`call()`, asked again while a just-created topic's partitions have no leader yet."""
    return ask_again(call, what, StreamsError, wait_s=wait_s)


def _committed(consumer: Any, partitions: list[Any], wait_s: float = 60.0) -> dict[int, int]:
    """The group's committed offsets; waits out a coordinator that is still starting (fresh broker)."""
    return ask_again(
        lambda: {tp.partition: tp.offset for tp in consumer.committed(partitions, timeout=10)},
        "read the group's committed offsets",
        StreamsError,
        codes=STARTING,
        wait_s=wait_s,
    )


def read_alert_file(path: str | Path) -> Iterator[dict[str, Any]]:
    """Alert records of an Avro container file (`.avro`) or a JSON Lines file of events."""
    from schemas.files import iter_container, read_jsonl

    source = Path(path)
    if not source.is_file():
        raise StreamsError(f"{source}: no such file")
    events: Iterable[Event] = read_jsonl(source) if source.suffix == ".jsonl" else iter_container(source)
    for event in events:
        if event.type == "Alert":
            yield event.record


def forward_file(path: str | Path, forwarder: AlertForwarder) -> int:
    """Send the last state of every alert of a file once; returns how many alerts went out.

    Alerts firing at the end of the file are sent with the keep-alive `endsAt`: Alertmanager
    resolves them by itself unless something keeps sending them.
    """
    sent = forwarder.handle_batch(list(read_alert_file(path)))
    refused = forwarder.take_refused()
    if refused:
        record, refusal = refused[0]
        raise StreamsError(
            f"Alertmanager refused {len(refused)} alert(s) of {path} (the others were sent), first "
            f"{record.get('rule')} of job {record.get('job_id')}: {refusal.reason}"
        )
    return sent


def forwarder_metrics(*, received: int, sent: int, firing_by_rule: Mapping[str, int]) -> list[Metric]:
    """`ranksight alerts forward`'s health as metric families."""
    return [
        Metric(
            "ranksight_forward_alerts_in",
            "counter",
            "Alert records read from the alert topic (after the rebuild).",
            (),
            {(): float(received)},
        ),
        Metric(
            "ranksight_forward_alerts_sent",
            "counter",
            "Alert states Alertmanager accepted (new, resolved and keep-alive re-sends).",
            (),
            {(): float(sent)},
        ),
        Metric(
            "ranksight_forward_alerts_firing",
            "gauge",
            "Alerts the forwarder keeps alive in Alertmanager, per rule.",
            ("rule",),
            {(r,): float(n) for r, n in sorted(firing_by_rule.items())},
        ),
    ]
