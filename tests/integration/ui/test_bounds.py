"""What a record cannot make the UI do (issue 32.5): loop over a forged rank, break a page with a
string that spells an internal placeholder, link to another site through a path-like href, answer a
rebinding page's host name, or show the credentials of a configured URL.

The UI runs in its own process over its own chDB store (chDB opens one store per process; this
package's store is another), filled from one small simulated incident plus the forged records.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from producers.simulator import load_scenario, simulate
from schemas.files import write_container
from schemas.records import Event
from tests.integration.ui.conftest import READY, needs_chromium

pytestmark = needs_chromium

FORGED_RANK = 2_000_000_000
# The placeholder the UI's JSON encoder once used for spliced-in ClickHouse JSON.
PLACEHOLDER = "\u0000raw0\u0000"
AM_URL = "http://admin:s3cret-pw@127.0.0.1:9/"

# Fills a store from a recording and serves the UI on it; prints the URL.
_SERVE = """
import sys
from pathlib import Path
from ranksight.commands.report import replayed
from ranksight.commands.ui import silence_reader
from sinks.clickhouse import connect
from sinks.ddl import migrate
from ui.server import UiServer
from ui.store import load_events

client = connect(sys.argv[2])
migrate(client, ttl_days=None)
load_events(client, replayed([Path(sys.argv[1])]))
server = UiServer(client, "127.0.0.1", 0, silences=silence_reader(sys.argv[3]), allowed_hosts=["ui.example.org"])
server.serve_forever(lambda url: print("UI on", url, flush=True))
"""


@dataclass(frozen=True)
class Forged:
    """The served UI, the forged job and its recording."""

    url: str
    job_id: str
    recording: Path


def _forged_events() -> tuple[str, list[Event]]:
    scenario = load_scenario("straggler_gpu").with_overrides(duration=6 * 60)
    # The job completes a minute before the recording ends: the fleet must show it finished.
    # The straggler fires and resolves within it (the history page lists it).
    scenario = replace(
        scenario,
        jobs=tuple(replace(j, end=5 * 60) for j in scenario.jobs),
        faults=tuple(replace(f, start=60.0, duration=150.0) for f in scenario.faults),
    )
    events = list(simulate(scenario, 0).events())
    job_id = next(e.record["job_id"] for e in events if e.type == "JobStarted")
    out: list[Event] = []
    forged = False
    for event in events:
        if event.type == "JobStarted":
            event = Event(event.type, {**event.record, "owner": PLACEHOLDER})
        out.append(event)
        if event.type == "StepCompleted" and not forged and event.record["step"] > 20:
            out.append(Event(event.type, {**event.record, "rank": FORGED_RANK}))
            forged = True
    assert forged
    return job_id, out


def _lines(stream: Any, into: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):
        into.put(line)


@pytest.fixture(scope="module")
def forged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forged]:
    tmp = tmp_path_factory.mktemp("forged")
    job_id, events = _forged_events()
    recording = tmp / "forged.avro"
    write_container(recording, iter(events))
    env = {k: v for k, v in os.environ.items() if k != "CLICKHOUSE_URL"}
    cmd = [sys.executable, "-c", _SERVE, str(recording), f"chdb://{tmp / 'chdb'}", AM_URL]
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True).start()
    try:
        url = None
        deadline = time.monotonic() + 180
        while url is None and time.monotonic() < deadline:
            line = lines.get(timeout=180)
            match = re.search(r"UI on (http://\S+/)", line)
            url = match.group(1) if match else None
        assert url, "the UI never said where it is"
        yield Forged(url, job_id, recording)
    finally:
        process.terminate()
        process.wait(30)


def _job_path(job_id: str) -> str:
    return "jobs/" + urllib.parse.quote(job_id, safe="")


def test_a_string_spelling_the_placeholder_is_data(forged: Forged) -> None:
    """A job whose owner is the encoder's old placeholder: its page is valid JSON, the owner as published."""
    page = httpx.get(forged.url + "api/" + _job_path(forged.job_id), timeout=60)
    assert page.status_code == 200
    data = page.json()
    assert data["job"]["owner"] == PLACEHOLDER
    assert isinstance(data["heatmap"]["cells"], list) and data["heatmap"]["cells"][0]


def test_a_forged_rank_is_counted_not_drawn(forged: Forged, browser: Any) -> None:
    """Rank 2,000,000,000 in one step record: the job page renders its declared ranks and says one is outside."""
    data = httpx.get(forged.url + "api/" + _job_path(forged.job_id), timeout=60).json()
    assert FORGED_RANK in data["heatmap"]["cells"][1]  # the store holds it; the page must cope
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.goto(forged.url + _job_path(forged.job_id))
    tab.wait_for_function(READY, timeout=30_000)
    assert tab.evaluate("() => window.ranksight.error") is None and errors == []
    labels = tab.evaluate("() => window.ranksight.rankLabels")
    assert len(labels) == data["job"]["world_size"] and labels[0].startswith("r0 ")
    assert "1 rank ids outside the job's" in tab.inner_text("#charts")
    tab.close()


