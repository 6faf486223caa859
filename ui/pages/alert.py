"""The alert page (`/alerts/<id>`): the alert, its transitions, routed copies, mutes and actions, and its job's panels around it.

`alert_page` reads the store; `alert_report` builds the same JSON from a recording.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clickhouse_connect.driver.client import Client

from sinks.ddl import table_specs
from sinks.rows import row_converter
from ui.alerts import routed_copies, transitions, units_of
from ui.errors import NotFoundError
from ui.pages.common import (
    ALERT_MARGIN_MS,
    TARGET_BUCKETS,
    fetch_rows,
    plain,
    rounded,
    store_actions,
)
from ui.pages.job import Panels, fold_alerts, job_page, recording_frame
from ui.pages.recording import EventSource, scan

__all__ = ["alert_identity", "alert_job", "alert_page", "alert_report"]


def alert_identity(client: Client, alert_id: str) -> tuple[str, str]:
    """The fingerprint and rule of an alert (what Alertmanager knows it by); NotFoundError if unknown."""
    rows = fetch_rows(
        client,
        "SELECT any(fingerprint), any(rule), count() FROM alerts WHERE alert_id = {id:String}",
        id=alert_id,
    )
    if not rows or not rows[0][2]:
        raise NotFoundError("alert", alert_id)
    return str(rows[0][0]), str(rows[0][1])


# --- alert page --------------------------------------------------------------------------------------


def alert_job(client: Client, alert_id: str) -> str | None:
    """The job an alert names, None for an unknown alert or one without a job."""
    rows = fetch_rows(client, "SELECT any(job_id) FROM alerts WHERE alert_id = {id:String}", id=alert_id)
    return str(rows[0][0]) if rows and rows[0][0] else None


def alert_page(
    client: Client, alert_id: str, kinds: Mapping[str, str] | None = None, defer_details: bool = False
) -> dict[str, Any]:
    """Everything an alert carries (its latest record and its status history) and its job's evidence panels.

    Also: each routed copy (team, receiver, paged or informed by `kinds`), the cause that muted it
    or the alerts it mutes, and the remediation decisions taken on it (`actions`).
    """
    rows = client.query(
        # FINAL: the table keeps one record per (team, fingerprint, alert_id, status) once merged
        # (ReplacingMergeTree(ts)); without it the history would depend on whether a merge ran.
        "SELECT * FROM alerts FINAL WHERE alert_id = {id:String} ORDER BY ts, status = 'resolved'",
        parameters={"id": alert_id},
    )
    if not rows.result_rows:
        raise NotFoundError("alert", alert_id)
    records = [dict(zip(rows.column_names, r, strict=True)) for r in rows.result_rows]
    latest = records[-1]
    alert = {k: plain(v) for k, v in latest.items() if not k.startswith("_") and not k.startswith("history.")}
    alert["history"] = [
        [plain(t), rounded(v, 5)]
        for t, v in zip(latest.get("history.ts") or [], latest.get("history.value") or [], strict=False)
    ]
    alert["transitions"] = transitions(records, plain)
    # The headline is what went wrong (the last firing record), the resolution how it ended; the
    # threshold is the expected value of any record that had one (a resolved record may carry none).
    fired = [r for r in records if r["status"] == "firing"] or records
    alert["summary"] = fired[-1]["summary"]
    alert["resolution"] = latest["summary"] if latest["status"] == "resolved" else ""
    alert["observed_fired"] = plain(fired[-1]["observed"])
    alert.update(units_of(fired[-1], [r for r in records if r["expected"] is not None]))
    thresholds = [r["expected"] for r in records if r["expected"] is not None]
    alert["threshold"] = plain(thresholds[-1]) if thresholds else None
    alert["starts_ms"] = plain(min(r["starts_at"] for r in records))
    ends = [r["ends_at"] for r in records if r["ends_at"] is not None]
    alert["ends_ms"] = plain(max(ends)) if ends and latest["status"] == "resolved" else None
    alert["status"] = latest["status"]
    alert["copies"] = routed_copies(records, kinds)
    alert["inhibited_by"] = latest.get("inhibited_by") or ""
    fold_alerts(client, [alert])
    alert["mutes"] = [
        {"alert_id": str(r[0]), "rule": str(r[1])}
        for r in fetch_rows(
            client,
            "SELECT alert_id, any(rule) FROM alerts WHERE inhibited_by = {id:String} AND alert_id != {id:String} "
            "GROUP BY alert_id ORDER BY min(starts_at), alert_id",
            id=alert_id,
        )
    ]
    alert["actions"] = store_actions(client, "alert_id = {id:String}", id=alert_id)
    window_end = (alert["ends_ms"] or plain(latest["ts"])) + ALERT_MARGIN_MS
    evidence = None
    if alert.get("job_id"):
        try:
            # The alert page shows no efficiency panel: it is not computed.
            evidence = job_page(
                client,
                alert["job_id"],
                alert["starts_ms"] - ALERT_MARGIN_MS,
                window_end,
                with_efficiency=False,
                kinds=kinds,
                defer_details=defer_details,
            )
        except NotFoundError:
            evidence = None
    return {"alert": alert, "evidence": evidence}


def alert_report(
    events: EventSource, alert_id: str, *, target: int = TARGET_BUCKETS, kinds: dict[str, str] | None = None
) -> dict[str, Any]:
    """An alert report's data: the alert (`alert_page`) and its job's panels around it."""
    found = scan(events())
    records = found.alert_records(alert_id)
    if not records:
        raise NotFoundError("alert", alert_id)
    spec = table_specs()["Alert"]
    convert = row_converter("Alert")
    names = [c.name for c in spec.columns]
    latest_values = dict(zip(names, convert(records[-1]), strict=True))
    alert: dict[str, Any] = {
        k: rounded(v, 6) if isinstance(v, float) else v
        for k, v in latest_values.items()
        if not k.startswith("history.")
    }
    latest = records[-1]
    alert["history"] = [[p["ts"], rounded(p["value"], 5)] for p in latest.get("history") or []]
    alert["transitions"] = transitions(records)
    fired = [r for r in records if r["status"] == "firing"] or records
    alert["summary"] = fired[-1]["summary"]
    alert["resolution"] = latest["summary"] if latest["status"] == "resolved" else ""
    alert["observed_fired"] = rounded(fired[-1].get("observed"), 6)
    alert.update(units_of(fired[-1], [r for r in records if r.get("expected") is not None]))
    thresholds = [r["expected"] for r in records if r.get("expected") is not None]
    alert["threshold"] = rounded(thresholds[-1], 6) if thresholds else None
    alert["starts_ms"] = min(r["starts_at"] for r in records)
    ends = [r["ends_at"] for r in records if r.get("ends_at") is not None]
    alert["ends_ms"] = max(ends) if ends and latest["status"] == "resolved" else None
    alert["status"] = latest["status"]
    alert["copies"] = routed_copies(records, kinds)
    alert["inhibited_by"] = latest.get("inhibited_by") or ""
    found.fold([alert], kinds)
    muted = [
        (min(r["starts_at"] for r in rs), other, rs[0]["rule"])
        for other, rs in found.all_alerts().items()
        if other != alert_id and any(r.get("inhibited_by") == alert_id for r in rs)
    ]
    alert["mutes"] = [{"alert_id": other, "rule": rule} for _, other, rule in sorted(muted)]
    alert["actions"] = found.actions_of("alert_id", alert_id)
    evidence = None
    if alert.get("job_id"):
        window_end = (alert["ends_ms"] or latest["ts"]) + ALERT_MARGIN_MS
        try:
            frame = recording_frame(
                found, alert["job_id"], alert["starts_ms"] - ALERT_MARGIN_MS, window_end, target, kinds
            )
        except NotFoundError:
            frame = None
        if frame is not None:
            panels = Panels(frame)
            for event in events():
                panels.feed(event)
            evidence = panels.page()
    return {"alert": alert, "evidence": evidence, "_events": found.events}
