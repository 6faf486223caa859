"""Scheduler actions: the Slurm commands run, and the Kubernetes requests the official client makes against
recorded API responses served over HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from producers.scheduler.actions import SchedulerActionError, SlurmActions

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "kubernetes"


class FakeRunner:
    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        if self.fail:
            raise SchedulerActionError(self.fail)
        return "ok"


def test_slurm_cancel_is_scancel_and_requeue_is_scontrol_requeue() -> None:
    runner = FakeRunner()
    slurm = SlurmActions(runner=runner)
    assert slurm.target("4242", {}) == "4242"
    assert slurm.describe("cancel", "4242") == "scancel 4242"
    assert slurm.act("cancel", "4242") == "scancel 4242: ok"
    slurm.act("requeue", "4242")
    assert runner.calls == [["scancel", "4242"], ["scontrol", "requeue", "4242"]]


def test_slurm_names_the_job_by_its_label_and_refuses_anything_else() -> None:
    slurm = SlurmActions(runner=FakeRunner())
    assert slurm.target("pretrain-7b", {"ranksight.dev/scheduler-job-id": "77_3"}) == "77_3"
    for bad in ("pretrain-7b", "12; rm -rf /", "--all"):
        with pytest.raises(SchedulerActionError, match="no Slurm job id"):
            slurm.target(bad, {})


def test_a_slurm_refusal_is_an_error_with_its_message() -> None:
    slurm = SlurmActions(runner=FakeRunner(fail="`scancel 9` failed: Invalid job id specified"))
    with pytest.raises(SchedulerActionError, match="Invalid job id"):
        slurm.act("cancel", "9")


# -- Kubernetes -------------------------------------------------------------------------------------

pytest.importorskip(
    "kubernetes", reason="the Kubernetes client is an optional extra: pip install 'ranksight[kubernetes]'"
)


class FakeApiServer:
    """Serves the running Job of 3-running.json and the recorded answers to PATCH and DELETE."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        running = json.loads((RECORDED / "3-running.json").read_text())
        patched = json.loads((RECORDED / "actions" / "patch-job-suspend.json").read_text())
        deleted = json.loads((RECORDED / "actions" / "delete-pod.json").read_text())
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def _answer(self, body: Any, status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _record(self) -> tuple[str, str]:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                path, _, query = self.path.partition("?")
                server.requests.append((self.command, self.path, body))
                return path, query

            def do_GET(self) -> None:
                path, query = self._record()
                selector = parse_qs(query).get("labelSelector", [""])[0]
                if path.endswith("/jobs"):
                    # As the API does: the Jobs of the namespace (or all) carrying the selected label.
                    everywhere = path == "/apis/batch/v1/jobs" or path.endswith(
                        "/namespaces/ml-research/jobs"
                    )
                    name, _, value = selector.partition("=")
                    items = [
                        j
                        for j in running["jobs"]["items"]
                        if everywhere and (not name or j["metadata"]["labels"].get(name) == value)
                    ]
                    self._answer({**running["jobs"], "items": items})
                elif path == "/api/v1/namespaces/ml-research/pods" and "job-name%3Dllama-ft" in query:
                    self._answer(running["pods"])
                else:
                    self._answer(
                        {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}, 403
                    )

            def do_PATCH(self) -> None:
                path, _ = self._record()
                if path == "/apis/batch/v1/namespaces/ml-research/jobs/llama-ft":
                    self._answer(patched)
                else:
                    self._answer({"kind": "Status", "reason": "NotFound", "code": 404}, 404)

            def do_DELETE(self) -> None:
                path, _ = self._record()
                if path == "/api/v1/namespaces/ml-research/pods/llama-ft-a1b2c":
                    self._answer(deleted)
                else:
                    self._answer({"kind": "Status", "reason": "NotFound", "code": 404}, 404)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def actions(self, namespace: str | None = "ml-research") -> Any:
        from kubernetes import client

        from producers.scheduler.actions import KubernetesActions

        return KubernetesActions(
            namespace=namespace, api_client=client.ApiClient(client.Configuration(host=self.url))
        )

    def writes(self) -> list[tuple[str, str, Any]]:
        return [r for r in self.requests if r[0] != "GET"]


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def test_kubernetes_finds_the_job_by_its_ranksight_label(api: FakeApiServer) -> None:
    assert api.actions().target("llama-ft-7", {}) == "ml-research/llama-ft"
    assert any("labelSelector=ranksight.dev/job-id%3Dllama-ft-7" in path for _, path, _ in api.requests)
    assert api.actions().target("ml-research/llama-ft", {}) == "ml-research/llama-ft"


def test_kubernetes_requeue_deletes_the_jobs_pods_only(api: FakeApiServer) -> None:
    out = api.actions().act("requeue", "ml-research/llama-ft")
    assert out == "Job ml-research/llama-ft: deleted 1 Pods (llama-ft-a1b2c)"
    assert [(m, p.split("?")[0]) for m, p, _ in api.writes()] == [
        ("DELETE", "/api/v1/namespaces/ml-research/pods/llama-ft-a1b2c")
    ]


def test_kubernetes_cancel_suspends_the_job_then_deletes_its_pods(api: FakeApiServer) -> None:
    out = api.actions().act("cancel", "ml-research/llama-ft")
    assert out == "Job ml-research/llama-ft: suspended, deleted 1 Pods (llama-ft-a1b2c)"
    writes = api.writes()
    assert [(m, p.split("?")[0]) for m, p, _ in writes] == [
        ("PATCH", "/apis/batch/v1/namespaces/ml-research/jobs/llama-ft"),
        ("DELETE", "/api/v1/namespaces/ml-research/pods/llama-ft-a1b2c"),
    ]
    assert writes[0][2] == {"spec": {"suspend": True}}


def test_a_kubernetes_refusal_is_one_sentence(api: FakeApiServer) -> None:
    with pytest.raises(SchedulerActionError, match="refused to suspend the Job: 404"):
        api.actions().act("cancel", "ml-research/other")
    with pytest.raises(SchedulerActionError, match="0 Kubernetes Jobs are labelled"):
        api.actions(namespace="elsewhere").target("llama-ft-7", {})
