"""Record strings are data: hostile values in every string field, published to Kafka, stored by
`ranksight serve`, then read back through every endpoint of its UI and shown in a real browser.

Three jobs come from one simulated incident, each with every string of every record (ids, node
and cluster names, teams, summaries, reasons, map keys and values, the runbook link) rewritten:
- `xss`: script payloads (`<img src=x onerror=...>`, `</script><script>...`, a `javascript:` link);
- `sql`: `%`, `%(x)s`, `{x:String}`, quotes, backslashes and unicode (the SQL the UI builds);
- `long`: 10 kB in the job's descriptive strings and the alert ids (300 more characters on ids).
The UI runs in its own process (`serve` owns its chDB store); the tests wait on its row counts.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.errors import KafkaSetupError
from infra.kafka.topics import create_topics, delete_topics, prefixed
from producers.publisher import open_publisher
from producers.simulator import load_scenario, simulate
from ranksight.commands.report import detected
from schemas.records import Event, default_schemas
from tests.integration.ui.conftest import READY, needs_chromium

pytestmark = needs_chromium

# What a script payload would do if it ran: set this flag, open a dialog, or fetch `x`.
XSS = '<img src=x onerror="window.__xss=1;alert(1)"></script><script>window.__xss=2;alert(2)</script>'
SQL = "%_%(x)s_{x:String}_'\"\\_'); DROP TABLE steps; --_ü✓漢"
LONG = "x" * 10_000
# Fields on every high-volume record: they stay identifiers of moderate length in the `long` job.
_IDS = {"job_id", "run_id", "node", "cluster", "gpu_uuid", "nodes", "job_ids"}
_BULK = {
    "GpuSample",
    "HostSample",
    "StepCompleted",
    "DataLoaderSample",
    "CollectiveSample",
    "RankWindowStats",
}
SCENARIO = "straggler_gpu"


def _rewrite(variant: str, record_type: str, field: str, value: str) -> str:
    if variant == "xss":
        return "javascript:window.__xss=3;alert(3)" if field == "runbook_url" else f"{XSS}{value}"
    if variant == "sql":
        return f"{SQL}{value}"
    if field == "alert_id":
        return f"{value}{LONG}"
    if field in _IDS:
        return f"{value}{'y' * 300}"
    return value if record_type in _BULK else f"{value}{LONG}"


def _string_fields(schema: Any) -> dict[str, str]:
    """Field name -> how strings sit in it: `str`, `array` (of strings), `map` (string keys, maybe values)."""
    out = {}
    for field in schema["fields"]:
        kinds = field["type"] if isinstance(field["type"], list) else [field["type"]]
        for kind in kinds:
            if kind == "string":
                out[field["name"]] = "str"
            elif isinstance(kind, dict) and kind.get("type") == "array" and kind.get("items") == "string":
                out[field["name"]] = "array"
            elif isinstance(kind, dict) and kind.get("type") == "map":
                out[field["name"]] = "map_str" if kind.get("values") == "string" else "map"
    return out


def hostile(events: list[Event], variant: str) -> list[Event]:
    """The events with every string field (and map key) rewritten; the same string always the same way."""
    fields = {name: _string_fields(r.json) for name, r in default_schemas().records.items()}
    out = []
    for event in events:
        record = dict(event.record)
        for name, kind in fields[event.type].items():
            value = record.get(name)
            if value is None:
                continue
            rw: Callable[[str], str] = lambda s, n=name, t=event.type: _rewrite(variant, t, n, s)  # noqa: E731
            if kind == "str":
                record[name] = rw(value)
            elif kind == "array":
                record[name] = [rw(v) for v in value]
            elif kind == "map_str":
                record[name] = {rw(k): rw(v) for k, v in value.items()}
            else:
                record[name] = {rw(k): v for k, v in value.items()}
        out.append(Event(event.type, record))
    return out


@dataclass(frozen=True)
class HostileUi:
    """The served UI and what was published to it, by variant."""

    url: str
    jobs: dict[str, str]
    events: dict[str, list[Event]]
    tmp: Path

    def alerts(self, variant: str) -> dict[str, list[dict[str, Any]]]:
        """The published alert records of a variant, by alert id, in publication order."""
        out: dict[str, list[dict[str, Any]]] = {}
        for event in self.events[variant]:
            if event.type == "Alert":
                out.setdefault(event.record["alert_id"], []).append(event.record)
        return out


def _lines(stream: Any, into: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):
        into.put(line)


@pytest.fixture(scope="module")
def hostile_ui(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileUi]:
    """`ranksight serve` on a fresh store, fed through Kafka with the three hostile copies of one incident."""
    tmp = tmp_path_factory.mktemp("hostile")
    # Recent event times (the sink bounds them by the Kafka time); the job completes before the end.
    start = (int(time.time()) // 60 - 12) * 60_000
    # Compressed to 8 minutes: the straggler fires and resolves, checkpoints and evaluations happen.
    scenario = load_scenario(SCENARIO).with_overrides(duration=8 * 60, start_ms=start)
    scenario = replace(
        scenario,
        jobs=tuple(
            replace(
                j,
                end=7.5 * 60,
                checkpoint=replace(j.checkpoint, every=150.0),
                evaluation=replace(j.evaluation, every_steps=150),
            )
            for j in scenario.jobs
        ),
        faults=tuple(replace(f, start=120.0, duration=180.0) for f in scenario.faults),
    )
    clean = list(detected(simulate(scenario, 0).events()))
    assert any(e.type == "Alert" for e in clean), "the incident raised no alert to show"
    events = {v: hostile(clean, v) for v in ("xss", "sql", "long")}
    jobs = {v: next(e.record["job_id"] for e in evs if e.type == "JobStarted") for v, evs in events.items()}

    prefix = f"h{os.getpid()}{int(time.time()) % 100_000}."
    create_topics(kafka_bootstrap, prefix=prefix)
    publisher = open_publisher(
        "kafka",
        kafka_conf={"bootstrap.servers": kafka_bootstrap},
        topic_prefix=prefix,
        spool_dir=tmp / "spool",
    )
    for evs in events.values():
        for event in evs:
            publisher.publish(event)
    assert publisher.flush(120) == 0
    publisher.close()
    published = Counter(e.type for evs in events.values() for e in evs)

    env = {k: v for k, v in os.environ.items() if k != "CLICKHOUSE_URL"}
    env.update(
        KAFKA_BOOTSTRAP=kafka_bootstrap, RANKSIGHT_TOPIC_PREFIX=prefix, RANKSIGHT_HOME=str(tmp / "home")
    )
    cli = [sys.executable, "-m", "ranksight.cli", "serve", "--port", "0", "--batch-interval", "0.2"]
    process = subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(process.stderr, lines), daemon=True).start()
    try:
        url = None
        deadline = time.monotonic() + 180
        while url is None and time.monotonic() < deadline:
            match = re.search(r"UI on (http://\S+/)", lines.get(timeout=180))
            url = match.group(1) if match else None
        assert url, "serve never said where its UI is"
        # Progress, not time: every published row of each table the pages read is stored.
        want = {
            "steps": published["StepCompleted"],
            # alerts is a ReplacingMergeTree on (team, fingerprint, alert_id, status): merges fold repeats.
            "alerts": len(
                {
                    (r["team"], r["fingerprint"], r["alert_id"], r["status"])
                    for evs in events.values()
                    for r in (e.record for e in evs if e.type == "Alert")
                }
            ),
            "job_started": published["JobStarted"],
            "job_states": published["JobStateChanged"],
            "gpu_samples": published["GpuSample"],
            "host_samples": published["HostSample"],
            "rank_bound": published["RankBound"],
            "checkpoints": published["CheckpointEvent"],
            "derived_rank_windows": published["RankWindowStats"],
        }
        stored: dict[str, int] = {}
        with httpx.Client(timeout=60) as http:
            while time.monotonic() < deadline:
                stored = http.get(f"{url}api/version").json()
                if all(stored.get(t, 0) >= n for t, n in want.items()):
                    break
                time.sleep(0.5)
        assert all(stored.get(t, 0) >= n for t, n in want.items()), (stored, want)
        yield HostileUi(url, jobs, events, tmp)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        with contextlib.suppress(KafkaSetupError):
            delete_topics(kafka_bootstrap, prefixed(prefix).values())


def _path(*parts: str) -> str:
    return "/".join(urllib.parse.quote(p, safe="") for p in parts)


def _no_sql(text: str) -> None:
    for word in ("SELECT", "FROM steps", "DB::Exception", "Traceback"):
        assert word not in text, f"{word!r} in a response: {text[:300]}"


def test_every_endpoint_answers_hostile_values_as_stored(hostile_ui: HostileUi) -> None:
    """Every page and API answers 200 for each hostile job and alert, with the strings exactly as published."""
    with httpx.Client(base_url=hostile_ui.url, timeout=120) as http:

        def get(path: str, **params: Any) -> httpx.Response:
            response = http.get(path, params=params or None)
            assert response.status_code == 200, (path[:200], response.status_code, response.text[:300])
            assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")
            assert "'unsafe-inline'" not in response.headers["Content-Security-Policy"].split("style-src")[0]
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            return response

        fleet = get("/api/fleet").json()
        listed = {j["job_id"]: j for j in fleet["jobs"]}
        assert set(hostile_ui.jobs.values()) <= set(listed)
        goodput = get("/api/fleet/goodput").json()
        get("/api/version")
        for variant, job_id in hostile_ui.jobs.items():
            started = next(e.record for e in hostile_ui.events[variant] if e.type == "JobStarted")
            assert (
                listed[job_id]["team"] == started["team"] and listed[job_id]["cluster"] == started["cluster"]
            )
            assert listed[job_id]["last_step"] is not None and job_id in goodput
            page = get("/" + _path("api", "jobs", job_id)).json()
            assert page["job"]["job_id"] == job_id and page["job"]["owner"] == started["owner"]
            nodes = sorted(started["nodes"])
            assert page["hosts"]["nodes"] == nodes and sorted({r["node"] for r in page["ranks"]}) == nodes
            assert [k[0] for k in page["gpus"]["keys"]] and {k[0] for k in page["gpus"]["keys"]} == set(nodes)
            assert page["gpus"]["cells"][0] and page["heatmap"]["cells"][0]  # the node lists matched rows
            assert page["hosts"]["cpu"][nodes[0]]
            assert page["states"][-1]["state"] == "completed"
            reason = next(
                e.record["reason"] for e in hostile_ui.events[variant] if e.type == "JobStateChanged"
            )
            assert reason in {s["reason"] for s in page["states"]}
            # Zoomed in: the raw tables answer (gpu_samples, steps), with the same node parameters.
            t0 = page["range"]["from_ms"] + 120_000
            zoom = get("/" + _path("api", "jobs", job_id), **{"from": t0, "to": t0 + 120_000}).json()
            assert zoom["gpus"]["source"] == "gpu_samples" and zoom["gpus"]["cells"][0]
            assert zoom["heatmap"]["source"] == "steps" and zoom["heatmap"]["cells"][0]
            compared = get("/api/compare", job=job_id).json()
            assert [r["job_id"] for r in compared["runs"]] == [job_id]
            assert compared["runs"][0]["config"]["model_name"] == started["model_name"]
            assert compared["series"][0]["step"] and compared["family"] == started["workload_family"]
            efficiency = get("/" + _path("api", "jobs", job_id, "efficiency")).json()
            assert efficiency is not None and efficiency["runs"] >= 1
            html = get("/" + _path("jobs", job_id)).text
            assert XSS not in html and "<img" not in html
            report = get("/" + _path("reports", "jobs", job_id))
            assert report.headers["Content-Disposition"].startswith('attachment; filename="ranksight-job-')
            assert "<img src=x" not in report.text
            (hostile_ui.tmp / f"job-{variant}.html").write_bytes(report.content)
            for n, (alert_id, records) in enumerate(hostile_ui.alerts(variant).items()):
                data = get("/" + _path("api", "alerts", alert_id)).json()
                alert = data["alert"]
                for key in (
                    "alert_id",
                    "rule",
                    "team",
                    "summary",
                    "owner",
                    "node",
                    "runbook_url",
                    "history_metric",
                ):
                    assert alert[key] in {r[key] for r in records}, key
                # (One alert may be published once per routed team: the page shows one of those records.)
                assert alert["labels"] in [r["labels"] for r in records]
                assert data["evidence"]["job"]["job_id"] == job_id
                assert get("/" + _path("alerts", alert_id)).status_code == 200
                report = get("/" + _path("reports", "alerts", alert_id))
                (hostile_ui.tmp / f"alert-{variant}-{n}.html").write_bytes(report.content)
        # Unknown things are 404 with one sentence, never the SQL behind it.
        for path in ("/api/jobs/" + _path(XSS + SQL), "/api/alerts/" + _path(SQL), "/runbooks/" + _path(XSS)):
            response = http.get(path)
            assert response.status_code == 404, path
            _no_sql(response.text)
            assert "<img" not in response.text or response.headers["Content-Type"].startswith(
                "application/json"
            )
        bad = http.get("/api/jobs/x", params={"from": "1%(x)s"})
        assert bad.status_code == 400
        _no_sql(bad.text)


def test_a_finished_jobs_panels_come_from_the_cache(hostile_ui: HostileUi) -> None:
    """The second read of a completed job's page is a cache hit with the same body; the fleet is never cached."""
    job_id = hostile_ui.jobs["sql"]
    path = "/" + _path("api", "jobs", job_id)
    with httpx.Client(base_url=hostile_ui.url, timeout=120) as http:
        first = http.get(path)
        second = http.get(path)
        assert first.status_code == second.status_code == 200
        assert first.headers["X-Ranksight-Cache"] in ("miss", "hit")
        assert second.headers["X-Ranksight-Cache"] == "hit"
        assert second.content == first.content
        assert http.get("/api/fleet").headers["X-Ranksight-Cache"] == "none"


