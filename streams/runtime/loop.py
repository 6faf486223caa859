"""The default runtime: the worker core driven by one librdkafka consumer, with explicit commits.

`ranksight worker` runs it (`--runtime direct`). One consumer in group `<prefix><group>` reads the
side path's node-keyed topics and the job-keyed topics. Every topic has the same partition count
and the `range` assignor gives a member the same partition numbers of each, so partition p of
every job topic meets in task p. A newly assigned partition is restored from the changelogs
before any of its records is processed; a graceful revocation or stop checkpoints first. Offsets
are committed only inside a `Checkpoint`, after what covers them is durable.

Reading never stops for held records: the core's aligners bound what they hold by releasing the
oldest (`align_max_buffer`), so the records that would release the others keep coming.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from streams import gc_policy
from streams.errors import StreamsError
from streams.runtime.aligner import tp_key
from streams.runtime.changelog import restore, topic_specs
from streams.runtime.checkpoint import perform
from streams.runtime.core import WorkerCore
from streams.runtime.health import WorkerHealth
from streams.runtime.intake import Record
from streams.runtime.kafka_io import KafkaIO
from streams.runtime.options import (
    ASK_ENDS_S,
    INPUT_TOPICS,
    METRICS_S,
    WorkerOptions,
    kafka_config,
)

__all__ = ["DirectWorker", "ensure_topics"]

log = logging.getLogger("ranksight.worker")

_BATCH = 2_000  # records taken from librdkafka's queue per call
_POLL_S = 0.05  # how long one call waits when nothing is queued


def ensure_topics(options: WorkerOptions, conf: dict[str, Any]) -> None:
    """Create the topics the worker reads and writes unless they exist (both runtimes)."""
    from infra.kafka.topics import create_topics

    create_topics(
        options.bootstrap,
        topic_specs(options),
        prefix=options.topic_prefix,
        conf=conf,
        replication_factor=options.replication_factor,
    )


class DirectWorker:
    """One process of the detection worker on librdkafka. `run()` blocks until `stop()`."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.prefix = options.topic_prefix
        self.conf = kafka_config(options)
        self.group = self.prefix + options.app_id
        self.core = WorkerCore(options, self.lag)
        self.health = WorkerHealth(self.core, options.metrics_port)
        self.io = KafkaIO(
            self.conf, self.prefix, self._commit, self.health.produced, pause=self._pause, resume=self._resume
        )
        self.asked: dict[str, int] = {}  # end offsets asked of the broker ("topic:p")
        self.committed: dict[str, int] = {}  # committed offsets at assignment
        self.committed_by_us: dict[str, int] = {}
        self._ktps: dict[str, TopicPartition] = {}
        self._unprefixed: dict[str, str] = {}
        self.stopping = False
        self._timers = dict.fromkeys(("tick", "ends", "metrics", "stats"), time.monotonic())
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
        name = self._unprefixed.get(topic)
        if name is None:
            name = topic[len(self.prefix) :] if self.prefix and topic.startswith(self.prefix) else topic
            self._unprefixed[topic] = name
        return name

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
        for p in sorted(self.core.assigned):
            for topic in INPUT_TOPICS:
                tp = tp_key(topic, p)
                if self.consumer.get_watermark_offsets(self._ktp(tp), cached=True)[1] >= 0:
                    continue
                try:
                    _, hw = self.consumer.get_watermark_offsets(self._ktp(tp), timeout=1.0, cached=False)
                except KafkaException as exc:  # a later tick asks again
                    log.debug("end offset of %s not known yet: %s", tp, exc)
                    continue
                self.asked[tp] = int(hw)

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

    def _pause(self, tps: list[str]) -> None:
        # librdkafka drops what it prefetched of them and fetches again from the next unread offset.
        self.consumer.pause([self._ktp(tp) for tp in tps])
        log.debug("paused %s (ahead of a slower input)", ", ".join(tps))

    def _resume(self, tps: list[str]) -> None:
        self.consumer.resume([self._ktp(tp) for tp in tps])

    # -- rebalances ------------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        names = {self.prefix + t for t in INPUT_TOPICS}
        parts = {tp.partition for tp in partitions if tp.topic in names}
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
        self.core.assign(parts, restore(self.conf, self.options, parts))
        gc_policy.settle()  # a restored state is long-lived: out of the collector's way

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self.core.assigned:
            try:
                perform(self.core.revoke(), self.io)
                log.info("checkpointed every partition (revocation)")
            except StreamsError as exc:  # the next owner re-reads from the last checkpoint
                log.warning("no checkpoint at revocation: %s", exc)
        self.core.lose()

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.warning("partitions lost (session timed out): dropping their state uncommitted")
        self.core.lose()

    # -- the loop ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Begin a clean stop: the loop checkpoints every partition and leaves the group."""
        self.stopping = True

    def run(self) -> None:
        """Consume until stopped; then checkpoint every partition and leave the group."""
        ensure_topics(self.options, self.conf)
        topics = [self.prefix + t for t in INPUT_TOPICS]
        self.consumer.subscribe(
            topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        log.info("direct worker %s: subscribed to %s", self.group, ", ".join(topics))
        try:
            while not self.stopping:
                self.step()
            if self.core.assigned:
                perform(self.core.checkpoint_all(), self.io)
                log.info("checkpointed every partition (stop)")
        finally:
            self.consumer.close()  # leaves the group (its revocation checkpoints nothing more)
            self.io.close()

    def step(self) -> None:
        """One batch from the consumer through the core; the timers that are due."""
        # Records released but not fed yet (`release_batch` per call): read what is there, no wait.
        pending = self.core.ready()
        msgs = self.consumer.consume(_BATCH, 0 if pending else _POLL_S)
        records: list[Record] = []
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise StreamsError(f"Kafka consumer failed: {err.str()}")
                log.debug("consumer: %s", err.str())
                continue
            records.append(_record(msg, self._unprefix(msg.topic() or "")))
        if records:
            perform(self.core.receive(records), self.io)
        if (records or pending) and self.core.ready():  # nothing read, nothing pending: nothing to release
            perform(self.core.release(), self.io)
        self.io.poll()
        self._timers_due(time.monotonic())

    def _due(self, name: str, every_s: float, now: float) -> bool:
        if now - self._timers[name] < every_s:
            return False
        self._timers[name] = now
        return True

    def _timers_due(self, now: float) -> None:
        if self._due("tick", min(0.25, self.options.align_idle_s / 4), now):
            perform(self.core.tick(), self.io)
        if self.core.assigned and self._due("ends", ASK_ENDS_S, now):
            self._ask_ends()
        if self._due("metrics", METRICS_S, now):
            self.health.publish_metrics()
        if self._due("stats", self.options.stats_interval_s, now):
            self.health.log_progress()


def _record(msg: Message, topic: str) -> Record:
    kind, ms = msg.timestamp()
    return Record(
        topic,
        msg.partition() or 0,
        msg.offset() or 0,
        msg.key(),
        msg.value(),
        ms if kind != 0 and ms > 0 else None,
    )