def test_a_report_with_a_forged_rank_opens(forged: Forged, browser: Any, tmp_path: Path) -> None:
    """The same job's report, folded from the recording without a store, opens in the browser."""
    from ranksight.commands.report import replayed
    from ui.report import report_from_events

    out = tmp_path / "report.html"
    report_from_events(lambda: replayed([forged.recording]), out, job_id=forged.job_id)
    tab = browser.new_page()
    tab.goto(out.as_uri())
    tab.wait_for_function(READY, timeout=30_000)
    assert tab.evaluate("() => window.ranksight.error") is None
    assert len(tab.evaluate("() => window.ranksight.rankLabels")) < 1000
    tab.close()


def test_hrefs_are_parsed_as_urls(forged: Forged, browser: Any) -> None:
    """Only http(s) URLs and paths of this site become links; what a browser would send elsewhere does not."""
    tab = browser.new_page()
    tab.goto(forged.url)
    tab.wait_for_function(READY, timeout=30_000)
    cases = {
        "/\\evil.example/x": None,
        "//evil.example/x": None,
        "/%5Cevil.example/x": "/%5Cevil.example/x",
        "javascript:alert(1)": None,
        " JavaScript:alert(1)": None,
        "data:text/html,x": None,
        "http://evil.example/x\nhttp://y": None,
        "/runbooks/straggler": "/runbooks/straggler",
        "/alerts/a?b=1#c": "/alerts/a?b=1#c",
        "https://runbooks.example.org/gpu#xid": "https://runbooks.example.org/gpu#xid",
        "http://admin:pw@runbooks.example.org/x": "http://runbooks.example.org/x",
        "http:/\\evil.example": None,
    }
    got = tab.evaluate("(cases) => cases.map((c) => window.ranksight.safeHref(c))", list(cases))
    assert dict(zip(cases, got, strict=True)) == cases
    tab.close()


def test_only_the_uis_own_host_names_are_answered(forged: Forged) -> None:
    """DNS rebinding: a request naming another host is refused; IPs, localhost and configured names are served."""
    port = urllib.parse.urlsplit(forged.url).port
    with httpx.Client(base_url=forged.url, timeout=30) as http:
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil"):
            response = http.get("/api/version", headers={"Host": host})
            assert response.status_code == 421, host
            assert "--allowed-host" in response.text
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "ui.example.org", f"UI.example.org:{port}"):
            assert http.get("/api/version", headers={"Host": host}).status_code == 200, host


def test_alertmanager_credentials_are_never_shown(forged: Forged, browser: Any) -> None:
    """The configured Alertmanager URL carries a password: the silences answer and the fleet page redact it."""
    answer = httpx.get(forged.url + "api/fleet/silences", timeout=60)
    assert answer.status_code == 200
    body = answer.json()
    assert body["configured"] and body["error"], body  # nothing listens there: the error quotes the URL
    assert "s3cret-pw" not in answer.text and "admin" not in answer.text
    assert "http://***@127.0.0.1:9" in body["error"]
    tab = browser.new_page()
    tab.goto(forged.url)
    tab.wait_for_function(READY, timeout=30_000)
    tab.wait_for_function("() => document.body.innerText.includes('127.0.0.1:9')", timeout=30_000)
    assert "s3cret-pw" not in tab.inner_text("body")
    tab.close()


def test_the_fleet_shows_a_finished_job_finished(forged: Forged, browser: Any) -> None:
    """A completed job's fleet row says completed, not 'no progress for N min' in red."""
    from tests.integration.ui.test_ui_reading import _FLEET_ROWS

    tab = browser.new_page()
    tab.goto(forged.url)
    tab.wait_for_function(READY, timeout=30_000)
    [row] = tab.evaluate(_FLEET_ROWS)
    assert row["state"] == "completed", row
    assert not row["stale"] and "no progress" not in row["progress"] + row["health"], row
    assert "completed" in row["health"] + row["progress"]
    tab.close()


