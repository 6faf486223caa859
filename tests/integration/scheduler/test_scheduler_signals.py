"""`ranksight scheduler --slurm` stops on SIGINT and SIGTERM, also when started with SIGINT ignored.

The companion of tests/integration/test_signals.py for the one command that needs the session's
real Slurm: its polls publish to Kafka, and a stop ends the wait between polls.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.kafka.topics import create_topics, delete_topics, prefixed
from ranksight.signals import STOP_GRACE_S
from tests.integration.scheduler.conftest import SlurmCluster
from tests.integration.stopping import Running


@pytest.fixture
def own_prefix(kafka_bootstrap: str) -> Iterator[str]:
    prefix = f"sch{uuid.uuid4().hex[:6]}."
    create_topics(kafka_bootstrap, prefix=prefix)
    yield prefix
    delete_topics(kafka_bootstrap, prefixed(prefix).values())


@pytest.mark.parametrize(
    ("ignore_sigint", "sig"),
    [
        pytest.param(True, signal.SIGINT, id="sigint-ignored-SIGINT"),
        pytest.param(False, signal.SIGINT, id="default-SIGINT"),
        pytest.param(False, signal.SIGTERM, id="default-SIGTERM"),
    ],
)
def test_scheduler_stops_between_polls(
    slurm: SlurmCluster,
    kafka_bootstrap: str,
    own_prefix: str,
    tmp_path: Path,
    ignore_sigint: bool,
    sig: signal.Signals,
) -> None:
    env = {
        **slurm.env,
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RANKSIGHT_HOME": str(tmp_path / "home"),
        "RANKSIGHT_TOPIC_PREFIX": own_prefix,
    }
    running = Running.start(
        ["scheduler", "--slurm", "--interval", "0.5", "--state-file", str(tmp_path / "state.json")],
        env=env,
        log=tmp_path / "scheduler.log",
        ignore_sigint=ignore_sigint,
    )
    try:
        running.wait_for(r"^poll 1: ")
        stopped = running.stop(sig)
    finally:
        running.kill()
    print(f"scheduler: stopped {stopped.seconds:.2f} s after {sig.name}")
    assert stopped.code == 0, stopped.output
    assert "Traceback" not in stopped.output and "exiting now" not in stopped.output, stopped.output
    assert stopped.seconds < STOP_GRACE_S + 3.0, stopped.output
    assert " polls, " in stopped.output and "state changes published" in stopped.output, stopped.output
