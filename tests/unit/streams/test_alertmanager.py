"""Alertmanager bridge: payloads, the re-send schedule (fake clock) and real HTTP against a fake Alertmanager."""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from streams.alerting.alertmanager import (
    AlertForwarder,
    AlertmanagerClient,
    AlertmanagerError,
    AlertmanagerRefused,
    coalesce,
    redact_url,
    round_observed,
    to_alertmanager,
)


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
    p = to_alertmanager(_alert(run_id="job1-r2", observed=1.41234567), ui_url="http://ui:8080/")
    assert p["labels"]["alertname"] == "straggler"
    assert p["labels"]["team"] == "llm-pretrain"
    assert p["labels"]["job_id"] == "job1"
    assert p["labels"]["job"] == "job1"
    assert "run_id" not in p["labels"]  # a restarted run is the same alert
    assert p["annotations"]["run_id"] == "job1-r2"
    assert p["annotations"]["observed"] == "1.41"
    assert p["labels"]["rank"] == "3"
    assert p["labels"]["severity"] == "warning"
    assert "model" not in p["labels"]  # a job label reaches Alertmanager only when allowlisted
    assert to_alertmanager(_alert(), job_labels=("model",))["labels"]["model"] == "7b"
    assert "gpu_uuid" not in p["labels"]  # nulls are left out, not sent as "None"
    assert p["annotations"]["summary"].startswith("rank 3")
    assert p["annotations"]["runbook_url"] == "https://runbooks.example/straggler"
    assert p["startsAt"] == "2026-01-01T00:00:00.000Z"
    assert "endsAt" not in p
    assert p["generatorURL"] == "http://ui:8080/alerts/a1"


def test_resolved_payload_sets_ends_at() -> None:
    p = to_alertmanager(_alert("resolved"), ends_at_ms=1)
    assert p["endsAt"] == "2026-01-01T00:01:00.000Z"
    assert "generatorURL" not in p


def test_firing_alert_is_resent_every_interval_until_resolved() -> None:
    """The re-send schedule: every `resend_s` while firing, never after the resolution."""
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


def test_a_muted_alert_carries_its_cause_as_a_label_alertmanager_can_route_on() -> None:
    p = to_alertmanager(_alert(inhibited_by="cause-1", group_key="node:n1@1"))
    assert p["labels"]["inhibited_by"] == "cause-1"
    assert "inhibited_by" not in to_alertmanager(_alert(inhibited_by=None))["labels"]
    assert p["annotations"]["group_key"] == "node:n1@1"


def test_a_symptom_muted_after_it_paged_resolves_its_unmuted_labels_in_alertmanager() -> None:
    """A cause that fires after its symptom re-sends the symptom muted: Alertmanager sees a new label set,
    so the forwarder resolves the old one rather than leave it firing until its keep-alive lapses."""
    sent: list[list[dict[str, Any]]] = []
    clock = FakeClock()
    fwd = AlertForwarder(sent.append, resend_s=60, clock=clock)
    fwd.handle(_alert())
    clock.now += 5
    fwd.handle(_alert(inhibited_by="cause-1", ts=1_767_225_665_000))
    old, new = sent[-1]
    # It ends when it was muted (never before it started, whatever the wall clock says).
    assert "inhibited_by" not in old["labels"] and old["endsAt"] == "2026-01-01T00:01:05.000Z"
    assert new["labels"]["inhibited_by"] == "cause-1" and "endsAt" in new
    assert fwd.firing == 1 and fwd.firing_records()[0]["inhibited_by"] == "cause-1"
    # Both states in one backlog: only the muted one is ever sent.
    sent.clear()
    fresh = AlertForwarder(sent.append, resend_s=60, clock=clock)
    fresh.handle_batch([_alert(), _alert(inhibited_by="cause-1")])
    assert [p["labels"].get("inhibited_by") for p in sent[0]] == ["cause-1"]


def test_a_refresh_of_a_firing_alert_updates_it_in_alertmanager_without_resolving_it() -> None:
    """A lasting alert republished while it fires (issue 34.2) keeps its labels: the forwarder re-posts
    it at once with the new summary and value (Alertmanager updates the annotations of the alert it
    holds), resolves nothing, and keeps one alert alive."""
    sent: list[list[dict[str, Any]]] = []
    clock = FakeClock()
    fwd = AlertForwarder(sent.append, resend_s=60, clock=clock)
    fwd.handle(_alert(observed=61.0, summary="no progress for 61 s"))
    clock.now += 60
    fwd.handle(_alert(observed=121.0, summary="no progress for 121 s", ts=1_767_225_720_000))
    (update,) = sent[-1]
    assert "endsAt" in update and update["annotations"]["summary"] == "no progress for 121 s"
    assert update["annotations"]["observed"] == "121"
    assert update["labels"] == to_alertmanager(_alert())["labels"]
    assert fwd.firing == 1 and fwd.firing_records()[0]["observed"] == 121.0


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
    assert bodies[1][0]["endsAt"] == "1970-01-01T00:21:41.000Z"  # keep-alive: 1061 s + 240 s
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