# Run before any page script: whatever a payload would do is recorded, never lost.
_WATCH = """
window.__xss = 0;
window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
"""


class Watched:
    """A browser page whose dialogs, errors, CSP violations and requests for `x` are recorded."""

    def __init__(self, browser: Any, **context: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 900}, **context)
        self.context.add_init_script(_WATCH)
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.fetched_x: list[str] = []
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on(
            "request", lambda r: self.fetched_x.append(r.url) if r.url.rstrip("/").endswith("/x") else None
        )

    def open(self, url: str) -> None:
        self.page.goto(url)
        self.page.wait_for_function(READY, timeout=60_000)
        assert self.page.evaluate("() => window.ranksight.error") is None

    def assert_nothing_ran(self, where: str) -> None:
        assert self.dialogs == [], (where, self.dialogs)
        assert self.page.evaluate("() => window.__xss") == 0, where
        assert self.page.evaluate("() => window.__csp") == [], where
        assert self.page.evaluate("() => document.querySelectorAll('img[src=\"x\"]').length") == 0, where
        assert (
            self.page.evaluate(
                "() => [...document.querySelectorAll('a[href]')].filter(a => /^\\s*javascript:/i.test(a.getAttribute('href'))).length"
            )
            == 0
        ), where
        assert self.fetched_x == [] and self.errors == [], (where, self.fetched_x, self.errors)

    def hover_tooltips(self) -> list[str]:
        """Hover the middle of every chart's data (timeline bars, heatmap cells, lines): the tooltips' text."""
        texts: list[str] = []
        charts = self.page.evaluate("() => Object.keys(window.ranksight.charts)")
        for key in charts:
            points = self.page.evaluate(
                """(key) => {
                    const chart = window.ranksight.charts[key];
                    chart.getDom().scrollIntoView({ block: 'center' });
                    const box = chart.getDom().getBoundingClientRect();
                    const out = [];
                    (chart.getOption().series || []).forEach((s, i) => {
                      const data = s.data || [];
                      if (!data.length || out.length >= 3) return;
                      const d = data[Math.floor(data.length / 2)];
                      const v = Array.isArray(d) ? d : (d && d.value) || null;
                      if (!v) return;
                      const at = s.type === 'custom'
                        ? chart.convertToPixel({ gridIndex: 0 }, [(v[1] + v[2]) / 2, v[0]])
                        : chart.convertToPixel({ seriesIndex: i }, [v[0], v[1]]);
                      if (at && isFinite(at[0]) && isFinite(at[1])) out.push([box.left + at[0], box.top + at[1]]);
                    });
                    return out;
                }""",
                key,
            )
            for x, y in points:
                self.page.mouse.move(x, y)
                with contextlib.suppress(Exception):  # a line chart between two points may show none
                    self.page.wait_for_function(
                        "() => [...document.querySelectorAll('.tip')].some(t => t.offsetParent !== null)",
                        timeout=3_000,
                    )
                texts.extend(self.page.eval_on_selector_all(".tip", "tips => tips.map(t => t.textContent)"))
                self.page.mouse.move(1, 1)
        return texts


