"""`ranksight jobs`: each job's progress towards its target and the estimated time to completion, from ClickHouse."""

from __future__ import annotations

import json
import math
import sys
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


def _cells(row: Any) -> list[str]:
    target = f"{_number(row.target)} {row.target_kind}" if row.target_kind else "-"
    done = f"{_number(row.done)} ({row.fraction:.1%})" if row.fraction is not None else _number(row.done)
    return [
        row.job_id,
        row.team,
        row.state,
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
    if not rows:
        fail(f"no job recorded{f' as {job}' if job else ''}{f' for team {team}' if team else ''} yet", code=1)
    if as_json:
        for row in rows:
            sys.stdout.write(json.dumps(row.as_dict()) + "\n")
        return
    print_rows(list(_HEADERS), [_cells(r) for r in rows], "jobs: progress and time to completion")


def register(app: typer.Typer) -> None:
    """Add the `jobs` command."""
    app.command("jobs")(jobs)
