"""A three-broker KRaft cluster on loopback: one broker SIGKILLed and restarted mid-stream loses nothing.

The publisher (`ranksight publish`, paced), `ranksight worker` and `ranksight sink` run as real
processes against `LocalKafkaCluster(3)` (topics at replication factor 3, min.insync.replicas 2,
producers acks=all + idempotence). While events flow, the broker coordinating the worker's group
is SIGKILLed, and started again once the others have moved on without it. Afterwards: every event
is stored exactly once in ClickHouse, the worker raised the alerts the offline replay raises, and
no component died of the leader changes (issue 21.5).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from infra.kafka.local import LocalKafkaCluster, ensure_jars
from infra.kafka.topics import create_topics
from producers.publisher import DEFAULT_PRODUCER_CONF
from producers.simulator import load_scenario, simulate
from schemas.files import write_container
from schemas.topics import ALERTS, TELEMETRY_GPU, TELEMETRY_HOST, TRAINING_EVENTS, TRAINING_STEPS
from sinks.ddl import table_for
from streams.offline.replay import replay_offline
from tests.integration.stopping import RANKSIGHT, Running
from tests.integration.streams.harness import AlertReader, Worker, group_lag, pairs, recent

SCENARIO = "nan_loss"
SOURCES = (TELEMETRY_GPU, TELEMETRY_HOST, TRAINING_STEPS, TRAINING_EVENTS)
# 20 minutes of event time in about 30 s: long enough to kill and restart a broker in the middle.
SPEED = "40"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    started = time.monotonic()
    kafka = LocalKafkaCluster(tmp_path_factory.mktemp("cluster"), 3, libs=ensure_jars())
    kafka.start()
    print(f"3-node cluster up in {time.monotonic() - started:.1f} s: {kafka.bootstrap}")
    try:
        yield kafka
    finally:
        kafka.stop()


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})


def _sizes(bootstrap: str, topics: list[str]) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sizes", "log_level": 0})
    try:
        total = 0
        for topic in topics:
            for p in consumer.list_topics(topic, timeout=15).topics[topic].partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
                total += high - low
        return total
    finally:
        consumer.close()


def _size_or_none(bootstrap: str, topics: list[str]) -> int | None:
    try:
        return _sizes(bootstrap, topics)
    except KafkaException:  # a leader is moving: ask again
        return None


def _under_replicated(bootstrap: str, prefix: str) -> int:
    """Partitions of the test's topics whose in-sync replicas are fewer than 3."""
    metadata = _admin(bootstrap).list_topics(timeout=15)
    return sum(
        1
        for name, topic in metadata.topics.items()
        if name.startswith(prefix)
        for partition in topic.partitions.values()
        if len(partition.isrs) < 3
    )