def test_observed_is_rounded_to_three_significant_digits() -> None:
    assert round_observed(1.41234) == "1.41"
    assert round_observed(97.349) == "97.3"
    assert round_observed(0.000123456) == "0.000123"
    assert round_observed(12345.6) == "1.23e+04"
    assert round_observed(0) == "0"
    assert round_observed(float("nan")) == "nan"


def test_firing_alert_carries_a_keepalive_end_and_is_resent_before_it_lapses() -> None:
    """Every send of a firing alert sets endsAt = now + keepalive; the next send comes before that."""
    sent: list[list[dict[str, Any]]] = []
    clock = FakeClock()
    fwd = AlertForwarder(sent.append, resend_s=60, clock=clock)
    fwd.handle(_alert())
    for _ in range(5):
        clock.now += 30
        fwd.tick()
    ends = [batch[0]["endsAt"] for batch in sent]
    assert len(sent) == 3  # t=0, 60, 120
    assert ends[0] == "1970-01-01T00:20:40.000Z"  # 1000 s + 4 x 60 s
    assert len(set(ends)) == 3


def test_keepalive_must_outlast_the_resend_interval() -> None:
    with pytest.raises(ValueError, match="keepalive_s must be longer"):
        AlertForwarder(lambda alerts: None, resend_s=60, keepalive_s=60)


def test_restored_firing_alerts_are_resent_at_the_first_tick_and_resolved_ones_never() -> None:
    """A restart rebuilds the firing set silently, then re-sends only what still fires."""
    sent: list[list[dict[str, Any]]] = []
    fwd = AlertForwarder(sent.append, resend_s=60, clock=FakeClock())
    fwd.restore(_alert(fingerprint="a"))
    fwd.restore(_alert(fingerprint="b"))
    fwd.restore(_alert("resolved", fingerprint="b"))
    assert sent == [] and not fwd.settled
    assert fwd.tick() == 1
    assert [a["labels"]["fingerprint"] for a in sent[0]] == ["a"]
    assert "endsAt" in sent[0][0] and fwd.settled


def test_a_backlog_is_coalesced_so_a_resolved_alert_is_never_paged() -> None:
    sent: list[list[dict[str, Any]]] = []
    fwd = AlertForwarder(sent.append, clock=FakeClock())
    n = fwd.handle_batch(
        [_alert(fingerprint="a"), _alert(fingerprint="b"), _alert("resolved", fingerprint="a")]
    )
    assert n == 2 and len(sent) == 1
    by_fp = {a["labels"]["fingerprint"]: a for a in sent[0]}
    assert by_fp["a"]["endsAt"] == "2026-01-01T00:01:00.000Z"  # the real resolution, not a page
    assert fwd.firing == 1
    assert [
        r["fingerprint"]
        for r in coalesce([_alert(fingerprint="x"), _alert(fingerprint="y"), _alert(fingerprint="x")])
    ] == ["y", "x"]


def test_a_failed_post_is_retried_at_the_next_tick() -> None:
    """Alertmanager down: nothing is lost, the forwarder is not settled until it went out."""
    sent: list[list[dict[str, Any]]] = []
    down = True

    def post(alerts: list[dict[str, Any]]) -> None:
        if down:
            raise AlertmanagerError("down")
        sent.append(alerts)

    fwd = AlertForwarder(post, clock=FakeClock())
    with pytest.raises(AlertmanagerError):
        fwd.handle_batch([_alert(fingerprint="a"), _alert("resolved", fingerprint="b")])
    assert not fwd.settled
    down = False
    assert fwd.tick() == 2
    assert fwd.settled and fwd.tick() == 0


