"""Runbooks open from the UI: every rule's page is served at /runbooks/<rule>, rendered safely, and
the alert page's runbook link reaches it whether the alert carries the engine's relative
`docs/runbooks/<rule>` or an absolute URL built from a base that points at the UI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.ui.conftest import READY, UiStore, needs_chromium
from ui.runbooks import default_runbooks_dir, render_runbook, runbook_rules
from ui.server import UiServer

RULES = runbook_rules(default_runbooks_dir())


def test_markup_in_a_runbook_is_shown_as_text_and_unsafe_links_are_not_links(tmp_path: Path) -> None:
    """Raw HTML in a page is escaped; a javascript: link stays text; links between pages lose `.md`."""
    (tmp_path / "evil.md").write_text(
        "# evil\n\n<script>alert(1)</script> <img src=x onerror=alert(2)>\n\n"
        "[click](javascript:alert(3)) [next](job_stall.md#what-to-do) [index](README.md)\n"
    )
    html = render_runbook(tmp_path, "evil")
    assert "<script>" not in html and "<img" not in html and "&lt;script&gt;" in html
    assert 'href="javascript' not in html
    assert 'href="job_stall#what-to-do"' in html and 'href="./"' in html


@pytest.fixture(scope="module")
def ui(ui_store: UiStore) -> Iterator[tuple[UiServer, str]]:
    """The UI over the store, with one job-less alert per rule (alternately a relative and an absolute link)."""
    server = UiServer(ui_store.client, "127.0.0.1", 0)
    url = server.start()
    for i, rule in enumerate(RULES):
        link = f"docs/runbooks/{rule}" if i % 2 == 0 else f"{url}runbooks/{rule}"
        ui_store.client.command(
            "INSERT INTO alerts SELECT * REPLACE (concat('rb-', {r:String}) AS alert_id, {r:String} AS rule, "
            "{link:String} AS runbook_url, '' AS job_id, 'resolved' AS status) "
            "FROM (SELECT * FROM alerts LIMIT 1)",
            parameters={"r": rule, "link": link},
        )
    try:
        yield server, url
    finally:
        server.stop()
        ui_store.client.command(
            "ALTER TABLE alerts DELETE WHERE startsWith(alert_id, 'rb-')", settings={"mutations_sync": 2}
        )


def test_every_rules_runbook_page_is_served(ui: tuple[UiServer, str]) -> None:
    """GET /runbooks/<rule> is 200 with that rule's page for every rule; /runbooks/ is the index, linking each."""
    _, url = ui
    with httpx.Client(base_url=url, timeout=60) as http:
        index = http.get("/runbooks/")
        assert index.status_code == 200 and "<h1>Runbooks</h1>" in index.text
        for rule in RULES:
            page = http.get(f"/runbooks/{rule}")
            assert page.status_code == 200, rule
            assert f"<h1>{rule}:" in page.text and page.headers["Content-Security-Policy"].startswith(
                "default-src"
            )
        assert http.get("/runbooks/no_such_rule").status_code == 404
    # The index links every page (data_errors and three more were once missing from it).
    assert [rule for rule in RULES if f'href="{rule}"' not in index.text] == []


@needs_chromium
def test_every_rules_runbook_link_on_its_alert_page_opens_its_runbook(
    ui: tuple[UiServer, str], browser: Any
) -> None:
    """From each alert page the runbook link leads to a 200 page about that rule (relative and absolute links)."""
    _, url = ui
    context = browser.new_context()
    page = context.new_page()
    forms = set()
    try:
        for rule in RULES:
            page.goto(f"{url}alerts/rb-{rule}")
            page.wait_for_function(READY, timeout=60_000)
            href = page.get_attribute("a.runbook", "href")
            assert href is not None, rule
            forms.add("absolute" if href.startswith("http") else "relative")
            response = page.goto(href if href.startswith("http") else url.rstrip("/") + href)
            assert response is not None and response.status == 200, (rule, href)
            assert page.locator("article.runbook h1").inner_text().startswith(f"{rule}:"), rule
    finally:
        context.close()
    assert forms == {"absolute", "relative"}


def test_every_runbook_query_runs_filled_in_for_a_job(
    ui_store: UiStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened with an alert's values, every runbook's SQL comes as `ranksight sql --param ...` commands,
    and each of them runs against the store (ClickHouse binds the values; none is pasted into SQL)."""
    import html as html_lib
    import re
    import shlex

    from typer.testing import CliRunner

    from ranksight.cli import app
    from sinks.ddl import migrate
    from tests.integration.ui.conftest import STRAGGLER_JOB, STRAGGLER_RANK

    [(node, gpu)] = ui_store.client.query(
        "SELECT argMax(node, ts), argMax(gpu_index, ts) FROM rank_bound WHERE job_id = {j:String} AND rank = {r:Int32}",
        parameters={"j": STRAGGLER_JOB, "r": STRAGGLER_RANK},
    ).result_rows
    params = {"job_id": STRAGGLER_JOB, "node": node, "rank": str(STRAGGLER_RANK), "gpu_index": str(gpu)}
    commands = []
    for rule in RULES:
        page = render_runbook(default_runbooks_dir(), rule, params)
        for block in re.findall(r"<pre class='run'><code>(.*?)</code></pre>", page, re.S):
            commands += [shlex.split(c) for c in html_lib.unescape(block).split("\n\n")]
    assert len(commands) >= len(RULES)  # nearly every runbook has queries
    monkeypatch.setenv("CLICKHOUSE_URL", ui_store.dsn)
    monkeypatch.setenv("RANKSIGHT_TTL_DAYS", "3650")
    failed = []
    try:
        for argv in commands:
            assert argv[:2] == ["ranksight", "sql"]
            result = CliRunner().invoke(app, [*argv[1:], "--format", "jsonl"])
            if result.exit_code != 0:
                failed.append((argv[-1][:120], result.output[-300:]))
        wrong = CliRunner().invoke(app, ["sql", "--param", "nope=1", "SELECT 1"])
    finally:
        migrate(ui_store.client, ttl_days=None)
    assert failed == []
    assert wrong.exit_code != 0 and "no {nope:Type} placeholder" in wrong.output
