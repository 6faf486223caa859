"""Telemetry is published node-keyed (for the sink) and once more for the worker: an attributed
GPU sample keyed by its job and node on rs.telemetry.job; a host sample (it concerns every job on
its node) and an unattributed GPU sample node-keyed on rs.telemetry.unattributed."""

from __future__ import annotations

import time

from confluent_kafka import Consumer

from producers.publisher import open_publisher
from schemas.codec import Codec
from schemas.records import Event
from schemas.topics import TELEMETRY_GPU, TELEMETRY_HOST, TELEMETRY_JOB, TELEMETRY_UNATTRIBUTED, partition_for
from tests.unit.streams.builders import gpu_sample, host_sample

_TS = 1_767_225_600_000


def _attributed(event: Event, **fields: object) -> Event:
    return Event(event.type, {**event.record, **fields})


def _read_all(bootstrap: str, topic: str, group: str, expected: int) -> list[tuple[bytes, int, Event]]:
    """Every record of `topic` as (key, partition, event), reading until `expected` arrived (or 60 s)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    codec, out = Codec(), []
    deadline = time.monotonic() + 60
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            out.append((msg.key(), msg.partition(), codec.decode(msg.value())))
        # One more quiet poll: a copy too many would show up here.
        msg = consumer.poll(1.0)
        if msg is not None and not msg.error():
            out.append((msg.key(), msg.partition(), codec.decode(msg.value())))
    finally:
        consumer.close()
    return out


def test_each_sample_gets_one_worker_copy_and_the_node_topics_each_once(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, group_id: str
) -> None:
    samples = [
        _attributed(gpu_sample("node-01", 0, _TS), job_id="job-a", run_id="run-a"),
        gpu_sample("node-02", 0, _TS),  # an idle GPU: node-keyed only
        _attributed(host_sample("node-01", _TS), job_ids=["job-b", "job-a"]),
        host_sample("node-02", _TS),  # no job on the node
    ]
    with open_publisher(kafka_conf={"bootstrap.servers": kafka_bootstrap}, topic_prefix=topic_prefix) as pub:
        for event in samples:
            pub.publish(event)
        assert pub.flush(30) == 0
        stats = pub.stats
    # The job-keyed copies are not extra events for the publisher's counts.
    assert stats["published"] == 4 and stats["delivered"] == 4, stats

    by_job = _read_all(kafka_bootstrap, topics[TELEMETRY_JOB], group_id + "-job", 1)
    got = sorted((key, e.type, e.record["node"]) for key, _, e in by_job)
    # Keyed by job and node: a giant job's telemetry spreads over the partitions with its ranks.
    assert got == [(b"job-a/node-01", "GpuSample", "node-01")]
    # Co-partitioned with the training topics: the partition the worker expects for the job.
    for key, partition, _ in by_job:
        assert partition == partition_for(key, 6)

    for name in (TELEMETRY_GPU, TELEMETRY_HOST):
        node_keyed = _read_all(kafka_bootstrap, topics[name], f"{group_id}-{name}", 2)
        assert sorted(key for key, _, _ in node_keyed) == [b"node-01", b"node-02"], name

    # Host samples go by node whatever jobs they name (the worker sends them to every job on the
    # node), and so does the idle GPU's sample.
    unattributed = _read_all(kafka_bootstrap, topics[TELEMETRY_UNATTRIBUTED], group_id + "-unattributed", 3)
    assert sorted((key, e.type) for key, _, e in unattributed) == [
        (b"node-01", "HostSample"),
        (b"node-02", "GpuSample"),
        (b"node-02", "HostSample"),
    ]
    for key, partition, _ in unattributed:
        assert partition == partition_for(key, 6)
