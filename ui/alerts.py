"""How the pages present alerts: muted symptoms folded under their cause, and who got each routed copy.

The engine mutes a symptom its cause explains (`inhibited_by` = the cause's `alert_id`, issue 20):
a page lists the cause once and the symptom under it ("straggler, muted by gpu_throttling on the
same GPU"), never as a second firing alert. Routing publishes one record per receiver copy of an
alert (`team`, `receiver`); the alert page says which copies paged a team and which only informed
it, from the receivers' kinds the UI was given (`ui --ownership`: the ownership file's page,
inform and escalate receivers; without it a copy's kind is unknown).

Pure functions over the pages' alert dicts; the served pages and reports from recordings share them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "copies_of",
    "fold_muted",
    "latest_order",
    "routed_copies",
    "scope_text",
    "transitions",
    "units_of",
]

# What a receiver's copy does, by the ownership file's receiver kinds.
_KIND_WORDS = {"page": "paged", "escalate": "escalated", "inform": "informed"}


def scope_text(cause: Mapping[str, Any], symptom: Mapping[str, Any]) -> str:
    """Where the cause and its symptom meet: "on the same GPU", "on the same node", "in the same job" or ""."""
    node, gpu = cause.get("node"), cause.get("gpu_index")
    if node and node == symptom.get("node"):
        if gpu is not None and gpu == symptom.get("gpu_index"):
            return "on the same GPU"
        return "on the same node"
    if cause.get("job_id") and cause.get("job_id") == symptom.get("job_id"):
        return "in the same job"
    return ""


def fold_muted(
    alerts: Sequence[dict[str, Any]], others: Mapping[str, Mapping[str, Any]] | None = None
) -> None:
    """Mark each alert with `muted_by` (its cause: alert_id, rule, scope; None when not muted) and `mutes`
    (the alert_ids it mutes among `alerts`), in place.

    A cause missing from `alerts` is looked up in `others` (a cause on another job or outside the
    page's range); unknown, it is named by its alert_id alone.
    """
    by_id = {a["alert_id"]: a for a in alerts}
    for alert in alerts:
        alert["mutes"] = []
    for alert in alerts:
        cause_id = alert.get("inhibited_by") or ""
        if not cause_id:
            alert["muted_by"] = None
            continue
        cause = by_id.get(cause_id) or (others or {}).get(cause_id)
        alert["muted_by"] = {
            "alert_id": cause_id,
            "rule": cause.get("rule") if cause else None,
            "scope": scope_text(cause, alert) if cause else "",
        }
        if cause_id in by_id and cause_id != alert["alert_id"]:
            by_id[cause_id]["mutes"].append(alert["alert_id"])


def copies_of(pairs: Iterable[Sequence[Any]], kinds: Mapping[str, str] | None) -> list[dict[str, Any]]:
    """The routed copies of one alert from its (team, receiver) pairs, sorted, each with what it did."""
    out = []
    for team, receiver in sorted({(str(t), str(r)) for t, r, *_ in pairs}):
        kind = (kinds or {}).get(receiver)
        out.append({"team": team, "receiver": receiver, "kind": _KIND_WORDS.get(kind or "")})
    return out


def routed_copies(
    records: Sequence[Mapping[str, Any]], kinds: Mapping[str, str] | None
) -> list[dict[str, Any]]:
    """Per routed copy of one alert (its records, any order): team, receiver, what it did, status and when."""
    latest: dict[tuple[str, str], Mapping[str, Any]] = {}
    for record in records:
        key = (str(record.get("team") or ""), str(record.get("receiver") or ""))
        if key not in latest or _ts(record) >= _ts(latest[key]):
            latest[key] = record
    out = copies_of(latest, kinds)
    for copy in out:
        record = latest[(copy["team"], copy["receiver"])]
        copy["status"] = record.get("status")
        copy["updated_ms"] = _ts(record)
    return out


def _ts(record: Mapping[str, Any]) -> int:
    value = record.get("ts")
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return round(aware.timestamp() * 1000)
    return int(value or 0)


def latest_order(record: Mapping[str, Any]) -> tuple[Any, bool]:
    """Sort key of an alert's records, oldest to latest: by time, and of two at one time the
    resolution last (an alert_id resolves once and nothing follows it; a refresh while it fires may
    carry the resolution's own time). The store's queries order the same (`ui.pages.common._LATEST`)."""
    return (record["ts"], record.get("status") == "resolved")


def transitions(records: Iterable[Mapping[str, Any]], ts: Any = lambda v: v) -> list[dict[str, Any]]:
    """An alert's status history from its records in time order: one row per change, not one per
    routed copy (routing writes the same transition once for each receiving team) nor one per
    refresh while it fires. A firing row is dated when the alert began (`starts_at`) and says what
    its newest firing record says and when that was (`updated`): the store keeps only the newest
    firing record of an alert once merged, a recording keeps them all, and both give these rows.
    `ts` turns a record's time into what the page shows."""
    out: list[dict[str, Any]] = []
    rows: dict[tuple[Any, Any], dict[str, Any]] = {}
    for r in records:
        firing = r["status"] == "firing" and r.get("starts_at") is not None
        since = r["starts_at"] if firing else r["ts"]
        row = rows.get((r["status"], since))
        if row is None:
            row = rows[(r["status"], since)] = {"ts": ts(since), "status": r["status"]}
            out.append(row)
        row["summary"] = r["summary"]
        row["updated"] = ts(r["ts"])
    return out


def units_of(fired: Mapping[str, Any], with_expected: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The units and meanings of an alert page's numbers, each from the record its value comes from:
    the observed value when it fired (`fired`) and the threshold (the newest record that had one).
    None where a record written before alerts carried units has none (the page then says so)."""
    threshold = with_expected[-1] if with_expected else {}
    return {
        "observed_fired_unit": fired.get("observed_unit"),
        "observed_fired_what": fired.get("observed_what"),
        "threshold_unit": threshold.get("expected_unit"),
        "threshold_what": threshold.get("expected_what"),
    }
