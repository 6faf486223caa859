"""`ranksight sink` dead-letters without librdkafka configuration warnings (issue 24.8).

The sink's dead-letter producer was built from the consumer's settings, so its session timeout
printed `CONFWARN ... session.timeout.ms is a consumer property` the first time a record was
dead-lettered.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from confluent_kafka import Producer

from schemas.topics import TELEMETRY_GPU
from tests.integration.stopping import RANKSIGHT


def test_a_dead_letter_prints_no_configuration_warning(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, tmp_path: Path
) -> None:
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "log_level": 0})
    producer.produce(topics[TELEMETRY_GPU], key=b"n1", value=b"not avro")
    assert producer.flush(30) == 0
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RANKSIGHT_TOPIC_PREFIX": topic_prefix,
        "RANKSIGHT_HOME": str(tmp_path / "home"),
    }
    done = subprocess.run(
        [RANKSIGHT, "sink", "--idle-exit", "3", "--session-timeout", "30"],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "dead-lettered 1" in done.stdout, done.stdout + done.stderr
    assert "CONFWARN" not in done.stdout + done.stderr, done.stderr
