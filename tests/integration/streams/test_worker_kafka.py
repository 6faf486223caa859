"""Simulator -> Kafka -> `ranksight worker` (a real subprocess) -> rs.alerts, including a SIGKILL mid-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from producers.publisher import open_publisher
from producers.simulator import Scenario, load_scenario, simulate
from schemas.codec import Codec
from schemas.files import parse_ts, write_container
from schemas.records import Event
from schemas.topics import ALERTS
from sinks.clickhouse import close_all, connect
from sinks.consumer import SinkConsumer
from sinks.ddl import migrate
from streams.offline.replay import replay_offline

SCENARIO = "nan_loss"
RANKSIGHT = str(Path(sys.executable).parent / "ranksight")


def recent(scenario: Scenario) -> Scenario:
    """The scenario ending an hour ago, as live agents would have published it.

    The worker checks each record's event time against its Kafka timestamp (the publish time):
    more than `engine.max_record_age_s` (7 days) behind it is a clock reset, so the scenarios' fixed
    2026-01-01 start would be rejected. An hour back keeps the wall-clock guard (events within 10
    minutes of now) off, so the worker's alerts stay those of the offline replay.
    """
    return scenario.with_overrides(
        start_ms=int(time.time() * 1000) - int(scenario.duration * 1000) - 3_600_000
    )


@pytest.fixture(scope="module")
def scenario_events() -> tuple[list[Event], list[dict[str, Any]]]:
    sim = simulate(recent(load_scenario(SCENARIO)), seed=0)
    return list(sim.events()), sim.labels


@pytest.fixture(scope="module")
def offline_alerts(
    scenario_events: tuple[list[Event], list[dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    path = tmp_path_factory.mktemp("offline") / "events.avro"
    write_container(path, scenario_events[0])
    return [e.record for e in replay_offline([path]) if e.type == "Alert"]


def _publish(bootstrap: str, prefix: str, events: list[Event]) -> None:
    pub = open_publisher("kafka", kafka_conf={"bootstrap.servers": bootstrap}, topic_prefix=prefix)
    try:
        for event in events:
            pub.publish(event)
        assert pub.flush(60) == 0
    finally:
        pub.close()


class Worker:
    """`ranksight worker` as a child process with its own log file."""

    def __init__(self, bootstrap: str, prefix: str, home: Path, runtime: str = "faust") -> None:
        self.runtime = runtime  # `--runtime`: faust or direct
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": bootstrap,
            "RANKSIGHT_TOPIC_PREFIX": prefix,
            "RANKSIGHT_HOME": str(home),
        }
        self.home = home
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self, *options: str, runtime: str | None = None) -> None:
        self.runs += 1
        log = open(self.home / f"worker-{self.runs}.log", "wb")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [
                RANKSIGHT,
                "worker",
                "--runtime",
                runtime or self.runtime,
                "--log-level",
                "info",
                "--checkpoint-interval-ms",
                "30000",
                *options,
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log(self) -> str:
        """Every warning and error of every run, then the tail of each run's log (for assertion messages)."""
        texts = [(self.home / f"worker-{i}.log").read_text(errors="replace") for i in range(1, self.runs + 1)]
        notable = [
            line[:300]
            for text in texts
            for line in text.splitlines()
            if "[WARNING]" in line or "[ERROR]" in line
        ]
        return "\n".join(notable[:80] + [text[-3000:] for text in texts])


RUNTIMES = ("faust", "direct")  # `ranksight worker --runtime`: every worker test runs on both


@pytest.fixture(params=RUNTIMES)
def worker(
    kafka_bootstrap: str,
    topic_prefix: str,
    topics: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Worker]:
    w = Worker(kafka_bootstrap, topic_prefix, tmp_path, request.param)
    try:
        yield w
    finally:
        w.stop()


