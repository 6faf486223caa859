"""Roll-ups the job page reads instead of raw rows: per job and minute, filled at write time.

A 16,384-rank job writes ~33,000 derived rank windows and ~16,000 data-loader and collective
samples a minute; the page's panels aggregate them per bucket (a minute over a 2-hour range).
Four `AggregatingMergeTree` tables, each fed by a materialized view on every insert into its raw
table (and backfilled from rows stored before, by `sinks.ddl` version 10), hold what those panels
compute, so a page reads a few hundred thousand rows instead of millions:

- `rank_window_minute` (from `derived_rank_windows`): per job, minute of `window_start` and block of
  `RANK_BLOCK` consecutive ranks: the slowest value of each heatmap view and which rank it was (a
  big job's node-row heatmap), and sums and counts of the step segments (the mean over ranks).
- `loader_minute` (from `dataloader_samples`): per job and minute: the data-wait fraction's and
  queue depth's sums, counts and extremes, the worst rank of each data-path measure, error sums.
- `collective_minute` (from `collective_samples`): per job, op and minute: collective time, interval
  and bus-bandwidth sums.
- `gpm_node_minute` (from `gpu_samples`): per node and minute: the least SM and tensor-pipe activity
  (NVML GPM) of its GPUs' samples, and how many samples carried GPM.

Everything here is decomposable (sums, counts, extremes with their rank), so a minute's partial rows
from several inserts, parts or shards merge to the answer the raw rows give; medians are not (the
data path's exact medians still read the raw samples). Each roll-up's aggregate list is written
once (`*_AGGREGATES`): the view, the backfill and the page's query of a range that ends inside a
minute (`rollup_rows`, the raw rows of that last minute) all use it.
"""

from __future__ import annotations

__all__ = [
    "COLLECTIVE_ROLLUP",
    "GPM_ROLLUP",
    "GPM_SAMPLE",
    "LOADER_ROLLUP",
    "LOADER_WORST",
    "PAGE_ROLLUPS",
    "RANK_BLOCK",
    "WINDOW_ROLLUP",
    "page_backfill_sql",
    "page_rollup_sql",
    "page_view_sql",
    "rollup_rows",
    "top_rank",
    "top_sql",
    "top_value",
]

WINDOW_ROLLUP = "rank_window_minute"
LOADER_ROLLUP = "loader_minute"
COLLECTIVE_ROLLUP = "collective_minute"
GPM_ROLLUP = "gpm_node_minute"

# Ranks per block of `rank_window_minute`: a node of 8 GPUs, so a node row (or a group of nodes) of a
# job placed in rank order is a whole number of blocks.
RANK_BLOCK = 8

_F = "Nullable(Float64)"
_MAX_F = f"SimpleAggregateFunction(max, {_F})"
_MIN_F = f"SimpleAggregateFunction(min, {_F})"
_SUM_F = "SimpleAggregateFunction(sum, Float64)"
_SUM_N = "SimpleAggregateFunction(sum, UInt64)"
_SUM_I = "SimpleAggregateFunction(sum, Int64)"


def _top(kind: str, value: str) -> tuple[str, str]:
    """The type and aggregate of "the highest (max) or lowest (min) value and which rank had it", as one
    (value, rank) tuple: of equal values the lowest rank, whatever order partial rows merge in (the
    recording fold's rule, and a scan in the raw table's (job, rank, time) order). A null value is
    -inf (max) or +inf (min), so it never wins over a number; readers turn it back into null
    (`top_value`). A plain tuple, not an argMax state: reading states costs several times more."""
    if kind == "max":
        return (
            "SimpleAggregateFunction(max, Tuple(Float64, Int64))",
            f"max((ifNull(toFloat64({value}), -inf), -toInt64(rank)))",
        )
    return (
        "SimpleAggregateFunction(min, Tuple(Float64, Int64))",
        f"min((ifNull(toFloat64({value}), inf), toInt64(rank)))",
    )


def top_sql(kind: str, value: str) -> str:
    """The aggregate of `_top` over raw rows (a reader of raw rows names the same rank as the roll-up)."""
    return _top(kind, value)[1]


def top_value(top: str) -> str:
    """SQL of the value of a `_top` tuple (`top` an aggregate over the column): null where none was known."""
    return f"if(isFinite(tupleElement({top}, 1)), tupleElement({top}, 1), NULL)"


