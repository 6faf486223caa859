"""The producing half of the worker's I/O: a stuck or refusing producer stops the worker, loudly."""

from __future__ import annotations

import collections

import pytest

from streams.errors import StreamsError
from streams.runtime import kafka_io
from streams.runtime.checkpoint import Send
from streams.runtime.kafka_io import KafkaIO


class _StuckProducer:
    """Acknowledges nothing: every flush leaves one record undelivered."""

    def produce(self, topic: str, **kwargs: object) -> None:
        pass

    def flush(self, timeout: float) -> int:
        return 1

    def poll(self, timeout: float) -> int:
        return 0


def _io() -> KafkaIO:
    io = KafkaIO({"bootstrap.servers": "127.0.0.1:1"}, "t.", lambda offsets: None, collections.Counter())
    io.producer = _StuckProducer()  # type: ignore[assignment]
    return io


def test_a_producer_that_acknowledges_nothing_stops_the_worker_with_a_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stuck producer used to hold everything silently: the flush gives up and says why."""
    monkeypatch.setattr(kafka_io, "DELIVERY_TIMEOUT_S", 0.05)
    io = _io()
    io.send(Send("rs.alerts", b"team", b"x"))
    with pytest.raises(StreamsError, match="has not acknowledged the snapshot of partition 3"):
        io.flush("the snapshot of partition 3")
    assert io.produced["rs.alerts"] == 1  # counted per unprefixed topic


def test_a_refused_send_fails_the_next_flush_naming_the_topic() -> None:
    io = _io()
    io.producer = type("P", (), {"flush": lambda self, t: 0})()
    io.errors.append("t.rs.alerts: Broker: Message size too large")
    with pytest.raises(StreamsError, match=r"refused 1 send\(s\) of the outputs of partition 0: t.rs.alerts"):
        io.flush("the outputs of partition 0")


def test_a_record_too_large_for_the_producer_is_one_sentence_naming_its_size_and_topic() -> None:
    """librdkafka refuses it at produce: the worker says what and where, not a KafkaException traceback."""
    io = KafkaIO({"bootstrap.servers": "127.0.0.1:1"}, "t.", lambda offsets: None, collections.Counter())
    try:
        with pytest.raises(StreamsError, match=r"record of 17,825,792 bytes for t\.rs\.alerts as too large"):
            io.send(Send("rs.alerts", b"team", b"x" * (17 * 1024 * 1024)))
    finally:
        io.close(0.1)