def test_no_script_runs_on_any_page_or_report_and_values_read_literally(
    hostile_ui: HostileUi, browser: Any
) -> None:
    """Fleet, job, alert, runbook pages and reports with script payloads everywhere: nothing runs, text is literal."""
    job_id = hostile_ui.jobs["xss"]
    node = next(e.record["node"] for e in hostile_ui.events["xss"] if e.type == "RankBound")
    tab = Watched(browser)
    tab.open(hostile_ui.url)
    assert job_id in tab.page.inner_text("#app")  # the job id, payload and all, as text
    assert (
        tab.page.eval_on_selector_all("tr[data-job]", "rows => rows.map(r => r.dataset.job)").count(job_id)
        == 1
    )
    tab.assert_nothing_ran("fleet")

    tab.open(hostile_ui.url + _path("jobs", job_id))
    assert f"job {job_id}" in tab.page.inner_text("h1")
    tips = tab.hover_tooltips()
    assert any(XSS in t for t in tips), tips[
        :5
    ]  # the alert bar's rule/summary, the nodes' lines, rank labels
    assert any(node in t for t in tips)
    tab.assert_nothing_ran("job page")

    for alert_id, records in hostile_ui.alerts("xss").items():
        tab.open(hostile_ui.url + _path("alerts", alert_id))
        text = tab.page.inner_text("#app")
        assert any(r["summary"] in text and r["fingerprint"] in text for r in records)
        assert "runbook: javascript:" in text  # shown, not linked
        assert any(XSS in t for t in tab.hover_tooltips())
        tab.assert_nothing_ran(f"alert page {alert_id[-20:]}")

    tab.open(f"{hostile_ui.url}compare?job={urllib.parse.quote(job_id, safe='')}")
    assert job_id in tab.page.inner_text("#app")
    assert any(job_id in t for t in tab.hover_tooltips())
    tab.assert_nothing_ran("compare page")

    tab.page.goto(hostile_ui.url + "runbooks/straggler")
    assert tab.page.locator("article.runbook h1").inner_text().startswith("straggler")
    tab.assert_nothing_ran("runbook")
    tab.context.close()

    # Reports open from file:// under their own policy: downloaded from the UI, and written from a
    # recording the way `ranksight report recording.avro` writes them (streamed, no store).
    from ui.report import report_from_events

    xss_events = hostile_ui.events["xss"]
    report_from_events(lambda: iter(xss_events), hostile_ui.tmp / "recording-xss-job.html", job_id=job_id)
    first_alert = next(iter(hostile_ui.alerts("xss")))
    report_from_events(
        lambda: iter(xss_events), hostile_ui.tmp / "recording-xss-alert.html", alert_id=first_alert
    )
    for report in sorted(hostile_ui.tmp.glob("*-xss*.html")):
        offline = Watched(browser, offline=True)
        offline.open(report.as_uri())
        assert XSS in offline.page.inner_text("#app")
        assert any(XSS in t for t in offline.hover_tooltips())
        offline.assert_nothing_ran(f"report {report.name}")
        offline.context.close()
