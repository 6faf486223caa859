"""The SQL behind every panel of the UI, one function per page, returning plain JSON-ready dicts.

Times are UTC milliseconds everywhere. A page's time range is cut into at most about
`TARGET_BUCKETS` buckets of a "nice" width; series are aggregated per bucket in ClickHouse. The
roll-ups answer whenever the bucket is at least as wide as their resolution: `derived_rank_windows`
(the detectors' per-rank windows) for the rank heatmap, `gpu_minute` for GPU panels and
`job_step_minute` for the job's time range and the fleet's progress. Raw tables answer the rest
and any zoomed-in range.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

from clickhouse_connect.driver.client import Client

from schemas.eventtime import MIN_EVENT_TS
from sinks.efficiency import PriceList, job_rows, run_rows
from sinks.errors import QueryError
from ui.alerts import copies_of, fold_muted, routed_copies, transitions, units_of
from ui.errors import NotFoundError
from ui.facts import PROGRESS_WINDOW_S, checkpoint_facts, job_condition, progress_panel, without_eta
from ui.rows import RowLayout, row_layout

__all__ = [
    "ACTION_COLUMNS",
    "BUCKET_STEPS_MS",
    "DATAPATH_METRICS",
    "DETAIL_PANELS",
    "HISTORY_LIMIT",
    "MAX_FAULTS",
    "TARGET_BUCKETS",
    "alert_history",
    "alert_identity",
    "alert_job",
    "alert_page",
    "bucket_ms",
    "compare",
    "compare_of_job",
    "efficiency",
    "finished_fingerprint",
    "fleet",
    "fleet_goodput",
    "job_details",
    "job_page",
    "latest_version",
    "plausible_bounds",
    "step_rate",
    "to_json",
]

TARGET_BUCKETS = 180
BUCKET_STEPS_MS: tuple[int, ...] = tuple(
    s * 1000 for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
)
_DERIVED_HOP_MS = 30_000  # the detectors' hop: derived windows answer buckets at least this wide
_MINUTE_MS = 60_000
# Alert pages show this much before and after the alert's span.
_ALERT_MARGIN_MS = 10 * 60_000
_RECENT_RESOLVED_MS = 6 * 3600_000
_SEVERITIES = ("critical", "warning", "info")
# A job without a step for this long behind the fleet's newest data shows "no progress" and 0 steps/s.
STALLED_MS = 120_000
# The plausible event times (`plausible_bounds`): 2000-01-01, as the sink's own lower bound, and the
# worker's default `engine.max_clock_skew_s` (300 s) past the wall clock.
MIN_PLAUSIBLE_MS = MIN_EVENT_TS
MAX_CLOCK_SKEW_MS = 300_000


def bucket_ms(span_ms: int, target: int = TARGET_BUCKETS) -> int:
    """The smallest nice bucket width that cuts `span_ms` into at most `target` buckets."""
    want = max(1, math.ceil(span_ms / max(target, 1)))
    for step in BUCKET_STEPS_MS:
        if step >= want:
            return step
    return BUCKET_STEPS_MS[-1]


@dataclass(frozen=True)
class RawJson:
    """JSON text ClickHouse wrote itself (big cell arrays): passed through, never parsed in Python."""

    text: str


def to_json(data: Any) -> str:
    """Compact JSON of a page's data, `RawJson` parts spliced in as they are."""
    raws: list[str] = []
    # The placeholders carry a fresh random tag: a record string cannot spell one (a string equal to a
    # fixed placeholder would have been replaced in its place, and the raw part left quoted).
    tag = secrets.token_hex(8)

    def default(value: Any) -> str:
        if isinstance(value, RawJson):
            raws.append(value.text)
            return f"\u0000raw{tag}:{len(raws) - 1}\u0000"
        raise TypeError(f"not JSON serialisable: {type(value).__name__}")

    text = json.dumps(data, separators=(",", ":"), default=default)
    for i, raw in enumerate(raws):
        text = text.replace(f'"\\u0000raw{tag}:{i}\\u0000"', raw, 1)
    return text


