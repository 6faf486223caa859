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

from producers.scheduler.actions import SchedulerActionError, SchedulerJob, SlurmActions

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "kubernetes"
# A Job outside the namespaces remediate may act in, labelled with an id an attacker could claim.
COREDNS: dict[str, Any] = {
    "metadata": {
        "name": "coredns",
        "namespace": "kube-system",
        "labels": {"ranksight.dev/job-id": "llama-ft-7"},
    },
    "spec": {"suspend": False},
    "status": {"active": 1},
}


def _squeue(*jobs: dict[str, Any]) -> str:
    return json.dumps({"jobs": list(jobs), "errors": []})


def _entry(job_id: int, **kw: Any) -> dict[str, Any]:
    """One `squeue --json` job of Slurm 22.05, running."""
    return {
        "job_id": job_id,
        "job_state": "RUNNING",
        "user_name": "alice",
        "account": "research",
        "cluster": "ranksight",
        "start_time": 1_780_000_000,
        "submit_time": 1_779_999_000,
        "array_job_id": 0,
        "array_task_id": None,
        **kw,
    }


class FakeRunner:
    def __init__(self, fail: str | None = None, squeue: str = "") -> None:
        self.calls: list[list[str]] = []
        self.fail = fail
        self.squeue = squeue

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        if self.fail:
            raise SchedulerActionError(self.fail)
        return self.squeue if argv[0] == "squeue" else ""


def test_slurm_cancel_is_scancel_and_requeue_is_scontrol_requeue() -> None:
    runner = FakeRunner(squeue=_squeue(_entry(4242)))
    slurm = SlurmActions(runner=runner)
    job = slurm.lookup("4242")
    assert job == SchedulerJob(
        "4242", "4242", "running", "RUNNING", "alice", "research", "ranksight", 1_780_000_000_000
    )
    assert slurm.describe("cancel", job) == "scancel 4242"
    assert slurm.act("cancel", job) == "scancel 4242: ok"
    slurm.act("requeue", job)
    assert runner.calls == [
        ["squeue", "--json", "--jobs", "4242"],
        ["scancel", "4242"],
        ["scontrol", "requeue", "4242"],
    ]


def test_slurm_keeps_only_the_entry_whose_id_is_the_one_asked_for() -> None:
    """squeue --json of 22.05 lists every job whatever --jobs says: a neighbour is never taken for the job."""
    slurm = SlurmActions(runner=FakeRunner(squeue=_squeue(_entry(42), _entry(424), _entry(4243))))
    assert slurm.lookup("4242") is None
    tasks = _squeue(
        _entry(77, array_job_id=70, array_task_id=3), _entry(70, array_job_id=70, array_task_id=0)
    )
    slurm = SlurmActions(runner=FakeRunner(squeue=tasks))
    assert slurm.lookup("70_3").target == "70_3"  # type: ignore[union-attr]
    assert slurm.lookup("77").target == "77"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "bad",
    [
        "pretrain-7b",
        "12; rm -rf /",
        "--all",
        "4242\n",
        "\u0664\u0662",
        "\uff14\uff12",
        "42 ",
        "-1",
        "",
        "1_",
        "_1",
    ],
)
def test_slurm_refuses_anything_slurm_could_not_have_made_before_running_a_command(bad: str) -> None:
    runner = FakeRunner(squeue=_squeue(_entry(4242)))
    with pytest.raises(SchedulerActionError, match="is not a Slurm job id"):
        SlurmActions(runner=runner).lookup(bad)
    with pytest.raises(SchedulerActionError, match="is not a Slurm job id"):
        SlurmActions(runner=runner).act("cancel", SchedulerJob(bad, bad, "running", "RUNNING"))
    assert runner.calls == []


