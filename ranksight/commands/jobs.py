"""`ranksight jobs`: each job's progress towards its target and the estimated time to completion, from ClickHouse."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import typer

from ranksight.console import fail, print_rows, user_errors

__all__ = ["register"]


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _when(ms: int | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


# Firing rules that stop a job (as the job page reads them: `ui.facts.job_condition`).
_STOPPING_RULES = ["job_stall", "zombie_job", "rank_hang"]


def _conditions(client: Any, rows: list[Any]) -> dict[str, dict[str, Any]]:
    """Each job's condition now (finished, stalled, hung, overdue or running): a stopped job has no ETA."""
    from ui.facts import job_condition

    firing = client.query(
        "SELECT alert_job, alert_rule, toUnixTimestamp64Milli(alert_start) FROM (SELECT alert_id, "
        "any(job_id) AS alert_job, any(rule) AS alert_rule, min(starts_at) AS alert_start, "
        "argMax(status, ts) AS alert_status FROM alerts WHERE rule IN {rules:Array(String)} GROUP BY alert_id) "
        "WHERE alert_status = 'firing'",
        parameters={"rules": _STOPPING_RULES},
    ).result_rows
    newest = client.query("SELECT toUnixTimestamp64Milli(max(ts)) FROM alerts").result_rows
    alerts: dict[str, list[dict[str, Any]]] = {}
    for job_id, rule, starts_ms in firing:
        alerts.setdefault(job_id, []).append({"status": "firing", "rule": rule, "starts_ms": int(starts_ms)})
    now = max([int(newest[0][0] or 0) if newest else 0, *(r.last_step_ts or 0 for r in rows)])
    return {
        r.job_id: job_condition(
            {"state": r.state, "last_step_ms": r.last_step_ts, "rate_steps_s": r.rate_steps_s},
            alerts.get(r.job_id, []),
            now,
        )
        for r in rows
    }


def _state(row: Any, condition: dict[str, Any]) -> str:
    if condition["kind"] in ("stalled", "hung"):
        return f"{row.state}, {condition['kind']} since {_when(condition['since_ms'])}"
    if condition["kind"] == "overdue":
        return f"{row.state}, no step since {_when(condition['since_ms'])}"
    return str(row.state)


def _cells(row: Any, condition: dict[str, Any]) -> list[str]:
    target = f"{_number(row.target)} {row.target_kind}" if row.target_kind else "-"
    done = f"{_number(row.done)} ({row.fraction:.1%})" if row.fraction is not None else _number(row.done)
    return [
        row.job_id,
        row.team,
        _state(row, condition),
        "-" if row.step is None else str(row.step),
        "-" if row.epoch is None else str(row.epoch),
        target,
        done if row.target_kind else "-",
        "-" if row.rate_steps_s is None else f"{row.rate_steps_s:.3g}",
        _duration(row.eta_s),
        _when(row.finish_ts),
    ]


_HEADERS = ["job", "team", "state", "step", "epoch", "target", "done", "steps/s", "ETA", "finishes"]


def jobs(
    job: str | None = typer.Option(None, "--job", help="Only this job."),
    team: str | None = typer.Option(None, "--team", help="Only this team's jobs."),
    window: float = typer.Option(
        600.0,
        "--window",
        min=10.0,
        help="Seconds of the latest run's most recent steps the rate is measured over.",
    ),
    as_json: bool = typer.Option(False, "--json", help="JSON Lines of the rows instead of a table."),
) -> None:
    """Progress of each job towards its target (steps, tokens or epochs) and the time left at its recent step rate."""
    from ranksight.settings import load_settings
    from sinks.clickhouse import connect
    from sinks.ddl import migrate
    from sinks.errors import ClickHouseLockedError
    from sinks.progress import job_progress

    settings = load_settings()
    with user_errors():
        try:
            client = connect(settings.clickhouse_dsn())
        except ClickHouseLockedError as exc:
            fail(str(exc), code=2)
        migrate(client, settings.ttl_days)
        rows = job_progress(client, job=job, team=team, window_s=window)
        conditions = _conditions(client, rows)
    # State wins over averages: a stalled, hung or overdue job has no ETA, and its state says since when.
    stopped = {j for j, c in conditions.items() if c["kind"] in ("stalled", "hung", "overdue")}
    rows = [replace(r, eta_s=None, finish_ts=None) if r.job_id in stopped else r for r in rows]
    if not rows:
        fail(f"no job recorded{f' as {job}' if job else ''}{f' for team {team}' if team else ''} yet", code=1)
    if as_json:
        for row in rows:
            sys.stdout.write(json.dumps({**row.as_dict(), "condition": conditions[row.job_id]}) + "\n")
        return
    print_rows(
        list(_HEADERS),
        [_cells(r, conditions[r.job_id]) for r in rows],
        "jobs: progress and time to completion",
    )


def register(app: typer.Typer) -> None:
    """Add the `jobs` command."""
    app.command("jobs")(jobs)
