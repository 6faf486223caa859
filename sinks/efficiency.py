"""Reading the efficiency views (`job_efficiency`, `run_efficiency`) and pricing GPU time.

The views hold the measured quantities (docs/efficiency.md), computed from roll-ups that the
inserts maintain (`sinks.efficiency_sql`). Asked for one job, the same statements run with the job
bound as a parameter, so they read that job's roll-up rows only (a 512-rank, 2-hour job answers in
well under a second), not every job's. Money is a setting, so cost is
computed here from a price per GPU-hour by GPU class: a job's cost is its allocated GPU-hours
times its class's price, and the cost per successful run divides the cost of every run (failed
ones included) by the runs that completed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError as _DriverError

from sinks.efficiency_sql import RUN_COLUMNS, job_efficiency_sql, run_efficiency_sql
from sinks.errors import QueryError, SinkError

__all__ = ["PriceList", "PriceListError", "family_jobs", "job_and_runs", "job_rows", "run_rows", "summarise"]


class PriceListError(SinkError):
    """A GPU price list cannot be read or has the wrong shape."""


@dataclass(frozen=True)
class PriceList:
    """Price per GPU-hour by GPU class, with an optional default for classes not listed."""

    prices: Mapping[str, float] = field(default_factory=dict)
    default: float | None = None

    def price(self, gpu_class: str) -> float | None:
        """Price of one GPU-hour of this class (None: unknown)."""
        return self.prices.get(gpu_class, self.default)

    @classmethod
    def parse(cls, items: Iterable[str], base: PriceList | None = None) -> PriceList:
        """`CLASS=PRICE` strings (`default=PRICE` for the rest) over an optional base list."""
        prices = dict(base.prices) if base else {}
        default = base.default if base else None
        for item in items:
            name, sep, value = item.partition("=")
            try:
                price = float(value)
            except ValueError:
                price = -1.0
            if not sep or not name or price < 0:
                raise PriceListError(f"price {item!r} must be CLASS=USD_PER_GPU_HOUR, e.g. H100-80GB=2.5")
            if name == "default":
                default = price
            else:
                prices[name] = price
        return cls(prices, default)

    @classmethod
    def load(cls, path: Path) -> PriceList:
        """A YAML mapping of GPU class -> price per GPU-hour (`default:` for the rest)."""
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise PriceListError(f"cannot read the price list {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise PriceListError(f"price list {path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise PriceListError(f"price list {path} must map GPU classes to prices per GPU-hour")
        return cls.parse(f"{k}={v}" for k, v in data.items())


def _query(client: Client, sql: str, parameters: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        result = client.query(sql, parameters=parameters)
    except _DriverError as exc:
        raise QueryError(str(exc).strip().splitlines()[0]) from exc
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def family_jobs(client: Client, job: str) -> list[str]:
    """The job and the single-node jobs of its workload family (its scaling baseline)."""
    rows = _query(
        client,
        "SELECT DISTINCT job_id FROM job_started WHERE job_id = %(job)s OR (length(nodes) = 1 AND "
        "workload_family != '' AND workload_family IN "
        "(SELECT workload_family FROM job_started WHERE job_id = %(job)s))",
        {"job": job},
    )
    return sorted({job, *(str(r["job_id"]) for r in rows)})


def _source(client: Client, view: str, job: str | None, team: str | None) -> tuple[str, dict[str, Any]]:
    """`FROM ...` of a view, or of its statement for one job (bound as parameters), and the parameters."""
    params: dict[str, Any] = {}
    if job and view == "job_efficiency":
        params.update(job=job, jobs=family_jobs(client, job))
        source = f"({job_efficiency_sql(job=True)})"
    elif job:
        params.update(jobs=[job])
        source = f"({run_efficiency_sql('job_id IN %(jobs)s')})"
    else:
        source = view
    if team:
        params["team"] = team
        return f"{source} WHERE team = %(team)s", params
    return source, params


def job_rows(
    client: Client, prices: PriceList, *, job: str | None = None, team: str | None = None
) -> list[dict[str, Any]]:
    """`job_efficiency` rows (newest first) with `cost` and `cost_per_successful_run` added."""
    source, params = _source(client, "job_efficiency", job, team)
    rows = _query(client, f"SELECT * FROM {source} ORDER BY started DESC, job_id", params)
    for row in rows:
        row["cost"] = _cost(row, prices)
        row["cost_per_successful_run"] = row["cost"] if row["outcome"] == "completed" else None
    return rows


def job_and_runs(
    client: Client, prices: PriceList, job: str
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """`job_rows(job=...)`'s row and `run_rows(job=..., prices=...)` from one statement (None, []: no such job).

    A job page needs both: one statement plans and runs the efficiency SQL once instead of twice.
    """
    rows = _query(
        client,
        f"SELECT * FROM ({job_efficiency_sql(job=True, with_runs=True)})",
        {"job": job, "jobs": family_jobs(client, job)},
    )
    if not rows:
        return None, []
    row = rows[0]
    runs = [dict(zip(RUN_COLUMNS, values, strict=True)) for values in row.pop("run_rows")]
    row["cost"] = _cost(row, prices)
    row["cost_per_successful_run"] = row["cost"] if row["outcome"] == "completed" else None
    for run in runs:
        run["cost"] = _cost(run, prices)
    return row, runs


def run_rows(
    client: Client, *, job: str | None = None, team: str | None = None, prices: PriceList | None = None
) -> list[dict[str, Any]]:
    """`run_efficiency` rows of the selected jobs, in start order (with `cost` when priced)."""
    source, params = _source(client, "run_efficiency", job, team)
    rows = _query(client, f"SELECT * FROM {source} ORDER BY job_id, started", params)
    if prices is not None:
        for row in rows:
            row["cost"] = _cost(row, prices)
    return rows


def _cost(row: Mapping[str, Any], prices: PriceList) -> float | None:
    # Allocated GPU-hours times the class's price: a job's or a run's cost alike.
    price = prices.price(row["gpu_class"])
    return None if price is None else row["allocated_gpu_h"] * price


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over job rows: GPU-hours, goodput, energy, cost and cost per successful run."""
    alloc = sum(r["allocated_gpu_h"] for r in rows)
    productive = sum(r["productive_gpu_h"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    kwh = sum(r["energy_kwh"] for r in rows)
    priced = [r for r in rows if r["cost"] is not None]
    completed = sum(1 for r in rows if r["outcome"] == "completed")
    cost = sum(r["cost"] for r in priced) if priced else None
    return {
        "jobs": len(rows),
        "completed": completed,
        "allocated_gpu_h": alloc,
        "goodput_pct": 100 * productive / alloc if alloc else None,
        "tokens_per_gpu_h": tokens / alloc if alloc else None,
        "energy_kwh": kwh,
        "kwh_per_billion_tokens": kwh / (tokens / 1e9) if tokens else None,
        "cost": cost,
        # Failed and unfinished jobs cost money too: all of it is divided by the runs that succeeded.
        "cost_per_successful_run": cost / completed
        if cost is not None and completed and len(priced) == len(rows)
        else None,
    }
