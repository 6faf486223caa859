"""Alertmanager bridge: payloads, the re-send schedule (fake clock) and real HTTP against a fake Alertmanager."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from streams.alertmanager import AlertForwarder, AlertmanagerClient, AlertmanagerError, to_alertmanager


def _alert(status: str = "firing", **over: Any) -> dict[str, Any]:
    record = {
        "alert_id": "a1",
        "fingerprint": "fp-straggler-job1-3",
        "rule": "straggler",
        "category": "platform",
        "severity": "warning",
        "status": status,
        "ts": 1_767_225_660_000,
        "starts_at": 1_767_225_600_000,
        "ends_at": 1_767_225_660_000 if status == "resolved" else None,
        "team": "llm-pretrain",
        "receiver": "llm-pretrain-oncall",
        "summary": "rank 3 is 40% slower than the job median",
        "owner": "alice",
        "job_id": "job1",
        "cluster": "local",
        "node": "node-01",
        "rank": 3,
        "gpu_uuid": None,
        "gpu_index": None,
        "invariant": "rank compute time within 1.3x of the job median",
        "observed": 1.4,
        "expected": 1.3,
        "suspected_layer": "gpu",
        "runbook_url": "https://runbooks.example/straggler",
        "labels": {"model": "7b"},
    }
    record.update(over)
    return record


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Recorder(BaseHTTPRequestHandler):
    posts: list[tuple[str, Any]]
    status = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts.append((self.path, json.loads(body)))
        self.send_response(type(self).status)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass


@pytest.fixture
def fake_alertmanager() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Rec", (_Recorder,), {"posts": [], "status": 200})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_firing_payload_has_rule_as_alertname_identity_labels_and_no_end() -> None:
    p = to_alertmanager(_alert(), "http://grafana/d/1")
    assert p["labels"]["alertname"] == "straggler"
    assert p["labels"]["team"] == "llm-pretrain"
    assert p["labels"]["job_id"] == "job1"
    assert p["labels"]["rank"] == "3"
    assert p["labels"]["severity"] == "warning"
    assert p["labels"]["model"] == "7b"
    assert "gpu_uuid" not in p["labels"]  # nulls are left out, not sent as "None"
    assert p["annotations"]["summary"].startswith("rank 3")
    assert p["annotations"]["runbook_url"] == "https://runbooks.example/straggler"
    assert p["startsAt"] == "2026-01-01T00:00:00.000Z"
    assert "endsAt" not in p
    assert p["generatorURL"] == "http://grafana/d/1"


def test_resolved_payload_sets_ends_at() -> None:
    p = to_alertmanager(_alert("resolved"))
    assert p["endsAt"] == "2026-01-01T00:01:00.000Z"
    assert "generatorURL" not in p


def test_firing_alert_is_resent_every_interval_until_resolved() -> None:
    sent: list[list[dict[str, Any]]] = []
    clock = FakeClock()
    fwd = AlertForwarder(sent.append, resend_s=60, clock=clock)
    fwd.handle(_alert())
    assert len(sent) == 1
    clock.now += 59
    assert fwd.tick() == 0
    clock.now += 1
    assert fwd.tick() == 1
    assert sent[-1][0]["labels"]["alertname"] == "straggler"
    clock.now += 30
    assert fwd.tick() == 0  # the re-send restarted the interval
    fwd.handle(_alert("resolved"))
    assert "endsAt" in sent[-1][0]
    clock.now += 600
    assert fwd.tick() == 0
    assert fwd.firing == 0


def test_team_filter_drops_other_teams() -> None:
    sent: list[list[dict[str, Any]]] = []
    fwd = AlertForwarder(sent.append, team="infra", clock=FakeClock())
    assert fwd.handle(_alert()) is False
    assert sent == []


def test_client_posts_json_list_to_api_v2_alerts(fake_alertmanager: tuple[str, type[_Recorder]]) -> None:
    url, rec = fake_alertmanager
    client = AlertmanagerClient(url)
    clock = FakeClock()
    fwd = AlertForwarder(client.post, resend_s=60, clock=clock)
    try:
        fwd.handle(_alert())
        clock.now += 61
        fwd.tick()
        fwd.handle(_alert("resolved"))
    finally:
        client.close()
    assert [path for path, _ in rec.posts] == ["/api/v2/alerts"] * 3
    bodies = [body for _, body in rec.posts]
    assert all(isinstance(b, list) and len(b) == 1 for b in bodies)
    assert "endsAt" not in bodies[1][0]
    assert bodies[2][0]["endsAt"] == "2026-01-01T00:01:00.000Z"


def test_client_error_answer_raises_one_sentence(fake_alertmanager: tuple[str, type[_Recorder]]) -> None:
    url, rec = fake_alertmanager
    rec.status = 400
    client = AlertmanagerClient(url)
    try:
        with pytest.raises(AlertmanagerError, match="answered 400"):
            client.post([to_alertmanager(_alert())])
    finally:
        client.close()


def test_client_unreachable_raises() -> None:
    client = AlertmanagerClient("http://127.0.0.1:9", timeout_s=2)
    try:
        with pytest.raises(AlertmanagerError, match="cannot reach Alertmanager"):
            client.post([to_alertmanager(_alert())])
    finally:
        client.close()
