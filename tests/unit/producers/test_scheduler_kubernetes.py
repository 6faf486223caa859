"""The Kubernetes source through the official client, against recorded API responses served over HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "kubernetes", reason="the Kubernetes client is an optional extra: pip install 'ranksight[kubernetes]'"
)

from kubernetes import client

from producers.publisher import MemoryPublisher
from producers.scheduler import StateTracker, TeamMap, poll_once
from producers.scheduler.errors import SchedulerUnavailableError
from producers.scheduler.kubernetes import CLUSTER_LABEL, KubernetesSource
from streams.offline.detection import DetectionEngine

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "kubernetes"
PHASES = sorted(p.stem for p in RECORDED.glob("*.json"))


class FakeApiServer:
    """Serves one recorded poll (Job list + Pod list) at the API paths the client requests."""

    def __init__(self) -> None:
        self.phase: dict[str, Any] = {}
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out at once, not 40 ms apart

            def do_GET(self) -> None:
                server.paths.append(self.path)
                path = self.path.split("?")[0]
                if path == "/apis/batch/v1/namespaces/ml-research/jobs":
                    body, status = server.phase["jobs"], 200
                elif path == "/api/v1/namespaces/ml-research/pods":
                    body, status = server.phase["pods"], 200
                else:
                    body, status = (
                        {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403},
                        403,
                    )
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def load(self, phase: str) -> None:
        self.phase = json.loads((RECORDED / f"{phase}.json").read_text())

    def api_client(self) -> Any:
        config = client.Configuration(host=self.url)
        return client.ApiClient(config)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def _source(api: FakeApiServer, namespace: str | None = "ml-research") -> KubernetesSource:
    return KubernetesSource(
        namespace=namespace, label_selector="kueue.x-k8s.io/queue-name=gpu", api_client=api.api_client()
    )


def test_a_job_through_its_life_publishes_each_scheduler_state_once(api: FakeApiServer) -> None:
    teams = TeamMap(accounts={"ml-research": "llm"})
    source, tracker, out = _source(api), StateTracker("kubernetes", teams.team_for), MemoryPublisher()
    now = 1_800_000_000_000
    for phase in PHASES:
        api.load(phase)
        poll_once(source, tracker, out, now)
        poll_once(source, tracker, out, now)  # the same answer twice publishes nothing new
    got = [(e.record["state"], e.record["restart_count"], e.record["exit_code"]) for e in out.events]
    assert got == [
        ("pending", 0, None),  # suspended by Kueue
        ("running", 0, None),
        ("restarting", 1, None),  # a failed Pod retried
        ("running", 1, None),
        ("preempted", 1, 143),
        ("failed", 1, 143),
    ]
    first = out.events[0].record
    assert first["job_id"] == "llama-ft-7" and first["owner"] == "alice" and first["team"] == "llm"
    assert first["reason"] == "Suspended: queued (suspended)" and first["source"] == "kubernetes"
    running = out.events[1].record
    # Queue wait from the Job's creation to its Pod's start: 25 minutes.
    assert running["ts"] - running["submit_ts"] == 25 * 60_000
    assert out.events[-1].record["reason"] == "Failed: BackoffLimitExceeded"
    assert any("labelSelector=kueue.x-k8s.io" in p for p in api.paths)


def test_the_engine_raises_long_pending_from_kubernetes_events_alone(api: FakeApiServer) -> None:
    api.load("1-queued")
    out = MemoryPublisher()
    poll_once(
        _source(api),
        StateTracker("kubernetes", TeamMap(default="llm").team_for, cluster="gke-eu-1"),
        out,
        1_800_000_000_000,
    )
    engine = DetectionEngine()
    alerts = [a for e in out.events for a in engine.process(e)]
    alerts += engine.advance(out.events[0].record["ts"] + 20 * 60_000)
    fired = [a.record for a in alerts if a.type == "Alert" and a.record["rule"] == "long_pending"]
    assert fired and {a["job_id"] for a in fired} == {"llama-ft-7"}
    assert [a["team"] for a in fired] == ["platform", "llm"]  # the platform pages; the job's team is informed
    # The API names no cluster: `ranksight scheduler --cluster` does, and the page says it (issue 23.7).
    assert {a["cluster"] for a in fired} == {"gke-eu-1"}


def test_a_jobs_cluster_label_names_its_cluster_before_the_command_default(api: FakeApiServer) -> None:
    api.load("1-queued")
    for job in api.phase["jobs"]["items"]:
        job["metadata"].setdefault("labels", {})[CLUSTER_LABEL] = "gke-us-2"
    out = MemoryPublisher()
    poll_once(_source(api), StateTracker("kubernetes", cluster="gke-eu-1"), out, 1_800_000_000_000)
    assert {e.record["cluster"] for e in out.events} == {"gke-us-2"}


def test_a_refusing_api_is_one_sentence(api: FakeApiServer) -> None:
    api.load("1-queued")
    with pytest.raises(SchedulerUnavailableError, match="refused the request: 403"):
        _source(api, namespace=None).poll()  # the cluster-wide list is forbidden here