def test_every_panel_exports_its_data_as_csv(forged: Forged, browser: Any) -> None:
    """Each job panel's CSV button downloads its points (time in UTC, value); record strings stay text."""
    tab = browser.new_page()
    tab.goto(forged.url + _job_path(forged.job_id))
    tab.wait_for_function(READY, timeout=30_000)
    keys = tab.evaluate("() => [...document.querySelectorAll('button.csv')].map(b => b.dataset.csv)")
    assert {"heatmap", "throughput", "loss"} <= set(keys), keys
    with tab.expect_download() as download:
        tab.click("button[data-csv='throughput']")
    text = Path(download.value.path()).read_text()
    header, *rows = text.splitlines()
    assert header == "series,time_utc,row,value,detail" and len(rows) > 10
    assert all(re.match(r"^[^,]+,\d{4}-\d\d-\d\dT", r) for r in rows), rows[:3]
    heat = tab.evaluate("() => window.ranksight.chartCsv('heatmap')").splitlines()
    assert heat[1].split(",")[2].startswith("r")  # the row label of a heatmap cell
    assert tab.evaluate("() => window.ranksight.chartCsv('loss')").count("\n") > 10
    spans = tab.evaluate("() => window.ranksight.chartCsv('timeline')").splitlines()
    assert any(",job state," in line and "completed" in line for line in spans), spans
    tab.close()


_ISO_UTC = r"^\d{4}-\d\d-\d\d \d\d:\d\d$"


def _utc_text(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")


def test_the_time_range_picker_rereads_the_page(forged: Forged, browser: Any) -> None:
    """Two UTC instants typed in the picker re-read the job page over them (?from=&to=); a preset too.
    The fields read and take ISO 8601 in UTC whatever the browser's locale (an en-US
    datetime-local field showed mm/dd/yyyy beside its "UTC" label); a text that is no time says so."""
    tab = browser.new_page(locale="en-US", timezone_id="America/Los_Angeles")
    tab.goto(forged.url + _job_path(forged.job_id))
    tab.wait_for_function(READY, timeout=30_000)
    whole = tab.evaluate("() => window.ranksight.data.range")
    shown = tab.input_value("input[name='range-from']")
    assert re.match(_ISO_UTC, shown) and shown == _utc_text(whole["from_ms"]), shown
    assert tab.get_attribute("input[name='range-from']", "type") == "text"
    mid = (whole["span"][0] + whole["span"][1]) // 2 // 60_000 * 60_000
    tab.fill("input[name='range-from']", "12/07/2026 5:45 PM")
    tab.click("button[name='range-apply']")
    message = tab.eval_on_selector("input[name='range-from']", "e => e.validationMessage")
    assert message.startswith("Write the time in UTC as YYYY-MM-DD HH:MM"), message
    assert "from=" not in tab.url  # nothing re-read on a text that is no time
    tab.fill("input[name='range-from']", _utc_text(mid))
    with tab.expect_navigation():
        tab.click("button[name='range-apply']")
    tab.wait_for_function(READY, timeout=30_000)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(tab.url).query)
    part = tab.evaluate("() => window.ranksight.data.range")
    assert int(query["from"][0]) == mid and part["from_ms"] <= mid < part["from_ms"] + part["bucket_ms"]
    assert part["to_ms"] - part["from_ms"] < whole["to_ms"] - whole["from_ms"]
    with tab.expect_navigation():
        tab.select_option("select[name='range-preset']", label="whole run")
    tab.wait_for_function(READY, timeout=30_000)
    assert (
        "from=" not in tab.url
        and tab.evaluate("() => window.ranksight.data.range.from_ms") == whole["from_ms"]
    )
    tab.close()


def test_the_alert_history_filters_by_job_node_rule_team_and_time(forged: Forged, browser: Any) -> None:
    """/history lists what fired, newest first; each filter narrows it, values bound (a quote finds nothing)."""
    with httpx.Client(base_url=forged.url, timeout=60) as http:
        everything = http.get("/api/history").json()["alerts"]
        assert everything, "the incident raised no alert"
        first = everything[-1]
        assert [a["starts_ms"] for a in everything] == sorted(
            (a["starts_ms"] for a in everything), reverse=True
        )
        for key, value in (("job", first["job_id"]), ("rule", first["rule"]), ("team", first["team"])):
            found = http.get("/api/history", params={key: value}).json()["alerts"]
            assert first["alert_id"] in {a["alert_id"] for a in found}, key
        by_rule = http.get("/api/history", params={"rule": first["rule"]}).json()["alerts"]
        assert {a["rule"] for a in by_rule} == {first["rule"]}
        assert http.get("/api/history", params={"job": "x' OR 1=1 --"}).json()["alerts"] == []
        later = http.get("/api/history", params={"from": first["starts_ms"] + 1}).json()["alerts"]
        assert first["alert_id"] not in {a["alert_id"] for a in later}
        assert http.get("/api/history", params={"to": "soon"}).status_code == 400
    tab = browser.new_page()
    tab.goto(f"{forged.url}history?rule={urllib.parse.quote(first['rule'])}")
    tab.wait_for_function(READY, timeout=30_000)
    rows = tab.eval_on_selector_all("tr[data-alert]", "rows => rows.map(r => r.dataset.alert)")
    assert first["alert_id"] in rows and len(rows) == len(by_rule)
    assert tab.input_value("select[name='rule']") == first["rule"]
    # The time filter is ISO 8601 in UTC: typed so, it narrows the list (a "T" and seconds are fine too).
    assert tab.get_attribute("input[name='from']", "placeholder") == "YYYY-MM-DD HH:MM"
    later = (first["starts_ms"] // 60_000 + 1) * 60_000
    tab.fill("input[name='from']", _utc_text(later).replace(" ", "T") + ":00Z")
    with tab.expect_navigation():
        tab.click("#history-filters button[type='submit']")
    tab.wait_for_function(READY, timeout=30_000)
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(tab.url).query)["from"] == [str(later)]
    assert tab.input_value("input[name='from']") == _utc_text(later)
    rows = tab.eval_on_selector_all("tr[data-alert]", "rows => rows.map(r => r.dataset.alert)")
    assert first["alert_id"] not in rows
    tab.close()


