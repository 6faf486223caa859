"""What the on-call engineer reads: facts paired with their values at every width, charts that say
what they show (threshold, unit, axis), resolved alerts told apart, a stalled job at 0 steps/s.

Read from the DOM and the charts' models in Chromium, never from pixels.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.integration.ui.conftest import READY, STRAGGLER_JOB, UiStore, needs_chromium
from ui.pages.fleet import fleet as fleet_json
from ui.pages.job import job_page

pytestmark = needs_chromium

STALLED_JOB = "vit-h-0302"  # every rank stops at minute 8 of the mixed scenario, to the end of the store
WIDTHS = (1280, 1600, 1920, 390)  # three desktop widths and a phone


def _open(browser: Any, url: str, width: int = 1400) -> Any:
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    page.wait_for_function(READY, timeout=60_000)
    assert page.evaluate("() => window.ranksight.error") is None and not errors, errors
    return page


# For each fact: its label, its value, and where both are drawn.
_FACTS = """(sel) => [...document.querySelectorAll(sel + ' dt')].map(dt => {
    const dd = dt.nextElementSibling;
    const a = dt.getBoundingClientRect(), b = dd.getBoundingClientRect();
    return { label: dt.textContent, value: dd.textContent, dt: [a.left, a.top, a.right, a.bottom], dd: [b.left, b.top, b.right, b.bottom],
             sameCell: dt.parentElement === dd.parentElement && dd.tagName === 'DD' };
})"""


def _pairs(page: Any, selector: str) -> dict[str, str]:
    facts = page.evaluate(_FACTS, selector)
    assert facts, selector
    for f in facts:
        # The value is drawn right under its own label: same left edge, just below, nothing between.
        assert f["sameCell"], f
        assert abs(f["dd"][0] - f["dt"][0]) < 1.5, f
        assert 0 <= f["dd"][1] - f["dt"][3] < 12, f
    # No two labels share a place (a label over another's value is how the grid misled at 1600 px).
    spots = {(round(f["dt"][0]), round(f["dt"][1])) for f in facts}
    assert len(spots) == len(facts)
    return {f["label"]: f["value"] for f in facts}


@pytest.mark.parametrize("width", WIDTHS)
def test_each_label_sits_over_its_own_value_at_every_width(
    browser: Any, ui_url: str, ui_store: UiStore, width: int
) -> None:
    """Job, efficiency and alert facts read label -> value correctly at 1280, 1600, 1920 px and on a phone."""
    page = _open(browser, f"{ui_url}jobs/{STRAGGLER_JOB}", width)
    job = page.evaluate("() => window.ranksight.data.job")
    pairs = _pairs(page, ".header dl.facts")
    assert (
        pairs["team"] == job["team"] and pairs["cluster"] == job["cluster"] and pairs["owner"] == job["owner"]
    )
    assert pairs["ranks"] == str(job["world_size"]) and pairs["run"] == job["run_id"]
    page.wait_for_function("() => window.ranksight.efficiencyReady === true", timeout=60_000)
    figures = _pairs(page, "#efficiency dl.facts")
    shown = dict(
        page.eval_on_selector_all(
            "#efficiency dd[data-figure]", "dds => dds.map(d => [d.dataset.figure, d.textContent])"
        )
    )
    assert figures["allocated GPU-hours"] == shown["allocated_gpu_h"]
    assert figures["tokens per GPU-hour"] == shown["tokens_per_gpu_h"]
    alert = page.evaluate("() => window.ranksight.data.alerts.find(a => a.rule === 'straggler')")
    page.context.close()
    page = _open(browser, f"{ui_url}alerts/{alert['alert_id']}", width)
    pairs = _pairs(page, ".header dl.facts")
    a = page.evaluate("() => window.ranksight.data.alert")
    assert (
        pairs["cluster"] == a["cluster"]
        and pairs["owner"] == a["owner"]
        and pairs["GPU uuid"] == a["gpu_uuid"]
    )
    assert pairs["fingerprint"] == a["fingerprint"] and pairs["category"] == a["category"]
    page.context.close()


def _alert_ids(ui_store: UiStore) -> list[tuple[str, str]]:
    rows = ui_store.client.query(
        "SELECT alert_id, any(rule) FROM alerts GROUP BY alert_id ORDER BY 2, 1"
    ).result_rows
    return [(str(a), str(r)) for a, r in rows]


# How a value of each unit reads on an alert page (`valueText` in app.js).
_UNIT_TEXT = {
    "s": r"-?[\d.e+-]+ s",
    "%": r"-?[\d.e+-]+ %",
    "ratio": r"-?[\d.e+-]+ %",
    "step": r"step \d+",
    "steps": r"-?\d+ steps",
    "count": r"-?[\d.e+-]+",
    "": r"-?[\d.e+-]+",
}


def _reads_as(text: str, unit: str | None, what: str | None) -> bool:
    """Whether a fact's text is a value of `unit` (and nothing else) followed by what it measures."""
    if unit is None:
        return text.endswith("(unit not recorded)")
    pattern = _UNIT_TEXT.get(unit, r"-?[\d.e+-]+ " + re.escape(unit))
    return re.fullmatch(pattern + (r" \(" + re.escape(what) + r"\)" if what else ""), text) is not None


