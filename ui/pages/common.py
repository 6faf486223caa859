"""What every page shares: store query helpers, time buckets, SQL fragments, and the folds' means and frame.

Times are UTC milliseconds everywhere. A page's time range is cut into at most about
`TARGET_BUCKETS` buckets of a "nice" width (`bucket_ms`); series are aggregated per bucket in
ClickHouse. The roll-ups answer whenever the bucket is at least as wide as their resolution:
`derived_rank_windows` (the detectors' per-rank windows) for the rank heatmap, `gpu_minute` for
GPU panels and `job_step_minute` for the job's time range and the fleet's progress. Raw tables
answer the rest and any zoomed-in range. Queries bind parameters (a record's strings never
become SQL); big arrays are answered column-wise as pre-encoded JSON (`RawJson`). A page made from a recording
(`ui.pages.recording`) folds events into the same buckets with `Mean` (avg skips nulls, like
ClickHouse) and rounds with `ch_round`, so both answer the same JSON.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from schemas.eventtime import MIN_EVENT_TS
from sinks.page_rollups import rollup_rows
from ui.alerts import copies_of
from ui.rows import RowLayout

__all__ = [
    "ACTION_COLUMNS",
    "ALERT_MARGIN_MS",
    "BUCKET_STEPS_MS",
    "DERIVED_HOP_MS",
    "GIB",
    "JOB_WHERE",
    "MAX_CLOCK_SKEW_MS",
    "MINUTE_MS",
    "MIN_PLAUSIBLE_MS",
    "PLAUSIBLE_MINUTE",
    "PLAUSIBLE_TS",
    "TARGET_BUCKETS",
    "TERMINAL_STATES",
    "VERSION_TABLES",
    "JobFrame",
    "Mean",
    "PanelFold",
    "RawJson",
    "RecordingFrame",
    "between",
    "bucket_ms",
    "bucket_sql",
    "ch_round",
    "fetch_rows",
    "finite",
    "json_columns",
    "latest_version",
    "ms_of",
    "plain",
    "plausible_bounds",
    "rollup_cut",
    "rollup_source",
    "round_sql",
    "rounded",
    "store_actions",
    "store_alerts",
    "to_json",
]

TARGET_BUCKETS = 180
BUCKET_STEPS_MS: tuple[int, ...] = tuple(
    s * 1000 for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
)
DERIVED_HOP_MS = 30_000  # the detectors' hop: derived windows answer buckets at least this wide
MINUTE_MS = 60_000
# Alert pages show this much before and after the alert's span.
ALERT_MARGIN_MS = 10 * 60_000
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


def json_columns(client: Client, sql: str, **params: Any) -> RawJson:
    """A result as JSON columns (`[[col1...], [col2...]]`) written by ClickHouse."""
    raw = client.raw_query(
        sql,
        parameters=_bound(sql, params),
        fmt="JSONCompactColumns",
        settings={"output_format_json_quote_64bit_integers": 0, "output_format_json_quote_denormals": 0},
    )
    return RawJson(raw.decode().strip())


def fetch_rows(client: Client, sql: str, **params: Any) -> Sequence[Sequence[Any]]:
    return client.query(sql, parameters=_bound(sql, params)).result_rows


def ms_of(column: str) -> str:
    return f"toUnixTimestamp64Milli({column})"


def between(column: str) -> str:
    """`column` in [t0, t1): the bounds are the parameters `t0` and `t1` (UTC ms)."""
    return (
        f"{column} >= fromUnixTimestamp64Milli({{t0:Int64}}, 'UTC') "
        f"AND {column} < fromUnixTimestamp64Milli({{t1:Int64}}, 'UTC')"
    )


def bucket_sql(column_ms: str) -> str:
    """The start of `column_ms`'s bucket: the width is the parameter `width` (ms)."""
    return f"intDiv({column_ms}, {{width:Int64}}) * {{width:Int64}}"


def rollup_cut(t0: int, t1: int, width: int) -> int | None:
    """Where a range's per-minute roll-ups (`sinks.page_rollups`) stop answering it: the start of the
    minute its end cuts (UTC ms). None when its buckets are not whole minutes (zoomed in: raw rows)."""
    if width % MINUTE_MS or t0 % MINUTE_MS or t1 <= t0:
        return None
    return t1 // MINUTE_MS * MINUTE_MS


