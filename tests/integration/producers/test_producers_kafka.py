"""The agent CLI and the training SDK publish to the real broker: right topics, keyed by node / job."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer
from typer.testing import CliRunner

from producers.training import Reporter
from ranksight.cli import app
from schemas.codec import Codec
from schemas.records import Event
from schemas.topics import TELEMETRY_GPU, TELEMETRY_HOST, TRAINING_EVENTS, TRAINING_STEPS


def _consume(
    bootstrap: str, topics: list[str], group_id: str, want: int, timeout: float = 60
) -> list[tuple[bytes, Event]]:
    codec = Codec()
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group_id, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe(topics)
    out: list[tuple[bytes, Event]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append((msg.key(), codec.decode(msg.value())))
    finally:
        consumer.close()
    return out


def test_simulated_agent_publishes_gpu_and_host_samples_keyed_by_node(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    group_id: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: object,
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("RANKSIGHT_TOPIC_PREFIX", topic_prefix)
    monkeypatch.setenv("RANKSIGHT_HOME", str(tmp_path))
    result = CliRunner().invoke(
        app,
        [
            "agent",
            "--simulate",
            "--gpus",
            "4",
            "--count",
            "2",
            "--interval",
            "0.2",
            "--node",
            "node-x",
            "--cluster",
            "c9",
        ],
    )
    assert result.exit_code == 0, result.output
    got = _consume(kafka_bootstrap, [topics[TELEMETRY_GPU], topics[TELEMETRY_HOST]], group_id, want=10)
    kinds = sorted(e.type for _, e in got)
    assert kinds == ["GpuSample"] * 8 + ["HostSample"] * 2
    assert {key for key, _ in got} == {b"node-x"}
    assert {e.record["cluster"] for _, e in got} == {"c9"}


def test_reporter_publishes_rank_records_keyed_by_job_and_node_and_job_events_by_job(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, group_id: str
) -> None:
    reporter = Reporter(
        "job-kafka",
        1,
        world_size=2,
        env={},
        kafka_conf={"bootstrap.servers": kafka_bootstrap},
        topic_prefix=topic_prefix,
    )
    for step in range(5):
        with reporter.step(step) as s, s.segment("forward"):
            s.record(loss=1.0 / (step + 1))
    reporter.state("running")
    reporter.close()
    assert reporter.stats["sdk_errors"] == 0
    got = _consume(kafka_bootstrap, [topics[TRAINING_STEPS], topics[TRAINING_EVENTS]], group_id, want=7)
    # A rank's records by job and node (one job spreads over its nodes' partitions, issue 19);
    # the job's own events by job.
    node = {e.record.get("node") for _, e in got if e.type == "StepCompleted"}
    assert len(node) == 1 and None not in node
    keys = {e.type: key for key, e in got}
    assert keys["StepCompleted"] == f"job-kafka/{node.pop()}".encode()
    assert keys["JobStateChanged"] == b"job-kafka"
    steps = sorted(e.record["step"] for _, e in got if e.type == "StepCompleted")
    assert steps == [0, 1, 2, 3, 4]
    assert {e.type for _, e in got} == {"StepCompleted", "RankBound", "JobStateChanged"}
