"""What the worker integration tests share: `ranksight worker` as a child process, publishing a
scenario, reading the alert topic, a group's lag. Real broker, real processes; no fakes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from producers.publisher import open_publisher
from producers.simulator import Scenario
from schemas.codec import Codec
from schemas.records import Event

__all__ = ["RANKSIGHT", "AlertReader", "Worker", "group_lag", "pairs", "publish", "recent"]

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


def publish(bootstrap: str, prefix: str, events: list[Event]) -> None:
    pub = open_publisher("kafka", kafka_conf={"bootstrap.servers": bootstrap}, topic_prefix=prefix)
    try:
        for event in events:
            pub.publish(event)
        assert pub.flush(60) == 0
    finally:
        pub.close()


class Worker:
    """`ranksight worker` as a child process with its own log file."""

    def __init__(self, bootstrap: str, prefix: str, home: Path, runtime: str = "direct") -> None:
        self.runtime = runtime  # `--runtime`: direct (the default) or faust
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


def pairs(records: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(fingerprint, status) of alert records: what the offline replay and the worker must agree on."""
    return {(r["fingerprint"], r["status"]) for r in records}
