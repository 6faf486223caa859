"""Pure parts of the UI: bucket widths, the JSON wire format, the report's inlining and the page shells."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ui.shell
from ui.pages.common import BUCKET_STEPS_MS, TARGET_BUCKETS, RawJson, bucket_ms, rollup_cut, to_json
from ui.shell import page_html, report_html


@pytest.fixture(autouse=True)
def _no_vendored_echarts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests need not have run `make ui-assets`: ECharts is replaced by a stub of its name."""
    real = ui.shell.asset_text
    monkeypatch.setattr(
        ui.shell, "asset_text", lambda name: "/* echarts */" if name == "echarts.min.js" else real(name)
    )


@given(st.integers(min_value=1, max_value=30 * 24 * 3600_000))
def test_a_range_is_cut_into_at_most_the_target_number_of_nice_buckets(span_ms: int) -> None:
    """The bucket is the smallest nice width giving at most TARGET_BUCKETS buckets (or the widest width)."""
    width = bucket_ms(span_ms)
    assert width in BUCKET_STEPS_MS
    assert -(-span_ms // width) <= TARGET_BUCKETS or width == BUCKET_STEPS_MS[-1]
    smaller = [w for w in BUCKET_STEPS_MS if w < width]
    assert not smaller or -(-span_ms // smaller[-1]) > TARGET_BUCKETS


def test_two_hours_use_one_minute_buckets_the_roll_ups_answer() -> None:
    """A 2-hour job page reads per-minute roll-ups (gpu_minute, job_step_minute resolution)."""
    assert bucket_ms(2 * 3600_000) == 60_000


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=1, max_value=10**7))
def test_the_page_rollups_answer_whole_minute_buckets_up_to_the_minute_the_end_cuts(
    minutes: int, length: int
) -> None:
    """Minute-aligned buckets of a minute or more: the roll-ups answer [t0, cut), the raw rows [cut, t1)."""
    t0 = minutes * 60_000
    for width in (60_000, 300_000):
        t0w = t0 // width * width
        cut = rollup_cut(t0w, t0w + length, width)
        assert cut is not None and cut % 60_000 == 0 and t0w <= cut <= t0w + length < cut + 60_000
    # Zoomed in (buckets under a minute) or a start inside a minute: the raw rows answer it all.
    assert rollup_cut(t0, t0 + length, 30_000) is None
    assert rollup_cut(t0 + 1, t0 + length + 1, 60_000) is None


def test_raw_json_parts_are_spliced_in_unparsed() -> None:
    """ClickHouse-written JSON is inserted as is, next to ordinary values."""
    data = {"cells": RawJson("[[0,1],[2.5,null]]"), "name": 'job "a"', "more": [RawJson("[]"), 1]}
    assert json.loads(to_json(data)) == {"cells": [[0, 1], [2.5, None]], "name": 'job "a"', "more": [[], 1]}


def test_a_report_cannot_be_broken_out_of_by_its_data() -> None:
    """A job id or summary holding `</script>`, `<!--` or `&` stays inside the report's JSON data block."""
    evil = "</script><script>alert(1)</script><!--&amp;"
    html = report_html("job", evil, "t", {"job": {"job_id": evil}}, "now")
    data_script = html.split("id='ranksight-report'>", 1)[1].split("</script>", 1)[0]
    assert "<" not in data_script and ">" not in data_script and "&" not in data_script
    assert json.loads(data_script)["data"]["job"]["job_id"] == evil
    assert "alert(1)" not in html.replace(data_script, "")  # only inside the data block


def test_a_report_runs_under_a_policy_that_allows_only_its_own_scripts() -> None:
    """The report's CSP lists the hash of each inlined script and of its stylesheet, nothing inline else."""
    import base64
    import hashlib
    import html as markup
    import re

    html = report_html("job", "j", "t", {}, "now")
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)
    assert policy is not None
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    assert len(scripts) == 2
    for body in scripts:
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in markup.unescape(policy.group(1))
    assert "unsafe-inline" not in policy.group(1) and "unsafe-eval" not in policy.group(1)


def test_a_report_inlines_its_scripts_and_fetches_nothing() -> None:
    """No <script src>, no stylesheet link: everything a report needs is in the file."""
    html = report_html("job", "j", "t", {}, "now")
    assert "<script src" not in html and "<link" not in html
    assert "echarts" in html and "window.ranksight" in html and "<script type='application/json'" in html


def test_a_served_page_names_its_kind_and_key_escaped() -> None:
    """The page shell carries the page kind and id for the script, HTML-escaped."""
    html = page_html("alert", 'a"<b>', "alert")
    assert "data-page=" in html and '"<b>' not in html and "/static/app.js" in html
