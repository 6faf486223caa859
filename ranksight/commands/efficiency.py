"""`ranksight efficiency`: goodput, GPU-hours, energy and cost per job (and run) from ClickHouse."""

from __future__ import annotations

import json
import math
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import typer

from ranksight.console import fail, print_rows, user_errors

__all__ = ["register"]

# (column, header, format) of the job view; docs/efficiency.md defines each.
_JOB_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("job_id", "job", "s"),
    ("team", "team", "s"),
    ("outcome", "outcome", "s"),
    ("runs", "runs", "d"),
    ("allocated_gpu_h", "GPU-h", ".2f"),
    ("goodput_pct", "goodput%", ".1f"),
    ("stall_gpu_h", "stall GPU-h", ".2f"),
    ("restart_gpu_h", "restart GPU-h", ".2f"),
    ("checkpoint_gpu_h", "ckpt GPU-h", ".2f"),
    ("evaluation_gpu_h", "eval GPU-h", ".2f"),
    ("queue_s", "queue s", ".0f"),
    ("tokens_per_gpu_h", "tokens/GPU-h", ".3g"),
    ("energy_kwh", "kWh", ".3g"),
    ("kwh_per_billion_tokens", "kWh/Btok", ".3g"),
    ("failed_work_pct", "failed%", ".1f"),
    ("scaling_efficiency", "scaling", ".2f"),
    ("cost", "cost", ".2f"),
    ("cost_per_successful_run", "cost/success", ".2f"),
)
_RUN_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("job_id", "job", "s"),
    ("run_id", "run", "s"),
    ("outcome", "outcome", "s"),
    ("gpus", "GPUs", "d"),
    ("wall_s", "wall s", ".0f"),
    ("productive_s", "productive s", ".0f"),
    ("stall_s", "stall s", ".0f"),
    ("restart_lost_s", "restart s", ".0f"),
    ("checkpoint_s", "ckpt s", ".0f"),
    ("evaluation_s", "eval s", ".0f"),
    ("goodput_pct", "goodput%", ".1f"),
    ("tokens_per_gpu_s", "tokens/GPU-s", ".3g"),
    ("energy_kwh", "kWh", ".3g"),
    ("last_verified_step", "verified step", "d"),
)


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if fmt == "s":
        return str(value)
    return format(value, fmt)


def _print(rows: list[dict[str, Any]], columns: tuple[tuple[str, str, str], ...], title: str) -> None:
    cells = [[_cell(r.get(c), f) for c, _, f in columns] for r in rows]
    print_rows([h for _, h, _ in columns], cells, title)


def _json_default(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def efficiency(
    job: str | None = typer.Option(None, "--job", help="Only this job."),
    team: str | None = typer.Option(None, "--team", help="Only this team's jobs (with a team total)."),
    runs: bool = typer.Option(False, "--runs", help="Also show each run of the jobs."),
    price: list[str] = typer.Option(
        [], "--price", help="GPU-hour price by class, CLASS=USD (repeatable; default=USD for the rest)."
    ),
    prices: Path | None = typer.Option(None, "--prices", help="YAML: GPU class -> price per GPU-hour."),
    as_json: bool = typer.Option(False, "--json", help="JSON Lines of the rows instead of a table."),
) -> None:
    """Goodput per job: GPU-hours, where they went, throughput, energy, queue wait, failed work and cost."""
    from ranksight.settings import load_settings
    from sinks.clickhouse import connect
    from sinks.ddl import migrate
    from sinks.efficiency import PriceList, job_rows, run_rows, summarise
    from sinks.errors import ClickHouseLockedError

    settings = load_settings()
    with user_errors():
        price_list = PriceList.parse(price, PriceList.load(prices) if prices else None)
        try:
            client = connect(settings.clickhouse_dsn())
        except ClickHouseLockedError as exc:
            fail(str(exc), code=2)
        migrate(client, settings.ttl_days)
        jobs = job_rows(client, price_list, job=job, team=team)
        run_list = run_rows(client, job=job, team=team) if runs else []
    if not jobs:
        fail(
            f"no runs recorded{f' for job {job}' if job else ''}{f' of team {team}' if team else ''} yet",
            code=1,
        )
    if as_json:
        for row in [*jobs, *run_list]:
            sys.stdout.write(json.dumps(row, default=_json_default) + "\n")
        return
    _print(jobs, _JOB_COLUMNS, "efficiency per job")
    if run_list:
        _print(run_list, _RUN_COLUMNS, "runs")
    if team or len(jobs) > 1:
        total = summarise(jobs)
        parts = [
            f"{total['jobs']} jobs ({total['completed']} completed)",
            f"{total['allocated_gpu_h']:.2f} GPU-h",
            f"goodput {_cell(total['goodput_pct'], '.1f')}%",
            f"{_cell(total['energy_kwh'], '.3g')} kWh",
            f"cost {_cell(total['cost'], '.2f')}",
            f"cost per successful run {_cell(total['cost_per_successful_run'], '.2f')}",
        ]
        sys.stdout.write(f"{team or 'all teams'}: " + ", ".join(parts) + "\n")


def register(app: typer.Typer) -> None:
    """Add the `efficiency` command."""
    app.command("efficiency")(efficiency)
