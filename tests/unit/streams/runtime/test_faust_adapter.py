"""The Faust adapter without a broker: bad input through its real agent function, credentials."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.codec import Codec
from schemas.topics import TRAINING_EVENTS, TRAINING_STEPS
from streams.runtime.changelog import Restored
from streams.runtime.faust_adapter import broker_credentials, build_app
from streams.runtime.options import WorkerOptions
from tests.unit.streams.runtime.fake_kafka import FakeIO, FakeKafka
from tests.unit.streams.runtime.test_intake import _GOOD_AND_WRONG, _bad_values


@dataclass
class _Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: float | None = 1_780_000_000.0


@dataclass
class _FaustEvent:
    message: _Message
    key: bytes | None
    value: bytes | None


class _Stream:
    """The slice of a Faust stream the agent uses: `noack().events()` and `ack`."""

    def __init__(self, events: list[_FaustEvent]) -> None:
        self._events = events
        self.acked: list[_FaustEvent] = []

    def noack(self) -> _Stream:
        return self

    async def events(self) -> Any:
        for event in self._events:
            yield event

    async def ack(self, event: _FaustEvent) -> bool:
        self.acked.append(event)
        return True


def test_bad_input_never_raises_out_of_the_agent_and_counts_as_read(tmp_path: Path) -> None:
    """Every kind of bad record on the topics whose dead letters the sink owns (no send needed)."""
    app = build_app(WorkerOptions(bootstrap="127.0.0.1:1", workdir=tmp_path, runtime="faust"))
    runtime = app.ranksight_runtime  # type: ignore[attr-defined]
    runtime.io = FakeIO(
        FakeKafka(6), runtime._committed
    )  # the Kafka I/O is the same as the default runtime's: not tested here
    runtime.core.assign({1}, Restored())  # as the assignment signal does (no changelog to read here)
    [agent] = app.agents.values()
    codec = Codec()
    offsets: dict[str, int] = {}
    events = []
    for topic in (TRAINING_STEPS, TRAINING_EVENTS):
        good, wrong = _GOOD_AND_WRONG[topic]
        for value in _bad_values(codec.encode(good), codec.encode(wrong)).values():
            offset = offsets[topic] = offsets.get(topic, -1) + 1
            events.append(_FaustEvent(_Message(topic, 1, offset, b"key", value), b"key", value))
    stream = _Stream(events)
    asyncio.run(agent.fun(stream))  # returns once the stream ends; raises on a bug
    task = runtime.core.tasks[1]
    described = task.aligner.describe(0.0)
    for topic in (TRAINING_STEPS, TRAINING_EVENTS):
        assert described[f"{topic}:1"][1] == offsets[topic]  # read, not a backlog
    assert task.counts["rejected"] == len(events)
    # A checkpoint (when input goes quiet) commits them: the adapter acknowledges what it covers.
    task.uncommitted = len(events)
    asyncio.run(runtime.perform([task.checkpoint(now=0.0)]))
    assert stream.acked == events


def test_worker_credentials_follow_the_kafka_security_settings(tmp_path: Path) -> None:
    """PLAINTEXT: none; SSL: a verifying context; SASL_SSL + SCRAM: user, mechanism and TLS."""
    import faust

    plain = WorkerOptions(bootstrap="b:9092", workdir=tmp_path)
    assert broker_credentials(plain) is None
    ssl_only = broker_credentials(
        WorkerOptions(bootstrap="b:9093", workdir=tmp_path, security_protocol="SSL")
    )
    assert isinstance(ssl_only, faust.SSLCredentials)
    sasl = WorkerOptions(
        bootstrap="b:9094",
        workdir=tmp_path,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="detector",
        sasl_password="s3cret",
    )
    creds = broker_credentials(sasl)
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value) == ("detector", "s3cret", "SCRAM-SHA-512")
    assert creds.ssl_context is not None and creds.protocol.value == "SASL_SSL"
    assert "s3cret" not in repr(sasl)  # options end up in logs
