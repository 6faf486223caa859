"""Operating from the pages (issues 20.4 and 22): a muted alert folds under its cause, each routed copy
says whether it paged or informed its team, remediation decisions show on the job and alert pages, and
Alertmanager's silences (a real Debian Alertmanager) show on the fleet page, which survives it being down.

The store is a database of its own in the package's chDB engine: a 16-rank job from
`bench/bench_ui.py`'s generator plus the alerts and decisions written here, hostile strings included.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import clickhouse_connect
import httpx
import pytest
import yaml
from clickhouse_connect.driver.client import Client

from bench.bench_ui import START, fill_job
from ranksight.commands.ui import receiver_kinds, silence_reader
from sinks.ddl import migrate
from tests.integration.alerting.conftest import Alertmanager, start_alertmanager  # noqa: F401 (fixture)
from tests.integration.ui.conftest import READY, UiStore, needs_chromium
from ui.server import UiServer

DATABASE = "ui_operations"
JOB = "ops-16"
HOSTILE = "<img src=x onerror=window.__pwned=1>'); DROP TABLE actions; --"
WIDTHS = (1280, 390)
MUTED = "straggler, muted by gpu_throttling on the same GPU"


def _alert(
    client: Client, alert_id: str, rule: str, team: str, receiver: str, starts_s: int = 650, **fields: Any
) -> None:
    """One alert record (one routed copy) of the job, on rank 5's GPU (node-0000, GPU 5), firing."""
    row = {
        "alert_id": alert_id,
        "fingerprint": f"fp-{alert_id}",
        "rule": rule,
        "category": "platform",
        "severity": "warning",
        "status": "firing",
        "team": team,
        "receiver": receiver,
        "summary": f"{rule} on rank 5 {HOSTILE}",
        "job_id": JOB,
        "run_id": f"{JOB}-r0",
        "cluster": "bench",
        "node": "node-0000",
        "rank": 5,
        "gpu_index": 5,
        "invariant": "",
        "suspected_layer": "gpu",
        "history_metric": "score",
        "runbook_url": f"docs/runbooks/{rule}",
        "inhibited_by": None,
    } | fields
    columns = ", ".join(row)
    placeholders = ", ".join(
        f"{{{k}:Nullable(String)}}"
        if k == "inhibited_by"
        else f"{{{k}:String}}"
        if isinstance(v, str)
        else f"{{{k}:Int32}}"
        for k, v in row.items()
    )
    client.command(
        f"INSERT INTO alerts (ts, starts_at, owner, model_version, dataset_version, workload_family, {columns}) "
        f"SELECT toDateTime64('{START}', 3, 'UTC') + toIntervalSecond(800), toDateTime64('{START}', 3, 'UTC') "
        f"+ toIntervalSecond({int(starts_s)}), 'bench', 'v1', 'd1', 'llama', {placeholders}",
        parameters=row,
    )