def test_a_file_of_alerts_is_forwarded_as_the_last_state_of_each(tmp_path: Any) -> None:
    """`alerts forward --file`: a replay's alerts, coalesced; the resolved one goes out as a resolution."""
    from schemas.files import write_container
    from schemas.records import Event, default_schemas
    from streams.alerting.delivery import forward_file

    def full(record: dict[str, Any]) -> dict[str, Any]:
        out = {
            f["name"]: f["default"]
            for f in default_schemas().records["Alert"].json["fields"]
            if "default" in f
        }
        return out | {k: v for k, v in record.items() if v is not None or k in out}

    path = tmp_path / "alerts.avro"
    write_container(
        path,
        [
            Event("Alert", full(_alert(fingerprint="a", labels={}))),
            Event("Alert", full(_alert(fingerprint="b", labels={}))),
            Event("Alert", full(_alert("resolved", fingerprint="a", labels={}))),
        ],
    )
    sent: list[list[dict[str, Any]]] = []
    assert forward_file(path, AlertForwarder(sent.append, clock=FakeClock())) == 2
    assert [(a["labels"]["fingerprint"], a["endsAt"]) for a in sent[0]] == [
        ("b", "1970-01-01T00:20:40.000Z"),
        ("a", "2026-01-01T00:01:00.000Z"),
    ]


def _config_labels(matchers: list[str]) -> set[str]:
    import re

    return {re.match(r"\s*(\w+)\s*(=~|!=|!~|=)", m).group(1) for m in matchers}  # type: ignore[union-attr]


def _walk(route: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield route
    for child in route.get("routes", []):
        yield from _walk(child)


def test_shipped_alertmanager_config_groups_and_routes_on_labels_ranksight_sends() -> None:
    """infra/alertmanager/alertmanager.yml: group_by, matchers and inhibit `equal` name real labels; teams routed."""
    from pathlib import Path

    import yaml

    from producers.simulator import builtin_scenarios, load_scenario

    root = Path(__file__).resolve().parents[3]
    config = yaml.safe_load((root / "infra/alertmanager/alertmanager.yml").read_text(encoding="utf-8"))
    sent = set(to_alertmanager(_alert(labels={}))["labels"]) | {"gpu_uuid", "gpu_index", "inhibited_by"}
    route = config["route"]
    routes = list(_walk(route))
    used = {label for r in routes for label in r.get("group_by", [])}
    used |= {label for r in routes for label in _config_labels(r.get("matchers", []))}
    for rule in config["inhibit_rules"]:
        used |= _config_labels(rule["source_matchers"]) | _config_labels(rule["target_matchers"])
        used |= set(rule["equal"])
    assert "rule" not in used and "alertname" in route["group_by"]
    assert used <= sent, sorted(used - sent)
    receivers = {r["name"] for r in config["receivers"]}
    assert {r["receiver"] for r in routes if "receiver" in r} <= receivers
    team_routes = " ".join(m for r in routes for m in r.get("matchers", []) if m.startswith("team"))
    teams = {"platform", "infrastructure-operations"}
    teams |= {j.team for name in builtin_scenarios() for j in load_scenario(name).jobs}
    import re

    routed = {t for t in teams if re.search(rf'team(=~?)"[^"]*\b{re.escape(t)}\b', team_routes)}
    assert routed == teams, sorted(teams - routed)


def test_shipped_alertmanager_config_is_the_rendering_of_the_shipped_ownership_file() -> None:
    """Regenerate it with `ranksight alerts am-config > infra/alertmanager/alertmanager.yml` after an edit."""
    from pathlib import Path

    from streams.alerting.amconfig import render_alertmanager_config
    from streams.alerting.routing import load_router

    router = load_router()
    assert router.ownership is not None
    rendered = render_alertmanager_config(
        router.ownership, router.inhibit_rules, router.routes, source="streams/alerting/ownership.yaml"
    )
    shipped = (Path(__file__).resolve().parents[3] / "infra/alertmanager/alertmanager.yml").read_text()
    assert shipped == rendered.text


def test_a_job_alert_says_the_runs_progress_and_eta_in_its_annotations() -> None:
    """Issue 23.1: the page says how far the run is and the time left at its recent step rate."""
    p = to_alertmanager(
        _alert(current_step=1199, target_kind="steps", target=5000.0, target_done=1200.0, eta_s=7560.4)
    )
    assert (
        p["annotations"]["progress"]
        == "1,200 of 5,000 steps (24%), about 2h 06m left at the recent step rate"
    )
    assert p["annotations"]["eta_s"] == "7560" and p["annotations"]["current_step"] == "1199"
    bare = to_alertmanager(_alert(target_kind=None, target=None, target_done=None, eta_s=None))
    assert "progress" not in bare["annotations"] and "eta_s" not in bare["annotations"]


def test_the_jobs_image_and_workspace_are_annotations_not_labels() -> None:
    """Issue 35.5: the page says where the job runs; a claimed string never becomes a routing label."""
    p = to_alertmanager(_alert(image="nvcr.io/nvidia/pytorch:25.01-py3", workspace="llm-pretrain"))
    assert p["annotations"]["image"] == "nvcr.io/nvidia/pytorch:25.01-py3"
    assert p["annotations"]["workspace"] == "llm-pretrain"
    assert "image" not in p["labels"] and "workspace" not in p["labels"]
    assert "image" not in to_alertmanager(_alert(image=""))["annotations"]


def test_job_labels_reach_alertmanager_only_allowlisted_renamed_and_never_as_a_reserved_label() -> None:
    claimed = {
        "inhibited_by": "cause-of-another-job",
        "receiver": "muted",
        "team": "nobody",
        "alertname": "x",
        "ranksight.dev/remediate": "true",
        "9lives": "y",
        "model": "7b",
    }
    labels = to_alertmanager(_alert(labels=claimed), job_labels=tuple(claimed))["labels"]
    assert "inhibited_by" not in labels and labels["receiver"] == "llm-pretrain-oncall"
    assert labels["team"] == "llm-pretrain" and labels["alertname"] == "straggler"
    assert (
        labels["ranksight_dev_remediate"] == "true" and labels["_9lives"] == "y" and labels["model"] == "7b"
    )
    assert all(re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name) for name in labels)
    assert "model" not in to_alertmanager(_alert(labels=claimed))["labels"]  # nothing unless allowlisted
    long = to_alertmanager(_alert(labels={"model": "7" * 100_000}), job_labels=("model",))["labels"]
    assert len(long["model"]) == 1024


