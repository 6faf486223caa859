"""The rendered configuration in Debian's real Alertmanager: amtool accepts it, routes every copy where
ranksight's router sent it, pages owners, informs job teams, escalates only critical pages nobody
silenced, inhibits symptoms, and the silences are read back through the v2 API."""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from ranksight.cli import app
from streams.alerting.alertmanager import AlertForwarder, AlertmanagerClient, read_silences
from streams.alerting.ownership import CATEGORIES, DEFAULT_OWNERSHIP_PATH, SEVERITIES
from streams.alerting.routing import DEFAULT_ROUTING_PATH, Router, load_router
from tests.integration.alerting.conftest import Alertmanager

T0 = int(time.time() * 1000) - 60_000
UI = "http://ui.example:8080"


class Webhooks:
    """Records what Alertmanager notifies, per receiver (`/hook/<receiver>`)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with hooks.lock:
                    hooks.received.append((self.path.rsplit("/", 1)[-1], body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def firing(self, receiver: str) -> list[dict[str, str]]:
        """Labels of every firing alert notified to `receiver` so far."""
        with self.lock:
            return [
                a["labels"] | {"_runbook": a["annotations"].get("runbook_url", "")}
                for name, body in self.received
                if name == receiver
                for a in body["alerts"]
                if a["status"] == "firing"
            ]

    def wait(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 90
        while not done():
            if time.monotonic() > deadline:
                with self.lock:
                    got = [(n, [a["labels"].get("alertname") for a in b["alerts"]]) for n, b in self.received]
                raise AssertionError(f"Alertmanager never notified: {what}; received {got}")
            time.sleep(0.1)


@pytest.fixture
def hooks() -> Iterator[Webhooks]:
    server = Webhooks()
    yield server
    server.server.shutdown()
    server.server.server_close()


def _files(tmp_path: Path, hook_url: str) -> tuple[Path, Path]:
    """The shipped ownership and routing files, every receiver a webhook here and short timers."""
    ownership = yaml.safe_load(DEFAULT_OWNERSHIP_PATH.read_text())
    names = {r for spec in [*ownership["teams"].values(), ownership["other_teams"]] for r in spec.values()}
    names.add(ownership["alertmanager"]["escalation"]["receiver"])
    ownership["receivers"] = {
        n: {"webhook_configs": [{"url": f"{hook_url}/hook/{n}", "send_resolved": True}]}
        for n in sorted(names)
    }
    ownership["alertmanager"].update({"group_wait": "1s", "group_interval": "1s"})
    ownership["alertmanager"]["escalation"]["after"] = "4s"
    own = tmp_path / "ownership.yaml"
    own.write_text(yaml.safe_dump(ownership))
    routing = yaml.safe_load(DEFAULT_ROUTING_PATH.read_text())
    routing["ownership"] = str(own)
    path = tmp_path / "routing.yaml"
    path.write_text(yaml.safe_dump(routing))
    return own, path


def _render(tmp_path: Path, amtool: str, hook_url: str = "http://127.0.0.1:9") -> tuple[Path, Router]:
    own, routing = _files(tmp_path, hook_url)
    out = tmp_path / "alertmanager.yml"
    result = CliRunner().invoke(
        app, ["alerts", "am-config", "--ownership", str(own), "--routing", str(routing), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    check = subprocess.run([amtool, "check-config", str(out)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout
    return out, load_router(routing)


def _record(rule: str, category: str, severity: str, team: str, **identity: Any) -> dict[str, Any]:
    """An Alert record as the alert tracker leaves it (team: the job's team), before routing."""
    fingerprint = "/".join([rule, *(str(v) for v in identity.values())])
    return {
        "alert_id": f"id-{fingerprint}",
        "fingerprint": fingerprint,
        "rule": rule,
        "category": category,
        "severity": severity,
        "status": "firing",
        "ts": T0,
        "starts_at": T0,
        "ends_at": None,
        "team": team,
        "receiver": "",
        "summary": f"{rule} on {fingerprint}",
        "cluster": "c1",
        "runbook_url": f"docs/runbooks/{rule}",
        "labels": {},
        **identity,
    }


def _routed(router: Router, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The copies the engine publishes: one per (team, receiver) the router chose."""
    return [{**record, "team": team, "receiver": receiver} for team, receiver in router.route_all(record)]


def test_amtool_routes_every_copy_to_the_receiver_ranksight_chose_and_escalates_only_critical_pages(
    tmp_path: Path, amtool: str
) -> None:
    """Alertmanager's own routing (amtool config routes test) agrees with ranksight's router for every
    category, severity, listed/unlisted/absent job team and plain/provider cluster."""
    config, router = _render(tmp_path, amtool)
    assert router.ownership is not None
    escalation = router.ownership.alertmanager.escalation_receiver
    teams = [*router.ownership.teams, "unlisted-team", ""]
    checked = 0
    for category, severity, team, cluster in itertools.product(
        CATEGORIES, SEVERITIES, teams, ["c1", "provider-east"]
    ):
        record = _record("some_rule", category, severity, team) | {"cluster": cluster}
        for delivery in router.explain(record):
            labels = {
                "alertname": "some_rule",
                "team": delivery.team,
                "receiver": delivery.receiver,
                "category": category,
                "severity": severity,
                "cluster": cluster,
            }
            argv = [amtool, "config", "routes", "test", f"--config.file={config}"]
            done = subprocess.run(
                [*argv, *(f"{k}={v}" for k, v in labels.items())], capture_output=True, text=True, check=False
            )
            assert done.returncode == 0, done.stderr
            got = set(done.stdout.strip().split(","))
            expected = {delivery.receiver}
            if delivery.kind == "page" and severity == "critical":
                expected.add(router.ownership.receivers_of(delivery.team).escalate or escalation)
            assert got == expected, f"{labels}: Alertmanager routes to {got}, ranksight chose {expected}"
            checked += 1
    assert checked > len(CATEGORIES) * len(SEVERITIES) * len(teams) * 2


def _post_silence(am: Alertmanager, matchers: list[dict[str, Any]], comment: str) -> str:
    now = datetime.now(UTC)
    body = {
        "matchers": matchers,
        "startsAt": (now - timedelta(minutes=1)).isoformat(),
        "endsAt": (now + timedelta(hours=1)).isoformat(),
        "createdBy": "oncall@example",
        "comment": comment,
    }
    response = httpx.post(f"{am.url}/api/v2/silences", json=body, timeout=10)
    assert response.status_code == 200, response.text
    return str(response.json()["silenceID"])


def test_alertmanager_pages_owners_informs_job_teams_escalates_unsilenced_pages_and_inhibits(
    tmp_path: Path,
    amtool: str,
    hooks: Webhooks,
    start_alertmanager: Callable[[Path], Alertmanager],
) -> None:
    config, router = _render(tmp_path, amtool, hooks.url)
    am = start_alertmanager(config)
    # Acknowledged before it fires: rank 3's hang is silenced (every copy of it).
    silence_id = _post_silence(
        am,
        [{"name": "rank", "value": "3", "isRegex": False, "isEqual": True}],
        "ack: rank 3 is being drained",
    )
    records = [
        # A hardware fault on llm-pretrain's job: infrastructure operations is paged, the team informed.
        _record("xid_error", "infra", "critical", "llm-pretrain", job_id="j1", node="n1", gpu_uuid="GPU-1"),
        # Its symptom on the same GPU: inhibited in Alertmanager by the rendered inhibit rules.
        _record(
            "straggler",
            "platform",
            "warning",
            "llm-pretrain",
            job_id="j1",
            node="n1",
            gpu_uuid="GPU-1",
            rank=0,
        ),
        # Two hung ranks of vision's job: the platform is paged; rank 3 was acknowledged.
        _record("rank_hang", "platform", "critical", "vision", job_id="j2", node="n2", rank=1),
        _record("rank_hang", "platform", "critical", "vision", job_id="j2", node="n2", rank=3),
        # A model alert pages the job's own team.
        _record("nonfinite_loss", "model", "critical", "llm-research", job_id="j3"),
    ]
    copies = [copy for r in records for copy in _routed(router, r)]
    client = AlertmanagerClient(am.url)
    try:
        forwarder = AlertForwarder(client.post, resend_s=60, ui_url=UI)
        # The XID first: Alertmanager's inhibitor learns of a source asynchronously, and a symptom
        # posted with it may be flushed before (the engine's inhibited_by label covers that case).
        xid = [c for c in copies if c["rule"] == "xid_error"]
        assert forwarder.handle_batch(xid) == len(xid)
        hooks.wait(
            "the xid page", lambda: "xid_error" in {a["alertname"] for a in hooks.firing("infra-pager")}
        )
        rest = [c for c in copies if c["rule"] != "xid_error"]
        assert forwarder.handle_batch(rest) == len(rest)
    finally:
        client.close()

    def names(receiver: str) -> set[tuple[str, str]]:
        return {(a["alertname"], a.get("rank", "")) for a in hooks.firing(receiver)}

    hooks.wait("the xid page", lambda: ("xid_error", "") in names("infra-pager"))
    hooks.wait("the informed copy", lambda: ("xid_error", "") in names("llm-pretrain-chat"))
    hooks.wait("the model page", lambda: ("nonfinite_loss", "") in names("llm-research-pager"))
    hooks.wait("the hang page", lambda: ("rank_hang", "1") in names("platform-pager"))
    # Escalation after 4 s: the xid page and rank 1's hang, never rank 3 (silenced) nor an informed copy.
    hooks.wait(
        "the escalations",
        lambda: {("xid_error", ""), ("rank_hang", "1"), ("nonfinite_loss", "")} <= names("escalation-pager"),
    )
    escalated = hooks.firing("escalation-pager")
    assert ("rank_hang", "3") not in names("escalation-pager") and ("rank_hang", "3") not in names(
        "platform-pager"
    )
    assert all(a["receiver"].endswith("-pager") for a in escalated), escalated
    assert all(a["team"] != "llm-pretrain" for a in escalated)
    # The runbook link Alertmanager shows is absolute: the UI serves /runbooks/<rule>.
    xid = next(a for a in hooks.firing("infra-pager") if a["alertname"] == "xid_error")
    assert xid["_runbook"] == f"{UI}/runbooks/xid_error"
    # The straggler on the faulty GPU is inhibited, so nobody was notified of it.
    assert all(a["alertname"] != "straggler" for name, _ in hooks.received for a in hooks.firing(name))
    held = AlertmanagerClient(am.url)
    try:
        straggler = [a for a in held.alerts() if a["labels"]["alertname"] == "straggler"]
    finally:
        held.close()
    assert straggler and all(a["status"]["inhibitedBy"] for a in straggler), straggler

    # The silence and what it mutes, read back as the UI does.
    report = read_silences(am.url)
    (active,) = report.active()
    assert active.id == silence_id and active.comment == "ack: rank 3 is being drained"
    assert active.created_by == "oncall@example" and active.matchers == (("rank", "=", "3"),)
    hang3 = [c for c in copies if c["rule"] == "rank_hang" and c["rank"] == 3]
    hang1 = [c for c in copies if c["rule"] == "rank_hang" and c["rank"] == 1]
    assert hang3 and all(report.silenced_by(c) == (silence_id,) for c in hang3)
    assert hang1 and all(report.silenced_by(c) == () for c in hang1)


def _edge_identity(rule: str, i: int, node: str) -> dict[str, Any]:
    """Where `rule`'s detector puts its alert, on pair i's own node (tests/unit/streams/test_inhibition_graph.py)."""
    gpu = {"node": node, "gpu_uuid": f"GPU-{node}-3", "gpu_index": 3}
    if rule in ("xid_error", "ecc_uncorrectable", "gpu_throttling"):
        return gpu
    if rule in ("straggler", "rank_hang", "gpu_imbalance", "rank_failed"):
        return {**gpu, "rank": 3}
    if rule in ("host_memory_pressure", "telemetry_missing", "network_degradation"):
        return {"node": node}
    return {}


def test_alertmanager_mutes_each_edge_of_the_graph_and_nothing_out_of_it(
    tmp_path: Path,
    amtool: str,
    hooks: Webhooks,
    start_alertmanager: Callable[[Path], Alertmanager],
) -> None:
    """Every cause -> symptom pair of the shipped graph, each in its own job on its own node: the rendered
    rules inhibit the symptom in Alertmanager; the same symptom alone (another job and node) pages; and a
    symptom the engine muted (label inhibited_by) notifies nobody even with no cause in Alertmanager."""
    config, router = _render(tmp_path, amtool, hooks.url)
    am = start_alertmanager(config)
    pairs = [(c, s) for rule in router.inhibit_rules for c in rule.causes for s in rule.symptoms]
    assert len(pairs) >= 20
    causes, records, symptoms, alone = [], [], [], []
    for i, (cause, symptom) in enumerate(pairs):
        job, node = f"j{i}", f"n{i}"
        causes.append(
            _record(cause, "infra", "critical", "llm-pretrain", job_id=job, **_edge_identity(cause, i, node))
        )
        sym = _record(
            symptom, "platform", "warning", "llm-pretrain", job_id=job, **_edge_identity(symptom, i, node)
        )
        lone = _record(
            symptom,
            "platform",
            "warning",
            "llm-pretrain",
            job_id=f"{job}-alone",
            **_edge_identity(symptom, i, f"{node}a"),
        )
        records += [sym, lone]
        symptoms.append(sym["fingerprint"])
        alone.append(lone["fingerprint"])
    engine_muted = _record("throughput_drop", "platform", "warning", "llm-pretrain", job_id="jm") | {
        "inhibited_by": "id-of-a-resolved-stall"
    }
    records.append(engine_muted)
    client = AlertmanagerClient(am.url)
    try:
        forwarder = AlertForwarder(client.post, resend_s=60, ui_url=UI)

        def notified() -> set[str]:
            return {a["labels"]["fingerprint"] for _, body in hooks.received for a in body["alerts"]}

        # Causes first: Alertmanager's inhibitor learns of a source asynchronously, so a symptom that
        # arrives with its cause in one post may be flushed before (the engine's label covers that case).
        forwarder.handle_batch([copy for r in causes for copy in _routed(router, r)])
        hooks.wait("every cause", lambda: {r["fingerprint"] for r in causes} <= notified())
        forwarder.handle_batch([copy for r in records for copy in _routed(router, r)])

        def status() -> dict[str, list[list[str]]]:
            out: dict[str, list[list[str]]] = {}
            for a in client.alerts():
                out.setdefault(a["labels"]["fingerprint"], []).append(a["status"]["inhibitedBy"])
            return out

        # Every lone symptom pages (so Alertmanager has flushed its groups) and every paired one is inhibited.
        try:
            hooks.wait("every symptom without its cause", lambda: set(alone) <= notified())
        except AssertionError:
            raise AssertionError(f"never notified: {sorted(set(alone) - notified())}") from None
        deadline = time.monotonic() + 60
        while not all(all(s) for fp in symptoms for s in status().get(fp, [[]])):
            assert time.monotonic() < deadline, {fp: status().get(fp) for fp in symptoms}
            time.sleep(0.2)
        held = status()
    finally:
        client.close()
    assert all(held[fp] and all(held[fp]) for fp in symptoms)
    assert all(held[fp] and not any(held[fp]) for fp in alone), {fp: held[fp] for fp in alone}
    assert not set(symptoms) & notified(), sorted(set(symptoms) & notified())
    muted = {name for name, body in hooks.received for a in body["alerts"] if a["labels"]["job"] == "jm"}
    assert muted == set(), muted


def test_a_straggler_under_a_throttling_that_fired_first_notifies_nobody_however_often_refreshed(
    tmp_path: Path,
    amtool: str,
    hooks: Webhooks,
    start_alertmanager: Callable[[Path], Alertmanager],
) -> None:
    """Issue 34.3 end to end, with both firing together: the engine's own records of a thermal
    straggler whose gpu_throttling fired first (an offline replay routed by the rendered routing,
    refreshed while they fire) go through the forwarder into a real Alertmanager in the order the
    engine wrote them. The throttling pages infrastructure operations; the straggler, muted from its
    first record, notifies nobody, and Alertmanager holds one suppressed alert per routed copy
    however often it was refreshed (the same labels: an update, not another alert)."""
    from ranksight.evaluation import run_scenario
    from streams.config import load_config
    from tests.unit.streams.test_inhibition_live import FAST_THROTTLE, THROTTLED_FIRST

    config, router = _render(tmp_path, amtool, hooks.url)
    am = start_alertmanager(config)
    scenario = tmp_path / "throttled_first.yaml"
    scenario.write_text(THROTTLED_FIRST)
    alerts = run_scenario(scenario, 0, load_config(None, FAST_THROTTLE), router).alerts
    # The incident while both fire: the engine's records up to the first resolution (the fault lasts
    # to the end of the recording), in its order.
    first_end = next((i for i, a in enumerate(alerts) if a["status"] == "resolved"), len(alerts))
    records = alerts[:first_end]
    throttling = next(a for a in records if a["rule"] == "gpu_throttling")
    straggler = [a for a in records if a["rule"] == "straggler"]
    copies = {(a["team"], a["receiver"]) for a in straggler}
    assert len(straggler) > len(copies), "the straggler is refreshed while it fires"
    assert {a["inhibited_by"] for a in straggler} == {throttling["alert_id"]}  # muted from its first record
    pager = next(
        a["receiver"] for a in records if a["rule"] == "gpu_throttling" and a["receiver"].endswith("-pager")
    )
    # A straggler of another job with no cause: it pages, which shows Alertmanager flushed its groups.
    lone = _record("straggler", "platform", "warning", "llm-pretrain", job_id="j-lone", node="n9", rank=2)
    client = AlertmanagerClient(am.url)
    try:
        forwarder = AlertForwarder(client.post, resend_s=60, ui_url=UI)
        for _, batch in itertools.groupby(records, key=lambda a: a["ts"]):
            forwarder.handle_batch(list(batch))
        forwarder.handle_batch(_routed(router, lone))
        hooks.wait(
            "the throttling page", lambda: "gpu_throttling" in {a["alertname"] for a in hooks.firing(pager)}
        )
        hooks.wait(
            "the lone straggler",
            lambda: any(
                a.get("job") == "j-lone"
                for _, body in hooks.received
                for a in [x["labels"] for x in body["alerts"]]
            ),
        )
        held = [
            a
            for a in client.alerts()
            if a["labels"]["alertname"] == "straggler" and a["labels"].get("job") != "j-lone"
        ]
    finally:
        client.close()
    notified = [
        a["labels"]
        for _, body in hooks.received
        for a in body["alerts"]
        if a["labels"]["alertname"] == "straggler"
    ]
    assert all(labels.get("job") == "j-lone" for labels in notified), notified
    assert len(held) == len(copies), held
    assert all(a["status"]["state"] == "suppressed" for a in held), held
    assert {a["labels"]["inhibited_by"] for a in held} == {throttling["alert_id"]}
