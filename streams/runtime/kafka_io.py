"""The producing half of the worker's Kafka I/O, shared by both runtimes: sends, delivery, flushes.

One librdkafka producer (acks=all, idempotent, the Java partitioner, lz4) carries out the core's
`Send`s; `flush` blocks until Kafka acknowledged everything sent, which a `Checkpoint` relies on.
Committing and pausing differ per runtime (an explicit commit and `Consumer.pause` on librdkafka,
acks and `pause_partitions` on Faust): they are the callables each runtime passes in.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from streams.errors import StreamsError
from streams.runtime.checkpoint import Send
from streams.runtime.options import DELIVERY_TIMEOUT_S
from streams.runtime.side_path import InFlight

__all__ = ["KafkaIO"]

log = logging.getLogger("ranksight.worker")


class KafkaIO:
    """`WorkerIO` over one librdkafka producer; `commit` is the runtime's."""

    def __init__(
        self,
        conf: dict[str, Any],
        prefix: str,
        commit: Callable[[dict[str, int]], None],
        produced: collections.Counter[str],
        pause: Callable[[list[str]], None] = lambda tps: None,
        resume: Callable[[list[str]], None] = lambda tps: None,
    ) -> None:
        self.prefix = prefix
        self._commit = commit
        self._pause = pause
        self._resume = resume
        self.produced = produced  # per topic (unprefixed)
        self.errors: list[str] = []
        self.producer = Producer(
            {
                **conf,
                "acks": "all",
                "enable.idempotence": True,
                # The Java partitioner, as the publisher uses: a key lands on the same partition
                # whichever runtime or producer wrote it.
                "partitioner": "murmur2_random",
                "linger.ms": 5,
                "compression.type": "lz4",
                "message.max.bytes": 16 * 1024 * 1024,
                "log_level": 3,
            }
        )
        self._topics: dict[str, str] = {}

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}: {err.str()}")

    def send(self, record: Send) -> None:
        """Produce one record; its `flight` entry is told the offset once Kafka acknowledged it."""
        topic = self._topics.get(record.topic)
        if topic is None:
            topic = self._topics[record.topic] = self.prefix + record.topic
        report = self._on_delivery
        flight = record.flight
        if flight is not None:

            def report(err: KafkaError | None, msg: Message) -> None:
                self._on_delivery(err, msg)
                InFlight.delivered(flight, None if err is not None else msg.offset())

        kwargs: dict[str, Any] = {"key": record.key, "value": record.value, "on_delivery": report}
        if record.partition is not None:
            kwargs["partition"] = record.partition
        if record.timestamp_ms is not None:
            kwargs["timestamp"] = record.timestamp_ms
        if record.headers:
            kwargs["headers"] = record.headers
        self.produced[record.topic] += 1
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                return
            except BufferError:  # librdkafka's queue is full: let it deliver
                self.producer.poll(0.1)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not isinstance(error, KafkaError) or error.code() != KafkaError.MSG_SIZE_TOO_LARGE:
                    raise
                # Inputs are capped at decode and snapshots shed jobs to fit, so this is a bug or a
                # changelog topic created with a smaller limit: say which, not a librdkafka traceback.
                raise StreamsError(
                    f"Kafka refused a record of {len(record.value or b''):,} bytes for {topic} as too "
                    "large (MSG_SIZE_TOO_LARGE); check the topic's max.message.bytes"
                ) from None

    def poll(self) -> None:
        """Serve delivery reports without waiting."""
        self.producer.poll(0)

    def flush(self, what: str) -> None:
        """Wait until Kafka acknowledged everything sent. A producer stuck past `DELIVERY_TIMEOUT_S`
        or a refused send stops the worker (a supervisor restarts it from its last checkpoint;
        nothing is lost: offsets are committed only after the state that covers them)."""
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while self.producer.flush(1.0) > 0:
            if time.monotonic() > deadline:
                raise StreamsError(
                    f"Kafka has not acknowledged {what} for {DELIVERY_TIMEOUT_S:.0f} s: the producer is"
                    " stuck; stopping so that the worker restarts from its last checkpoint"
                )
        if self.errors:
            errors, self.errors = self.errors, []
            raise StreamsError(f"Kafka refused {len(errors)} send(s) of {what}: {errors[0]}")

    def commit(self, offsets: dict[str, int]) -> None:
        """Commit these next offsets of the worker's group (the runtime's way)."""
        self._commit(offsets)

    def pause(self, tps: list[str]) -> None:
        """Stop fetching these partitions (the runtime's way)."""
        self._pause(tps)

    def resume(self, tps: list[str]) -> None:
        """Fetch these partitions again (the runtime's way)."""
        self._resume(tps)

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is still queued, for at most `timeout_s`."""
        self.producer.flush(timeout_s)