def test_every_alert_page_labels_each_value_with_its_own_unit(
    browser: Any, ui_url: str, ui_store: UiStore
) -> None:
    """Every alert of the store: observed and expected read in their own units (never the history's), a
    share never over 100 %, and a threshold line only on a chart of the threshold's unit."""
    page = _open(browser, ui_url)
    rules = set()
    for alert_id, rule in _alert_ids(ui_store):
        page.goto(f"{ui_url}alerts/{alert_id}")
        page.wait_for_function(READY, timeout=60_000)
        a = page.evaluate("() => window.ranksight.data.alert")
        texts = page.evaluate(
            "() => ['observed', 'threshold'].map(id => (document.getElementById(id) || {}).textContent)"
        )
        if a["observed_fired"] is not None:
            assert a["observed_fired_unit"] is not None, rule  # this store's alerts carry their units
            assert _reads_as(texts[0], a["observed_fired_unit"], a["observed_fired_what"]), (
                rule,
                texts[0],
                a,
            )
        if a["threshold"] is not None:
            assert _reads_as(texts[1], a["threshold_unit"], a["threshold_what"]), (rule, texts[1])
        for value, unit in (
            (a["observed_fired"], a["observed_fired_unit"]),
            (a["threshold"], a["threshold_unit"]),
        ):
            if unit == "ratio" and value is not None:
                assert 0 <= value <= 1, (rule, value)  # a share in % is 0-100 %
            if unit == "%" and value is not None:
                assert 0 <= value <= 100, (rule, value)
        meta = page.evaluate("() => window.ranksight.alertChart")
        if meta["threshold"] is not None:
            assert a["threshold_unit"] == meta["unit"], (rule, a["threshold_unit"], meta["unit"])
        rules.add(rule)
    assert {"straggler", "job_stall"} <= rules, rules
    page.context.close()


def test_every_alert_chart_has_its_threshold_line_unit_and_a_sane_axis(
    browser: Any, ui_url: str, ui_store: UiStore
) -> None:
    """On every alert page: a threshold the y axis shows, a unit, an axis of hours not days; job_stall in seconds."""
    seen = set()
    page = _open(browser, ui_url)
    for alert_id, rule in _alert_ids(ui_store):
        if rule in seen:
            continue
        seen.add(rule)
        page.goto(f"{ui_url}alerts/{alert_id}")
        page.wait_for_function(READY, timeout=60_000)
        a = page.evaluate("() => window.ranksight.data.alert")
        chart = page.evaluate(
            """() => {
                const c = window.ranksight.charts.history, m = window.ranksight.alertChart;
                const y = c.getModel().getComponent('yAxis', 0).axis.scale.getExtent();
                const x = c.getModel().getComponent('xAxis', 0).axis.scale.getExtent();
                const s = c.getOption().series[0];
                return { meta: m, y, x, color: s.color, mark: s.markLine ? s.markLine.data.map(d => d.yAxis) : [],
                         title: document.querySelector('#panel-history h3').textContent,
                         headline: document.querySelector('.summary-line').textContent,
                         resolution: (document.querySelector('.resolution-line') || {}).textContent || null };
            }"""
        )
        meta = chart["meta"]
        assert chart["x"][1] - chart["x"][0] < 6 * 3600_000, (rule, chart["x"])  # not a 2-day axis
        if meta["threshold"] is not None:
            assert chart["mark"] == [meta["threshold"]], rule
            assert chart["y"][0] <= meta["threshold"] <= chart["y"][1], (rule, chart["y"], meta["threshold"])
            assert a["threshold_what"] in chart["title"]
        # A unit, unless the alert declares its history dimensionless (`history_unit` ""; a copy of a
        # straggler's record that test_ui_browser stores as `live_check` among them).
        assert (
            meta["unit"]
            or a["history_unit"] == ""
            or rule
            in (
                "nonfinite_grad",
                "nonfinite_loss",
                "grad_spike",
                "loss_divergence",
                "straggler",  # a score: job median time / the rank's time
            )
        ), rule
        if rule == "job_stall":
            assert meta["name"] == "seconds without a step" and meta["unit"] == "s"
            assert "allowed" in chart["title"] and " s" in chart["title"]
            assert max(p[1] for p in meta["points"]) >= meta["threshold"]
        if rule == "straggler":
            assert meta["threshold"] == pytest.approx(0.75) and meta["unit"] == ""
        if a["status"] == "resolved":
            assert chart["color"] == "#6a9f58"  # resolved is green
            fired = [t["summary"] for t in a["transitions"] if t["status"] == "firing"]
            assert (
                chart["headline"] == fired[-1]
                and chart["resolution"]
                and a["resolution"] in chart["resolution"]
            )
        else:
            assert chart["resolution"] is None
    assert {"straggler", "job_stall"} <= seen, seen
    page.context.close()


