"""Every kind of bad record mixed into a fault scenario: the worker and the sink both finish, once each.

Real broker, real chDB, the real `ranksight worker` subprocess. Bad records go to each topic the
sink stores (among the good ones and as the last record of busy partitions, which used to stall
the worker) and to each topic only the worker reads; the owner of each topic (the sink for what it
stores, the worker for the rest) dead-letters each of them exactly once, and the worker's alerts
equal those of the offline replay of the good events.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from producers.simulator import load_scenario, simulate
from schemas.codec import SINGLE_OBJECT_MAGIC, Codec
from schemas.files import write_container
from schemas.records import Event
from schemas.topics import (
    ALERTS,
    DEADLETTER,
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TELEMETRY_JOB,
    TELEMETRY_UNATTRIBUTED,
    TRAINING_EVENTS,
    TRAINING_STEPS,
    key_for,
    topic_for,
)
from sinks.clickhouse import close_all, connect
from sinks.consumer import SinkConsumer
from sinks.ddl import migrate
from sinks.metrics import sink_metrics
from streams.offline.replay import replay_offline
from streams.runtime.options import BINDINGS, DEFAULT_APP_ID, RUNTIMES, SOURCE_TOPICS, TELEMETRY_BY_JOB
from tests.integration.streams.harness import Worker, group_lag, publish, recent

# 8 minutes, 2 nodes x 4 GPUs, one job: a NaN loss (training path) and an XID (telemetry path).
SCENARIO = """
name: bad_input_small
description: "A short nan_loss run with an XID on one GPU, for the bad-input test."
duration: 8m
cluster: {name: sim-a, nodes: 2, gpus_per_node: 4, gpu_class: H100-80GB}
jobs:
  - {id: pretrain-7b-0009, team: llm-pretrain, owner: alice, nodes: 2, model_name: llama-7b, model_version: v3}
faults:
  - {type: nan_loss, job: pretrain-7b-0009, start: 3m, duration: 30s}
  - {type: xid_error, job: pretrain-7b-0009, node: node-02, gpu: 2, start: 5m, xid: 79}
