"""Self-contained incident reports: one HTML file with the job or alert page, its data and ECharts inlined.

The file needs no network to open (clusters are often offline, tickets outlive servers). A report
is written from a ClickHouse store, or from events: a recording the CLI layer replayed through the
detectors (`ui/` runs none), folded panel by panel in two passes (`ui.pages.recording`, then each page's fold) without any store,
so its memory is bounded by the page, not by the recording.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.client import Client

from sinks.efficiency import PriceList
from ui.errors import UiError
from ui.pages.alert import alert_page, alert_report
from ui.pages.compare import compare_of_job
from ui.pages.job import job_page, job_report
from ui.pages.recording import EventSource
from ui.shell import report_html

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
    receivers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write the report of a job (optionally a time range) or of an alert; returns what it holds.

    `receivers` (receiver -> page, inform or escalate) says which routed copies of an alert paged.
    """
    if (job_id is None) == (alert_id is None):
        raise UiError("a report is of one job (--job) or one alert (--alert)")
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    data: dict[str, Any]
    if alert_id is not None:
        data = alert_page(client, alert_id, kinds=receivers)
        title = f"alert {data['alert']['rule']} on {data['alert'].get('job_id') or '-'}"
        _atomic_write(out, report_html("alert", alert_id, title, data, generated))
        evidence = data.get("evidence") or {}
        return {"kind": "alert", "alerts": len(evidence.get("alerts", [])), "bytes": out.stat().st_size}
    assert job_id is not None
    data = job_page(client, job_id, t0, t1, prices=prices, kinds=receivers)
    data["compare"] = compare_of_job(client, job_id)  # its runs next to its workload family's
    _atomic_write(out, report_html("job", job_id, f"job {job_id}", data, generated))
    return {"kind": "job", "alerts": len(data["alerts"]), "bytes": out.stat().st_size}


def report_from_events(
    events: EventSource,
    out: Path,
    *,
    job_id: str | None = None,
    alert_id: str | None = None,
    prices: PriceList | None = None,
    sources: EventSource | None = None,
    receivers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write the report of a job or an alert from events (a replayed recording), in bounded memory.

    `events` is called once per pass (a report reads the stream twice and keeps per-panel
    aggregates, never the events): no store is opened. `sources`, the recording without the
    detectors, lets a job report run them once.
    """
    if (job_id is None) == (alert_id is None):
        raise UiError("a report is of one job (--job) or one alert (--alert)")
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    if alert_id is not None:
        data = alert_report(events, alert_id, kinds=receivers)
        read = data.pop("_events")
        title = f"alert {data['alert']['rule']} on {data['alert'].get('job_id') or '-'}"
        _atomic_write(out, report_html("alert", alert_id, title, data, generated))
        evidence = data.get("evidence") or {}
        return {
            "kind": "alert",
            "alerts": len(evidence.get("alerts", [])),
            "bytes": out.stat().st_size,
            "events": read,
        }
    assert job_id is not None
    data = job_report(events, job_id, prices=prices, sources=sources, kinds=receivers)
    read = data.pop("_events")
    _atomic_write(out, report_html("job", job_id, f"job {job_id}", data, generated))
    return {"kind": "job", "alerts": len(data["alerts"]), "bytes": out.stat().st_size, "events": read}
