"""Fixtures of the UI tests: one chDB store filled from a simulated scenario, shared by the package.

The store is built without Kafka: the simulator's events and what the detectors raise on them
(replayed offline by the CLI layer, `ranksight.commands.report.replayed`) go through the sink's
writer in this process, so the tables, roll-ups, derived windows and alerts are those
a live deployment would hold. chDB opens one directory per process, hence one store per package.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from producers.simulator import load_scenario, simulate
from ranksight.commands.report import replayed
from schemas.files import write_container
from sinks.clickhouse import close, connect
from sinks.ddl import migrate
from ui.server import UiServer
from ui.store import load_events

# The demo's scenario, cut after the straggler (rank 13 of pretrain-13b-0301, 6..12 min) resolved.
SCENARIO = "mixed"
DURATION_S = 14 * 60
STRAGGLER_JOB = "pretrain-13b-0301"
STRAGGLER_RANK = 13
FAULT_START_S, FAULT_END_S = 6 * 60, 12 * 60
# The GPU-hour price the UI tests configure (`--price default=...` for the command).
PRICE_PER_GPU_H = 2.5

# The browser tests drive Debian's Chromium (not Playwright's download) headless.
CHROMIUM = os.environ.get("RANKSIGHT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Functions, not expressions: Playwright evaluates an expression string with eval(), which the
# pages' Content-Security-Policy forbids (no 'unsafe-eval').
READY = "() => window.ranksight && (window.ranksight.ready || window.ranksight.error)"
ECHARTS = Path(__file__).parents[3] / "ui" / "static" / "vendor" / "echarts.min.js"
# A browser test needs both; without them it is skipped, saying which is missing.
_MISSING = (
    f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run installs it)"
    if not Path(CHROMIUM).exists()
    else "ECharts is not vendored: run `make ui-assets` (make test does)"
    if not ECHARTS.exists()
    else ""
)
needs_chromium = pytest.mark.skipif(bool(_MISSING), reason=_MISSING or "Chromium and ECharts are here")


@dataclass(frozen=True)
class UiStore:
    """The filled store and what the tests need to know about its content."""

    client: Client
    dsn: str
    recording: Path
    start_ms: int
    jobs: tuple[str, ...]


@pytest.fixture(scope="package")
def ui_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiStore]:
    """A migrated chDB store holding the scenario's events, derived windows and alerts."""
    root = tmp_path_factory.mktemp("ui-store")
    scenario = load_scenario(SCENARIO).with_overrides(duration=DURATION_S)
    recording = root / "incident.avro"
    write_container(recording, simulate(scenario, 0).events())
    dsn = f"chdb://{root / 'chdb'}"
    client = connect(dsn)
    try:
        migrate(client, ttl_days=None)  # simulated time is in the past: no retention may drop it
        load_events(client, replayed([recording]))
        yield UiStore(client, dsn, recording, scenario.start_ms, tuple(job.id for job in scenario.jobs))
    finally:
        close(dsn)


def efficiency_json(store: UiStore, monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """`ranksight efficiency --json --runs --price default=PRICE` over the store: rows by job id and by run id.

    The command runs in this process (chDB opens a directory once per process) and gets the store's
    cached client. Its migration sets the retention: ten years here (a century would overflow DateTime), removed again after, so nothing
    of the simulated (past) data is dropped for the tests that follow.
    """
    from typer.testing import CliRunner

    from ranksight.cli import app
    from sinks.ddl import migrate

    monkeypatch.setenv("CLICKHOUSE_URL", store.dsn)
    monkeypatch.setenv("RANKSIGHT_TTL_DAYS", "3650")
    try:
        result = CliRunner().invoke(
            app, ["efficiency", "--json", "--runs", "--price", f"default={PRICE_PER_GPU_H}"]
        )
    finally:
        migrate(store.client, ttl_days=None)
    assert result.exit_code == 0, result.output
    rows: dict[str, dict[str, Any]] = {}
    for line in result.stdout.splitlines():
        row = json.loads(line)
        # Job rows carry `runs`; run rows a `run_id`.
        rows[row["run_id"] if "run_id" in row else row["job_id"]] = row
    return rows


@pytest.fixture(scope="module")
def ui_url(ui_store: UiStore) -> Iterator[str]:
    """The UI served on a free port of 127.0.0.1 over the package's store (a module may override it)."""
    server = UiServer(ui_store.client, "127.0.0.1", 0)
    yield server.start()
    server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium (the system's, not Playwright's download), headless, one per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