def test_an_allowlist_naming_a_reserved_label_is_refused() -> None:
    for name in ("inhibited_by", "inhibited.by", "receiver", "team", "job"):
        with pytest.raises(ValueError, match="sets itself"):
            AlertForwarder(lambda _: None, job_labels=(name,))


def test_a_refused_alert_is_set_aside_with_its_reason_and_never_wedges_the_forwarder() -> None:
    clock = FakeClock()
    sent: list[list[str]] = []

    def post(alerts: list[dict[str, Any]]) -> None:
        sent.append([a["labels"]["job_id"] for a in alerts])
        if any(a["labels"]["job_id"] == "bad" for a in alerts):
            raise AlertmanagerRefused("answered 400", 400, "start time must be before end time")

    f = AlertForwarder(post, resend_s=60, clock=clock)
    f.handle_batch([_alert(job_id="ok", fingerprint="a"), _alert(job_id="bad", fingerprint="b")])
    assert sent == [["ok", "bad"], ["ok"], ["bad"]]  # the batch, then each alone to find which
    refused = f.take_refused()
    assert [(r["job_id"], e.reason) for r, e in refused] == [("bad", "start time must be before end time")]
    assert f.settled and f.firing == 1 and f.refused == 1 and f.take_refused() == []
    clock.now += 61
    assert f.tick() == 1 and sent[-1] == ["ok"]  # the refused one is not re-posted every tick


def test_the_alertmanager_password_is_never_in_an_error() -> None:
    port = _closed_port()
    url = f"http://admin:s3cret-pw@127.0.0.1:{port}"
    assert redact_url(url + "/api/v2/alerts") == f"http://admin:***@127.0.0.1:{port}/api/v2/alerts"
    client = AlertmanagerClient(url)
    try:
        with pytest.raises(AlertmanagerError) as caught:
            client.post([{"labels": {}}])
    finally:
        client.close()
    assert "s3cret-pw" not in str(caught.value) and "admin:***@" in str(caught.value)


def test_alerts_forward_never_prints_the_alertmanager_password(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from ranksight.cli import app
    from schemas.files import write_container
    from schemas.records import Event, default_schemas

    defaults = {
        f["name"]: f["default"] for f in default_schemas().records["Alert"].json["fields"] if "default" in f
    }
    record = defaults | {k: v for k, v in _alert().items() if v is not None or k in defaults}
    file = tmp_path / "alerts.avro"
    write_container(file, [Event("Alert", record)])
    url = f"http://admin:s3cret-pw@127.0.0.1:{_closed_port()}"
    result = CliRunner().invoke(app, ["alerts", "forward", "--alertmanager", url, "--file", str(file)])
    assert result.exit_code == 1 and "cannot reach Alertmanager" in result.output, result.output
    assert "s3cret-pw" not in result.output and "admin:***@" in result.output


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