def _bound(sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
    # Values travel apart from the SQL (ClickHouse query parameters, `{name:Type}`): a value never
    # becomes SQL text. A parameter without its placeholder would make clickhouse-connect fall back to
    # %-formatting the text itself, so it is refused here.
    for name in params:
        if "{" + name + ":" not in sql:
            raise ValueError(f"query parameter {name!r} has no {{{name}:Type}} placeholder")
    return params or None


def _columns(client: Client, sql: str, **params: Any) -> RawJson:
    """A result as JSON columns (`[[col1...], [col2...]]`) written by ClickHouse."""
    raw = client.raw_query(
        sql,
        parameters=_bound(sql, params),
        fmt="JSONCompactColumns",
        settings={"output_format_json_quote_64bit_integers": 0, "output_format_json_quote_denormals": 0},
    )
    return RawJson(raw.decode().strip())


def _rows(client: Client, sql: str, **params: Any) -> Sequence[Sequence[Any]]:
    return client.query(sql, parameters=_bound(sql, params)).result_rows


def _ms(column: str) -> str:
    return f"toUnixTimestamp64Milli({column})"


def _between(column: str) -> str:
    """`column` in [t0, t1): the bounds are the parameters `t0` and `t1` (UTC ms)."""
    return (
        f"{column} >= fromUnixTimestamp64Milli({{t0:Int64}}, 'UTC') "
        f"AND {column} < fromUnixTimestamp64Milli({{t1:Int64}}, 'UTC')"
    )


def _bucket(column_ms: str) -> str:
    """The start of `column_ms`'s bucket: the width is the parameter `width` (ms)."""
    return f"intDiv({column_ms}, {{width:Int64}}) * {{width:Int64}}"


# Row filters on the plausible times (parameters `lo`, `hi` from `plausible_bounds`).
_PLAUSIBLE_TS = (
    "ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')"
)
# (The column stays bare so the sorting key and partitions prune: a function of `minute` would not.)
_PLAUSIBLE_MINUTE = "minute BETWEEN toDateTime(intDiv({lo:Int64}, 1000), 'UTC') AND toDateTime(intDiv({hi:Int64}, 1000), 'UTC')"


def plausible_bounds(now_ms: int | None = None) -> tuple[int, int]:
    """Event times the pages believe: 2000-01-01 .. now plus the worker's clock skew (UTC ms).

    A record stamped 2199 (a bad clock) or 1970 (seconds read as ms) must not stretch a job's time
    range or become a fleet's "now"; the sink may store what the worker rejects, so the pages
    apply the worker's bound themselves (docs/security.md).
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return MIN_PLAUSIBLE_MS, now + MAX_CLOCK_SKEW_MS


def _num(value: Any, digits: int = 4) -> float | None:
    """A finite float rounded for the wire, or None (JSON has no NaN)."""
    if value is None:
        return None
    f = float(value)
    if not math.isfinite(f):
        return None
    return round(f, digits)


# --- versions (live updates) -----------------------------------------------------------------------


# The tables whose row counts mark a change (the pages' live refresh; the untrusted-input test waits on them).
VERSION_TABLES = (
    "steps",
    "alerts",
    "gpu_samples",
    "host_samples",
    "job_started",
    "job_states",
    "rank_bound",
    "checkpoints",
    "evaluations",
    "derived_rank_windows",
)


def latest_version(client: Client) -> dict[str, int]:
    """Cheap change markers: row counts of the tables the pages read (a page refetches when they move)."""
    rows = _rows(
        client,
        "SELECT table, sum(rows) FROM system.parts WHERE database = currentDatabase() AND active "
        "AND table IN {tables:Array(String)} GROUP BY table",
        tables=list(VERSION_TABLES),
    )
    return {str(name): int(count) for name, count in rows}


# --- alerts ------------------------------------------------------------------------------------------

_ALERT_COLUMNS = (
    "alert_id",
    "argMax(status, ts) AS status",
    "any(rule) AS rule",
    "any(severity) AS severity",
    "any(category) AS category",
    "any(team) AS team",
    "any(receiver) AS receiver",
    # A resolved alert's headline stays what went wrong; how it ended is its `resolution`.
    # (raw_*: the subquery's copies of the columns; the aliases below shadow the column names.)
    "if(countIf(raw_status = 'firing') > 0, argMaxIf(raw_summary, ts, raw_status = 'firing'), "
    "argMax(raw_summary, ts)) AS summary",
    "if(argMax(raw_status, ts) = 'resolved', argMax(raw_summary, ts), '') AS resolution",
    "any(job_id) AS job_id",
    "any(run_id) AS run_id",
    "any(cluster) AS cluster",
    "any(node) AS node",
    "any(rank) AS rank",
    "any(gpu_index) AS gpu_index",
    "any(gpu_uuid) AS gpu_uuid",
    f"{_ms('min(starts_at)')} AS starts_ms",
    f"{_ms('argMax(ends_at, ts)')} AS ends_ms",
    f"{_ms('max(ts)')} AS updated_ms",
    "any(suspected_layer) AS suspected_layer",
    "any(runbook_url) AS runbook_url",
    "any(fingerprint) AS fingerprint",
    # The cause that muted it (the latest record's: a cause that fires later re-sends its symptom muted).
    "argMax(ifNull(raw_inhibited_by, ''), ts) AS inhibited_by",
    # Every routed copy (one record per team and receiver).
    "arraySort(groupUniqArray((raw_team, raw_receiver))) AS copies",
)
_ALERT_KEYS = tuple(c.split(" AS ")[-1] for c in _ALERT_COLUMNS)


def _alerts(
    client: Client, where: str = "1", kinds: Mapping[str, str] | None = None, **params: Any
) -> list[dict[str, Any]]:
    """One row per alert (its records folded), its routed copies named with what they did (`kinds`)."""
    # The filter runs in a subquery: the aggregates' aliases reuse the column names. Records stamped
    # outside the plausible times are left out (one 2199 alert must not become the fleet's "now").
    lo, hi = plausible_bounds()
    sql = (
        f"SELECT {', '.join(_ALERT_COLUMNS)} FROM (SELECT *, status AS raw_status, summary AS raw_summary, "
        "inhibited_by AS raw_inhibited_by, team AS raw_team, receiver AS raw_receiver "
        f"FROM alerts WHERE ({where}) "
        "AND ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC') "
        "AND starts_at BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')) "
        "GROUP BY alert_id ORDER BY starts_ms"
    )
    out = [dict(zip(_ALERT_KEYS, row, strict=True)) for row in _rows(client, sql, lo=lo, hi=hi, **params)]
    for alert in out:
        alert["copies"] = copies_of(alert["copies"], kinds)
    return out


def alert_identity(client: Client, alert_id: str) -> tuple[str, str]:
    """The fingerprint and rule of an alert (what Alertmanager knows it by); NotFoundError if unknown."""
    rows = _rows(
        client,
        "SELECT any(fingerprint), any(rule), count() FROM alerts WHERE alert_id = {id:String}",
        id=alert_id,
    )
    if not rows or not rows[0][2]:
        raise NotFoundError("alert", alert_id)
    return str(rows[0][0]), str(rows[0][1])


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
    alerts = _alerts(
        client, f"alert_id IN (SELECT DISTINCT alert_id FROM alerts WHERE {where})", kinds=kinds, **params
    )
    fold_muted(alerts)
    alerts.sort(key=lambda a: (-(a["starts_ms"] or 0), a["alert_id"]))
    choices = _rows(client, "SELECT groupUniqArray(team), groupUniqArray(rule) FROM alerts")
    return {
        "alerts": alerts[:HISTORY_LIMIT],
        "truncated": len(alerts) > HISTORY_LIMIT,
        "filters": {"job": job, "node": node, "rule": rule, "team": team, "from": t0, "to": t1},
        "teams": sorted(choices[0][0]) if choices else [],
        "rules": sorted(choices[0][1]) if choices else [],
    }


# --- fleet -------------------------------------------------------------------------------------------


def fleet(client: Client, goodput: bool = True, kinds: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every job with its health, and the alerts firing and recently resolved (routed teams included).

    A muted alert (`inhibited_by`) carries `muted_by` (its cause) and its cause `mutes`: the page
    lists it under the cause, and a job's firing counts leave it out. `kinds`: receiver -> page,
    inform or escalate (the ownership file's), so each routed copy says whether it paged.

    `goodput=False` leaves `goodput_pct` unset (None): the efficiency views scan every step row, so
    the server answers them apart (`fleet_goodput`, cached) and the page fills the column in after.
    """
    jobs: dict[str, dict[str, Any]] = {}
    lo, hi = plausible_bounds()
    for row in _rows(
        client,
        "SELECT job_id, argMax(run_id, ts), argMax(team, ts), argMax(owner, ts), argMax(cluster, ts), "
        "argMax(model_name, ts), argMax(world_size, ts), argMax(gpu_class, ts), "
        f"{_ms('min(ts)')} FROM job_started WHERE {_PLAUSIBLE_TS} GROUP BY job_id",
        lo=lo,
        hi=hi,
    ):
        jobs[row[0]] = {
            "job_id": row[0],
            "run_id": row[1],
            "team": row[2],
            "owner": row[3],
            "cluster": row[4],
            "model": row[5],
            "world_size": int(row[6]),
            "gpu_class": row[7],
            "started_ms": int(row[8]),
            "state": None,
            "last_progress_ms": None,
            "last_step": None,
            "step_rate": None,
            "progress_time_frac": None,
            "goodput_pct": None,
            "firing": {s: 0 for s in _SEVERITIES},
        }
    for job_id, state, reason in _rows(
        client, "SELECT job_id, argMax(state, ts), argMax(reason, ts) FROM job_states GROUP BY job_id"
    ):
        if job_id in jobs:
            jobs[job_id]["state"] = state
            jobs[job_id]["state_reason"] = reason
    # Progress from the per-minute roll-up; the step rate over the last five minutes of each job.
    minutes: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for job_id, minute_ms, last_step in _rows(
        client,
        "SELECT job_id, toUnixTimestamp(minute) * 1000 AS m, max(last_step) FROM job_step_minute "
        f"WHERE {_PLAUSIBLE_MINUTE} GROUP BY job_id, m ORDER BY job_id, m",
        lo=lo,
        hi=hi,
    ):
        minutes[job_id].append((int(minute_ms), int(last_step)))
    newest_minute = max((series[-1][0] for series in minutes.values()), default=0)
    for job_id, series in minutes.items():
        # Not ML goodput (nothing stores useful work yet): the share of the minutes from the job's first
        # step to the fleet's newest one that have steps; a stalled job falls behind.
        spanned = (newest_minute - series[0][0]) // _MINUTE_MS + 1
        job = jobs.setdefault(job_id, _unknown_job(job_id))
        job["progress_time_frac"] = _num(len(series) / spanned, 3)
        job["last_step"] = series[-1][1]
        # Over the fleet's last five minutes: a job that stopped stepping before them runs at 0 steps/s.
        window = [p for p in series if p[0] >= newest_minute - 5 * _MINUTE_MS]
        if not window:
            job["step_rate"] = 0.0
        elif len(window) >= 2 and window[-1][0] > window[0][0]:
            job["step_rate"] = _num(
                (window[-1][1] - window[0][1]) / ((window[-1][0] - window[0][0]) / 1000), 3
            )
    if minutes:
        for job_id, last_ms, last_step in _rows(
            client,
            f"SELECT job_id, {_ms('max(ts)')}, max(step) FROM steps "
            f"WHERE {_PLAUSIBLE_TS} AND (job_id, toStartOfMinute(ts)) IN "
            f"(SELECT job_id, max(minute) FROM job_step_minute WHERE {_PLAUSIBLE_MINUTE} GROUP BY job_id) "
            "GROUP BY job_id",
            lo=lo,
            hi=hi,
        ):
            jobs[job_id]["last_progress_ms"] = int(last_ms)
            jobs[job_id]["last_step"] = int(last_step)
    if goodput:
        for job_id, pct in fleet_goodput(client).items():
            if job_id in jobs:
                jobs[job_id]["goodput_pct"] = pct
    alerts = _alerts(client, kinds=kinds)
    fold_muted(alerts)
    data_now = max(
        [a["updated_ms"] for a in alerts] + [j["last_progress_ms"] or 0 for j in jobs.values()] + [0]
    )
    for job in jobs.values():
        # A job with no step for over STALLED_MS while the fleet moved on is stepping at 0/s now,
        # whatever it did in the minutes before.
        if job["last_progress_ms"] is not None and data_now - job["last_progress_ms"] > STALLED_MS:
            job["step_rate"] = 0.0
    firing = [a for a in alerts if a["status"] == "firing"]
    resolved = [
        a
        for a in alerts
        if a["status"] == "resolved" and (a["ends_ms"] or 0) >= data_now - _RECENT_RESOLVED_MS
    ]
    for alert in firing:
        owner = jobs.get(alert["job_id"])
        if owner is not None and alert["severity"] in owner["firing"] and not alert["muted_by"]:
            owner["firing"][alert["severity"]] += 1
    ordered = sorted(
        jobs.values(),
        key=lambda j: (-j["firing"]["critical"], -j["firing"]["warning"], -j["firing"]["info"], j["job_id"]),
    )
    return {
        "now_ms": data_now,
        "jobs": ordered,
        "teams": sorted({j["team"] for j in jobs.values() if j["team"]}),
        "clusters": sorted({j["cluster"] for j in jobs.values() if j["cluster"]}),
        "firing": sorted(firing, key=lambda a: (_SEVERITIES.index(a["severity"]), -a["starts_ms"])),
        "resolved": sorted(resolved, key=lambda a: -(a["ends_ms"] or 0)),
    }


def _unknown_job(job_id: str) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "run_id": "",
        "team": "",
        "owner": "",
        "cluster": "",
        "model": "",
        "world_size": 0,
        "gpu_class": "",
        "started_ms": None,
        "state": None,
        "last_progress_ms": None,
        "last_step": None,
        "step_rate": None,
        "progress_time_frac": None,
        "goodput_pct": None,
        "firing": {s: 0 for s in _SEVERITIES},
    }


# --- efficiency ----------------------------------------------------------------------------------

# Where a job's allocated GPU-hours went, in the order the stacked bar draws them (docs/efficiency.md).
_SPENT = ("productive", "stall", "restart", "skipped", "checkpoint", "evaluation")
_JOB_FIGURES = (
    "outcome",
    "runs",
    "gpus",
    "gpu_class",
    "allocated_gpu_h",
    "goodput_pct",
    "tokens",
    "samples",
    "tokens_per_gpu_h",
    "samples_per_gpu_h",
    "energy_kwh",
    "kwh_per_billion_tokens",
    "queue_s",
    "failed_work_pct",
    "cost",
    "cost_per_successful_run",
)
_RUN_FIGURES = (
    "run_id",
    "outcome",
    "gpus",
    "allocated_gpu_h",
    "goodput_pct",
    "tokens_per_gpu_h",
    "samples_per_gpu_h",
    "energy_kwh",
    "kwh_per_billion_tokens",
)


def _efficiency_rows(client: Client, prices: PriceList, job_id: str | None = None) -> list[dict[str, Any]]:
    # A store the efficiency views are missing from answers "unknown", not an error page.
    try:
        return job_rows(client, prices, job=job_id)
    except QueryError:
        return []


def _figure(value: Any) -> Any:
    return value if isinstance(value, str | int) and not isinstance(value, bool) else _num(value, 6)


def fleet_goodput(client: Client) -> dict[str, float | None]:
    """ML goodput per job from `job_efficiency` (docs/efficiency.md): productive / allocated GPU-hours, %."""
    return {row["job_id"]: _num(row["goodput_pct"], 2) for row in _efficiency_rows(client, PriceList())}