def top_rank(top: str, kind: str) -> str:
    """SQL of the rank of a `_top` tuple of `kind` ("max" or "min"): null where no value was known."""
    rank = f"-tupleElement({top}, 2)" if kind == "max" else f"tupleElement({top}, 2)"
    return f"if(isFinite(tupleElement({top}, 1)), {rank}, NULL)"


def _mean(name: str, value: str) -> tuple[tuple[str, str, str], ...]:
    """Sum and count of a value's non-null rows: their quotient is ClickHouse's `avg`."""
    return (
        (f"{name}_sum", _SUM_F, f"sum(ifNull(toFloat64({value}), 0))"),
        (f"{name}_n", _SUM_N, f"count({value})"),
    )


# The step segment "other": step time less compute, communication and data wait (never negative).
_OTHER = "greatest(0, step_time_s - compute_s - comm_s - data_wait_s)"

# (column, type, aggregate over raw rows): the roll-up's columns after its key.
WINDOW_AGGREGATES: tuple[tuple[str, str, str], ...] = (
    ("windows", _SUM_N, "count()"),
    ("compute_top", *_top("max", "compute_s")),
    ("step_top", *_top("max", "step_time_s")),
    ("comm_max", _MAX_F, "max(comm_s)"),
    ("wait_max", _MAX_F, "max(data_wait_s)"),
    *_mean("compute", "compute_s"),
    *_mean("comm", "comm_s"),
    *_mean("wait", "data_wait_s"),
    *_mean("other", _OTHER),
)

_WAIT_FRAC = "wait_s / nullIf(interval_s, 0)"

# The data path's worst rank per measure (`ui.pages.job_details.DATAPATH_METRICS` adds the digits):
# name, SQL of the value, whether low is worst.
LOADER_WORST: tuple[tuple[str, str, bool], ...] = (
    ("batch_prep_s", "batch_prep_s", False),
    ("read_latency_s", "read_latency_s", False),
    ("read_mb_s", "read_bytes_s / 1000000", True),
    ("cache_hit_ratio", "cache_hit_ratio", True),
    ("workers_live", "workers / nullIf(workers_expected, 0)", True),
    ("file_opens_s", "file_opens_s", False),
)

LOADER_AGGREGATES: tuple[tuple[str, str, str], ...] = (
    ("samples", _SUM_N, "count()"),
    *_mean("wait_frac", _WAIT_FRAC),
    ("wait_frac_top", *_top("max", _WAIT_FRAC)),
    *_mean("queue", "queue_depth"),
    ("queue_min", _MIN_F, "min(toFloat64(queue_depth))"),
    *((f"{name}_top", *_top("min" if low else "max", value)) for name, value, low in LOADER_WORST),
    ("errors_sum", _SUM_I, "sum(ifNull(errors, 0))"),
    ("file_open_errors_sum", _SUM_I, "sum(ifNull(file_open_errors, 0))"),
)

COLLECTIVE_AGGREGATES: tuple[tuple[str, str, str], ...] = (
    ("samples", _SUM_N, "count()"),
    ("time_sum", _SUM_F, "sum(toFloat64(time_s))"),
    ("interval_sum", _SUM_F, "sum(toFloat64(interval_s))"),
    *_mean("bus_bw", "bus_bw_gbps"),
)

# NVML GPM (Hopper and newer; null on older GPUs): the least active SMs and tensor pipes of a node's GPUs.
GPM_SAMPLE = "(sm_active_pct IS NOT NULL OR tensor_active_pct IS NOT NULL)"
GPM_AGGREGATES: tuple[tuple[str, str, str], ...] = (
    ("gpm_samples", _SUM_N, f"countIf({GPM_SAMPLE})"),
    ("sm_active_min", _MIN_F, "min(toFloat64(sm_active_pct))"),
    ("tensor_active_min", _MIN_F, "min(toFloat64(tensor_active_pct))"),
)

_MINUTE = "toStartOfMinute(toDateTime({}))"

