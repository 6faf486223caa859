"""`ranksight status` lists every group that commits on ranksight topics, the alert forwarder's too."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from ranksight.commands.status import is_throwaway_group
from schemas.codec import Codec
from schemas.records import Event, default_schemas
from schemas.topics import ALERTS
from tests.integration.stopping import RANKSIGHT, Running

T0 = 1_796_000_000_000


@pytest.fixture
def alertmanager() -> Iterator[str]:
    """Accepts Alertmanager's POST /api/v2/alerts."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _alert() -> Event:
    record: dict[str, Any] = {
        f["name"]: f["default"] for f in default_schemas().records["Alert"].json["fields"] if "default" in f
    }
    record.update(
        alert_id=f"xid_error/n1/0@{T0}", fingerprint="xid_error/n1/0", rule="xid_error", category="infra",
        severity="critical", status="firing", ts=T0, starts_at=T0, team="infra", receiver="default",
        summary="XID 79 on n1 GPU 0", job_id="job-1", run_id="job-1-r0", invariant="no XID",
    )  # fmt: skip
    return Event("Alert", record)


def test_the_forwarders_group_is_listed_with_its_lag(
    kafka_bootstrap: str, topics: dict[str, str], topic_prefix: str, alertmanager: str, tmp_path: Path
) -> None:
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RANKSIGHT_TOPIC_PREFIX": topic_prefix,
        "RANKSIGHT_HOME": str(tmp_path / "home"),
    }
    forward = Running.start(
        ["alerts", "forward", "--alertmanager", alertmanager, "--idle-exit", "3"],
        env=env, log=tmp_path / "forward.log", ignore_sigint=False,
    )  # fmt: skip
    try:
        forward.wait_for(r"rebuilt: 0 earlier alert records read")
        # A live alert (after the rebuild): forwarded, then its offset committed.
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "log_level": 0})
        producer.produce(topics[ALERTS], key=b"infra", value=Codec().encode(_alert()))
        assert producer.flush(30) == 0
        assert forward.proc.wait(120) == 0, forward.output()
    finally:
        forward.kill()
    assert "sent 1 alerts" in forward.output(), forward.output()
    status = subprocess.run(
        [RANKSIGHT, "status", "--interval", "0.2"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    group = f"ranksight-alerts-forward.{topics[ALERTS]}"
    rows = [line.split() for line in status.stdout.splitlines() if line.startswith(group)]
    assert rows == [[group, ALERTS, "0"]], status.stdout  # listed, everything forwarded


def test_only_the_readers_own_groups_are_left_out() -> None:
    assert is_throwaway_group("ranksight-status-0a1b2c3d")
    assert is_throwaway_group("ranksight-alerts-deadbeef")
    assert not is_throwaway_group("ranksight-alerts-forward.rs.alerts")
    assert not is_throwaway_group("ranksight-alerts-forward.rs.alerts.llm")
    assert not is_throwaway_group("ranksight-sink")
