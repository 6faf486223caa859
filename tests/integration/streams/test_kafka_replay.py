"""`record` / `replay --from --to` / `replay --to-kafka` against the real broker: by-time reads, sorted
files, a separate alert topic."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from producers.simulator import load_scenario, simulate
from schemas.codec import Codec
from schemas.eventtime import event_ts
from schemas.files import iter_container, write_container
from schemas.records import Event
from schemas.topics import ALERTS_REPLAY, TELEMETRY_GPU, TELEMETRY_HOST, TRAINING_EVENTS, TRAINING_STEPS
from streams.offline.detection import DetectionEngine
from streams.offline.kafka_replay import KafkaReplayError, read_range, record_range, replay_kafka

RANKSIGHT = str(Path(sys.executable).parent / "ranksight")
SOURCES = (TELEMETRY_GPU, TELEMETRY_HOST, TRAINING_STEPS, TRAINING_EVENTS)


@pytest.fixture(scope="module")
def nan_loss_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Event]]:
    events = list(simulate(load_scenario("nan_loss"), seed=0).events())
    path = tmp_path_factory.mktemp("sim") / "nan_loss.avro"
    write_container(path, events)
    return path, events


def _publish_cli(path: Path, bootstrap: str, prefix: str) -> None:
    env = {
        "KAFKA_BOOTSTRAP": bootstrap,
        "RANKSIGHT_TOPIC_PREFIX": prefix,
        "PATH": str(Path(sys.executable).parent),
    }
    done = subprocess.run(
        [RANKSIGHT, "replay", str(path), "--to-kafka", "--speed", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "published" in done.stdout


def test_publish_then_record_by_time_gives_back_every_event_in_event_time_order(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    nan_loss_file: tuple[Path, list[Event]],
    tmp_path: Path,
) -> None:
    path, events = nan_loss_file
    before = int(time.time() * 1000) - 1
    _publish_cli(path, kafka_bootstrap, topic_prefix)
    after = int(time.time() * 1000) + 1
    out = tmp_path / "recorded.avro"
    stats = record_range(
        {"bootstrap.servers": kafka_bootstrap}, [topics[t] for t in SOURCES], before, after, out
    )
    got = list(iter_container(out))
    assert stats.events == len(events) == len(got)
    assert [event_ts(e) for e in got] == sorted(event_ts(e) for e in events)
    # A window ending before the publish reads nothing.
    assert (
        list(read_range({"bootstrap.servers": kafka_bootstrap}, [topics[TRAINING_STEPS]], 0, before - 60_000))
        == []
    )


def test_replay_kafka_publishes_the_offline_alerts_to_the_replay_topic_only(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, nan_loss_file: tuple[Path, list[Event]]
) -> None:
    path, events = nan_loss_file
    before = int(time.time() * 1000) - 1
    _publish_cli(path, kafka_bootstrap, topic_prefix)
    after = int(time.time() * 1000) + 1
    conf = {"bootstrap.servers": kafka_bootstrap}
    stats, alerts = replay_kafka(
        conf,
        [topics[t] for t in SOURCES],
        before,
        after,
        engine=DetectionEngine(),
        alerts_topic=topics[ALERTS_REPLAY],
    )
    offline = [e.record for e in DetectionEngine().run(events) if e.type == "Alert"]
    assert [(a.record["fingerprint"], a.record["status"]) for a in alerts] == [
        (r["fingerprint"], r["status"]) for r in offline
    ]
    assert stats.by_rule["nonfinite_loss"] == {"firing": 1, "resolved": 1}
    published = _read_all(kafka_bootstrap, topics[ALERTS_REPLAY], len(alerts))
    assert sorted((r["alert_id"], r["status"]) for r in published) == sorted(
        (a.record["alert_id"], a.record["status"]) for a in alerts
    )
    assert _read_all(kafka_bootstrap, topics["rs.alerts"], 0, wait_s=2) == []


def test_replay_by_time_from_the_cli_publishes_to_the_replay_topic_and_not_to_live_alerts(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, nan_loss_file: tuple[Path, list[Event]]
) -> None:
    path, events = nan_loss_file
    before = int(time.time() * 1000) - 1
    _publish_cli(path, kafka_bootstrap, topic_prefix)
    after = int(time.time() * 1000) + 1
    env = {"KAFKA_BOOTSTRAP": kafka_bootstrap, "RANKSIGHT_TOPIC_PREFIX": topic_prefix}
    done = subprocess.run(
        [RANKSIGHT, "replay", "--from", str(before), "--to", str(after)],
        env={**env, "PATH": str(Path(sys.executable).parent)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert f"published to {topics[ALERTS_REPLAY]}" in done.stdout
    offline = [e.record for e in DetectionEngine().run(events) if e.type == "Alert"]
    assert ("nonfinite_loss", "firing") in {(r["rule"], r["status"]) for r in offline}
    published = _read_all(kafka_bootstrap, topics[ALERTS_REPLAY], len(offline))
    assert sorted((r["alert_id"], r["status"]) for r in published) == sorted(
        (r["alert_id"], r["status"]) for r in offline
    )
    assert _read_all(kafka_bootstrap, topics["rs.alerts"], 0, wait_s=2) == []


def test_unknown_topic_is_a_clear_error(kafka_bootstrap: str) -> None:
    with pytest.raises(KafkaReplayError, match="no topic"):
        list(read_range({"bootstrap.servers": kafka_bootstrap}, ["no.such.topic.xyz"], 0, 1))


def test_an_optional_missing_topic_is_skipped_and_said(kafka_bootstrap: str) -> None:
    # `ranksight record`'s default list names rs.scheduler.states, which an older cluster lacks.
    said: list[str] = []
    events = list(
        read_range(
            {"bootstrap.servers": kafka_bootstrap},
            ["no.such.topic.xyz"],
            0,
            1,
            progress=said.append,
            optional=frozenset({"no.such.topic.xyz"}),
        )
    )
    assert events == []
    assert said == ["no topic no.such.topic.xyz on this cluster: skipped"]


def _read_all(bootstrap: str, topic: str, count: int, wait_s: float = 20) -> list[dict[str, Any]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
    codec = Codec()
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline and (count == 0 or len(out) < count):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(codec.decode(msg.value() or b"").record)
    finally:
        consumer.close()
    return out