# Each roll-up: its raw table, time column, key (name, type, SQL over the raw rows) and aggregates.
_SPECS: dict[str, tuple[str, str, tuple[tuple[str, str, str], ...], tuple[tuple[str, str, str], ...]]] = {
    WINDOW_ROLLUP: (
        "derived_rank_windows",
        "window_start",
        (
            ("job_id", "LowCardinality(String)", "job_id"),
            ("minute", "DateTime('UTC')", _MINUTE.format("window_start")),
            ("rank_block", "Int32", f"intDiv(rank, {RANK_BLOCK})"),
        ),
        WINDOW_AGGREGATES,
    ),
    LOADER_ROLLUP: (
        "dataloader_samples",
        "ts",
        (
            ("job_id", "LowCardinality(String)", "job_id"),
            ("minute", "DateTime('UTC')", _MINUTE.format("ts")),
        ),
        LOADER_AGGREGATES,
    ),
    COLLECTIVE_ROLLUP: (
        "collective_samples",
        "ts",
        (
            ("job_id", "LowCardinality(String)", "job_id"),
            ("op", "LowCardinality(String)", "op"),
            ("minute", "DateTime('UTC')", _MINUTE.format("ts")),
        ),
        COLLECTIVE_AGGREGATES,
    ),
    GPM_ROLLUP: (
        "gpu_samples",
        "ts",
        (
            ("cluster", "LowCardinality(String)", "cluster"),
            ("node", "LowCardinality(String)", "node"),
            ("minute", "DateTime('UTC')", _MINUTE.format("ts")),
        ),
        GPM_AGGREGATES,
    ),
}

# Roll-up -> the raw table whose inserts feed it (`sinks.ddl.ROLLUP_TABLES`, the cluster DDL).
PAGE_ROLLUPS: dict[str, str] = {name: spec[0] for name, spec in _SPECS.items()}


def page_rollup_sql(ttl_days: int | None, dedup_window: int) -> list[str]:
    """`CREATE` statements of the page's roll-up tables (partitioned by day, TTL like the raw tables')."""
    ttl = f"\nTTL toDateTime(minute) + INTERVAL {int(ttl_days)} DAY" if ttl_days else ""
    # The dedup window on the targets too: an insert the raw table deduplicated (a retried batch,
    # same token) must not reach the roll-up a second time.
    settings = f"\nSETTINGS non_replicated_deduplication_window = {dedup_window}"
    out = []
    for name, (_, _, key, aggregates) in _SPECS.items():
        columns = ",\n    ".join(f"{c} {t}" for c, t, _ in (*key, *aggregates))
        out.append(
            f"CREATE TABLE IF NOT EXISTS {name} (\n    {columns}\n)\nENGINE = AggregatingMergeTree\n"
            f"PARTITION BY toDate(minute)\nORDER BY ({', '.join(c for c, _, _ in key)}){ttl}{settings}"
        )
    return out


def _select(name: str, where: str = "") -> str:
    source, _, key, aggregates = _SPECS[name]
    parts = [f"{sql} AS {c}" for c, _, sql in (*key, *aggregates)]
    return f"SELECT {', '.join(parts)}\nFROM {source}{where}\nGROUP BY {', '.join(c for c, _, _ in key)}"


def page_view_sql() -> list[str]:
    """The materialized views that feed the roll-ups from every insert into their raw tables."""
    return [
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {name}_mv TO {name} AS\n{_select(name)}" for name in _SPECS
    ]


def page_backfill_sql() -> list[str]:
    """Fill each empty roll-up from the rows stored before it existed; a no-op once it holds rows
    (run before the views are made, as `sinks.efficiency_sql.backfill_sql`)."""
    return [
        f"INSERT INTO {name} {_select(name, f' WHERE NOT EXISTS (SELECT 1 FROM {name})')}" for name in _SPECS
    ]


def rollup_rows(name: str, where: str, raw_where: str) -> str:
    """The roll-up's rows where `where` holds (its key and minute columns), and the raw rows where
    `raw_where` holds aggregated into the same columns: the minute a range's end cuts is read raw.

    Both halves name every column of the roll-up; a reader aggregates them again per bucket (the
    roll-up may hold several partial rows of one key: unmerged parts, several shards).
    """
    columns = ", ".join(c for c, _, _ in (*_SPECS[name][2], *_SPECS[name][3]))
    return f"SELECT {columns} FROM {name} WHERE {where}\nUNION ALL\n{_select(name, f' WHERE {raw_where}')}"