def test_a_slurm_refusal_is_an_error_with_its_message_and_an_unknown_job_is_none() -> None:
    slurm = SlurmActions(runner=FakeRunner(fail="`scancel 9` failed: Access/permission denied"))
    with pytest.raises(SchedulerActionError, match="permission denied"):
        slurm.act("cancel", SchedulerJob("9", "9", "running", "RUNNING"))
    gone = SlurmActions(
        runner=FakeRunner(fail="`squeue` failed: slurm_load_jobs error: Invalid job id specified")
    )
    assert gone.lookup("9") is None


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
                fields = parse_qs(query).get("fieldSelector", [""])[0]
                if path.endswith("/jobs"):
                    # As the API does: the Jobs of the namespace (or all) carrying the selected label
                    # or name; the namespaces hold this one Job, and kube-system its coredns.
                    namespace = path.split("/")[-2] if "/namespaces/" in path else None
                    name, _, value = selector.partition("=")
                    _, _, wanted = fields.partition("=")
                    items = [
                        j
                        for j in running["jobs"]["items"] + [COREDNS]
                        if namespace in (None, j["metadata"]["namespace"])
                        and (not name or j["metadata"]["labels"].get(name) == value)
                        and (not wanted or j["metadata"]["name"] == wanted)
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

    def actions(self, *namespaces: str) -> Any:
        from kubernetes import client

        from producers.scheduler.actions import KubernetesActions

        return KubernetesActions(
            namespaces=namespaces or ("ml-research",),
            cluster="gke-a",
            api_client=client.ApiClient(client.Configuration(host=self.url)),
        )

    def writes(self) -> list[tuple[str, str, Any]]:
        return [r for r in self.requests if r[0] != "GET"]


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def test_kubernetes_finds_the_job_by_its_label_in_the_configured_namespaces_only(api: FakeApiServer) -> None:
    job = api.actions().lookup("llama-ft-7")
    assert (job.job_id, job.target, job.state, job.user, job.account, job.cluster) == (
        "llama-ft-7",
        "ml-research/llama-ft",
        "running",
        "alice",
        "ml-research",
        "gke-a",  # the operator's name, never a label on the Job
    )
    paths = [p for _, p, _ in api.requests]
    assert any(
        p.startswith("/apis/batch/v1/namespaces/ml-research/jobs?labelSelector=ranksight.dev")
        and "llama-ft-7" in p
        for p in paths
    ), paths
    assert not any("kube-system" in p or p.startswith("/apis/batch/v1/jobs") for p in paths)
    # By namespace/name: the Job answers to its label, not to that name.
    named = api.actions().lookup("ml-research/llama-ft")
    assert (named.job_id, named.target) == ("llama-ft-7", "ml-research/llama-ft")


def test_a_job_id_naming_another_namespace_is_refused_before_any_request(api: FakeApiServer) -> None:
    """The attack: job id `kube-system/coredns` with --namespace ml."""
    for job_id in ("kube-system/coredns", "ml-research-x/llama-ft", "/coredns"):
        with pytest.raises(SchedulerActionError, match="remediate acts only in ml-research"):
            api.actions().lookup(job_id)
    coredns = SchedulerJob("kube-system/coredns", "kube-system/coredns", "running", "Running")
    with pytest.raises(SchedulerActionError, match="remediate acts only in ml-research"):
        api.actions().act("cancel", coredns)
    assert api.requests == []


@pytest.mark.parametrize("job_id", ["x,owner=alice", "x!=y", "a" * 64, "llama ft", "ml-research/Bad_Name"])
def test_a_job_id_that_would_change_the_selector_or_path_is_refused(api: FakeApiServer, job_id: str) -> None:
    with pytest.raises(SchedulerActionError, match=r"label value|does not name a Kubernetes Job"):
        api.actions().lookup(job_id)
    assert api.requests == []


def test_kubernetes_requeue_deletes_the_jobs_pods_only(api: FakeApiServer) -> None:
    out = api.actions().act("requeue", api.actions().lookup("llama-ft-7"))
    assert out == "Job ml-research/llama-ft: deleted 1 Pods (llama-ft-a1b2c)"
    assert [(m, p.split("?")[0]) for m, p, _ in api.writes()] == [
        ("DELETE", "/api/v1/namespaces/ml-research/pods/llama-ft-a1b2c")
    ]


def test_kubernetes_cancel_suspends_the_job_then_deletes_its_pods(api: FakeApiServer) -> None:
    out = api.actions().act("cancel", api.actions().lookup("llama-ft-7"))
    assert out == "Job ml-research/llama-ft: suspended, deleted 1 Pods (llama-ft-a1b2c)"
    writes = api.writes()
    assert [(m, p.split("?")[0]) for m, p, _ in writes] == [
        ("PATCH", "/apis/batch/v1/namespaces/ml-research/jobs/llama-ft"),
        ("DELETE", "/api/v1/namespaces/ml-research/pods/llama-ft-a1b2c"),
    ]
    assert writes[0][2] == {"spec": {"suspend": True}}


def test_a_kubernetes_refusal_is_one_sentence(api: FakeApiServer) -> None:
    other = SchedulerJob("ml-research/other", "ml-research/other", "running", "Running")
    with pytest.raises(SchedulerActionError, match="refused to suspend the Job: 404"):
        api.actions().act("cancel", other)
    assert api.actions("elsewhere").lookup("llama-ft-7") is None


def test_the_namespace_escape_replayed_through_remediation_acts_only_on_the_alerts_own_job(
    api: FakeApiServer,
) -> None:
    """The attack through the whole decision path: records for `kube-system/coredns` (opted in by
    their labels, team and state) and an alert on it, next to a real zombie in ml-research. With
    --namespace ml-research, remediation writes only to ml-research/llama-ft."""
    from streams.alerting.remediation import RemediationPolicy, Remediator
    from tests.unit.streams.builders import job_started, job_state

    actions = api.actions("ml-research")
    policy = RemediationPolicy.from_dict(
        {
            "rules": {"zombie_job": {"action": "cancel", "min_firing_s": 0}},
            "opt_in": {"accounts": ["ml-research", "kube-system"], "label": "ranksight.dev/remediate"},
        }
    )
    r = Remediator(policy, lookup=actions.lookup, execute=True, scheduler="kubernetes")
    opted = {"ranksight.dev/remediate": "true"}
    # The recorded Job's Pod started at 2026-11-30T10:25Z; the alerts fire after it (12:00Z).
    now = 1_796_040_000_000
    for job in ("kube-system/coredns", "llama-ft-7"):
        r.observe_event(job_started(job, now - 60_000, labels=opted, checkpoint_max_age_s=None))
        r.observe_event(job_state(job, now - 50_000, "running"))
        r.observe_alert(
            {
                "alert_id": f"z-{job}",
                "rule": "zombie_job",
                "status": "firing",
                "ts": now - 10_000,
                "job_id": job,
            }
        )
    decisions = r.decide(now)
    got = {d.alert["job_id"]: (d.kind, d.reason_code) for d in decisions}
    assert got == {"kube-system/coredns": ("skipped", "scheduler_refused"), "llama-ft-7": ("acted", "acted")}
    for decision in decisions:
        if decision.execute:
            assert decision.scheduler_job is not None
            actions.act("cancel", decision.scheduler_job)
    assert {p.split("?")[0] for _, p, _ in api.writes()} == {
        "/apis/batch/v1/namespaces/ml-research/jobs/llama-ft",
        "/api/v1/namespaces/ml-research/pods/llama-ft-a1b2c",
    }
    assert not [p for _, p, _ in api.requests if "kube-system" in p]