def rollup_source(rollup: str, time_column: str) -> str:
    """A job's rows of `rollup` over [t0, cut) and its raw rows over [cut, t1) rolled up alike (`rollup_rows`):
    parameters `job`, `t0`, `cut` (`rollup_cut`) and `t1`."""
    return rollup_rows(
        rollup,
        f"{JOB_WHERE} AND minute >= toDateTime(intDiv({{t0:Int64}}, 1000), 'UTC') "
        "AND minute < toDateTime(intDiv({cut:Int64}, 1000), 'UTC')",
        f"{JOB_WHERE} AND {time_column} >= fromUnixTimestamp64Milli({{cut:Int64}}, 'UTC') "
        f"AND {time_column} < fromUnixTimestamp64Milli({{t1:Int64}}, 'UTC')",
    )


# Row filters on the plausible times (parameters `lo`, `hi` from `plausible_bounds`).
PLAUSIBLE_TS = (
    "ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')"
)
# (The column stays bare so the sorting key and partitions prune: a function of `minute` would not.)
PLAUSIBLE_MINUTE = "minute BETWEEN toDateTime(intDiv({lo:Int64}, 1000), 'UTC') AND toDateTime(intDiv({hi:Int64}, 1000), 'UTC')"


def plausible_bounds(now_ms: int | None = None) -> tuple[int, int]:
    """Event times the pages believe: 2000-01-01 .. now plus the worker's clock skew (UTC ms).

    A record stamped 2199 (a bad clock) or 1970 (seconds read as ms) must not stretch a job's time
    range or become a fleet's "now"; the sink may store what the worker rejects, so the pages
    apply the worker's bound themselves (docs/security.md).
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return MIN_PLAUSIBLE_MS, now + MAX_CLOCK_SKEW_MS


def rounded(value: Any, digits: int = 4) -> float | None:
    """A finite float rounded for the wire, or None (JSON has no NaN)."""
    if value is None:
        return None
    f = float(value)
    if not math.isfinite(f):
        return None
    return round(f, digits)


def finite(value: Any) -> float | None:
    if value is None:
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def plain(value: Any) -> Any:
    """A ClickHouse value as JSON: datetimes to UTC milliseconds, floats made finite."""
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return round(aware.timestamp() * 1000)
    if isinstance(value, float):
        return rounded(value, 6)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def round_sql(expr: str, digits: int = 4) -> str:
    """SQL rounding a float for the wire, NULL when not finite (JSON has no NaN): no per-value Python work."""
    return f"if(isFinite({expr}), round({expr}, {digits}), NULL)"


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
    rows = fetch_rows(
        client,
        "SELECT table, sum(rows) FROM system.parts WHERE database = currentDatabase() AND active "
        "AND table IN {tables:Array(String)} GROUP BY table",
        tables=list(VERSION_TABLES),
    )
    return {str(name): int(count) for name, count in rows}


# --- alerts ------------------------------------------------------------------------------------------

# An alert's latest record: the newest, and of two at one time the resolution (an alert_id resolves
# once and nothing follows it; a refresh while firing may carry the resolution's own time).
_LATEST = "(ts, raw_status = 'resolved')"
_ALERT_COLUMNS = (
    "alert_id",
    f"argMax(raw_status, {_LATEST}) AS status",
    "any(rule) AS rule",
    "any(severity) AS severity",
    "any(category) AS category",
    "any(team) AS team",
    "any(receiver) AS receiver",
    # A resolved alert's headline stays what went wrong; how it ended is its `resolution`.
    # (raw_*: the subquery's copies of the columns; the aliases below shadow the column names.)
    "if(countIf(raw_status = 'firing') > 0, argMaxIf(raw_summary, ts, raw_status = 'firing'), "
    "argMax(raw_summary, ts)) AS summary",
    f"if(argMax(raw_status, {_LATEST}) = 'resolved', argMax(raw_summary, {_LATEST}), '') AS resolution",
    "any(job_id) AS job_id",
    "any(run_id) AS run_id",
    "any(cluster) AS cluster",
    "any(node) AS node",
    "any(rank) AS rank",
    "any(gpu_index) AS gpu_index",
    "any(gpu_uuid) AS gpu_uuid",
    f"{ms_of('min(starts_at)')} AS starts_ms",
    f"{ms_of(f'argMax(ends_at, {_LATEST})')} AS ends_ms",
    f"{ms_of('max(ts)')} AS updated_ms",
    "any(suspected_layer) AS suspected_layer",
    "any(runbook_url) AS runbook_url",
    "any(fingerprint) AS fingerprint",
    # The cause that muted it (the latest record's: a cause that fires later re-sends its symptom muted).
    f"argMax(ifNull(raw_inhibited_by, ''), {_LATEST}) AS inhibited_by",
    # Every routed copy (one record per team and receiver).
    "arraySort(groupUniqArray((raw_team, raw_receiver))) AS copies",
)
_ALERT_KEYS = tuple(c.split(" AS ")[-1] for c in _ALERT_COLUMNS)


def store_alerts(
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
    out = [
        dict(zip(_ALERT_KEYS, row, strict=True)) for row in fetch_rows(client, sql, lo=lo, hi=hi, **params)
    ]
    for alert in out:
        alert["copies"] = copies_of(alert["copies"], kinds)
    return out


# --- job page ----------------------------------------------------------------------------------------


JOB_WHERE = "job_id = {job:String}"


# A job in one of these states writes nothing more until it is requeued (which is a new state row).
TERMINAL_STATES = ("completed", "failed", "preempted")


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


def store_actions(client: Client, where: str, **params: Any) -> list[dict[str, Any]]:
    """Remediation decisions (acted, dry run, skipped and why, failed) from `actions`, oldest first."""
    rows = fetch_rows(
        client,
        f"SELECT {ms_of('ts')}, {ms_of('firing_since')}, {', '.join(ACTION_COLUMNS)} FROM actions WHERE {where} "
        "ORDER BY ts, action_id",
        **params,
    )
    out = []
    for ts, firing_since, *values in rows:
        action = dict(zip(ACTION_COLUMNS, values, strict=True))
        action["ts"] = int(ts)
        action["firing_since"] = None if firing_since is None else int(firing_since)
        action["dry_run"] = bool(action["dry_run"])
        action["checkpoint_age_s"] = rounded(action["checkpoint_age_s"], 1)
        out.append(action)
    return out


@dataclass(frozen=True)
class JobFrame:
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


GIB = 1073741824


def ch_round(value: float | None, digits: int = 4) -> float | None:
    """Rounded as ClickHouse's `round(x, N)` rounds a float (scale, round half to even, unscale), so a
    report from a recording shows the digits the served page shows."""
    if value is None or not math.isfinite(value):
        return None
    scale = 10.0**digits
    return round(value * scale) / scale


class Mean:
    """Sum and count of the non-null values seen (ClickHouse's avg skips nulls; no rows: null)."""

    __slots__ = ("n", "total")

    def __init__(self) -> None:
        self.total = 0.0
        self.n = 0

    def add(self, value: float | None) -> None:
        if value is not None:
            self.total += value
            self.n += 1

    def value(self) -> float | None:
        return self.total / self.n if self.n else None


# --- the page's frame: range, identity, GPUs -------------------------------------------------------


@dataclass(frozen=True)
class RecordingFrame:
    job_id: str
    start: int
    end: int
    width: int
    span: tuple[int, int]
    meta: dict[str, Any]
    ranks: list[dict[str, Any]]
    nodes: list[str]
    gpu_keys: list[tuple[str, int]]
    alerts: list[dict[str, Any]]
    actions: list[dict[str, Any]]
    latest_step: tuple[int, str] | None = None  # (ts, run) of the job's latest plausible step
    state: str | None = None  # its latest state, any time
    lo: int = 0
    hi: int = 0


class PanelFold:
    """What every panel fold of a recording shares: the job and range of pass 2 (`ui.pages.job.Panels`)."""

    f: RecordingFrame

    def _bucket(self, ts: int) -> int | None:
        f = self.f
        return ts // f.width * f.width if f.start <= ts < f.end else None
