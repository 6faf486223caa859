"""The UI in a real browser (Debian's headless Chromium driven by Playwright) on a simulated incident.

Checks read the data behind the charts (`window.ranksight`), never pixels. Screenshots of each
page land in the test's temporary output (`.../screenshots/`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sinks.efficiency import PriceList
from tests.integration.ui.conftest import (
    FAULT_END_S,
    FAULT_START_S,
    PRICE_PER_GPU_H,
    READY,
    STRAGGLER_JOB,
    STRAGGLER_RANK,
    UiStore,
    efficiency_json,
    needs_chromium,
)
from ui.report import write_report
from ui.server import UiServer

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def ui_url(ui_store: UiStore) -> Iterator[str]:
    """The UI over the package's store with GPU-hours priced (overrides conftest's unpriced one)."""
    server = UiServer(ui_store.client, "127.0.0.1", 0, prices=PriceList.parse([f"default={PRICE_PER_GPU_H}"]))
    url = server.start()
    yield url
    server.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go (printed, to look at them)."""
    path = tmp_path_factory.mktemp("screenshots")
    print(f"screenshots in {path}")
    return path


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page that records script errors (a test fails on any)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    yield page
    context.close()
    assert not errors, f"script errors in the page: {errors}"


def _open(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_function(READY, timeout=60_000)
    assert page.evaluate("window.ranksight.error") is None


def _straggler_alert(page: Any) -> dict[str, Any]:
    alerts = page.evaluate("window.ranksight.data.alerts")
    stragglers = [a for a in alerts if a["rule"] == "straggler" and a["rank"] == STRAGGLER_RANK]
    assert stragglers, f"no straggler alert on rank {STRAGGLER_RANK}: {[a['rule'] for a in alerts]}"
    return stragglers[0]


def test_fleet_lists_every_job_with_health_and_filters_by_team(
    page: Any, ui_url: str, ui_store: UiStore, shots: Path
) -> None:
    """The fleet page lists the scenario's jobs, its alerts with their teams, and the team filter narrows it."""
    _open(page, ui_url)
    listed = page.eval_on_selector_all("tr[data-job]", "rows => rows.map(r => r.dataset.job)")
    assert sorted(listed) == sorted(ui_store.jobs)
    shown = page.eval_on_selector_all(
        "table.alerts tr[data-alert]",
        "rows => rows.map(r => [r.dataset.alert, [...r.querySelectorAll('.copy strong')].map(s => s.textContent)])",
    )
    routed = page.evaluate(
        "() => Object.fromEntries([...window.ranksight.data.firing, ...window.ranksight.data.resolved]"
        ".map(a => [a.alert_id, a.copies.map(c => c.team)]))"
    )
    # Each alert row names every team it was routed to (routing decides which: by category, by owner).
    assert {alert: teams for alert, teams in shown} == routed and len(shown) >= 2
    assert all(teams for _, teams in shown) and any(len(teams) > 1 for _, teams in shown)
    page.screenshot(path=str(shots / "fleet.png"), full_page=True)
    page.select_option("select[name=team]", "vision")
    assert page.eval_on_selector_all("tr[data-job]", "rows => rows.map(r => r.dataset.job)") == ["vit-h-0302"]


def test_fleet_goodput_and_the_job_efficiency_panel_show_what_the_efficiency_command_says(
    page: Any, ui_url: str, ui_store: UiStore, shots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fleet's goodput cells and the job panel's figures are `ranksight efficiency --json`'s, rounded."""
    expected = efficiency_json(ui_store, monkeypatch)
    _open(page, ui_url)
    # Goodput comes after the table, from its own (cached) endpoint.
    page.wait_for_function("() => window.ranksight.goodputReady === true", timeout=60_000)
    shown = page.eval_on_selector_all(
        "tr[data-job]",
        "rows => rows.map(r => [r.dataset.job, r.querySelector('td[data-goodput]').textContent])",
    )
    assert {job: text for job, text in shown} == {
        job: f"{expected[job]['goodput_pct']:.1f} %" for job in ui_store.jobs
    }
    _open(page, f"{ui_url}jobs/{STRAGGLER_JOB}")
    page.wait_for_function("() => window.ranksight.efficiencyReady === true", timeout=60_000)
    row = expected[STRAGGLER_JOB]
    figures = dict(
        page.eval_on_selector_all(
            "#efficiency dd[data-figure]", "dds => dds.map(d => [d.dataset.figure, d.textContent])"
        )
    )
    assert figures["allocated_gpu_h"] == f"{row['allocated_gpu_h']:.2f}"
    assert figures["goodput_pct"] == f"{row['goodput_pct']:.1f} %"
    assert figures["failed_work_pct"] == f"{row['failed_work_pct']:.1f} %"
    assert figures["cost"] == f"${row['cost']:.2f} at ${PRICE_PER_GPU_H:.2f}/GPU-h"
    values = dict(
        page.eval_on_selector_all(
            "#efficiency dd[data-figure]", "dds => dds.map(d => [d.dataset.figure, d.dataset.value])"
        )
    )
    for key in ("tokens_per_gpu_h", "samples_per_gpu_h", "energy_kwh", "kwh_per_billion_tokens", "queue_s"):
        assert float(values[key]) == pytest.approx(row[key], rel=1e-5), key
    compact = "v => new Intl.NumberFormat('en', {notation: 'compact', maximumSignificantDigits: 3}).format(v)"
    assert figures["tokens_per_gpu_h"] == page.evaluate(compact, row["tokens_per_gpu_h"])  # e.g. 228M
    # The stacked bar: each part's width is its share of allocated GPU-hours plus the queue wait
    # (of the parts' sum when they overlap and add up to more, as an evaluation during steps does).
    widths = dict(
        page.eval_on_selector_all(
            "#efficiency .stack .seg", "segs => segs.map(s => [s.dataset.part, parseFloat(s.style.width)])"
        )
    )
    queue_gpu_h = row["queue_s"] * row["gpus"] / 3600
    parts = sum(
        row[f"{p}_gpu_h"] for p in ("productive", "stall", "restart", "skipped", "checkpoint", "evaluation")
    )
    total = max(row["allocated_gpu_h"], parts) + queue_gpu_h
    assert widths["productive"] == pytest.approx(100 * row["productive_gpu_h"] / total, abs=0.01)
    assert widths["checkpoint"] == pytest.approx(100 * row["checkpoint_gpu_h"] / total, abs=0.01)
    assert widths["queue"] == pytest.approx(100 * queue_gpu_h / total, abs=0.01)
    page.locator("#efficiency").screenshot(path=str(shots / "efficiency.png"))


def test_job_heatmap_shows_the_stragglers_stripe_at_its_rank(
    page: Any, ui_url: str, ui_store: UiStore, shots: Path
) -> None:
    """Per-rank compute time during the fault is highest on the straggler's row, and only there."""
    _open(page, f"{ui_url}jobs/{STRAGGLER_JOB}")
    cells = page.evaluate("window.ranksight.charts.heatmap.getOption().series[0].data")
    buckets = page.evaluate("window.ranksight.buckets")
    rows = page.evaluate("window.ranksight.charts.heatmap.getOption().yAxis[0].data")
    assert len(rows) == 16 and len(cells) > 16 * 10
    start, end = ui_store.start_ms + FAULT_START_S * 1000, ui_store.start_ms + FAULT_END_S * 1000
    during: dict[int, list[float]] = {}
    for x, rank, value in cells:
        if start + 60_000 <= buckets[x] < end - 60_000:
            during.setdefault(rank, []).append(value)
    means = {rank: sum(v) / len(v) for rank, v in during.items()}
    slowest = max(means, key=lambda r: means[r])
    assert slowest == STRAGGLER_RANK, means
    others = sorted(v for r, v in means.items() if r != STRAGGLER_RANK)
    assert means[STRAGGLER_RANK] > 1.2 * others[len(others) // 2]
    page.screenshot(path=str(shots / "job.png"), full_page=True)


def test_clicking_an_alert_zooms_every_panel_to_its_window_and_marks_its_rank(
    page: Any, ui_url: str, shots: Path
) -> None:
    """After a click on the straggler alert, every panel shows the alert's span and its rank is marked."""
    _open(page, f"{ui_url}jobs/{STRAGGLER_JOB}")
    full = page.evaluate("window.ranksight.data.range")
    alert = _straggler_alert(page)
    page.click(f"tr[data-alert='{alert['alert_id']}']")
    page.wait_for_function("() => window.ranksight.window !== null")
    t0, t1 = page.evaluate("window.ranksight.window")
    assert t0 <= alert["starts_ms"] and t1 >= alert["ends_ms"]
    assert t1 - t0 < 0.8 * (full["to_ms"] - full["from_ms"])
    assert page.evaluate("window.ranksight.focus.rank") == STRAGGLER_RANK
    # Every time panel's axis now spans the window (within one bucket), not the job's whole range.
    extents = page.evaluate(
        """Object.entries(window.ranksight.charts).filter(([k, c]) => c.getOption().xAxis[0].type === 'time')
             .map(([k, c]) => [k, c.getModel().getComponent('xAxis', 0).axis.scale.getExtent()])"""
    )
    assert len(extents) > 10
    for name, (lo, hi) in extents:
        assert abs(lo - t0) <= full["bucket_ms"] and abs(hi - t1) <= full["bucket_ms"], name
    label = page.evaluate(f"window.ranksight.rankLabels[{STRAGGLER_RANK}]")
    assert label in page.evaluate("[...window.ranksight.focusRows]")
    page.locator("#panel-timeline").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "job-alert-zoom.png"), full_page=False)


def test_alert_page_carries_the_alert_and_its_evidence(page: Any, ui_url: str, shots: Path) -> None:
    """/alerts/<id>: identity, team, invariant, observed vs expected, runbook, and the job's panels around it."""
    _open(page, f"{ui_url}jobs/{STRAGGLER_JOB}")
    alert = _straggler_alert(page)
    _open(page, f"{ui_url}alerts/{alert['alert_id']}")
    text = page.inner_text("#app")
    for expected in ("straggler", "llm-pretrain", f"rank {STRAGGLER_RANK}", "invariant", "runbook"):
        assert expected in text
    assert page.evaluate("window.ranksight.data.alert.alert_id") == alert["alert_id"]
    assert page.evaluate("Object.keys(window.ranksight.charts).length") > 10
    assert page.evaluate("window.ranksight.focus.rank") == STRAGGLER_RANK
    page.screenshot(path=str(shots / "alert.png"), full_page=True)


def test_the_alert_page_says_the_runs_progress_and_eta_when_it_fired(page: Any, ui_url: str) -> None:
    """Issue 23.1: the alert carries the run's target, steps done and the ETA at its recent step rate,
    and its page says them (the simulated run's target is 20,000 steps)."""
    _open(page, f"{ui_url}jobs/{STRAGGLER_JOB}")
    alert = _straggler_alert(page)
    _open(page, f"{ui_url}alerts/{alert['alert_id']}")
    a = page.evaluate("window.ranksight.data.alert")
    assert (a["target_kind"], a["target"]) == ("steps", 20000)
    assert a["target_done"] == a["current_step"] + 1 and a["eta_s"] > 0
    text = page.inner_text("#alert-progress")
    assert re.fullmatch(
        r"\S+ of 20K steps \(\d+\.\d %\); ETA .+ at the recent step rate, done about 20\d\d-.+ UTC", text
    ), text


def test_report_file_opens_with_no_network(
    browser: Any, ui_store: UiStore, tmp_path: Path, shots: Path
) -> None:
    """A job report renders the same panels from file:// with every other request blocked."""
    out = tmp_path / "report.html"
    result = write_report(
        ui_store.client, out, job_id=STRAGGLER_JOB, prices=PriceList.parse([f"default={PRICE_PER_GPU_H}"])
    )
    assert result["alerts"] >= 1
    context = browser.new_context(viewport={"width": 1400, "height": 900}, offline=True)
    blocked: list[str] = []

    def guard(route: Any) -> None:
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(out.as_uri())
    page.wait_for_function(READY, timeout=60_000)
    assert page.evaluate("window.ranksight.error") is None and not errors
    assert blocked == []
    assert len(page.evaluate("window.ranksight.charts.heatmap.getOption().series[0].data")) > 100
    assert page.text_content("#efficiency dd[data-figure=cost]").endswith(f"at ${PRICE_PER_GPU_H:.2f}/GPU-h")
    alert = _straggler_alert(page)
    page.click(f"tr[data-alert='{alert['alert_id']}']")
    assert page.evaluate("window.ranksight.focus.rank") == STRAGGLER_RANK
    page.screenshot(path=str(shots / "report.png"), full_page=False)
    context.close()


def test_report_command_replays_a_recording_offline(ui_store: UiStore, tmp_path: Path) -> None:
    """`ranksight report incident.avro --job J -o r.html` writes a report with the alerts the detectors raise."""
    out = tmp_path / "r.html"
    cli = [sys.executable, "-m", "ranksight.cli", "report", str(ui_store.recording)]
    done = subprocess.run(
        [*cli, "--job", STRAGGLER_JOB, "-o", str(out), "--price", f"default={PRICE_PER_GPU_H}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert "id='ranksight-report'" in html and '"rule":"straggler"' in html
    assert f'"price_per_gpu_h":{PRICE_PER_GPU_H}' in html  # --price reaches the efficiency panel
    assert "<script src=" not in html and "http://" not in html.split("id='ranksight-report'")[0]
    missing = subprocess.run(
        [*cli, "--job", "no-such-job", "-o", str(tmp_path / "x.html")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert missing.returncode == 1
    assert "not in the recording" in missing.stderr and "Traceback" not in missing.stderr


def test_a_new_alert_appears_on_the_open_fleet_page_without_a_reload(
    page: Any, ui_url: str, ui_store: UiStore
) -> None:
    """The page polls: an alert stored after it loaded shows up in the firing table by itself."""
    _open(page, ui_url)
    assert page.locator("tr[data-alert='live-check']").count() == 0
    ui_store.client.command(
        "INSERT INTO alerts SELECT * REPLACE ('live-check' AS alert_id, 'live_check' AS rule, 'firing' AS status, "
        "'live-0001' AS job_id, NULL AS ends_at) FROM (SELECT * FROM alerts WHERE rule = 'straggler' LIMIT 1)"
    )
    page.wait_for_selector("tr[data-alert='live-check']", timeout=60_000)
    assert "live_check" in page.inner_text("tr[data-alert='live-check']")