@pytest.fixture(scope="module")
def ops_client(ui_store: UiStore) -> Iterator[Client]:
    """A database with the job, a gpu_throttling cause muting a straggler, a zombie_job and its decisions."""
    ui_store.client.command(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    client = clickhouse_connect.get_client(dsn=ui_store.dsn, database=DATABASE)
    migrate(client, ttl_days=None)
    fill_job(client, 16, 0.25, step_s=5, sample_s=10, straggler=5, job=JOB)
    # Routed as the shipped ownership does: the owner paged, the job's team informed.
    for team, receiver in (
        ("infrastructure-operations", "infra-pager"),
        ("llm-pretrain", "llm-pretrain-chat"),
    ):
        _alert(client, "cause-1", "gpu_throttling", team, receiver, starts_s=700, category="infra")
    for team, receiver in (("platform", "platform-pager"), ("llm-pretrain", "llm-pretrain-chat")):
        # The symptom fired first (560 s), its cause later (700 s): listed by time they would be rows apart.
        _alert(client, "sym-1", "straggler", team, receiver, starts_s=560, inhibited_by="cause-1")
    _alert(
        client, "zj-1", "zombie_job", "platform", "platform-pager", severity="critical", rank=0, gpu_index=0
    )
    for i, (decision, code, reason) in enumerate(
        (
            ("skipped", "operation_open", f"a checkpoint is open {HOSTILE}"),
            ("dry_run", "dry_run", "would cancel the job: dry run (pass --execute to act)"),
        )
    ):
        client.command(
            "INSERT INTO actions (ts, action_id, alert_id, fingerprint, rule, job_id, run_id, team, cluster, "
            "scheduler, target, action, decision, reason_code, reason, dry_run, severity, checkpoint_age_s, detail) "
            f"SELECT toDateTime64('{START}', 3, 'UTC') + toIntervalSecond({800 + 60 * i}), {{id:String}}, 'zj-1', "
            f"'fp-zj-1', 'zombie_job', '{JOB}', '{JOB}-r0', 'llm-pretrain', 'bench', 'slurm', '4242', 'cancel', "
            "{decision:String}, {code:String}, {reason:String}, true, 'critical', 420, {detail:String}",
            parameters={
                "id": f"act-{i}",
                "decision": decision,
                "code": code,
                "reason": reason,
                "detail": f"scancel 4242 {HOSTILE}",
            },
        )
    # Faults: rank 3 ran out of CUDA memory, rank 7 exited; GPU 2 of node-0000 reported XID 79 twice.
    client.command(
        "INSERT INTO rank_faults (ts, job_id, run_id, rank, node, kind, detail, exit_code) VALUES "
        f"(toDateTime64('{START}', 3, 'UTC') + toIntervalSecond(600), '{JOB}', '{JOB}-r0', 3, 'node-0000', "
        "'cuda_oom', {detail:String}, NULL), "
        f"(toDateTime64('{START}', 3, 'UTC') + toIntervalSecond(610), '{JOB}', '{JOB}-r0', 7, 'node-0000', 'exit', '', 137)",
        parameters={"detail": f"CUDA out of memory {HOSTILE}"},
    )
    client.command(
        "INSERT INTO gpu_samples (ts, cluster, node, gpu_index, gpu_uuid, xid, ecc_uncorrected) SELECT "
        f"toDateTime64('{START}', 3, 'UTC') + toIntervalSecond(500 + 10 * number), 'bench', 'node-0000', 2, 'GPU-2', "
        "79, 0 FROM numbers(2)"
    )
    yield client
    ui_store.client.command(f"DROP DATABASE IF EXISTS {DATABASE}")


@pytest.fixture(scope="module")
def ops_url(ops_client: Client) -> Iterator[str]:
    """The UI over that database, told the shipped ownership file's receivers."""
    server = UiServer(ops_client, "127.0.0.1", 0, receivers=receiver_kinds())
    yield server.start()
    server.stop()


def test_the_fleet_and_job_answers_fold_a_muted_alert_under_its_cause(ops_url: str) -> None:
    """The straggler carries its cause and scope, the cause what it mutes; the job's firing count leaves it out;
    each copy says paged or informed."""
    with httpx.Client(base_url=ops_url, timeout=60) as http:
        fleet = http.get("/api/fleet").json()
        job = http.get(f"/api/jobs/{JOB}").json()
        alert = http.get("/api/alerts/sym-1").json()["alert"]
        cause = http.get("/api/alerts/cause-1").json()["alert"]
    firing = {a["alert_id"]: a for a in fleet["firing"]}
    assert firing["sym-1"]["muted_by"] == {
        "alert_id": "cause-1",
        "rule": "gpu_throttling",
        "scope": "on the same GPU",
    }
    assert firing["cause-1"]["mutes"] == ["sym-1"] and firing["cause-1"]["muted_by"] is None
    # fill_job's five stragglers on rank 137 (not of this job's 16 ranks), the cause; never the muted one.
    (ops,) = [j for j in fleet["jobs"] if j["job_id"] == JOB]
    assert ops["firing"] == {"critical": 1, "warning": 6, "info": 0}
    assert {a["alert_id"]: a["muted_by"] for a in job["alerts"]}["sym-1"]["rule"] == "gpu_throttling"
    assert firing["sym-1"]["copies"] == [
        {"team": "llm-pretrain", "receiver": "llm-pretrain-chat", "kind": "informed"},
        {"team": "platform", "receiver": "platform-pager", "kind": "paged"},
    ]
    assert [(c["team"], c["kind"], c["status"]) for c in alert["copies"]] == [
        ("llm-pretrain", "informed", "firing"),
        ("platform", "paged", "firing"),
    ]
    assert alert["muted_by"]["rule"] == "gpu_throttling" and cause["mutes"] == [
        {"alert_id": "sym-1", "rule": "straggler"}
    ]
    # Faults of the job's ranks and GPUs.
    assert [(f["rank"], f["kind"], f["exit_code"]) for f in job["faults"]["ranks"]] == [
        (3, "cuda_oom", None),
        (7, "exit", 137),
    ]
    assert [(g["node"], g["gpu_index"], g["xids"], g["xid_samples"]) for g in job["faults"]["gpus"]] == [
        ("node-0000", 2, [79], 2)
    ]
    # Remediation decisions: on the job page and on their alert's page, oldest first.
    assert [(a["decision"], a["reason_code"]) for a in job["actions"]] == [
        ("skipped", "operation_open"),
        ("dry_run", "dry_run"),
    ]


# Text lying loose in the page's root (what `replaceChildren(null)` leaves: "null").
_STRAY_TEXT = "() => [...document.getElementById('app').childNodes].filter(n => n.nodeType === 3).map(n => n.textContent)"


def _open(browser: Any, url: str, width: int) -> Any:
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.goto(url)
    page.wait_for_function(READY, timeout=60_000)
    assert page.evaluate("() => window.ranksight.error") is None
    return page


def _close(page: Any) -> None:
    assert page.evaluate("() => window.__pwned") is None  # no record string ran as markup
    assert not page.errors, page.errors
    page.context.close()


@needs_chromium
@pytest.mark.parametrize("width", WIDTHS)
def test_pages_show_the_straggler_under_its_cause_who_was_paged_and_what_remediation_did(
    ops_url: str, browser: Any, width: int
) -> None:
    """Fleet and job tables: the straggler's row right under gpu_throttling's, saying why; the alert page: each
    copy paged or informed, the cause, the decisions; the job page: the remediation panel."""
    page = _open(browser, ops_url, width)
    rows = page.eval_on_selector_all("table.alerts tr[data-alert]", "rows => rows.map(r => r.dataset.alert)")
    assert rows.index("sym-1") == rows.index("cause-1") + 1
    assert page.inner_text("tr[data-alert='sym-1'] .muted-by") == MUTED
    assert page.locator("tr[data-alert='sym-1'] .fold").count() == 1
    kinds = page.eval_on_selector_all(
        "tr[data-alert='sym-1'] .copy",
        "cs => cs.map(c => [c.querySelector('strong').textContent, c.dataset.kind])",
    )
    assert kinds == [["llm-pretrain", "informed"], ["platform", "paged"]]
    assert page.inner_text("h2 >> nth=0").startswith("Firing (7, 1 muted under their cause)")
    # No Alertmanager configured: no silences panel, and no stray "null" where it would be.
    assert page.evaluate(_STRAY_TEXT) == []
    _close(page)

    page = _open(browser, f"{ops_url}jobs/{JOB}", width)
    rows = page.eval_on_selector_all("table.alerts tr[data-alert]", "rows => rows.map(r => r.dataset.alert)")
    assert rows.index("sym-1") == rows.index("cause-1") + 1
    assert page.inner_text("tr[data-alert='sym-1'] .muted-by") == MUTED
    decisions = page.eval_on_selector_all("#actions tr[data-action]", "rs => rs.map(r => r.dataset.decision)")
    assert decisions == ["skipped", "dry_run"]
    assert HOSTILE in page.inner_text("#actions")
    assert page.eval_on_selector_all("#faults tr[data-kind]", "rs => rs.map(r => r.dataset.kind)") == [
        "cuda_oom",
        "exit",
    ]
    assert f"CUDA out of memory {HOSTILE}" in page.inner_text("#faults")
    # The header counts the muted straggler apart, as the fleet does.
    assert page.inner_text("h1 .badge") == "7 firing (1 muted)"
    if width >= 1280:
        # Two routed copies and a hostile summary wrap in their cells: the alerts table fits the page.
        assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    assert page.eval_on_selector_all("#faults tr[data-gpu]", "rs => rs.map(r => r.dataset.gpu)") == [
        "node-0000/2"
    ]
    _close(page)

    page = _open(browser, f"{ops_url}alerts/sym-1", width)
    copies = page.eval_on_selector_all(
        "table.copies tr[data-team]", "rs => rs.map(r => [r.dataset.team, r.dataset.kind])"
    )
    assert copies == [["llm-pretrain", "informed"], ["platform", "paged"]]
    assert page.inner_text("#muted-by") == MUTED
    _close(page)
    page = _open(browser, f"{ops_url}alerts/zj-1", width)
    assert page.eval_on_selector_all("#alert-actions tr[data-action]", "rs => rs.length") == 2
    assert "scancel 4242" in page.inner_text("#alert-actions")
    _close(page)


def _alertmanager_config(path: Path) -> Path:
    path.write_text(yaml.safe_dump({"route": {"receiver": "nobody"}, "receivers": [{"name": "nobody"}]}))
    return path


@needs_chromium
def test_the_fleet_page_shows_alertmanagers_silences_and_survives_it_being_down(
    ops_client: Client,
    browser: Any,
    tmp_path: Path,
    start_alertmanager: Callable[[Path], Alertmanager],  # noqa: F811
) -> None:
    """A silence made in a real Alertmanager on the straggler's copy: listed on the fleet page with its comment,
    the straggler's row marked silenced; an Alertmanager that does not answer is one sentence, the rest renders."""
    am = start_alertmanager(_alertmanager_config(tmp_path / "am.yml"))
    now = datetime.now(UTC)
    labels = {"alertname": "straggler", "fingerprint": "fp-sym-1", "team": "platform", "job_id": JOB}
    posted = httpx.post(
        f"{am.url}/api/v2/alerts", json=[{"labels": labels, "startsAt": now.isoformat()}], timeout=10
    )
    assert posted.status_code == 200, posted.text
    silence = httpx.post(
        f"{am.url}/api/v2/silences",
        json={
            "matchers": [{"name": "fingerprint", "value": "fp-sym-1", "isRegex": False, "isEqual": True}],
            "startsAt": (now - timedelta(minutes=1)).isoformat(),
            "endsAt": (now + timedelta(hours=1)).isoformat(),
            "createdBy": "oncall@example",
            "comment": f"ack: draining node-0000 {HOSTILE}",
        },
        timeout=10,
    )
    assert silence.status_code == 200, silence.text
    silence_id = silence.json()["silenceID"]
    # Wait until Alertmanager itself says the alert is silenced (a condition polled, generous deadline).
    deadline = time.monotonic() + 60
    while not any(
        silence_id in (a.get("status") or {}).get("silencedBy", [])
        for a in httpx.get(f"{am.url}/api/v2/alerts", timeout=10).json()
    ):
        assert time.monotonic() < deadline, f"Alertmanager never silenced the alert:\n{am.logs()}"
        time.sleep(0.1)
    up = UiServer(ops_client, "127.0.0.1", 0, silences=silence_reader(am.url))
    down = UiServer(ops_client, "127.0.0.1", 0, silences=silence_reader("http://127.0.0.1:9"))
    try:
        url = up.start()
        answer = httpx.get(f"{url}api/fleet/silences", timeout=30).json()
        assert answer["silenced"] == {"fp-sym-1": [silence_id]} and answer["error"] is None, json.dumps(
            answer
        )
        page = _open(browser, url, 1280)
        page.wait_for_function("() => window.ranksight.silencesReady === true", timeout=60_000)
        assert page.eval_on_selector_all(
            "#silences tr[data-silence]", "rs => rs.map(r => r.dataset.silence)"
        ) == [silence_id]
        assert f"ack: draining node-0000 {HOSTILE}" in page.inner_text("#silences")
        assert page.inner_text("tr[data-alert='sym-1'] .badge.silenced") == "silenced"
        _close(page)

        page = _open(browser, down.start(), 1280)
        page.wait_for_function("() => window.ranksight.silencesReady === true", timeout=60_000)
        assert page.inner_text("#silences").startswith("Alertmanager: ")
        assert page.locator("tr[data-alert='sym-1']").count() == 1  # the fleet still renders
        _close(page)
    finally:
        up.stop()
        down.stop()
