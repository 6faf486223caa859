"""The alert history page (`/history`): alerts that started in a range, filtered by job, node, rule, team."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clickhouse_connect.driver.client import Client

from ui.alerts import fold_muted
from ui.pages.common import fetch_rows, store_alerts

__all__ = ["HISTORY_LIMIT", "alert_history"]


# --- alert history -----------------------------------------------------------------------------------

# The most alerts one history page lists (the newest first): a narrower filter finds older ones.
HISTORY_LIMIT = 500


def alert_history(
    client: Client,
    *,
    job: str | None = None,
    node: str | None = None,
    rule: str | None = None,
    team: str | None = None,
    t0: int | None = None,
    t1: int | None = None,
    kinds: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Every alert that fired for a job, node, rule or team (any of them), started in [t0, t1), newest
    first, at most `HISTORY_LIMIT`; the teams and rules there are, for the page's filters."""
    clauses: list[str] = []
    params: dict[str, Any] = {}
    for name, column, value in (("job", "job_id", job), ("node", "node", node), ("rule", "rule", rule)):
        if value:
            clauses.append(f"{column} = {{{name}:String}}")
            params[name] = value
    if team:
        clauses.append("team = {team:String}")
        params["team"] = team
    if t0 is not None:
        clauses.append("starts_at >= fromUnixTimestamp64Milli({t0:Int64}, 'UTC')")
        params["t0"] = t0
    if t1 is not None:
        clauses.append("starts_at < fromUnixTimestamp64Milli({t1:Int64}, 'UTC')")
        params["t1"] = t1
    # Every routed copy of a matching alert: the team filter picks alerts, the page shows all their copies.
    where = " AND ".join(clauses) or "1"
    alerts = store_alerts(
        client, f"alert_id IN (SELECT DISTINCT alert_id FROM alerts WHERE {where})", kinds=kinds, **params
    )
    fold_muted(alerts)
    alerts.sort(key=lambda a: (-(a["starts_ms"] or 0), a["alert_id"]))
    choices = fetch_rows(client, "SELECT groupUniqArray(team), groupUniqArray(rule) FROM alerts")
    return {
        "alerts": alerts[:HISTORY_LIMIT],
        "truncated": len(alerts) > HISTORY_LIMIT,
        "filters": {"job": job, "node": node, "rule": rule, "team": team, "from": t0, "to": t1},
        "teams": sorted(choices[0][0]) if choices else [],
        "rules": sorted(choices[0][1]) if choices else [],
    }
