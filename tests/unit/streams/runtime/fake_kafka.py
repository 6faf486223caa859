"""An in-memory Kafka for unit tests of the worker core: partitioned logs, a consumer, a `WorkerIO`.

Not a mock of a client library: a small real model of what the core relies on (offsets per
partition, the Java partitioner, delivery before flush returns, committed offsets), so the core's
logic is tested with no broker. Integration tests run the same core against the real broker.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from schemas.codec import Codec
from schemas.eventtime import event_ts
from schemas.records import Event
from schemas.topics import ALERTS, key_for, partition_for, telemetry_copies, topic_for
from streams.runtime.checkpoint import Action, Send, perform
from streams.runtime.core import WorkerCore
from streams.runtime.intake import Record
from streams.runtime.options import INPUT_TOPICS, WorkerOptions
from streams.runtime.side_path import InFlight

__all__ = ["Clock", "FakeIO", "FakeKafka", "drive"]


class Clock:
    """A monotonic clock a test moves by hand."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeKafka:
    """Topic partitions as lists of records; every topic has `partitions` partitions."""

    partitions: int
    logs: dict[tuple[str, int], list[Record]] = field(default_factory=lambda: collections.defaultdict(list))
    headers: dict[tuple[str, int, int], dict[str, bytes]] = field(default_factory=dict)

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> int:
        """Append a record; returns its offset."""
        if partition is None:
            partition = partition_for(key or b"", self.partitions)
        log = self.logs[(topic, partition)]
        log.append(Record(topic, partition, len(log), key, value, timestamp_ms))
        if headers:
            self.headers[(topic, partition, len(log) - 1)] = dict(headers)
        return len(log) - 1

    def publish(self, events: Iterable[Event], codec: Codec, delay_ms: int = 3_600_000) -> int:
        """Write events as the publisher does (job-keyed training records, the worker's telemetry
        copies), stamped `delay_ms` after their event time (a backlog published later)."""
        count = 0
        for event in events:
            value = codec.encode(event)
            ts = event_ts(event) + delay_ms
            copies = telemetry_copies(event.type, event.record)
            if copies:
                for topic, key in copies:
                    self.produce(topic, key, value, timestamp_ms=ts)
                    count += 1
            else:
                topic = topic_for(event.type)
                self.produce(topic, key_for(topic, event.record), value, timestamp_ms=ts)
                count += 1
        return count

    def end(self, topic: str, partition: int) -> int:
        return len(self.logs.get((topic, partition), ()))

    def records(self, topic: str) -> list[Record]:
        return [r for (t, _), log in sorted(self.logs.items()) if t == topic for r in log]


class FakeIO:
    """`WorkerIO` on a `FakeKafka`: sends append at once (delivered), commits are remembered, and
    every call is logged in order (`calls`) for tests of the commit order."""

    def __init__(self, kafka: FakeKafka, on_commit: Callable[[dict[str, int]], None] | None = None) -> None:
        self.kafka = kafka
        self.on_commit = on_commit  # the runtime's own commit (the Faust adapter acknowledges)
        self.committed: dict[str, int] = {}
        self.calls: list[tuple[str, Any]] = []
        self.consumer: Consumer | None = None  # set by `drive`: pauses reach it

    def send(self, record: Send) -> None:
        offset = self.kafka.produce(
            record.topic, record.key, record.value, record.partition, record.timestamp_ms, record.headers
        )
        if record.flight is not None:
            InFlight.delivered(record.flight, offset)
        self.calls.append(("send", record.topic))

    def flush(self, what: str) -> None:
        self.calls.append(("flush", what))

    def poll(self) -> None:
        """Deliveries are immediate here."""

    def pause(self, tps: list[str]) -> None:
        self.calls.append(("pause", list(tps)))
        if self.consumer is not None:
            self.consumer.paused.update(tps)

    def resume(self, tps: list[str]) -> None:
        self.calls.append(("resume", list(tps)))
        if self.consumer is not None:
            self.consumer.paused.difference_update(tps)

    def commit(self, offsets: dict[str, int]) -> None:
        for tp, offset in offsets.items():
            self.committed[tp] = max(offset, self.committed.get(tp, -1))
        self.calls.append(("commit", dict(offsets)))
        if self.on_commit is not None:
            self.on_commit(offsets)


