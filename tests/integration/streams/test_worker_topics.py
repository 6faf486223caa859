"""Co-partitioning is checked before anything runs: `kafka topics` and the worker name the wrong topic."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from infra.errors import KafkaSetupError
from infra.kafka.topics import DEFAULT_TOPIC_SPECS, create_topics, delete_topics
from schemas.topics import TELEMETRY_UNATTRIBUTED
from tests.integration.streams.harness import RANKSIGHT


def test_a_source_topic_with_another_partition_count_is_named_by_kafka_topics_and_the_worker(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    # Someone created rs.telemetry.unattributed by hand with 3 partitions; the rest come from
    # `kafka topics`. (rs.telemetry.gpu/host may have any count: only the sink reads them.)
    spec = next(s for s in DEFAULT_TOPIC_SPECS if s.name == TELEMETRY_UNATTRIBUTED)
    create_topics(kafka_bootstrap, [spec.__class__(spec.name, 3, spec.retention_ms)], prefix=topic_prefix)
    try:
        with pytest.raises(
            KafkaSetupError, match=rf"topic {topic_prefix}rs\.telemetry\.unattributed has 3 partitions"
        ):
            create_topics(kafka_bootstrap, prefix=topic_prefix)  # what `ranksight kafka topics` runs
        env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": kafka_bootstrap,
            "RANKSIGHT_TOPIC_PREFIX": topic_prefix,
            "RANKSIGHT_HOME": str(tmp_path),
        }
        run = subprocess.run([RANKSIGHT, "worker"], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode != 0
        out = run.stdout + run.stderr
        assert f"topic {topic_prefix}rs.telemetry.unattributed has 3 partitions" in out, out
        assert "--partitions" in out and "Traceback" not in out, out
        assert not (tmp_path / "worker").exists() or not any((tmp_path / "worker").iterdir()), "Faust started"
    finally:
        with contextlib.suppress(KafkaSetupError):
            delete_topics(kafka_bootstrap, [topic_prefix + s.name for s in DEFAULT_TOPIC_SPECS])