# Leaf elements with text that overlap another's box or are clipped: what a reader cannot read.
_LAYOUT_PROBLEMS = """() => {
  const width = document.documentElement.clientWidth;
  const leaves = [...document.querySelectorAll('body *')].filter((e) => e.children.length === 0
    && e.textContent.trim() && e.getClientRects().length && !['OPTION', 'SCRIPT', 'STYLE', 'TITLE'].includes(e.tagName)
    && !e.closest('.chart, .tip, select'));
  const problems = [];
  const boxes = [];
  for (const e of leaves) {
    const cs = getComputedStyle(e);
    if (cs.visibility === 'hidden') continue;
    const name = `${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''} "${e.textContent.trim().slice(0, 40)}"`;
    if (['hidden', 'clip'].includes(cs.overflowX) && e.scrollWidth > e.clientWidth + 1 && cs.textOverflow !== 'ellipsis') problems.push(`cut: ${name}`);
    for (const r of e.getClientRects()) {
      if (r.width < 1 || r.height < 1) continue;
      if (r.right > width + 1 && !e.closest('.scroll, table')) problems.push(`off the page: ${name}`);
      boxes.push([r, e, name]);
    }
  }
  boxes.sort((a, b) => a[0].top - b[0].top);
  for (let i = 0; i < boxes.length; i++) {
    const [a, ea, na] = boxes[i];
    for (let j = i + 1; j < boxes.length && boxes[j][0].top < a.bottom - 1; j++) {
      const [b, eb, nb] = boxes[j];
      if (ea === eb || ea.contains(eb) || eb.contains(ea)) continue;
      const dx = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const dy = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (dx > 2 && dy > 2) problems.push(`overlap: ${na} / ${nb}`);
    }
  }
  return [...new Set(problems)];
}"""


@pytest.mark.parametrize("width", [1280, 1600, 1920])
def test_no_text_overlaps_or_is_cut_off_on_any_page(
    forged: Forged, browser: Any, width: int, tmp_path: Path
) -> None:
    """Every page at desktop widths: no text box overlaps another, none is clipped (bounding boxes, not pixels).
    The screenshots are kept under the test's tmp directory."""
    alert_id = httpx.get(forged.url + "api/history", timeout=60).json()["alerts"][0]["alert_id"]
    context = browser.new_context(viewport={"width": width, "height": 1000})
    tab = context.new_page()
    pages = {
        "fleet": forged.url,
        "job": forged.url + _job_path(forged.job_id),
        "alert": forged.url + "alerts/" + urllib.parse.quote(alert_id, safe=""),
        "history": forged.url + "history",
        "compare": forged.url + "compare?job=" + urllib.parse.quote(forged.job_id, safe=""),
    }
    found = {}
    for name, url in pages.items():
        tab.goto(url)
        tab.wait_for_function(READY, timeout=30_000)
        tab.screenshot(path=str(tmp_path / f"{name}-{width}.png"), full_page=True)
        problems = tab.evaluate(_LAYOUT_PROBLEMS)
        if problems:
            found[name] = problems[:10]
    # The probe sees what it looks for: two labels drawn on one spot, and a clipped one.
    tab.evaluate(
        """() => {
            for (const [text, left] of [['first label', 10], ['second label', 20]]) {
                const s = document.createElement('span');
                s.textContent = text;
                Object.assign(s.style, { position: 'absolute', left: `${left}px`, top: '200px' });
                document.body.append(s);
            }
            const cut = document.createElement('div');
            cut.textContent = 'a long label that does not fit in its box';
            Object.assign(cut.style, { width: '40px', overflow: 'hidden', whiteSpace: 'nowrap' });
            document.body.append(cut);
        }"""
    )
    planted = tab.evaluate(_LAYOUT_PROBLEMS)
    context.close()
    assert found == {}
    assert any(p.startswith("overlap: span") and "second label" in p for p in planted), planted
    assert any(p.startswith("cut: div") for p in planted), planted