def efficiency(client: Client, job_id: str, prices: PriceList | None = None) -> dict[str, Any] | None:
    """The job's efficiency panel: `job_efficiency` and its runs, priced by `prices` (None: unknown)."""
    prices = prices or PriceList()
    rows = _efficiency_rows(client, prices, job_id)
    if not rows or rows[0]["runs"] == 0:
        return None
    row = rows[0]
    out: dict[str, Any] = {k: _figure(row[k]) for k in _JOB_FIGURES}
    out["price_per_gpu_h"] = prices.price(row["gpu_class"])
    out["spent_gpu_h"] = {k: _num(row[f"{k}_gpu_h"], 6) for k in _SPENT}
    out["queue_gpu_h"] = _num((row["queue_s"] or 0) * (row["gpus"] or 0) / 3600, 6)
    runs = []
    for run in run_rows(client, job=job_id, prices=prices):
        item = {k: _figure(run[k]) for k in _RUN_FIGURES}
        gpus = run["gpus"] or 0
        item["spent_gpu_h"] = {
            "productive": _num(gpus * run["productive_s"] / 3600, 6),
            "stall": _num(gpus * run["stall_s"] / 3600, 6),
            "restart": _num(gpus * run["restart_lost_s"] / 3600, 6),
            "skipped": _num(gpus * run["skipped_s"] / 3600, 6),
            "checkpoint": _num(gpus * run["checkpoint_s"] / 3600, 6),
            "evaluation": _num(gpus * run["evaluation_s"] / 3600, 6),
        }
        item["cost"] = _num(run["cost"], 6)
        runs.append(item)
    out["per_run"] = runs
    return out


# --- job page ----------------------------------------------------------------------------------------


_JOB = "job_id = {job:String}"


def _job_meta(client: Client, job_id: str) -> dict[str, Any]:
    lo, hi = plausible_bounds()
    rows = _rows(
        client,
        "SELECT argMax(run_id, ts), argMax(team, ts), argMax(owner, ts), argMax(cluster, ts), "
        "argMax(model_name, ts), argMax(model_version, ts), argMax(dataset_version, ts), "
        "argMax(world_size, ts), argMax(nodes, ts), argMax(gpu_class, ts), argMax(workload_family, ts), "
        "argMax(target_steps, ts), argMax(target_tokens, ts), argMax(target_epochs, ts), "
        "argMax(checkpoint_max_age_s, ts), argMax(image, ts), argMax(workspace, ts), "
        f"{_ms('min(ts)')}, count() FROM job_started WHERE {_JOB} AND {_PLAUSIBLE_TS}",
        job=job_id,
        lo=lo,
        hi=hi,
    )
    if not rows or not rows[0][-1]:
        return {"job_id": job_id, "team": "", "owner": "", "cluster": "", "nodes": [], "world_size": 0}
    r = rows[0]
    return {
        "job_id": job_id,
        "run_id": r[0],
        "team": r[1],
        "owner": r[2],
        "cluster": r[3],
        "model": f"{r[4]} {r[5]}".strip(),
        "dataset_version": r[6],
        "world_size": int(r[7]),
        "nodes": list(r[8]),
        "gpu_class": r[9],
        "workload_family": r[10],
        "target_steps": r[11],
        "target_tokens": r[12],
        "target_epochs": _num(r[13], 6),
        "checkpoint_max_age_s": _num(r[14], 6),
        "image": r[15],  # where the job runs (issue 35.5)
        "workspace": r[16],
        "started_ms": int(r[17]),
    }


def _job_span(client: Client, job_id: str) -> tuple[int, int] | None:
    # Only plausible times make the span: one record stamped 2199 must not stretch the job to 2199.
    lo, hi = plausible_bounds()
    rows = _rows(
        client,
        "SELECT toUnixTimestamp(min(minute)) * 1000, toUnixTimestamp(max(minute)) * 1000 + 60000, count() "
        f"FROM job_step_minute WHERE {_JOB} AND {_PLAUSIBLE_MINUTE}",
        job=job_id,
        lo=lo,
        hi=hi,
    )
    if rows and rows[0][2]:
        return int(rows[0][0]), int(rows[0][1])
    rows = _rows(
        client,
        f"SELECT {_ms('min(ts)')}, {_ms('max(ts)')} + 1, count() FROM steps WHERE {_JOB} AND {_PLAUSIBLE_TS}",
        job=job_id,
        lo=lo,
        hi=hi,
    )
    if rows and rows[0][2]:
        return int(rows[0][0]), int(rows[0][1])
    return None


def _quiet_until(client: Client, job_id: str) -> int | None:
    """Where the range of a job that stopped stepping ends: its last state change or alert record, and,
    while it is not in a terminal state, the newest step the store holds of any job (UTC ms).

    A stalled job's steps end where the stall begins; ending its page there would hide the stall
    (and its 0 steps/s, its idle GPUs, the alert that fired).
    """
    lo, hi = plausible_bounds()
    rows = _rows(
        client,
        f"SELECT (SELECT argMax(state, ts) FROM job_states WHERE {_JOB}), "
        f"(SELECT {_ms('max(ts)')} FROM job_states WHERE {_JOB} AND {_PLAUSIBLE_TS}), "
        f"(SELECT {_ms('max(ts)')} FROM alerts WHERE {_JOB} AND {_PLAUSIBLE_TS}), "
        "(SELECT toUnixTimestamp(max(minute)) * 1000 + 60000 FROM job_step_minute "
        f"WHERE {_PLAUSIBLE_MINUTE})",
        job=job_id,
        lo=lo,
        hi=hi,
    )
    if not rows:
        return None
    state, state_ms, alert_ms, newest_ms = rows[0]
    ends = [int(v) + 1 for v in (state_ms, alert_ms) if v and int(v) >= lo]
    if state not in TERMINAL_STATES and newest_ms:
        ends.append(int(newest_ms))
    return max(ends) if ends else None


def _ranks(client: Client, job_id: str) -> list[dict[str, Any]]:
    rows = _rows(
        client,
        "SELECT rank, argMax(node, ts), argMax(gpu_index, ts), argMax(gpu_uuid, ts) FROM rank_bound "
        f"WHERE {_JOB} GROUP BY rank ORDER BY rank",
        job=job_id,
    )
    return [{"rank": int(r[0]), "node": r[1], "gpu_index": r[2], "gpu_uuid": r[3]} for r in rows]


def _r(expr: str, digits: int = 4) -> str:
    """SQL rounding a float for the wire, NULL when not finite (JSON has no NaN): no per-value Python work."""
    return f"if(isFinite({expr}), round({expr}, {digits}), NULL)"


_HEAT_COLUMNS = ["bucket index", "rank", "compute", "step", "comm", "wait"]
# The per-rank values a heatmap cell shows, from the derived windows and from the step rows.
_WINDOW_VALUES = ("compute_s", "step_time_s", "comm_s", "data_wait_s")
_STEP_VALUES = (
    "ifNull(forward_s, 0) + ifNull(backward_s, 0) + ifNull(optimizer_s, 0)",
    "step_time_s",
    "comm_s",
    "data_wait_s",
)


def _rank_heatmap(
    client: Client, job_id: str, t0: int, t1: int, width: int, layout: RowLayout | None = None
) -> dict[str, Any]:
    """Per (bucket, rank): compute, step time, communication and data wait in seconds, as JSON columns.

    With a `layout` (`ui.rows`): per (bucket, row). A drill-down's rows are its ranks; a node (or
    node group) row holds the row's worst value in the bucket (its slowest window) and which rank it was.
    """
    params = {"job": job_id, "t0": t0, "t1": t1}
    if width >= _DERIVED_HOP_MS:
        where = f"{_JOB} AND {_between('window_start')}"
        if _rows(
            client,
            f"SELECT count() FROM (SELECT 1 FROM derived_rank_windows WHERE {where} LIMIT 1)",
            **params,
        )[0][0]:
            if layout is not None:
                return _rows_heatmap(
                    client, "derived_rank_windows", "window_start", _WINDOW_VALUES, layout, params, width
                )
            return {
                "source": "derived_rank_windows",
                "columns": _HEAT_COLUMNS,
                "cells": _columns(
                    client,
                    f"SELECT intDiv({_ms('window_start')} - {{t0:Int64}}, {{width:Int64}}) AS x, rank, "
                    f"{_r('avg(compute_s)')}, {_r('avg(step_time_s)')}, {_r('avg(comm_s)')}, "
                    f"{_r('avg(data_wait_s)')} FROM derived_rank_windows WHERE {where} "
                    "GROUP BY x, rank ORDER BY x, rank",
                    width=width,
                    **params,
                ),
            }
    if layout is not None:
        return _rows_heatmap(client, "steps", "ts", _STEP_VALUES, layout, params, width)
    return {
        "source": "steps",
        "columns": _HEAT_COLUMNS,
        "cells": _columns(
            client,
            f"SELECT intDiv({_ms('ts')} - {{t0:Int64}}, {{width:Int64}}) AS x, rank, "
            f"{_r('avg(ifNull(forward_s, 0) + ifNull(backward_s, 0) + ifNull(optimizer_s, 0))')}, "
            f"{_r('avg(step_time_s)')}, {_r('avg(comm_s)')}, {_r('avg(data_wait_s)')} "
            f"FROM steps WHERE {_JOB} AND {_between('ts')} GROUP BY x, rank ORDER BY x, rank",
            width=width,
            **params,
        ),
    }


