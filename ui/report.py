"""Self-contained incident reports: one HTML file with the job or alert page, its data and ECharts inlined.

The file needs no network to open (clusters are often offline, tickets outlive servers). A report
is written from a ClickHouse store, or from events: a recording the CLI layer replayed through the
detectors (`ui/` runs none), stored into a private, temporary chDB store (this process must not
hold another one).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.client import Client

from schemas.records import Event
from sinks.efficiency import PriceList
from ui import queries
from ui.errors import UiError
from ui.pages import report_html

__all__ = ["report_from_events", "write_report"]


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_report(
    client: Client,
    out: Path,
    *,
    job_id: str | None = None,
    alert_id: str | None = None,
    t0: int | None = None,
    t1: int | None = None,
    prices: PriceList | None = None,
) -> dict[str, Any]:
    """Write the report of a job (optionally a time range) or of an alert; returns what it holds."""
    if (job_id is None) == (alert_id is None):
        raise UiError("a report is of one job (--job) or one alert (--alert)")
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    data: dict[str, Any]
    if alert_id is not None:
        data = queries.alert_page(client, alert_id)
        title = f"alert {data['alert']['rule']} on {data['alert'].get('job_id') or '-'}"
        _atomic_write(out, report_html("alert", alert_id, title, data, generated))
        evidence = data.get("evidence") or {}
        return {"kind": "alert", "alerts": len(evidence.get("alerts", [])), "bytes": out.stat().st_size}
    assert job_id is not None
    data = queries.job_page(client, job_id, t0, t1, prices=prices)
    data["compare"] = queries.compare_of_job(client, job_id)  # its runs next to its workload family's
    _atomic_write(out, report_html("job", job_id, f"job {job_id}", data, generated))
    return {"kind": "job", "alerts": len(data["alerts"]), "bytes": out.stat().st_size}


def report_from_events(
    events: Iterable[Event],
    out: Path,
    *,
    job_id: str | None = None,
    alert_id: str | None = None,
    prices: PriceList | None = None,
) -> dict[str, Any]:
    """Store events (a replayed recording: source events, alerts, derived windows) in a temporary chDB, report from it."""
    from sinks.clickhouse import close, connect
    from sinks.ddl import migrate
    from ui.store import load_events

    with tempfile.TemporaryDirectory(prefix="ranksight-report-") as tmp:
        dsn = f"chdb://{Path(tmp) / 'chdb'}"
        client = connect(dsn)
        try:
            migrate(client, ttl_days=None)  # recordings are old: no retention may drop them on insert
            loaded = {"events": load_events(client, events)}
            if job_id is not None:
                known = client.query(
                    "SELECT count() FROM steps WHERE job_id = {job:String}", parameters={"job": job_id}
                ).result_rows[0][0]
                if not known:
                    jobs = [
                        r[0] for r in client.query("SELECT DISTINCT job_id FROM steps ORDER BY 1").result_rows
                    ]
                    raise UiError(
                        f"job {job_id!r} is not in the recording (it holds: {', '.join(jobs) or 'none'})"
                    )
            result = write_report(client, out, job_id=job_id, alert_id=alert_id, prices=prices)
        finally:
            close(dsn)
    return {**result, **loaded}