class Consumer:
    """Reads the worker's input topics from the committed offsets, a chunk of one partition at a time
    (as a fetch answers per partition): round-robin over partitions, or `sticky`: one partition until
    it is read or paused (the worst case of a client whose prefetched queue one partition fills)."""

    def __init__(self, kafka: FakeKafka, committed: dict[str, int], chunk: int, sticky: bool = False) -> None:
        self.kafka = kafka
        self.chunk = chunk
        self.sticky = sticky
        self.position: dict[str, int] = {}
        for topic in INPUT_TOPICS:
            for p in range(kafka.partitions):
                tp = f"{topic}:{p}"
                self.position[tp] = committed.get(tp, 0)
        self._order = sorted(self.position)
        self._next = 0
        self.paused: set[str] = set()

    def lag(self, tp: str, last_offset: int | None) -> int | None:
        topic, _, p = tp.rpartition(":")
        end = self.kafka.end(topic, int(p))
        start = self.position[tp] - 1 if last_offset is None else last_offset
        return max(0, end - (start + 1))

    def poll(self) -> list[Record]:
        """The next chunk of the next partition with records to read ([] when all is read)."""
        for _ in range(len(self._order)):
            tp = self._order[self._next]
            self._next = (self._next + 1) % len(self._order)
            if tp in self.paused:
                continue
            topic, _, p = tp.rpartition(":")
            log = self.kafka.logs.get((topic, int(p)), [])
            at = self.position[tp]
            if at < len(log):
                batch = log[at : at + self.chunk]
                self.position[tp] = at + len(batch)
                if self.sticky:
                    self._next = self._order.index(tp)
                return batch
        return []

    def all_read(self) -> bool:
        return all(self.kafka.end(*_split(tp)) <= at for tp, at in self.position.items())


def _split(tp: str) -> tuple[str, int]:
    topic, _, p = tp.rpartition(":")
    return topic, int(p)


def drive(
    kafka: FakeKafka,
    options: WorkerOptions,
    *,
    io: FakeIO | None = None,
    chunk: int = 500,
    sticky: bool = False,
    step_s: float = 0.01,
    quiet_s: float = 10.0,
    max_steps: int = 2_000_000,
    wall_ms: int | None = None,
    stop_after: Callable[[WorkerCore], bool] | None = None,
    core_hook: Callable[[WorkerCore], None] | None = None,
    restored: Any = None,
) -> tuple[WorkerCore, FakeIO]:
    """Run one worker core over everything on `kafka` (all partitions assigned) until it is read and
    the core has been quiet for `quiet_s` of its clock. The clock moves `step_s` per poll."""
    from streams.runtime.changelog import Restored

    io = io or FakeIO(kafka)
    clock = Clock()
    last = max((r.timestamp_ms or 0 for log in kafka.logs.values() for r in log), default=0)
    # Far past the data: a historical backlog, so the wall-clock guard never invents time.
    now_ms = wall_ms if wall_ms is not None else last + 86_400_000
    consumer = Consumer(kafka, io.committed, chunk, sticky)
    io.consumer = consumer
    core = WorkerCore(options, consumer.lag, monotonic=clock, wall_ms=lambda: now_ms)
    if core_hook is not None:
        core_hook(core)
    core.assign(set(range(kafka.partitions)), restored or Restored())
    next_tick = clock.now
    quiet_since: float | None = None
    for _ in range(max_steps):
        batch = consumer.poll()
        actions: list[Action] = core.receive(batch) if batch else []
        perform(actions, io)
        if core.ready():  # as the loop does: what is released but not fed yet, before the next read
            perform(core.release(), io)
        clock.now += step_s
        if clock.now >= next_tick:
            perform(core.tick(), io)
            next_tick = clock.now + 0.25
        if stop_after is not None and stop_after(core):
            break
        busy = batch or any(len(t.aligner) for t in core.tasks.values()) or len(core.side.aligner)
        if busy or not consumer.all_read():
            quiet_since = None
        elif quiet_since is None:
            quiet_since = clock.now
        elif clock.now - quiet_since >= quiet_s:
            break
    else:
        raise AssertionError(f"the core did not finish in {max_steps} steps")
    return core, io


def alerts_of(kafka: FakeKafka, codec: Codec) -> list[dict[str, Any]]:
    """Every alert record the worker produced, in topic order."""
    return [codec.decode(r.value).record for r in kafka.records(ALERTS)]


def restored_from(kafka: FakeKafka, options: WorkerOptions) -> Any:
    """What `streams.runtime.changelog.restore` would read back from this Kafka's changelogs."""
    import json

    from streams.runtime.changelog import ROUTES_TABLE, SNAPSHOT_TABLE, Restored, changelog_topic, key_name

    out = Restored()
    for rec in kafka.records(changelog_topic(options.app_id, SNAPSHOT_TABLE)):
        name = key_name(rec.key or b"")  # "engine@p" (rank stage) or "jobs@p" (job stage)
        if rec.value:
            out.snapshots[name] = rec.value
        else:
            out.snapshots.pop(name, None)
    for rec in kafka.records(changelog_topic(options.app_id, ROUTES_TABLE)):
        node = key_name(rec.key or b"")
        if rec.value:
            out.routes[node] = json.loads(rec.value)
        else:
            out.routes.pop(node, None)
    return out