def _wait(condition: Any, what: str, timeout: float = 180.0) -> float:
    """Poll `condition` until true; the seconds it took."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.2)
    return time.monotonic() - started


def test_topics_and_producers_are_set_up_for_one_lost_broker(cluster: LocalKafkaCluster) -> None:
    """Replication factor 3 and min.insync.replicas 2 by default; the publisher waits for all replicas."""
    prefix = f"t{uuid.uuid4().hex[:6]}."
    names = create_topics(cluster.bootstrap, prefix=prefix)
    admin = _admin(cluster.bootstrap)
    # Creation is acknowledged by the controller; the broker asked here may learn of the
    # topics a moment later (KRaft propagates metadata to each broker asynchronously).
    _wait(lambda: set(names) <= set(admin.list_topics(timeout=15).topics), "every topic in the metadata")
    metadata = admin.list_topics(timeout=15)
    assert len(metadata.brokers) == 3
    for name in names:
        assert {len(p.replicas) for p in metadata.topics[name].partitions.values()} == {3}, name
    resource = ConfigResource(ResourceType.TOPIC, prefix + TELEMETRY_GPU)
    config = admin.describe_configs([resource])[resource].result(15)
    assert config["min.insync.replicas"].value == "2"
    assert DEFAULT_PRODUCER_CONF["acks"] == "all" and DEFAULT_PRODUCER_CONF["enable.idempotence"] is True


def test_a_broker_killed_and_restarted_mid_stream_loses_and_doubles_nothing(
    cluster: LocalKafkaCluster, tmp_path: Path
) -> None:
    bootstrap = cluster.bootstrap
    prefix = f"c{uuid.uuid4().hex[:6]}."
    sources = [prefix + t for t in SOURCES]
    create_topics(bootstrap, prefix=prefix)
    sim = simulate(recent(load_scenario(SCENARIO)), seed=0)
    events = list(sim.events())
    path = tmp_path / "events.avro"
    write_container(path, events)
    expected_alerts = pairs([e.record for e in replay_offline([path]) if e.type == "Alert"])
    assert expected_alerts, "the offline replay raised no alert"
    env = {"KAFKA_BOOTSTRAP": bootstrap, "RANKSIGHT_TOPIC_PREFIX": prefix}
    sink_home = tmp_path / "sink-home"
    worker_group = f"w-{uuid.uuid4().hex[:6]}"
    sink_group = f"s-{uuid.uuid4().hex[:6]}"

    (tmp_path / "worker").mkdir()
    worker = Worker(bootstrap, prefix, tmp_path / "worker")
    worker.start("--replication-factor", "3", "--group", worker_group)
    sink = Running.start(
        ["sink", "--group", sink_group, "--batch-interval", "0.5", "--progress-interval", "5"],
        env={**env, "RANKSIGHT_HOME": str(sink_home)},
        log=tmp_path / "sink.log",
        ignore_sigint=False,
    )
    publisher: Running | None = None
    reader: AlertReader | None = None
    try:
        sink.wait_for(r"sink: \d+ topics from")
        _wait(
            lambda: "assigned partitions" in (tmp_path / "worker" / "worker-1.log").read_text(),
            "worker joins",
        )
        publisher = Running.start(
            ["publish", str(path), "--speed", SPEED],
            env={**env, "RANKSIGHT_HOME": str(tmp_path / "pub-home")},
            log=tmp_path / "publish.log",
            ignore_sigint=False,
        )
        # A third of the way in, kill the broker that coordinates the worker's group.
        _wait(lambda: (_size_or_none(bootstrap, sources) or 0) >= len(events) // 3, "a third published")
        admin = _admin(bootstrap)  # kept referenced: a collected client abandons its futures
        victim = admin.describe_consumer_groups([prefix + worker_group])[prefix + worker_group].result(30)
        victim = victim.coordinator.id
        killed_at = time.monotonic()
        before = _sizes(bootstrap, sources)
        cluster.kill_node(victim)
        # The publisher goes on with two brokers (new leaders, ISR of 2), and so does the sink.
        moved_on = _wait(lambda: (_size_or_none(bootstrap, sources) or 0) > before + 1000, "writes resume")
        sink_lag_seen = group_lag(bootstrap, prefix + sink_group, sources)
        restart_began = time.monotonic()
        cluster.start_node(victim)
        rejoined = time.monotonic() - restart_began
        in_sync = _wait(
            lambda: _under_replicated(bootstrap, prefix) == 0, "every partition back to 3 in sync"
        )
        print(
            f"killed node {victim} (worker group coordinator) at {before} of {len(events)} records; "
            f"writes resumed {moved_on:.1f} s later; restarted after {restart_began - killed_at:.1f} s down, "
            f"back in the cluster in {rejoined:.1f} s, all partitions in sync {in_sync:.1f} s after that "
            f"(sink lag while down: {sink_lag_seen})"
        )

        assert publisher.proc.wait(300) == 0, publisher.output()
        assert f"published {len(events):,} events" in publisher.output(), publisher.output()

        reader = AlertReader(bootstrap, prefix + ALERTS)
        assert reader.poll_until(lambda rs: pairs(rs) >= expected_alerts, 240), (
            expected_alerts - pairs(reader.records),
            worker.log(),
        )
        reader.poll_until(lambda rs: False, 5)  # anything else in flight
        assert worker.proc is not None and worker.proc.poll() is None, worker.log()
        _wait(lambda: group_lag(bootstrap, prefix + sink_group, sources) == 0, "the sink caught up", 240)
        assert sink.proc.poll() is None, sink.output()
        stopped = sink.stop(signal.SIGTERM)
        assert stopped.code == 0, stopped.output
    finally:
        if reader is not None:
            reader.close()
        worker.stop()
        sink.kill()
        if publisher is not None:
            publisher.kill()

    alert_ids = {(r["alert_id"], r["status"]) for r in reader.records}
    print(
        f"alerts: {len(reader.records)} records, {len(alert_ids)} distinct, "
        f"offline {len(expected_alerts)}: equal={pairs(reader.records) == expected_alerts}"
    )
    assert pairs(reader.records) == expected_alerts
    assert len(alert_ids) == len(expected_alerts)  # re-deliveries only repeat an (alert_id, status)

    by_table = Counter(table_for(e.type).name for e in events)
    stored = _query(
        sink_home, " UNION ALL ".join(f"SELECT '{t}', count() FROM {t}" for t in sorted(by_table))
    )
    counts = {row[0]: int(row[1]) for row in stored}
    unique = _query(
        sink_home,
        "SELECT (SELECT uniqExact(job_id, rank, step) FROM steps), (SELECT uniqExact(node, gpu_index, ts) "
        "FROM gpu_samples), (SELECT uniqExact(node, ts) FROM host_samples)",
    )[0]
    print(f"stored rows by table: {counts}; expected {dict(by_table)}")
    assert counts == dict(by_table)  # nothing lost, nothing doubled
    records = {
        t: [e.record for e in events if e.type == t] for t in ("StepCompleted", "GpuSample", "HostSample")
    }
    assert [int(u) for u in unique] == [
        len({(r["job_id"], r["rank"], r["step"]) for r in records["StepCompleted"]}),
        len({(r["node"], r["gpu_index"], r["ts"]) for r in records["GpuSample"]}),
        len({(r["node"], r["ts"]) for r in records["HostSample"]}),
    ]


def _query(home: Path, statement: str) -> list[list[str]]:
    done = subprocess.run(
        [RANKSIGHT, "sql", "-f", "csv", statement],
        env={"RANKSIGHT_HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split(",") for line in done.stdout.strip().splitlines()[1:]]  # after the header
    return [[cell.strip('"') for cell in row] for row in rows]


def test_kafka_up_brokers_3_runs_a_cluster_every_command_finds(tmp_path: Path) -> None:
    """`ranksight kafka up --brokers 3` in the background: status lists three live nodes; topics get
    three replicas; a second `up` with another size is refused in one sentence; `down` ends all."""
    env = {"RANKSIGHT_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([RANKSIGHT, *args], env=env, capture_output=True, text=True, timeout=300)

    up = cli("kafka", "up", "--brokers", "3")
    try:
        assert up.returncode == 0, up.stderr
        assert "Kafka cluster of 3 nodes is up (replication factor 3, min.insync.replicas 2)" in up.stdout
        bootstrap = up.stdout.split("export KAFKA_BOOTSTRAP=")[1].split()[0]
        assert len(bootstrap.split(",")) == 3
        status = json.loads(cli("kafka", "status").stdout)
        assert status["alive"] and status["ready"] and [n["alive"] for n in status["nodes"]] == [True] * 3
        metadata = _admin(bootstrap).list_topics(timeout=15)
        replicas = {len(p.replicas) for p in metadata.topics[TELEMETRY_GPU].partitions.values()}
        assert replicas == {3}
        again = cli("kafka", "up")
        assert again.returncode == 1 and "already runs" in again.stderr and "Traceback" not in again.stderr
    finally:
        down = cli("kafka", "down")
    assert down.returncode == 0 and "Kafka stopped" in down.stdout, down.stderr
    assert cli("kafka", "status").returncode == 3