def group_lag(bootstrap: str, group: str, names: list[str]) -> int:
    """Records of the topics `names` that `group` has not committed yet; -1 while that is unknown."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, "log_level": 0}
    )
    try:
        partitions = [
            TopicPartition(name, p)
            for name in names
            for p in consumer.list_topics(name, timeout=10).topics[name].partitions
        ]
        committed = consumer.committed(partitions, timeout=10)
        ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions]
        return sum(end - max(tp.offset, 0) for tp, end in zip(committed, ends, strict=True))
    except KafkaException:  # the coordinator or a partition leader is moving: ask again
        return -1
    finally:
        consumer.close()


class AlertReader:
    """Reads the alerts topic from the beginning, without a group."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "alert-reader",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        meta = self.consumer.list_topics(topic, timeout=10).topics[topic]
        self.consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        self.codec = Codec()
        self.records: list[dict[str, Any]] = []

    def poll_until(self, done: Any, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                self.records.append(self.codec.decode(msg.value() or b"").record)
            if done(self.records):
                return True
        return False

    def close(self) -> None:
        self.consumer.close()


def _pairs(records: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(r["fingerprint"], r["status"]) for r in records}


def test_worker_publishes_the_labelled_alert_to_the_team(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    worker: Worker,
    scenario_events: tuple[list[Event], list[dict[str, Any]]],
) -> None:
    events, labels = scenario_events
    label = labels[0]
    _publish(kafka_bootstrap, topic_prefix, events)
    started = time.monotonic()
    worker.start()
    reader = AlertReader(kafka_bootstrap, topics[ALERTS])
    try:

        def resolved(records: list[dict[str, Any]]) -> bool:
            return any(r["rule"] == label["alert"] and r["status"] == "resolved" for r in records)

        assert reader.poll_until(resolved, 150), worker.log()
    finally:
        reader.close()
    print(f"first run: labelled alert resolved after {time.monotonic() - started:.1f} s")
    firing = [r for r in reader.records if r["rule"] == label["alert"] and r["status"] == "firing"]
    assert firing, reader.records
    alert = firing[0]
    assert alert["job_id"] == label["job_id"]
    assert alert["team"] == label["team"]
    assert alert["starts_at"] - parse_ts(label["start"]) <= 120_000
    # Healthy phases fire nothing else: only the labelled rule and the ones it may co-fire.
    allowed = {label["alert"], *label["also"]}
    assert {r["rule"] for r in reader.records} <= allowed, reader.records


def test_worker_killed_mid_run_loses_and_duplicates_no_alert(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    worker: Worker,
    scenario_events: tuple[list[Event], list[dict[str, Any]]],
    offline_alerts: list[dict[str, Any]],
    group_id: str,
    tmp_path: Path,
) -> None:
    expected = _pairs(offline_alerts)
    assert expected, "the offline replay of the scenario raised no alert"
    _publish(kafka_bootstrap, topic_prefix, scenario_events[0])
    worker.start()
    reader = AlertReader(kafka_bootstrap, topics[ALERTS])
    try:
        # Kill as soon as the first alert is out: the rest of the run is still to come.
        assert reader.poll_until(lambda rs: len(rs) >= 1, 150), worker.log()
        worker.kill()
        before = len(reader.records)
        restarted = time.monotonic()
        worker.start()
        assert reader.poll_until(lambda rs: _pairs(rs) >= expected, 150), (
            expected - _pairs(reader.records),
            worker.log(),
        )
        # Anything else still in flight arrives within a few seconds.
        reader.poll_until(lambda rs: False, 5)
    finally:
        reader.close()
    print(
        f"killed after {before} alerts; recovered in {time.monotonic() - restarted:.1f} s; "
        f"{len(reader.records)} records, {len({(r['alert_id'], r['status']) for r in reader.records})} distinct"
    )
    assert _pairs(reader.records) == expected
    # At-least-once with deterministic ids: re-deliveries share (alert_id, status), so consumers collapse them.
    distinct = {(r["alert_id"], r["status"]) for r in reader.records}
    assert len(distinct) == len(expected)
    assert "restored engine snapshot" in (worker.home / "worker-2.log").read_text()
    # Through the ClickHouse sink (chDB): the alerts table collapses re-deliveries to one row each.
    client = connect(f"chdb://{tmp_path / 'chdb'}")
    try:
        migrate(client, ttl_days=None)  # simulated time is months old: no TTL
        SinkConsumer({"bootstrap.servers": kafka_bootstrap}, client, [topics[ALERTS]], group_id).run(
            idle_exit_s=5
        )
        rows = client.query("SELECT fingerprint, status FROM alerts FINAL").result_rows
    finally:
        close_all()
    assert {(fp, st) for fp, st in rows} == expected
    assert len(rows) == len(expected)


def test_a_group_moves_from_faust_to_direct_keeping_its_state(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    tmp_path: Path,
    scenario_events: tuple[list[Event], list[dict[str, Any]]],
    offline_alerts: list[dict[str, Any]],
) -> None:
    """Both runtimes keep the same state in the same changelog topics: a group stopped on one resumes
    on the other from its checkpoints (a crashed member must first leave: the two runtimes' group
    protocols cannot share a group, so its session must time out)."""
    expected = _pairs(offline_alerts)
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path, "faust")
    _publish(kafka_bootstrap, topic_prefix, scenario_events[0])
    worker.start()
    reader = AlertReader(kafka_bootstrap, topics[ALERTS])
    try:
        assert reader.poll_until(lambda rs: len(rs) >= 1, 150), worker.log()
        worker.stop()  # SIGTERM: Faust commits what it acked and leaves the group
        worker.start(runtime="direct")
        assert reader.poll_until(lambda rs: _pairs(rs) >= expected, 150), (
            expected - _pairs(reader.records),
            worker.log(),
        )
        reader.poll_until(lambda rs: False, 5)
    finally:
        worker.stop()
        reader.close()
    assert _pairs(reader.records) == expected
    assert len({(r["alert_id"], r["status"]) for r in reader.records}) == len(expected)
    assert "restored engine snapshot" in (worker.home / "worker-2.log").read_text()


def test_a_worker_of_the_other_runtime_is_refused_while_the_group_runs(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, tmp_path: Path
) -> None:
    """Kafka cannot mix the runtimes' assignors in one group (a Faust worker would wait in its join
    forever): the second worker says so in one sentence and exits."""
    running = Worker(kafka_bootstrap, topic_prefix, tmp_path / "direct", "direct")
    (tmp_path / "direct").mkdir()
    running.start()
    try:
        deadline = time.monotonic() + 60
        log = running.home / "worker-1.log"
        while time.monotonic() < deadline and "assigned partitions" not in log.read_text(errors="replace"):
            time.sleep(0.2)  # until the group has its first member
        assert "assigned partitions" in log.read_text(errors="replace"), running.log()
        env = {**running.env, "RANKSIGHT_HOME": str(tmp_path / "faust")}
        second = subprocess.run(
            [RANKSIGHT, "worker", "--runtime", "faust"], env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        running.stop()
    assert second.returncode != 0, second.stdout + second.stderr
    message = " ".join(second.stderr.split())
    assert "running the direct runtime" in message and "--runtime direct" in message, message
    assert "Traceback" not in second.stderr