def _rows_heatmap(
    client: Client,
    table: str,
    time_column: str,
    values: tuple[str, ...],
    layout: RowLayout,
    params: dict[str, Any],
    width: int,
) -> dict[str, Any]:
    """`_rank_heatmap` over a layout's rows: ranks of a drill-down (means), or node rows (worst and which rank)."""
    per_row = layout.ranks_per_row
    if per_row is not None:
        row, where = "intDiv(rank, {per_row:Int32})", f"{_JOB} AND {_between(time_column)}"
        mapping: dict[str, Any] = {"per_row": per_row}
    else:
        row = "transform(rank, {rank_keys:Array(Int32)}, {rank_rows:Array(Int32)}, -1)"
        where = f"{_JOB} AND {_between(time_column)} AND rank IN {{rank_keys:Array(Int32)}}"
        mapping = {"rank_keys": layout.rank_keys, "rank_rows": layout.rank_rows}
    head = f"SELECT intDiv({_ms(time_column)} - {{t0:Int64}}, {{width:Int64}}) AS x, {row} AS row, "
    if layout.grouped:
        # One level: the slowest window of any of the row's ranks (a per-rank mean first would be a
        # second aggregation over ranks x buckets, millions of groups at 16k ranks). Which rank it
        # was for compute and step time, the slow views (each argMax costs as much as the max).
        select = ", ".join([*(_r(f"max({v})") for v in values), *(f"argMax(rank, {v})" for v in values[:2])])
        columns = ["bucket index", "row", "compute", "step", "comm", "wait", "compute rank", "step rank"]
    else:
        select = ", ".join(_r(f"avg({v})") for v in values)
        columns = ["bucket index", "row", "compute", "step", "comm", "wait"]
    cells = _columns(
        client,
        f"{head}{select} FROM {table} WHERE {where} GROUP BY x, row ORDER BY x, row",
        width=width,
        **mapping,
        **params,
    )
    return {"source": table, "columns": columns, "cells": cells, "rows": layout.as_dict()}