def test_the_heatmap_legend_reads_two_different_ends_with_their_unit(browser: Any, ui_url: str) -> None:
    """The colour scale says '<hi> s slow' and '<lo> s fast' (never '1 ... 1'); GPU activity '% busy' / '% idle'."""
    page = _open(browser, f"{ui_url}jobs/{STRAGGLER_JOB}")
    ranks = page.evaluate("() => window.ranksight.charts.heatmap.getOption().visualMap[0].text")
    gpus = page.evaluate("() => window.ranksight.charts.gpu_util.getOption().visualMap[0].text")
    assert (
        ranks[0].endswith(" s slow")
        and ranks[1].endswith(" s fast")
        and ranks[0].split()[0] != ranks[1].split()[0]
    )
    assert gpus == ["100 % busy", "0 % idle"]
    page.context.close()


def test_a_stalled_job_reads_zero_steps_per_second_while_stalled(ui_store: UiStore) -> None:
    """The stalled job's step rate is 0 from the stall on (page series and fleet), a healthy job's is not."""
    page = job_page(ui_store.client, STALLED_JOB, with_efficiency=False)
    stall_start = ui_store.start_ms + 8 * 60_000
    during = [v for t, v in page["steps"]["step_rate"] if t >= stall_start + 2 * 60_000]
    assert during and all(v == 0 for v in during), page["steps"]["step_rate"][-10:]
    # Before the stall it steps (a checkpoint's pause reads 0 too, honestly: most buckets do not).
    before = [v for t, v in page["steps"]["step_rate"] if t < stall_start - 60_000]
    assert before and sum(v > 0 for v in before) > 0.9 * len(before)
    fleet = {j["job_id"]: j for j in fleet_json(ui_store.client, goodput=False)["jobs"]}
    assert fleet[STALLED_JOB]["step_rate"] == 0.0 and fleet[STRAGGLER_JOB]["step_rate"] > 0


def test_a_stalled_job_has_no_eta_and_says_since_when(
    ui_store: UiStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """State wins over averages: the stalled job's page and `ranksight jobs` say stalled since its last step,
    with no ETA; a job that steps keeps its ETA."""
    page = job_page(ui_store.client, STALLED_JOB, with_efficiency=False)
    condition = page["condition"]
    assert condition["kind"] in ("stalled", "overdue"), condition
    assert condition["since_ms"] == page["progress"]["last_step_ms"]
    assert page["progress"]["eta_s"] is None and page["progress"]["finish_ms"] is None
    healthy = job_page(ui_store.client, STRAGGLER_JOB, with_efficiency=False)
    assert healthy["condition"]["kind"] in ("running", "finished")

    import json

    from typer.testing import CliRunner

    from ranksight.cli import app

    monkeypatch.setenv("CLICKHOUSE_URL", ui_store.dsn)
    monkeypatch.setenv("RANKSIGHT_TTL_DAYS", "3650")
    try:
        result = CliRunner().invoke(app, ["jobs", "--json"])
        table = CliRunner().invoke(app, ["jobs", "--job", STALLED_JOB])
    finally:
        from sinks.ddl import migrate

        migrate(ui_store.client, ttl_days=None)
    assert result.exit_code == 0, result.output
    rows = {r["job_id"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert rows[STALLED_JOB]["eta_s"] is None and rows[STALLED_JOB]["condition"]["kind"] == condition["kind"]
    assert table.exit_code == 0 and (
        " stalled since " in table.stdout or " no step since " in table.stdout
    ), table.stdout


def test_the_fleet_flags_a_stalled_job(browser: Any, ui_url: str) -> None:
    """The stalled job's row says 'no progress' (a finished job's does not: test_bounds)."""
    page = _open(browser, ui_url)
    rows = page.evaluate(_FLEET_ROWS)
    stalled = next(r for r in rows if r["job"] == STALLED_JOB)
    assert stalled["stale"] and "no progress" in stalled["progress"], stalled
    page.context.close()


_FLEET_ROWS = """() => [...document.querySelectorAll('tr[data-job]')].map(tr => ({
    job: tr.dataset.job, state: tr.children[2].textContent, health: tr.children[1].textContent,
    stale: !!tr.querySelector('.stale'), progress: tr.children[8].textContent }))"""