"""
KINDS = (
    "null value",
    "empty value",
    "random bytes",
    "truncated Avro",
    "unknown fingerprint",
    "wrong record type",
    "trailing junk",
    "900 kB value",
)
# A valid record of a type that does not belong on the topic.
WRONG_TYPE = {
    TELEMETRY_GPU: "StepCompleted",
    TELEMETRY_HOST: "GpuSample",
    TRAINING_STEPS: "HostSample",
    TRAINING_EVENTS: "StepCompleted",
}
TOPIC_TYPE = {
    TELEMETRY_GPU: "GpuSample",
    TELEMETRY_HOST: "HostSample",
    TRAINING_STEPS: "StepCompleted",
    TRAINING_EVENTS: "RankBound",
}
# The topics the sink stores (and dead-letters the bad records of); the worker reads only two of them.
SINK_SOURCES = (TELEMETRY_GPU, TELEMETRY_HOST, TRAINING_STEPS, TRAINING_EVENTS)
RUN_LIMIT_S = 420
_STUCK = "the producer is stuck"  # a bound for failure only: the waits below end on progress


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Event], set[tuple[str, str]]]:
    """The good events and the (fingerprint, status) pairs of their offline replay."""
    folder = tmp_path_factory.mktemp("bad-input")
    (folder / "scenario.yaml").write_text(SCENARIO)
    events = list(simulate(recent(load_scenario(folder / "scenario.yaml")), seed=0).events())
    write_container(folder / "events.avro", events)
    alerts = [e.record for e in replay_offline([folder / "events.avro"]) if e.type == "Alert"]
    return events, {(a["fingerprint"], a["status"]) for a in alerts}


def _bad_value(kind: str, topic: str, samples: dict[str, Event], rng: random.Random) -> bytes | None:
    """A bad value of one kind for `topic`, made from a good record of the topic's type."""
    codec = Codec()
    good = codec.encode(samples[TOPIC_TYPE[topic]])
    if kind == "null value":
        return None
    if kind == "empty value":
        return b""
    if kind == "random bytes":
        return b"\x7f" + rng.randbytes(99)  # never starts with a framing magic
    if kind == "truncated Avro":
        return good[: len(good) // 2]
    if kind == "unknown fingerprint":
        return SINGLE_OBJECT_MAGIC + b"\xab" * 8 + good[10:]
    if kind == "wrong record type":
        other = samples[WRONG_TYPE[topic]]
        stray = {k: f"stray-{k}" for k in ("job_id", "node") if k in other.record}
        return codec.encode(Event(other.type, {**other.record, **stray}))
    if kind == "trailing junk":
        return good + b"junk"
    assert kind == "900 kB value"
    return good[:10] + rng.randbytes(900_000)


class BadProducer:
    """Produces raw values (bad ones) on the partition a key goes to; remembers where each landed."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "enable.idempotence": True}
        )
        self.positions: list[tuple[str, int, int, str]] = []  # (topic, partition, offset, kind)

    def send(self, topic: str, key: bytes, value: bytes | None, kind: str) -> None:
        def delivered(err: Any, msg: Message) -> None:
            assert err is None, err
            self.positions.append((msg.topic() or "", msg.partition() or 0, msg.offset() or 0, kind))

        self.producer.produce(topic, key=key, value=value, on_delivery=delivered)
        assert self.producer.flush(30) == 0


def _read_all(bootstrap: str, topic: str, expect: int | None = None) -> list[Message]:
    """Every record of `topic` up to its current end (or until `expect` arrived), without a group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in meta.partitions
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        out: list[Message] = []
        deadline = time.monotonic() + 60
        target = sum(ends.values()) if expect is None else expect
        while len(out) < target and time.monotonic() < deadline:
            out += [m for m in consumer.consume(500, 0.5) if m.error() is None]
        return out
    finally:
        consumer.close()


def _supervise(worker: Worker) -> bool:
    """True while the worker runs; restarts it once if it stopped on a stuck producer.

    A supervisor's job, and only for the one failure the worker stops on by design: an
    intermittently stuck aiokafka producer at start-up (docs/worker.md). Any other exit is a failure.
    """
    assert worker.proc is not None
    if worker.proc.poll() is None:
        return True
    if worker.runs > 1 or _STUCK not in worker.log():
        return False
    worker.start()
    return True


def _headers(msg: Message) -> dict[str, bytes]:
    return {str(k): v if isinstance(v, bytes) else str(v).encode() for k, v in msg.headers() or []}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_kind_of_bad_record_is_dead_lettered_once_and_changes_no_alert(
    runtime: str,
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    group_id: str,
    scenario: tuple[list[Event], set[tuple[str, str]]],
    tmp_path: Path,
) -> None:
    events, expected = scenario
    assert expected, "the offline replay raised no alert"
    samples = {e.type: e for e in reversed(events)}
    rng = random.Random(13)
    bad = BadProducer(kafka_bootstrap)
    # Every kind on every source topic, spread through the run, on the partitions the scenario uses.
    mixes = [(kind, topic) for kind in KINDS for topic in SINK_SOURCES]
    step = len(events) // (len(mixes) + 1)
    last_key: dict[str, bytes] = {}
    for i, (kind, topic) in enumerate(mixes):
        chunk = events[i * step : (i + 1) * step]
        publish(kafka_bootstrap, topic_prefix, chunk)
        for e in chunk:
            last_key[topic_for(e.type)] = key_for(topic_for(e.type), e.record) or b""
        bad.send(topics[topic], last_key.get(topic, b"k"), _bad_value(kind, topic, samples, rng), kind)
    publish(kafka_bootstrap, topic_prefix, events[len(mixes) * step :])
    # The last record of a busy partition of each topic is bad too (this stalled the worker).
    for j, topic in enumerate(SINK_SOURCES):
        kind = KINDS[j % len(KINDS)]
        bad.send(topics[topic], last_key[topic], _bad_value(kind, topic, samples, rng), kind)
    assert len(bad.positions) == len(KINDS) * len(SINK_SOURCES) + len(SINK_SOURCES)

    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path, runtime)
    worker.start()
    client = connect(f"chdb://{tmp_path / 'chdb'}")
    healths: list[dict[str, Any]] = []
    started = time.monotonic()
    internal = BadProducer(kafka_bootstrap)
    try:
        migrate(client, ttl_days=None)  # simulated time is months old: no TTL
        sink = SinkConsumer(
            {"bootstrap.servers": kafka_bootstrap},
            client,
            [topics[t] for t in SINK_SOURCES],
            group_id,
            deadletter_topic=topics[DEADLETTER],
            batch_interval_s=0.5,
            on_health=healths.append,
            health_interval_s=0.5,
        )
        stats = sink.run(idle_exit_s=3)
        sink_health = sink_metrics(sink.health(), topic_prefix)
        assert group_lag(kafka_bootstrap, group_id, [topics[t] for t in SINK_SOURCES]) == 0
        # The worker: wait until its group has committed every source record (progress, not time).
        group = topic_prefix + DEFAULT_APP_ID
        deadline = time.monotonic() + RUN_LIMIT_S
        lag = -1
        while time.monotonic() < deadline and _supervise(worker):
            lag = group_lag(kafka_bootstrap, group, [topics[t] for t in SOURCE_TOPICS])
            if lag == 0:
                break
            time.sleep(1)  # poll interval of the progress check, not a wait for the worker
        assert lag == 0, worker.log()
        print(
            f"worker and sink at zero lag {time.monotonic() - started:.1f} s after the worker started"
            f" ({worker.runs} run(s) of the worker)"
        )
        # The worker's internal topics are read by no sink: the worker dead-letters their bad records
        # itself. (Sent once the group is settled: a rebalance between dead-lettering and the commit
        # would repeat a dead letter, as for the sink; see docs/worker.md.)
        internal.send(topic_prefix + BINDINGS, b"node-01", b"\x7fnot a binding", "random bytes")
        wrong = Codec().encode(samples["StepCompleted"])
        internal.send(topic_prefix + TELEMETRY_BY_JOB, b"pretrain-7b-0009", wrong, "wrong record type")
        internal.send(topics[TELEMETRY_JOB], b"pretrain-7b-0009", wrong, "wrong record type")
        truncated = Codec().encode(samples["GpuSample"])[:20]
        internal.send(topics[TELEMETRY_UNATTRIBUTED], b"node-02", truncated, "truncated Avro")
        alerts = [Codec().decode(m.value()).record for m in _read_all(kafka_bootstrap, topics[ALERTS])]
        # The sink's dead letters are in; the worker's may still be on their way.
        letters = _read_all(kafka_bootstrap, topics[DEADLETTER], len(bad.positions) + len(internal.positions))
        stored = stats["inserted_rows"]
    finally:
        worker.stop()
        close_all()
    log = worker.log()
    assert "Traceback" not in log, log
    internal_topics = {
        (topic_prefix + t).encode()
        for t in (BINDINGS, TELEMETRY_BY_JOB, TELEMETRY_JOB, TELEMETRY_UNATTRIBUTED)
    }
    assert {(a["fingerprint"], a["status"]) for a in alerts} == expected, log
    assert stored == len(events)
    # Each bad record dead-lettered exactly once, by the sink, with where it came from.
    where = Counter(
        (
            _headers(m)["x-source-topic"].decode(),
            int(_headers(m)["x-source-partition"]),
            int(_headers(m)["x-source-offset"]),
        )
        for m in letters
    )
    assert sorted(where) == sorted((t, p, o) for t, p, o, _ in bad.positions + internal.positions)
    assert set(where.values()) == {1}
    by_component = Counter(
        (_headers(m)["x-component"], _headers(m)["x-source-topic"] in internal_topics) for m in letters
    )
    assert by_component == {(b"sink", False): len(bad.positions), (b"worker", True): len(internal.positions)}
    assert stats["deadlettered"] == len(bad.positions)
    # The sink's /metrics view of the same run: every record read per topic, the dead letters, no lag.
    assert healths, "the sink never reported its health while polling"
    metric = {m.name: m.values for m in sink_health}
    read = Counter(topic_for(e.type) for e in events) + Counter(
        t[len(topic_prefix) :] for t, _, _, _ in bad.positions
    )
    assert metric["ranksight_sink_events_in"] == {(t,): float(n) for t, n in read.items()}
    assert metric["ranksight_sink_dead_letters"] == {(): float(len(bad.positions))}
    assert sum(metric["ranksight_sink_rows_inserted"].values()) == len(events)


def test_worker_stops_within_seconds_of_sigterm_while_processing(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    scenario: tuple[list[Event], set[tuple[str, str]]],
    tmp_path: Path,
) -> None:
    events, _ = scenario
    publish(kafka_bootstrap, topic_prefix, events)
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path)
    worker.start()
    group = topic_prefix + DEFAULT_APP_ID
    names = [topics[t] for t in SOURCE_TOPICS]
    try:
        # Processing is under way once the group committed something and has not finished.
        deadline = time.monotonic() + RUN_LIMIT_S
        total = len(events)
        lag = -1
        while time.monotonic() < deadline and _supervise(worker):
            lag = group_lag(kafka_bootstrap, group, names)
            if 0 <= lag < total:
                break
            time.sleep(0.2)  # poll interval of the progress check
        assert 0 <= lag < total, worker.log()
        assert worker.proc is not None and worker.proc.poll() is None, worker.log()
        signalled = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        code = worker.proc.wait(60)
        took = time.monotonic() - signalled
    finally:
        worker.stop()
    print(f"exited with {code} {took:.1f} s after SIGTERM (lag then {lag} of {total})")
    assert took <= 20, worker.log()