_SEGMENTS = ("data_wait_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "checkpoint_s")


def _step_series(
    client: Client, job_id: str, t0: int, t1: int, width: int, from_windows: bool
) -> dict[str, Any]:
    """Step segments, step time and rate, loss, lr and grad norm per bucket.

    Over wide ranges the segments come from the derived rank windows already read for the heatmap
    (compute = forward + backward + optimizer; no extra scan of the step rows); zoomed in, from the
    step rows with the forward / backward / optimizer / checkpoint split. Model metrics come from rank 0
    (the primary key answers it directly).
    """
    params = {"job": job_id, "t0": t0, "t1": t1, "width": width}
    progress = _rows(
        client,
        f"SELECT {_bucket(_ms('ts'))} AS b, {_r('avg(loss)', 5)}, {_r('avg(lr)', 9)}, "
        f"{_r('avg(grad_norm)')}, max(step), countIf(skipped), {_r('avg(step_time_s)')} FROM steps "
        f"WHERE {_JOB} AND rank = 0 AND {_between('ts')} GROUP BY b ORDER BY b",
        **params,
    )
    if from_windows:
        rows = _rows(
            client,
            f"SELECT {_bucket(_ms('window_start'))} AS b, {_r('avg(data_wait_s)')}, {_r('avg(compute_s)')}, "
            f"{_r('avg(comm_s)')}, {_r('avg(greatest(0, step_time_s - compute_s - comm_s - data_wait_s))')} "
            f"FROM derived_rank_windows WHERE {_JOB} AND {_between('window_start')} "
            "GROUP BY b ORDER BY b",
            **params,
        )
        names = ("data_wait", "compute", "comm", "other")
        segments = {name: [[r[0], r[i + 1]] for r in rows] for i, name in enumerate(names)}
        source = "derived_rank_windows"
    else:
        rows = _rows(
            client,
            f"SELECT {_bucket(_ms('ts'))} AS b, "
            + ", ".join(_r(f"avg({s})") for s in _SEGMENTS)
            + f" FROM steps WHERE {_JOB} AND {_between('ts')} GROUP BY b ORDER BY b",
            **params,
        )
        segments = {s.removesuffix("_s"): [[r[0], r[i + 1]] for r in rows] for i, s in enumerate(_SEGMENTS)}
        source = "steps"
    return {
        "segments": segments,
        "segments_source": source,
        "step_time": [[r[0], r[6]] for r in progress],
        "step_rate": step_rate([(int(r[0]), int(r[4])) for r in progress], t0, t1, width),
        "loss": [[r[0], r[1]] for r in progress],
        "lr": [[r[0], r[2]] for r in progress],
        "grad_norm": [[r[0], r[3]] for r in progress],
        "skipped": [[r[0], r[5]] for r in progress if r[5]],
    }


def step_rate(last_steps: list[tuple[int, int]], t0: int, t1: int, width: int) -> list[list[Any]]:
    """Steps per second per bucket from (bucket start, last step in it); 0 where the job stalled.

    A bucket with steps reads the steps since the previous such bucket over the time between them.
    An empty bucket reads 0 once the last step is longer ago than twice the bucket and three of the
    job's usual step periods (a line drawn from neighbour to neighbour would show a stalled job still
    stepping); an empty bucket inside a normal step period (1 s buckets, 1.5 s steps) has no point.
    """
    if not last_steps:
        return []
    periods = sorted((b[0] - a[0]) / (b[1] - a[1]) for a, b in pairwise(last_steps) if b[1] > a[1])
    period = periods[len(periods) // 2] if periods else width
    quiet = max(2 * width, 3 * period)
    by_bucket = dict(last_steps)
    out: list[list[Any]] = []
    previous: tuple[int, int] | None = None
    bucket = last_steps[0][0]
    while bucket < t1:
        last = by_bucket.get(bucket)
        if last is not None:
            if previous is not None:
                out.append([bucket, _num((last - previous[1]) / ((bucket - previous[0]) / 1000), 3)])
            previous = (bucket, last)
        elif previous is not None and bucket - previous[0] > quiet:
            out.append([bucket, 0.0])
        bucket += width
    return out


def _validation(client: Client, job_id: str, t0: int, t1: int) -> dict[str, list[list[Any]]]:
    out: dict[str, list[list[Any]]] = defaultdict(list)
    for ts, step, name, value in _rows(
        client,
        f"SELECT {_ms('ts')}, step, k, v FROM validation_results ARRAY JOIN mapKeys(metrics) AS k, "
        f"mapValues(metrics) AS v WHERE {_JOB} AND {_between('ts')} ORDER BY ts",
        job=job_id,
        t0=t0,
        t1=t1,
    ):
        out[name].append([int(ts), _num(value, 5), int(step)])
    return dict(out)


# Node names and GPU keys are parameters like every other value (a node may be named anything).
_GPU_WHERE = (
    "cluster = {cluster:String} AND node IN {nodes:Array(String)} "
    "AND (node, gpu_index) IN {keys:Array(Tuple(String, Int32))}"
)


def _gpu_buckets(width: int) -> tuple[str, str]:
    """The source and the SQL of per (bucket `b`, node, GPU) activity, power, SM clock, memory used (GiB)."""
    if width >= _MINUTE_MS:
        return (
            "gpu_minute",
            (
                f"SELECT {_bucket('toUnixTimestamp(minute) * 1000')} AS b, node, gpu_index, "
                "avgMerge(gpu_util_pct_avg) AS util, avgMerge(power_w_avg) AS power, "
                "avgMerge(sm_clock_mhz_avg) AS sm_clock, max(mem_used_bytes_max) / 1073741824 AS mem_used "
                f"FROM gpu_minute WHERE {_GPU_WHERE} "
                "AND minute >= toDateTime(intDiv({t0:Int64}, 1000), 'UTC') "
                "AND minute < toDateTime(intDiv({t1:Int64}, 1000), 'UTC') GROUP BY b, node, gpu_index"
            ),
        )
    return (
        "gpu_samples",
        (
            f"SELECT {_bucket(_ms('ts'))} AS b, node, gpu_index, avg(gpu_util_pct) AS util, "
            "avg(power_w) AS power, avg(sm_clock_mhz) AS sm_clock, max(mem_used_bytes) / 1073741824 AS mem_used "
            f"FROM gpu_samples WHERE {_GPU_WHERE} AND {_between('ts')} GROUP BY b, node, gpu_index"
        ),
    )


def _gpu_keys(ranks: Sequence[dict[str, Any]]) -> list[tuple[str, int]]:
    return sorted({(r["node"], int(r["gpu_index"])) for r in ranks if r["gpu_index"] is not None})


_GPU_VALUES = (("util", 1), ("power", 1), ("sm_clock", 0), ("mem_used", 2))


def _gpu_cells(
    client: Client,
    sql: str,
    keys: list[tuple[str, int]],
    values: Sequence[tuple[str, int]] = _GPU_VALUES,
    **params: Any,
) -> RawJson:
    """One row per (bucket, GPU) with every metric: the page draws the activity heatmap, the bands
    across GPUs and the line of whichever GPU an alert names from the same columns."""
    return _columns(
        client,
        # The GPU's row: a hash look-up of "node/gpu" (a node name may hold '/', the GPU index never
        # does: the key is unambiguous); indexOf over the key array per row was 3x slower at 512 GPUs.
        "SELECT intDiv(b - {t0:Int64}, {width:Int64}) AS x, "
        "transform(concat(node, '/', toString(gpu_index)), {names:Array(String)}, "
        "range(toUInt32(length({names:Array(String)}))), -1) AS i, "
        f"{', '.join(_r(v, digits) for v, digits in values)} FROM ({sql}) ORDER BY x, i",
        nodes=sorted({n for n, _ in keys}),
        keys=[(n, int(g)) for n, g in keys],
        names=[f"{n}/{int(g)}" for n, g in keys],
        **params,
    )


_GPU_COLUMNS = ["bucket index", "gpu", "util", "power", "sm_clock", "mem_used"]


def _gpus(
    client: Client,
    cluster: str,
    ranks: list[dict[str, Any]],
    t0: int,
    t1: int,
    width: int,
    layout: RowLayout | None = None,
    named: Sequence[tuple[str, int]] = (),
) -> dict[str, Any]:
    """Per (bucket, GPU of the job): activity, power, SM clock and memory used (GiB), as JSON columns.

    With a grouped `layout` (`ui.rows`): per (bucket, node row) the least busy GPU's activity (and
    which GPU), power and clock bands across the job's GPUs worked out by ClickHouse, and the lines of
    the GPUs in `named` (the ones the page's alerts name).
    """
    keys = _gpu_keys(ranks)
    if not keys:
        return {"source": None, "labels": [], "keys": [], "columns": [], "cells": []}
    if layout is not None and layout.grouped:
        return _gpus_grouped(client, cluster, keys, layout, named, t0, t1, width)
    rank_of = {(r["node"], r["gpu_index"]): r["rank"] for r in ranks}
    labels = [f"{node}/gpu{gpu} r{rank_of[(node, gpu)]}" for node, gpu in keys]
    source, sql = _gpu_buckets(width)
    cells = _gpu_cells(client, sql, keys, cluster=cluster, t0=t0, t1=t1, width=width)
    return {
        "source": source,
        "labels": labels,
        "keys": [[n, g] for n, g in keys],
        "columns": _GPU_COLUMNS,
        "cells": cells,
    }


_BANDED = ("power", "sm_clock", "mem_used")


def _gpus_grouped(
    client: Client,
    cluster: str,
    keys: list[tuple[str, int]],
    layout: RowLayout,
    named: Sequence[tuple[str, int]],
    t0: int,
    t1: int,
    width: int,
) -> dict[str, Any]:
    # One level over the GPU rows of the job's nodes (no per-GPU mean first, no (node, GPU) key
    # filter: both cost seconds at 16,384 GPUs): a row's cell is the least busy GPU-minute (or sample)
    # of its nodes in the bucket; the bands are taken over every GPU-minute of the bucket.
    if width >= _MINUTE_MS:
        source, time_ms = "gpu_minute", "toUnixTimestamp(minute) * 1000"
        util, power, clock = (
            f"finalizeAggregation({c})" for c in ("gpu_util_pct_avg", "power_w_avg", "sm_clock_mhz_avg")
        )
        mem = "mem_used_bytes_max"
        when = (
            "minute >= toDateTime(intDiv({t0:Int64}, 1000), 'UTC') "
            "AND minute < toDateTime(intDiv({t1:Int64}, 1000), 'UTC')"
        )
    else:
        source, time_ms = "gpu_samples", _ms("ts")
        util, power, clock, mem = "gpu_util_pct", "power_w", "sm_clock_mhz", "mem_used_bytes"
        when = _between("ts")
    rows = (
        f"SELECT {time_ms} AS t, node, gpu_index, {util} AS util, {power} AS power, {clock} AS sm_clock, "
        f"{mem} / 1073741824 AS mem_used FROM {source} WHERE cluster = {{cluster:String}} "
        f"AND node IN {{nodes:Array(String)}} AND {when}"
    )
    params: dict[str, Any] = {
        "cluster": cluster,
        "nodes": layout.node_keys,
        "t0": t0,
        "t1": t1,
        "width": width,
    }
    cells = _columns(
        client,
        "SELECT intDiv(t - {t0:Int64}, {width:Int64}) AS x, "
        "transform(node, {node_keys:Array(String)}, {node_rows:Array(Int32)}, -1) AS i, "
        f"{_r('min(util)', 1)}, argMin(concat(node, '/gpu', toString(gpu_index)), util) FROM ({rows}) "
        "WHERE t >= {t0:Int64} GROUP BY x, i ORDER BY x, i",
        node_keys=layout.node_keys,
        node_rows=layout.node_rows,
        **params,
    )
    bands: dict[str, dict[str, list[list[Any]]]] = {k: {"min": [], "median": [], "max": []} for k in _BANDED}
    quantiles = ", ".join(f"min({k}), quantileExact(0.5)({k}), max({k})" for k in _BANDED)
    for row in _rows(
        client, f"SELECT {_bucket('t')} AS b, {quantiles} FROM ({rows}) GROUP BY b ORDER BY b", **params
    ):
        for i, k in enumerate(_BANDED):
            digits = 0 if k == "sm_clock" else 2 if k == "mem_used" else 1
            for j, part in enumerate(("min", "median", "max")):
                bands[k][part].append([int(row[0]), _num(row[1 + 3 * i + j], digits)])
    wanted = [key for key in keys if key in set(named)]
    named_sql = _gpu_buckets(width)[1]
    return {
        "source": source,
        "labels": layout.labels,
        "keys": [],
        "rows": layout.as_dict(),
        # Only activity per row: power, clock and memory are the bands (reading an avg state per
        # GPU-minute is most of this panel's cost at 16,384 GPUs).
        "columns": ["bucket index", "row", "util", "least busy gpu"],
        "cells": cells,
        "bands": bands,
        # The lines of the GPUs the page's alerts name, drawn over the bands when one is focused.
        "named": {
            "keys": [[n, g] for n, g in wanted],
            "cells": _gpu_cells(client, named_sql, wanted, cluster=cluster, t0=t0, t1=t1, width=width)
            if wanted
            else [],
        },
    }


# NVML GPM (Hopper and newer): what share of the interval the SMs and their tensor pipes were busy; a
# collective spinning on a GPU keeps `util` at 100 % with little tensor work. Null on older GPUs.
_GPM_FILTER = "(sm_active_pct IS NOT NULL OR tensor_active_pct IS NOT NULL)"


def _gpm(
    client: Client,
    cluster: str,
    ranks: list[dict[str, Any]],
    t0: int,
    t1: int,
    width: int,
    layout: RowLayout | None = None,
) -> dict[str, Any]:
    """SM and tensor-pipe activity per (bucket, GPU) from the raw samples (`gpu_minute` holds no GPM);
    on a grouped page per (bucket, node row): its least active GPU. Empty cells where no GPU reports GPM."""
    keys = _gpu_keys(ranks)
    columns = ["bucket index", "gpu", "sm_active", "tensor_active"]
    if not keys:
        return {"columns": columns, "cells": []}
    if layout is not None and layout.grouped:
        params: dict[str, Any] = {"cluster": cluster, "nodes": layout.node_keys, "t0": t0, "t1": t1}
        where = f"cluster = {{cluster:String}} AND node IN {{nodes:Array(String)}} AND {_between('ts')}"
        # Most fleets have no GPM (pre-Hopper GPUs): one sample tells, before a scan of every sample.
        if not _rows(
            client,
            f"SELECT count() FROM (SELECT 1 FROM gpu_samples WHERE {where} AND {_GPM_FILTER} LIMIT 1)",
            **params,
        )[0][0]:
            return {"columns": ["bucket index", "row", "sm_active", "tensor_active"], "cells": []}
        cells = _columns(
            client,
            f"SELECT intDiv({_ms('ts')} - {{t0:Int64}}, {{width:Int64}}) AS x, "
            "transform(node, {node_keys:Array(String)}, {node_rows:Array(Int32)}, -1) AS i, "
            f"{_r('min(sm_active_pct)', 1)}, {_r('min(tensor_active_pct)', 1)} FROM gpu_samples "
            f"WHERE {where} AND {_GPM_FILTER} GROUP BY x, i ORDER BY x, i",
            node_keys=layout.node_keys,
            node_rows=layout.node_rows,
            width=width,
            **params,
        )
        return {"columns": ["bucket index", "row", "sm_active", "tensor_active"], "cells": cells}
    sql = (
        f"SELECT {_bucket(_ms('ts'))} AS b, node, gpu_index, avg(sm_active_pct) AS sm_active, "
        f"avg(tensor_active_pct) AS tensor_active FROM gpu_samples WHERE {_GPU_WHERE} AND {_between('ts')} "
        f"AND {_GPM_FILTER} GROUP BY b, node, gpu_index"
    )
    cells = _gpu_cells(
        client,
        sql,
        keys,
        (("sm_active", 1), ("tensor_active", 1)),
        cluster=cluster,
        t0=t0,
        t1=t1,
        width=width,
    )
    return {"columns": columns, "cells": cells}


# Rank faults shown at most (a crash loop of a 16k-rank job writes thousands).
MAX_FAULTS = 500


def _faults(
    client: Client,
    job_id: str,
    cluster: str,
    ranks: list[dict[str, Any]],
    t0: int,
    t1: int,
    layout: RowLayout | None = None,
) -> dict[str, Any]:
    """Rank faults (`RankFault`: exception, exit, CUDA OOM, ...) and GPU faults (XID events, uncorrected ECC)
    of the job's GPUs in the range."""
    rank_faults = [
        {"ts": int(r[0]), "rank": int(r[1]), "node": r[2], "kind": r[3], "detail": r[4], "exit_code": r[5]}
        for r in _rows(
            client,
            f"SELECT {_ms('ts')}, rank, node, kind, detail, exit_code FROM rank_faults "
            f"WHERE {_JOB} AND {_between('ts')} ORDER BY ts, rank, kind LIMIT {{limit:UInt32}}",
            job=job_id,
            t0=t0,
            t1=t1,
            limit=MAX_FAULTS,
        )
    ]
    keys = _gpu_keys(ranks)
    gpu_faults: list[dict[str, Any]] = []
    if keys:
        grouped = layout is not None and layout.grouped
        where = "cluster = {cluster:String} AND node IN {nodes:Array(String)}" if grouped else _GPU_WHERE
        params: dict[str, Any] = {
            "cluster": cluster,
            "nodes": sorted({n for n, _ in keys}),
            "t0": t0,
            "t1": t1,
        }
        if not grouped:
            params["keys"] = [(n, int(g)) for n, g in keys]
        for node, gpu, first, last, xids, ecc, xid_samples in _rows(
            client,
            f"SELECT node, gpu_index, {_ms('min(ts)')}, {_ms('max(ts)')}, "
            "arraySort(groupUniqArrayIf(xid, xid IS NOT NULL)), max(ecc_uncorrected), countIf(xid IS NOT NULL) "
            f"FROM gpu_samples WHERE {where} AND {_between('ts')} AND (xid IS NOT NULL OR ecc_uncorrected > 0) "
            "GROUP BY node, gpu_index ORDER BY node, gpu_index",
            **params,
        ):
            gpu_faults.append(
                {
                    "node": node,
                    "gpu_index": int(gpu),
                    "first_ms": int(first),
                    "last_ms": int(last),
                    "xids": [int(x) for x in xids],
                    "xid_samples": int(xid_samples),
                    "ecc_uncorrected": None if ecc is None else int(ecc),
                }
            )
    return {"ranks": rank_faults, "gpus": gpu_faults}


def _progress(client: Client, job_id: str, meta: dict[str, Any]) -> dict[str, Any]:
    """Progress towards the target and the ETA (`ui.facts.progress_panel`), at the job's latest step."""
    lo, hi = plausible_bounds()
    latest = _rows(
        client,
        f"SELECT argMax(run_id, ts), {_ms('max(ts)')}, count() FROM steps WHERE {_JOB} AND {_PLAUSIBLE_TS} "
        f"AND ts >= (SELECT max(minute) FROM job_step_minute WHERE {_JOB} AND {_PLAUSIBLE_MINUTE})",
        job=job_id,
        lo=lo,
        hi=hi,
    )
    window = None
    epochs: list[tuple[int, int, int]] = []
    if latest and latest[0][2]:
        run, last_ms = str(latest[0][0]), int(latest[0][1])
        params = {"job": job_id, "run": run, "lo": lo, "hi": hi}
        r = _rows(
            client,
            f"SELECT min(step), max(step), {_ms('min(ts)')}, {_ms('max(ts)')}, uniqExact(step), sum(tokens), "
            f"argMax(epoch, ts) FROM steps WHERE {_JOB} AND run_id = {{run:String}} AND {_PLAUSIBLE_TS} "
            "AND ts >= fromUnixTimestamp64Milli({from:Int64}, 'UTC')",
            **params,
            **{"from": last_ms - int(PROGRESS_WINDOW_S * 1000)},
        )[0]
        window = {
            "first_step": int(r[0]),
            "last_step": int(r[1]),
            "first_ms": int(r[2]),
            "last_ms": int(r[3]),
            "steps": int(r[4]),
            "tokens": r[5],
            "epoch": r[6],
        }
        # Epoch lengths only matter for a target in epochs (a scan of the run's every step).
        if meta.get("target_epochs") and not (meta.get("target_steps") or meta.get("target_tokens")):
            epochs = [
                (int(e), int(a), int(b))
                for e, a, b in _rows(
                    client,
                    f"SELECT epoch, min(step), max(step) FROM steps WHERE {_JOB} AND run_id = {{run:String}} "
                    f"AND {_PLAUSIBLE_TS} AND epoch IS NOT NULL GROUP BY epoch ORDER BY epoch",
                    **params,
                )
            ]
    state = _rows(client, f"SELECT argMax(state, ts), count() FROM job_states WHERE {_JOB}", job=job_id)
    return progress_panel(meta, window, epochs, state[0][0] if state and state[0][1] else None)


def _checkpoint_facts(
    client: Client, job_id: str, now_ms: int, max_age_s: float | None
) -> dict[str, Any] | None:
    """The job's last and last verified checkpoint, its age at the page's end and retention (`ui.facts`)."""
    lo, hi = plausible_bounds()
    rows = _rows(
        client,
        f"SELECT checkpoint_id, step, phase, {_ms('ts')}, retention_keep, deleted FROM checkpoints "
        f"WHERE {_JOB} AND {_PLAUSIBLE_TS}",
        job=job_id,
        lo=lo,
        hi=hi,
    )
    keys = ("checkpoint_id", "step", "phase", "ts", "retention_keep", "deleted")
    return checkpoint_facts([dict(zip(keys, r, strict=True)) for r in rows], now_ms, max_age_s)


def _hosts(
    client: Client,
    cluster: str,
    nodes: list[str],
    t0: int,
    t1: int,
    width: int,
    named: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Host CPU, memory, retransmits and IB errors per node and bucket.

    `named` (a page of many nodes): lines only for those nodes, and min / median / max bands across
    all `nodes` per bucket, worked out by ClickHouse.
    """
    if not nodes:
        return {"nodes": [], "cpu": {}, "mem_pct": {}, "retrans": {}, "ib_errors": {}}
    lines = sorted(nodes) if named is None else sorted(set(named) & set(nodes))
    out: dict[str, Any] = {"nodes": lines, "cpu": {}, "mem_pct": {}, "retrans": {}, "ib_errors": {}}
    per_node = (
        f"SELECT node, {_bucket(_ms('ts'))} AS b, avg(cpu_util_pct) AS cpu, "
        "avg(100 * mem_used_bytes / nullIf(mem_total_bytes, 0)) AS mem, avg(tcp_retrans_segs_s) AS retrans, "
        "max(ib_errors) AS ib FROM host_samples WHERE cluster = {cluster:String} AND node IN {nodes:Array(String)} "
        f"AND {_between('ts')} GROUP BY node, b"
    )
    for node, b, cpu, mem, retrans, ib in (
        _rows(client, f"{per_node} ORDER BY node, b", cluster=cluster, nodes=lines, t0=t0, t1=t1, width=width)
        if lines
        else []
    ):
        b = int(b)
        out["cpu"].setdefault(node, []).append([b, _num(cpu, 1)])
        out["mem_pct"].setdefault(node, []).append([b, _num(mem, 1)])
        out["retrans"].setdefault(node, []).append([b, _num(retrans, 1)])
        out["ib_errors"].setdefault(node, []).append([b, None if ib is None else int(ib)])
    if named is not None:
        # Over every sample of the nodes in the bucket (one level: a per-node mean first doubles the cost).
        metrics = ("cpu", "mem_pct", "retrans")
        bands: dict[str, dict[str, list[list[Any]]]] = {
            k: {"min": [], "median": [], "max": []} for k in metrics
        }
        values = ("cpu_util_pct", "100 * mem_used_bytes / nullIf(mem_total_bytes, 0)", "tcp_retrans_segs_s")
        for row in _rows(
            client,
            f"SELECT {_bucket(_ms('ts'))} AS b, "
            + ", ".join(f"min({v}), quantileExact(0.5)({v}), max({v})" for v in values)
            + " FROM host_samples WHERE cluster = {cluster:String} AND node IN {nodes:Array(String)} "
            f"AND {_between('ts')} GROUP BY b ORDER BY b",
            cluster=cluster,
            nodes=list(nodes),
            t0=t0,
            t1=t1,
            width=width,
        ):
            for i, k in enumerate(metrics):
                for j, part in enumerate(("min", "median", "max")):
                    bands[k][part].append([int(row[0]), _num(row[1 + 3 * i + j], 1)])
        out["bands"] = bands
        out["of"] = len(nodes)
    return out


# The data-path panel: per bucket, the median rank's value and the worst rank's (which rank it was),
# "worst" being the highest latency or preparation time, or the lowest throughput, cache hit ratio or
# share of live loader workers. Name, SQL of the value, digits, whether low is worst.
DATAPATH_METRICS: tuple[tuple[str, str, int, bool], ...] = (
    ("batch_prep_s", "batch_prep_s", 4, False),
    ("read_latency_s", "read_latency_s", 5, False),
    ("read_mb_s", "read_bytes_s / 1000000", 2, True),
    ("cache_hit_ratio", "cache_hit_ratio", 4, True),
    ("workers_live", "workers / nullIf(workers_expected, 0)", 3, True),
    ("file_opens_s", "file_opens_s", 2, False),
)


def _datapath(client: Client, job_id: str, t0: int, t1: int, width: int) -> dict[str, Any]:
    """Data wait aside (the data-loader panel), the loader's own measurements: median and worst rank per
    bucket, and the loader errors summed (`DataLoaderSample`)."""
    parts = []
    for _, value, _, low in DATAPATH_METRICS:
        fn, pick = ("min", "argMin") if low else ("max", "argMax")
        parts.append(f"quantileExact(0.5)({value}), {fn}({value}), {pick}(rank, {value})")
    rows = _rows(
        client,
        f"SELECT {_bucket(_ms('ts'))} AS b, {', '.join(parts)}, sum(errors), sum(file_open_errors) "
        f"FROM dataloader_samples WHERE {_JOB} AND {_between('ts')} GROUP BY b ORDER BY b",
        job=job_id,
        t0=t0,
        t1=t1,
        width=width,
    )
    out: dict[str, Any] = {}
    for i, (name, _, digits, _) in enumerate(DATAPATH_METRICS):
        median: list[list[Any]] = []
        worst: list[list[Any]] = []
        for r in rows:
            value, rank = r[2 + 3 * i], r[3 + 3 * i]
            if r[1 + 3 * i] is not None:
                median.append([int(r[0]), _num(r[1 + 3 * i], digits)])
            if value is not None:
                worst.append([int(r[0]), _num(value, digits), int(rank)])
        out[name] = {"median": median, "worst": worst}
    n = 1 + 3 * len(DATAPATH_METRICS)
    out["errors"] = [[int(r[0]), int(r[n] or 0), int(r[n + 1] or 0)] for r in rows if r[n] or r[n + 1]]
    return out


def _dataloader(client: Client, job_id: str, t0: int, t1: int, width: int) -> dict[str, Any]:
    rows = _rows(
        client,
        f"SELECT {_bucket(_ms('ts'))} AS b, avg(wait_s / nullIf(interval_s, 0)), "
        "max(wait_s / nullIf(interval_s, 0)), argMax(rank, wait_s / nullIf(interval_s, 0)), "
        "avg(queue_depth), min(queue_depth) "
        f"FROM dataloader_samples WHERE {_JOB} AND {_between('ts')} GROUP BY b ORDER BY b",
        job=job_id,
        t0=t0,
        t1=t1,
        width=width,
    )
    return {
        "wait_frac_avg": [[int(r[0]), _num(r[1])] for r in rows],
        "wait_frac_max": [[int(r[0]), _num(r[2]), int(r[3])] for r in rows],
        "queue_depth_avg": [[int(r[0]), _num(r[4], 2)] for r in rows],
        "queue_depth_min": [[int(r[0]), _num(r[5], 2)] for r in rows],
    }


def _collectives(client: Client, job_id: str, t0: int, t1: int, width: int) -> dict[str, Any]:
    out: dict[str, dict[str, list[list[Any]]]] = {}
    for op, b, frac, bw in _rows(
        client,
        f"SELECT op, {_bucket(_ms('ts'))} AS b, sum(time_s) / nullIf(sum(interval_s), 0), avg(bus_bw_gbps) "
        f"FROM collective_samples WHERE {_JOB} AND {_between('ts')} GROUP BY op, b ORDER BY op, b",
        job=job_id,
        t0=t0,
        t1=t1,
        width=width,
    ):
        series = out.setdefault(op, {"time_frac": [], "bus_bw_gbps": []})
        series["time_frac"].append([int(b), _num(frac)])
        series["bus_bw_gbps"].append([int(b), _num(bw, 2)])
    return out


_STARTED_TS = "minIf(ts, phase = 'started')"
# A checkpoint's band ends when it completed or failed, not when it was verified hours later.
_ENDED_TS = "maxIf(ts, phase IN ('completed', 'failed'))"


def _phases(
    client: Client, table: str, id_column: str, job_id: str, t0: int, t1: int
) -> list[dict[str, Any]]:
    # A band per checkpoint or evaluation: started .. last phase, with how it ended.
    name = "any(name)" if table == "evaluations" else "any(uri)"
    rows = _rows(
        client,
        f"SELECT {id_column}, min(step), {_ms(_STARTED_TS)}, {_ms(_ENDED_TS)}, "
        f"{_ms('min(ts)')}, {_ms('max(ts)')}, argMax(phase, ts), groupUniqArray(phase), {name}, any(error) "
        f"FROM {table} WHERE {_JOB} AND {_between('ts')} "
        f"GROUP BY {id_column} ORDER BY min(ts)",
        job=job_id,
        t0=t0 - 3600_000,
        t1=t1,
    )
    out = []
    for cid, step, started, ended, first, last, phase, phases, label, error in rows:
        start = int(started) if started and int(started) > 0 else int(first)
        last = int(ended) if ended and int(ended) > 0 else int(last)
        done = any(p in ("completed", "failed", "verified", "restored") for p in phases)
        if int(last) < t0 and done:
            continue
        out.append(
            {
                "id": cid,
                "step": int(step),
                "start_ms": start,
                "end_ms": int(last) if done else None,
                "status": phase if done else "open",
                "label": label,
                "error": error,
            }
        )
    return out


def _states(client: Client, job_id: str, t0: int, t1: int) -> list[dict[str, Any]]:
    rows = _rows(
        client,
        f"SELECT {_ms('ts')}, state, reason, exit_code, restart_count FROM job_states "
        f"WHERE {_JOB} AND {_between('ts')} ORDER BY ts",
        job=job_id,
        t0=t0 - 24 * 3600_000,
        t1=t1,
    )
    return [
        {"ts": int(r[0]), "state": r[1], "reason": r[2], "exit_code": r[3], "restart_count": int(r[4])}
        for r in rows
    ]


@dataclass(frozen=True)
class _Frame:
    """What every panel of a job page needs: identity, alerts, range and buckets, ranks and rows."""

    job_id: str
    meta: dict[str, Any]
    span: tuple[int, int]
    alerts: list[dict[str, Any]]
    start: int
    end: int
    width: int
    ranks: list[dict[str, Any]]
    layout: RowLayout | None
    hosts_nodes: list[str]

    @property
    def grouped(self) -> bool:
        return self.layout is not None and self.layout.grouped


def _job_frame(
    client: Client,
    job_id: str,
    t0: int | None,
    t1: int | None,
    target: int,
    nodes: Sequence[str],
    kinds: Mapping[str, str] | None,
) -> _Frame:
    meta = _job_meta(client, job_id)
    span = _job_span(client, job_id)
    alerts = _alerts(client, _JOB, kinds=kinds, job=job_id)
    _fold(client, alerts)
    if span is None and not meta.get("started_ms") and not alerts:
        raise NotFoundError("job", job_id)
    if span is None:
        first = meta.get("started_ms") or min(a["starts_ms"] for a in alerts)
        span = (first, first + _MINUTE_MS)
    quiet = _quiet_until(client, job_id)
    if quiet is not None and quiet > span[1]:
        span = (span[0], quiet)
    start = int(t0) if t0 is not None else span[0]
    end = int(t1) if t1 is not None else span[1]
    # A range asked for by URL is cut to the plausible times too (from=0&to=1e15 is 11 million buckets).
    lo, hi = plausible_bounds()
    start, end = min(max(start, lo), hi), min(max(end, lo), hi + _MINUTE_MS)
    if end <= start:
        end = start + _MINUTE_MS
    width = bucket_ms(end - start, target)
    start = start // width * width
    ranks = _ranks(client, job_id)
    job_nodes = meta.get("nodes") or sorted({r["node"] for r in ranks})
    layout = row_layout(ranks, nodes)
    if nodes:
        ranks = [r for r in ranks if r["node"] in set(nodes)]
        if not ranks:
            raise NotFoundError(f"rank of job {job_id!r} on node", ", ".join(nodes))
    hosts_nodes = sorted({r["node"] for r in ranks}) if nodes else list(job_nodes)
    return _Frame(job_id, meta, span, alerts, start, end, width, ranks, layout, hosts_nodes)


# The panels a big job's page answers apart (`job_details`): GPUs, hosts and the data loader, read
# over every GPU, node and rank (a second or more at 16,384 ranks on the 2-core build machine).
DETAIL_PANELS = ("gpus", "gpm", "hosts", "dataloader", "datapath", "collectives")


def _details(client: Client, f: _Frame) -> dict[str, Any]:
    cluster = f.meta.get("cluster", "")
    alerts = f.alerts
    return {
        "gpus": _gpus(
            client,
            cluster,
            f.ranks,
            f.start,
            f.end,
            f.width,
            f.layout,
            [(a["node"], int(a["gpu_index"])) for a in alerts if a["node"] and a["gpu_index"] is not None],
        ),
        "gpm": _gpm(client, cluster, f.ranks, f.start, f.end, f.width, f.layout),
        "hosts": _hosts(
            client,
            cluster,
            f.hosts_nodes,
            f.start,
            f.end,
            f.width,
            [a["node"] for a in alerts if a["node"]] if f.grouped else None,
        ),
        "dataloader": _dataloader(client, f.job_id, f.start, f.end, f.width),
        "datapath": _datapath(client, f.job_id, f.start, f.end, f.width),
        "collectives": _collectives(client, f.job_id, f.start, f.end, f.width),
    }


def job_details(
    client: Client,
    job_id: str,
    t0: int,
    t1: int,
    nodes: Sequence[str] = (),
    target: int = TARGET_BUCKETS,
) -> dict[str, Any]:
    """The `DETAIL_PANELS` of a job page over the page's own range (its `from_ms` and `to_ms`)."""
    f = _job_frame(client, job_id, t0, t1, target, nodes, None)
    return {"range": {"from_ms": f.start, "to_ms": f.end, "bucket_ms": f.width}, **_details(client, f)}


def job_page(
    client: Client,
    job_id: str,
    t0: int | None = None,
    t1: int | None = None,
    target: int = TARGET_BUCKETS,
    prices: PriceList | None = None,
    with_efficiency: bool = True,
    nodes: Sequence[str] = (),
    kinds: Mapping[str, str] | None = None,
    defer_details: bool = False,
) -> dict[str, Any]:
    """Every panel of a job's page over [t0, t1) (default: the job's whole span), on one time axis.

    The efficiency panel reads views that scan all the job's step rows (seconds for a big job): the
    server leaves it out (`with_efficiency=False`, no `efficiency` key) and answers it apart, cached.
    A job of more than `ui.rows.MAX_RANK_ROWS` ranks gets one heatmap row per node (or group of
    nodes) and bands across its GPUs and hosts; `nodes` drills down to those nodes' ranks. With
    `defer_details`, such a page (grouped or drilled down) leaves its `DETAIL_PANELS` out
    (`"details": "pending"`): the server answers them apart (`job_details`) so the page draws
    before they are read.
    """
    f = _job_frame(client, job_id, t0, t1, target, nodes, kinds)
    start, end, width, span = f.start, f.end, f.width, f.span
    heatmap = _rank_heatmap(client, job_id, start, end, width, f.layout)
    page: dict[str, Any] = {
        "job": f.meta,
        "range": {"from_ms": start, "to_ms": end, "bucket_ms": width, "span": list(span)},
        # A grouped page names its rows, not its 16,384 ranks (a megabyte of JSON nobody draws).
        "ranks": [] if f.grouped else f.ranks,
        "heatmap": heatmap,
        "steps": _step_series(
            client,
            job_id,
            start,
            end,
            width,
            heatmap["source"] == "derived_rank_windows",
        ),
        "validation": _validation(client, job_id, start, end),
        "faults": _faults(client, job_id, f.meta.get("cluster", ""), f.ranks, start, end, f.layout),
        "progress": _progress(client, job_id, f.meta),
        "checkpoint": _checkpoint_facts(client, job_id, span[1], f.meta.get("checkpoint_max_age_s")),
        "checkpoints": _phases(client, "checkpoints", "checkpoint_id", job_id, start, end),
        "evaluations": _phases(client, "evaluations", "evaluation_id", job_id, start, end),
        "states": _states(client, job_id, start, end),
        "alerts": f.alerts,
        "actions": _actions(client, _JOB, job=job_id),
    }
    # State wins over averages: a stalled, hung or overdue job shows no ETA and says since when.
    now_ms = max([span[1], *(a.get("updated_ms") or 0 for a in f.alerts)])
    page["condition"] = job_condition(page["progress"], f.alerts, now_ms)
    without_eta(page["progress"], page["condition"])
    # A big job's panels read all its ranks, GPUs and nodes, drilled down or not.
    if defer_details and f.layout is not None:
        page["details"] = "pending"
    else:
        page.update(_details(client, f))
    if with_efficiency:
        page["efficiency"] = efficiency(client, job_id, prices)
    return page


def _fold(client: Client, alerts: list[dict[str, Any]]) -> None:
    """`fold_muted` over a job's alerts; causes that are not among them (another job's, a node's) are read."""
    known = {a["alert_id"] for a in alerts}
    missing = sorted(
        {a["inhibited_by"] for a in alerts if a["inhibited_by"] and a["inhibited_by"] not in known}
    )
    others = (
        {a["alert_id"]: a for a in _alerts(client, "alert_id IN {ids:Array(String)}", ids=missing)}
        if missing
        else {}
    )
    fold_muted(alerts, others)


# A job in one of these states writes nothing more until it is requeued (which is a new state row).
TERMINAL_STATES = ("completed", "failed", "preempted")


def finished_fingerprint(client: Client, job_id: str) -> tuple[Any, ...] | None:
    """What identifies a finished job's data, None while it runs: its answers can be cached on it.

    The last state must be terminal; the counts of its state changes, step rows, checkpoint phases
    and alert records change with any row that arrives after (a restart, a late record), and with
    them the fingerprint, so a cached answer is never served stale.
    """
    rows = _rows(
        client,
        f"SELECT (SELECT argMax(state, ts) FROM job_states WHERE {_JOB}), "
        f"(SELECT count() FROM job_states WHERE {_JOB}), (SELECT count() FROM steps WHERE {_JOB}), "
        f"(SELECT count() FROM checkpoints WHERE {_JOB}), (SELECT count() FROM alerts WHERE {_JOB})",
        job=job_id,
    )
    if not rows or rows[0][0] not in TERMINAL_STATES:
        return None
    return tuple(rows[0])


# --- compare ---------------------------------------------------------------------------------------


def compare(client: Client, jobs: Sequence[str], run_ids: Sequence[str] = ()) -> dict[str, Any]:
    """Runs overlaid by step or by tokens (`ui.compare`): one job and its workload family, or a choice.

    Step time and its segments (mean over ranks), rank 0's loss and tokens per GPU-second per bucket
    of steps; each run's goodput from `run_efficiency`; the configuration diff from `JobStarted`.
    """
    from ui.compare import BucketRow, Run, assemble, choose_runs, config_of, step_bucket

    lo, hi = plausible_bounds()
    known = [
        Run(str(job), str(run), int(started), str(family), int(gpus))
        for job, run, started, family, gpus in _rows(
            client,
            f"SELECT job_id, run_id, {_ms('min(ts)')}, argMax(workload_family, ts), argMax(world_size, ts) "
            f"FROM job_started WHERE {_PLAUSIBLE_TS} GROUP BY job_id, run_id",
            lo=lo,
            hi=hi,
        )
    ]
    runs, family = choose_runs(known, jobs, run_ids)
    if not runs:
        raise NotFoundError("job", ", ".join([*jobs, *run_ids]) or "(none given)")
    keys = [(r.job_id, r.run_id) for r in runs]
    started = client.query(
        "SELECT * FROM job_started WHERE (job_id, run_id) IN {runs:Array(Tuple(String, String))} ORDER BY ts",
        parameters={"runs": keys},
    )
    records: dict[tuple[str, str], dict[str, Any]] = {}
    for row in started.result_rows:
        record = dict(zip(started.column_names, row, strict=True))
        records[(record["job_id"], record["run_id"])] = record  # ordered by time: the latest wins
    for run in runs:
        run.config = config_of(records.get((run.job_id, run.run_id), {}))
    max_step = _rows(
        client,
        "SELECT max(step) FROM steps WHERE (job_id, run_id) IN {runs:Array(Tuple(String, String))}",
        runs=keys,
    )[0][0]
    width = step_bucket(int(max_step or 0))
    rows: dict[tuple[str, str], list[BucketRow]] = defaultdict(list)
    segments = ", ".join(
        f"avg({s}_s)" for s in ("data_wait", "forward", "backward", "optimizer", "comm", "checkpoint")
    )
    for r in _rows(
        client,
        "SELECT job_id, run_id, intDiv(step, {width:Int64}) * {width:Int64} AS s, uniqExact(step), avg(step_time_s), "
        f"{segments}, avgIf(loss, rank = 0), sum(ifNull(tokens, 0)) FROM steps "
        "WHERE (job_id, run_id) IN {runs:Array(Tuple(String, String))} AND NOT skipped "
        "GROUP BY job_id, run_id, s ORDER BY job_id, run_id, s",
        width=width,
        runs=keys,
    ):
        rows[(r[0], r[1])].append(
            BucketRow(
                int(r[2]),
                int(r[3]),
                _finite(r[4]),
                tuple(_finite(v) for v in r[5:11]),
                _finite(r[11]),
                int(r[12]),
            )
        )
    goodput: dict[tuple[str, str], dict[str, Any]] = {}
    for job in sorted({r.job_id for r in runs}):
        try:
            for efficiency_row in run_rows(client, job=job):
                goodput[(efficiency_row["job_id"], efficiency_row["run_id"])] = efficiency_row
        except QueryError:
            pass  # a store without the efficiency views: goodput unknown
    return assemble(runs, rows, width, goodput, family)


def compare_of_job(client: Client, job_id: str) -> dict[str, Any] | None:
    """`compare` for one job (its runs and its family's), None when the store knows no run of it."""
    try:
        return compare(client, [job_id])
    except NotFoundError:
        return None


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    f = float(value)
    return f if math.isfinite(f) else None


# --- alert page --------------------------------------------------------------------------------------


def alert_job(client: Client, alert_id: str) -> str | None:
    """The job an alert names, None for an unknown alert or one without a job."""
    rows = _rows(client, "SELECT any(job_id) FROM alerts WHERE alert_id = {id:String}", id=alert_id)
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
        "SELECT * FROM alerts FINAL WHERE alert_id = {id:String} ORDER BY ts",
        parameters={"id": alert_id},
    )
    if not rows.result_rows:
        raise NotFoundError("alert", alert_id)
    records = [dict(zip(rows.column_names, r, strict=True)) for r in rows.result_rows]
    latest = records[-1]
    alert = {
        k: _plain(v) for k, v in latest.items() if not k.startswith("_") and not k.startswith("history.")
    }
    alert["history"] = [
        [_plain(t), _num(v, 5)]
        for t, v in zip(latest.get("history.ts") or [], latest.get("history.value") or [], strict=False)
    ]
    alert["transitions"] = transitions(records, _plain)
    # The headline is what went wrong (the last firing record), the resolution how it ended; the
    # threshold is the expected value of any record that had one (a resolved record may carry none).
    fired = [r for r in records if r["status"] == "firing"] or records
    alert["summary"] = fired[-1]["summary"]
    alert["resolution"] = latest["summary"] if latest["status"] == "resolved" else ""
    alert["observed_fired"] = _plain(fired[-1]["observed"])
    alert.update(units_of(fired[-1], [r for r in records if r["expected"] is not None]))
    thresholds = [r["expected"] for r in records if r["expected"] is not None]
    alert["threshold"] = _plain(thresholds[-1]) if thresholds else None
    alert["starts_ms"] = _plain(min(r["starts_at"] for r in records))
    ends = [r["ends_at"] for r in records if r["ends_at"] is not None]
    alert["ends_ms"] = _plain(max(ends)) if ends and latest["status"] == "resolved" else None
    alert["status"] = latest["status"]
    alert["copies"] = routed_copies(records, kinds)
    alert["inhibited_by"] = latest.get("inhibited_by") or ""
    _fold(client, [alert])
    alert["mutes"] = [
        {"alert_id": str(r[0]), "rule": str(r[1])}
        for r in _rows(
            client,
            "SELECT alert_id, any(rule) FROM alerts WHERE inhibited_by = {id:String} AND alert_id != {id:String} "
            "GROUP BY alert_id ORDER BY min(starts_at), alert_id",
            id=alert_id,
        )
    ]
    alert["actions"] = _actions(client, "alert_id = {id:String}", id=alert_id)
    window_end = (alert["ends_ms"] or _plain(latest["ts"])) + _ALERT_MARGIN_MS
    evidence = None
    if alert.get("job_id"):
        try:
            # The alert page shows no efficiency panel: it is not computed.
            evidence = job_page(
                client,
                alert["job_id"],
                alert["starts_ms"] - _ALERT_MARGIN_MS,
                window_end,
                with_efficiency=False,
                kinds=kinds,
                defer_details=defer_details,
            )
        except NotFoundError:
            evidence = None
    return {"alert": alert, "evidence": evidence}


# The columns of a remediation decision the pages show (`ActionTaken`, docs/operations.md).
ACTION_COLUMNS = (
    "action_id",
    "alert_id",
    "rule",
    "job_id",
    "run_id",
    "scheduler",
    "target",
    "action",
    "decision",
    "reason_code",
    "reason",
    "dry_run",
    "severity",
    "checkpoint_age_s",
    "detail",
)


def _actions(client: Client, where: str, **params: Any) -> list[dict[str, Any]]:
    """Remediation decisions (acted, dry run, skipped and why, failed) from `actions`, oldest first."""
    rows = _rows(
        client,
        f"SELECT {_ms('ts')}, {_ms('firing_since')}, {', '.join(ACTION_COLUMNS)} FROM actions WHERE {where} "
        "ORDER BY ts, action_id",
        **params,
    )
    out = []
    for ts, firing_since, *values in rows:
        action = dict(zip(ACTION_COLUMNS, values, strict=True))
        action["ts"] = int(ts)
        action["firing_since"] = None if firing_since is None else int(firing_since)
        action["dry_run"] = bool(action["dry_run"])
        action["checkpoint_age_s"] = _num(action["checkpoint_age_s"], 1)
        out.append(action)
    return out


def _plain(value: Any) -> Any:
    """A ClickHouse value as JSON: datetimes to UTC milliseconds, floats made finite."""
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return round(aware.timestamp() * 1000)
    if isinstance(value, float):
        return _num(value, 6)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
