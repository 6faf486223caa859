"""The local broker, topic creation and the detached up/status/down mode, against a real Kafka."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from infra.errors import KafkaSetupError
from infra.kafka import local
from infra.kafka.local import LocalKafka, ensure_jars
from infra.kafka.topics import DEFAULT_TOPIC_SPECS, TopicSpec, create_topics
from schemas.topics import ALERTS, DEADLETTER, TELEMETRY_GPU, TOPICS

_DAY_MS = 86_400_000
RANKSIGHT = str(Path(sys.executable).with_name("ranksight"))


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})


def _produce(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0})
    producer.produce(topic, key=key, value=value)
    assert producer.flush(15) == 0


def _consume_one(
    bootstrap: str, topic: str, group_id: str, timeout: float = 30
) -> tuple[bytes | None, bytes | None]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        consumer.subscribe([topic])
        for _ in range(int(timeout)):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                return message.key(), message.value()
        raise AssertionError(f"no message on {topic} within {timeout} s")
    finally:
        consumer.close()


def test_broker_answers_metadata(kafka_bootstrap: str) -> None:
    """The session broker answers a metadata request and reports one broker."""
    metadata = _admin(kafka_bootstrap).list_topics(timeout=10)
    assert len(metadata.brokers) == 1


def test_topics_get_their_partitions_and_retention(kafka_bootstrap: str, topics: dict[str, str]) -> None:
    """Every topic exists with the partition count and retention.ms of its spec."""
    assert set(topics) == set(TOPICS)
    admin = _admin(kafka_bootstrap)
    metadata = admin.list_topics(timeout=10)
    for spec in DEFAULT_TOPIC_SPECS:
        assert len(metadata.topics[topics[spec.name]].partitions) == spec.partitions, spec.name
    resources = [
        ConfigResource(ResourceType.TOPIC, topics[name]) for name in (TELEMETRY_GPU, ALERTS, DEADLETTER)
    ]
    configs = {
        resource.name: future.result(10) for resource, future in admin.describe_configs(resources).items()
    }
    assert configs[topics[TELEMETRY_GPU]]["retention.ms"].value == str(3 * _DAY_MS)
    assert configs[topics[ALERTS]]["retention.ms"].value == str(30 * _DAY_MS)
    assert configs[topics[DEADLETTER]]["retention.ms"].value == str(14 * _DAY_MS)
    assert configs[topics[DEADLETTER]]["cleanup.policy"].value == "delete"


def test_create_topics_is_idempotent(kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str) -> None:
    """Creating topics that already exist succeeds and names the same topics."""
    again = create_topics(kafka_bootstrap, prefix=topic_prefix)
    assert again == [topics[spec.name] for spec in DEFAULT_TOPIC_SPECS]


def test_create_topics_reports_an_invalid_spec(kafka_bootstrap: str, topic_prefix: str) -> None:
    """A topic the broker refuses raises KafkaSetupError naming the topic."""
    bad = TopicSpec("bad", partitions=1, retention_ms=1000, cleanup_policy="no-such-policy")
    with pytest.raises(KafkaSetupError, match=f"cannot create topic {topic_prefix}bad"):
        create_topics(kafka_bootstrap, [bad], prefix=topic_prefix)


def test_create_topics_says_when_no_broker_answers() -> None:
    """With nothing listening, the error says how to get a broker."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(KafkaSetupError, match="KAFKA_BOOTSTRAP"):
        create_topics(f"127.0.0.1:{port}", DEFAULT_TOPIC_SPECS[:1], timeout=3)


def test_produce_consume_round_trip(kafka_bootstrap: str, topics: dict[str, str], group_id: str) -> None:
    """A message produced to a topic is consumed back with its key and value."""
    _produce(kafka_bootstrap, topics[ALERTS], b"team-a", b"hello")
    assert _consume_one(kafka_bootstrap, topics[ALERTS], group_id) == (b"team-a", b"hello")


def test_the_broker_writes_its_own_log(restartable_kafka: LocalKafka) -> None:
    """The logging binding is on the classpath: server.log records the broker's start-up."""
    text = restartable_kafka.log_path.read_text()
    assert "Kafka Server started" in text, text[-2000:]


def test_restart_keeps_data_and_address(
    restartable_kafka: LocalKafka, topic_prefix: str, group_id: str
) -> None:
    """After stop() and start() on the same data dir, the bootstrap and the stored message are unchanged."""
    bootstrap = restartable_kafka.bootstrap
    (topic,) = create_topics(bootstrap, DEFAULT_TOPIC_SPECS[:1], prefix=topic_prefix)
    _produce(bootstrap, topic, b"node-1", b"before restart")
    restartable_kafka.stop()
    assert not restartable_kafka.running
    assert restartable_kafka.start() == bootstrap
    assert _consume_one(bootstrap, topic, group_id) == (b"node-1", b"before restart")


def test_start_fails_clearly_when_the_port_is_taken(tmp_path: Path) -> None:
    """A JVM that exits during start-up raises KafkaSetupError instead of waiting out the timeout."""
    broker = LocalKafka(tmp_path / "kafka", libs=ensure_jars(), progress=lambda _: None)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", int(broker.bootstrap.rsplit(":", 1)[1])))
        squatter.listen()
        with pytest.raises(KafkaSetupError, match="exited during start-up"):
            broker.start(timeout=60)
    assert not broker.running


def test_detached_up_status_down(tmp_path: Path) -> None:
    """up() starts a broker in its own session, is idempotent, and down() really ends the process."""
    state_dir = tmp_path / f"state-{uuid.uuid4().hex[:6]}"
    messages: list[str] = []
    bootstrap = local.up(state_dir, progress=messages.append)
    try:
        state = local.status(state_dir)
        assert state is not None
        assert state["alive"] and state["ready"]
        assert state["bootstrap"] == bootstrap
        pid = int(state["pid"])
        assert psutil.Process(pid).cmdline().count("kafka.Kafka") == 1
        assert local.up(state_dir, progress=messages.append) == bootstrap
        assert int(local.status(state_dir)["pid"]) == pid  # type: ignore[index]
    finally:
        stopped = local.down(state_dir)
    assert stopped
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert local.status(state_dir) is None
    assert not local.down(state_dir)


def _cli(
    home: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run `ranksight` as a user would: a private home, no KAFKA_BOOTSTRAP unless given."""
    environ = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "RANKSIGHT_TOPIC_PREFIX")}
    environ.update({"RANKSIGHT_HOME": str(home), **(env or {})})
    return subprocess.run(
        [RANKSIGHT, *args], env=environ, capture_output=True, text=True, timeout=timeout, cwd=home
    )


def _topic_size(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sizes", "log_level": 0})
    try:
        partitions = consumer.list_topics(topic, timeout=15).topics[topic].partitions
        total = 0
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
            total += high - low
        return total
    finally:
        consumer.close()


def test_commands_find_the_running_local_broker_and_a_producer_drains_old_spools(tmp_path: Path) -> None:
    """No KAFKA_BOOTSTRAP: after `kafka up`, agent, alerts tail and record use the local broker; events
    spooled while Kafka was away are sent by the next producer run, and `spool list` sees them go."""
    home = tmp_path / "home"
    home.mkdir()
    events = home / "events.avro"
    made = _cli(home, "simulate", "-s", "mixed", "--duration", "1m", "-o", str(events), "-q")
    assert made.returncode == 0, made.stderr
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]

    away = _cli(home, "publish", str(events), env={"KAFKA_BOOTSTRAP": f"127.0.0.1:{closed}"})
    # Kafka took none of them: non-zero, so a script does not go on as if they were published.
    assert away.returncode == 1, away.stderr
    assert f"wait in {home / 'spool' / 'publish'}" in away.stderr
    spooled = int(away.stderr.split("took none of the ")[1].split(" events")[0].replace(",", ""))
    assert spooled > 0
    assert f"publish: {spooled:,} events" in _cli(home, "spool", "list").stdout

    up = _cli(home, "kafka", "up")
    assert up.returncode == 0, up.stderr
    try:
        bootstrap = up.stdout.split("export KAFKA_BOOTSTRAP=")[1].split()[0]
        agent = _cli(home, "agent", "--simulate", "--gpus", "1", "--count", "1", "--interval", "0.1")
        assert agent.returncode == 0, agent.stderr
        assert "no Kafka" not in agent.stderr
        # The agent's start drained the publish spool to the local broker.
        assert "no spooled events" in _cli(home, "spool", "list").stdout
        assert _topic_size(bootstrap, TELEMETRY_GPU) >= 1
        assert sum(_topic_size(bootstrap, t) for t in TOPICS if t.startswith("rs.t")) >= spooled

        # Spooled again while "away", then sent by `ranksight spool drain` to the local broker.
        again = _cli(home, "publish", str(events), env={"KAFKA_BOOTSTRAP": f"127.0.0.1:{closed}"})
        assert again.returncode == 1 and "took none of the" in again.stderr, again.stderr
        drained = _cli(home, "spool", "drain")
        assert drained.returncode == 0, drained.stderr
        assert f"publish: sent {spooled:,} of {spooled:,} events to {bootstrap}" in drained.stdout

        tail = _cli(home, "alerts", "tail", "--from-beginning", "--idle-exit", "1")
        assert tail.returncode == 0, tail.stderr
        recorded = _cli(home, "record", "--from", "-1h", "-o", str(home / "recorded.avro"))
        assert recorded.returncode == 0, recorded.stderr
        assert "wrote " in recorded.stdout
    finally:
        down = _cli(home, "kafka", "down")
    assert down.returncode == 0, down.stderr
