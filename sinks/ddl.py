"""ClickHouse tables for every ranksight record, generated from the Avro schemas, and versioned migrations.

One raw table per record type (columns mapped from the Avro fields by `clickhouse_type`), the
derived window tables, the alert table, the `baselines` view, two per-minute roll-ups, the
efficiency roll-ups and views (`sinks.efficiency_sql`) and the job page's roll-ups (`sinks.page_rollups`).
Every table records the Kafka position of each row (`_topic`, `_partition`, `_offset`): the
sink uses it to skip offsets already stored after a crash, and users use it to trace a row back.
`migrate()` applies the missing versions; every statement is `IF NOT EXISTS` (a view `OR REPLACE`,
a roll-up's backfill only into an empty roll-up), so concurrent or repeated runs are harmless.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import Any

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError as _DriverError

from schemas.records import RECORD_TYPES, default_schemas
from sinks.efficiency_sql import ROLLUP_TIME_COLUMNS, backfill_sql, rollup_sql, rollup_view_sql, view_sql
from sinks.errors import ClickHouseError
from sinks.page_rollups import PAGE_ROLLUPS, page_backfill_sql, page_rollup_sql, page_view_sql

__all__ = [
    "BASELINE_METRICS",
    "DEDUP_WINDOW",
    "EFFICIENCY_VIEWS",
    "KAFKA_COLUMNS",
    "MIGRATIONS",
    "ROLLUP_TABLES",
    "TABLE_NAMES",
    "Column",
    "Migration",
    "TableSpec",
    "applied_versions",
    "clickhouse_type",
    "create_table_sql",
    "migrate",
    "table_for",
    "table_specs",
]

# Plain MergeTree honours `insert_deduplication_token` only with a non-zero window.
DEDUP_WINDOW = 10_000

TABLE_NAMES: dict[str, str] = {
    "GpuSample": "gpu_samples",
    "HostSample": "host_samples",
    "StepCompleted": "steps",
    "JobStarted": "job_started",
    "RankBound": "rank_bound",
    "CheckpointEvent": "checkpoints",
    "JobStateChanged": "job_states",
    "RankFault": "rank_faults",
    "DataLoaderSample": "dataloader_samples",
    "CollectiveSample": "collective_samples",
    "ValidationResult": "validation_results",
    "EvaluationEvent": "evaluations",
    "RestoreTest": "restore_tests",
    "RankWindowStats": "derived_rank_windows",
    "JobWindowStats": "derived_job_windows",
    "Alert": "alerts",
    "ActionTaken": "actions",
}

# Sorting keys chosen for the queries users run: a job's ranks over time, a node's GPUs over time.
_ORDER_BY: dict[str, tuple[str, ...]] = {
    "GpuSample": ("cluster", "node", "gpu_index", "ts"),
    "HostSample": ("cluster", "node", "ts"),
    "StepCompleted": ("job_id", "rank", "ts"),
    "JobStarted": ("job_id", "ts"),
    "RankBound": ("job_id", "rank", "ts"),
    "CheckpointEvent": ("job_id", "checkpoint_id", "ts"),
    "JobStateChanged": ("job_id", "ts"),
    "RankFault": ("job_id", "rank", "ts"),
    "DataLoaderSample": ("job_id", "rank", "ts"),
    "CollectiveSample": ("job_id", "rank", "op", "ts"),
    "ValidationResult": ("job_id", "step", "ts"),
    "EvaluationEvent": ("job_id", "evaluation_id", "ts"),
    "RestoreTest": ("job_id", "checkpoint_id", "ts"),
    "RankWindowStats": ("job_id", "rank", "window_start"),
    "JobWindowStats": ("job_id", "window_start"),
    "Alert": ("team", "fingerprint", "alert_id", "status"),
    "ActionTaken": ("job_id", "ts"),
}

# Strings that name things (few distinct values, repeated on every row): dictionary-encoded.
_IDENTITY_FIELDS = frozenset(
    {
        "cluster", "node", "job_id", "run_id", "gpu_uuid", "gpu_name", "owner", "team", "model_name",
        "model_version", "dataset_version", "workload_family", "gpu_class", "baseline_key", "kind", "op",
        "rule", "receiver", "invariant", "suspected_layer", "history_metric", "baseline", "reason_code", "scheduler",
    }
)  # fmt: skip

# Monotonic counters compress best as deltas.
_COUNTER_FIELDS = frozenset(
    {"energy_mj", "ecc_corrected", "ecc_uncorrected", "pcie_replay_count", "oom_kills", "step", "last_step",
     "current_step", "restart_count"}
)  # fmt: skip

KAFKA_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_topic", "LowCardinality(String)"),
    ("_partition", "Int32"),
    ("_offset", "Int64 CODEC(Delta, ZSTD(1))"),
)

_REQUIRED: Any = None  # the default of a field without an Avro default; None there marks the record invalid


@dataclass(frozen=True)
class Column:
    """One inserted column: its name and type, and the Avro field (and item sub-field) it comes from."""

    name: str
    type: str
    field: str
    item: str | None = None
    default: Any = None
    required: bool = False
    timestamp: bool = False


@dataclass(frozen=True)
class TableSpec:
    """A ClickHouse table fed by one record type."""

    name: str
    record_type: str
    columns: tuple[Column, ...]
    definitions: tuple[str, ...]
    time_column: str
    order_by: tuple[str, ...]
    engine: str = "MergeTree"
    column_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        names = tuple(c.name for c in self.columns) + tuple(name for name, _ in KAFKA_COLUMNS)
        object.__setattr__(self, "column_names", names)


def _is_timestamp(avro: Any) -> bool:
    return (
        isinstance(avro, dict)
        and avro.get("type") == "long"
        and avro.get("logicalType") == "timestamp-millis"
    )


def clickhouse_type(avro: Any, name: str = "") -> str:
    """The ClickHouse type of an Avro type (JSON form) for a field called `name`."""
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if len(branches) != 1:
            raise ValueError(f"field {name!r}: only [null, T] unions map to ClickHouse, got {avro!r}")
        inner = clickhouse_type(branches[0], name)
        if len(branches) == len(avro):
            return inner
        if inner.startswith(("Array(", "Map(")):
            return inner  # ClickHouse has no Nullable(Array); an absent array is stored empty
        if inner.startswith("LowCardinality("):
            return f"LowCardinality(Nullable({inner[len('LowCardinality(') : -1]}))"
        return f"Nullable({inner})"
    if isinstance(avro, dict):
        kind = avro.get("type")
        if _is_timestamp(avro):
            return "DateTime64(3, 'UTC')"
        if kind == "enum":
            # Not Enum8: a symbol added to the Avro enum must not need an ALTER before it can be stored.
            return "LowCardinality(String)"
        if kind == "array":
            return f"Array({clickhouse_type(avro['items'], name)})"
        if kind == "map":
            return f"Map(LowCardinality(String), {clickhouse_type(avro['values'], name)})"
        if kind == "record":
            raise ValueError(f"field {name!r}: records map to ClickHouse only as array items (Nested)")
        return clickhouse_type(kind, name)
    primitive = {
        "string": "LowCardinality(String)" if name in _IDENTITY_FIELDS else "String",
        "bytes": "String",
        "int": "Int32",
        "long": "Int64",
        "float": "Float32",
        "double": "Float64",
        "boolean": "Bool",
    }
    try:
        return primitive[avro]
    except (KeyError, TypeError):
        raise ValueError(f"field {name!r}: no ClickHouse type for Avro {avro!r}") from None


def _codec(ch_type: str, name: str, time_column: str) -> str:
    base = ch_type.removeprefix("Nullable(")
    if name == time_column:
        return " CODEC(DoubleDelta, ZSTD(1))"
    if base.startswith("DateTime64"):
        return " CODEC(Delta, ZSTD(1))"
    if base.startswith("Float"):
        return " CODEC(Gorilla, ZSTD(1))"
    if base.startswith("Int"):
        return " CODEC(Delta, ZSTD(1))" if name in _COUNTER_FIELDS else " CODEC(T64, ZSTD(1))"
    if base.startswith(("String", "Array", "Map")):
        return " CODEC(ZSTD(1))"
    return ""  # LowCardinality and Bool: the defaults are already good


def _build_spec(record_type: str) -> TableSpec:
    schema = default_schemas().records[record_type].json
    fields = schema["fields"]
    time_column = "window_start" if any(f["name"] == "window_start" for f in fields) else "ts"
    columns: list[Column] = []
    definitions: list[str] = []
    for f in fields:
        name, avro = f["name"], f["type"]
        required = "default" not in f
        default = f.get("default")
        items = avro.get("items") if isinstance(avro, dict) and avro.get("type") == "array" else None
        if isinstance(items, dict) and items.get("type") == "record":
            # Array of records -> Nested: one array column per sub-field, `history.ts`, `history.value`.
            subs = [(s["name"], clickhouse_type(s["type"], s["name"])) for s in items["fields"]]
            definitions.append(f"`{name}` Nested({', '.join(f'`{s}` {t}' for s, t in subs)})")
            for sub, sub_type in subs:
                columns.append(Column(f"{name}.{sub}", f"Array({sub_type})", name, sub, default, required))
            continue
        ch_type = clickhouse_type(avro, name)
        definitions.append(f"`{name}` {ch_type}{_codec(ch_type, name, time_column)}")
        timestamp = "DateTime64" in ch_type and not ch_type.startswith("Array")
        columns.append(Column(name, ch_type, name, None, default, required, timestamp))
    for kafka_name, kafka_type in KAFKA_COLUMNS:
        definitions.append(f"`{kafka_name}` {kafka_type}")
    engine = "ReplacingMergeTree(ts)" if record_type == "Alert" else "MergeTree"
    return TableSpec(
        name=TABLE_NAMES[record_type],
        record_type=record_type,
        columns=tuple(columns),
        definitions=tuple(definitions),
        time_column=time_column,
        order_by=_ORDER_BY[record_type],
        engine=engine,
    )


@cache
def table_specs() -> dict[str, TableSpec]:
    """Every table spec, by record type, generated once from the shipped schemas."""
    return {record_type: _build_spec(record_type) for record_type in RECORD_TYPES}


def table_for(record_type: str) -> TableSpec:
    """The table a record type is stored in."""
    try:
        return table_specs()[record_type]
    except KeyError:
        raise KeyError(f"no table for record type {record_type!r}") from None


def _ttl_clause(time_column: str, ttl_days: int | None) -> str:
    return f"\nTTL toDateTime({time_column}) + INTERVAL {int(ttl_days)} DAY" if ttl_days else ""


def create_table_sql(spec: TableSpec, ttl_days: int | None = 30) -> str:
    """`CREATE TABLE IF NOT EXISTS` for a record table; no TTL when `ttl_days` is None or 0."""
    body = ",\n    ".join(spec.definitions)
    return (
        f"CREATE TABLE IF NOT EXISTS {spec.name} (\n    {body}\n)\n"
        f"ENGINE = {spec.engine}\n"
        f"PARTITION BY toDate({spec.time_column})\n"
        f"ORDER BY ({', '.join(spec.order_by)})"
        f"{_ttl_clause(spec.time_column, ttl_days)}\n"
        f"SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}"
    )


# --- baselines view ---------------------------------------------------------------------------------

BASELINE_METRICS: tuple[str, ...] = (
    "step_time_s",
    "tokens_per_s_per_gpu",
    "gpu_util_pct",
    "power_w",
    "data_wait_frac",
)


def _baselines_sql() -> str:
    # Median and MAD (median absolute deviation, unscaled) per metric over healthy windows; NULL and
    # non-finite values are left out. Exact quantiles keep the view deterministic under replay.
    parts = []
    for m in BASELINE_METRICS:
        parts.append(f"quantileExactIf(0.5)({m}, isFinite({m})) AS {m}_median")
        parts.append(
            f"arrayReduce('quantileExact(0.5)', arrayMap(x -> abs(x - {m}_median), "
            f"groupArrayIf(assumeNotNull({m}), isFinite({m})))) AS {m}_mad"
        )
    metrics = ",\n    ".join(parts)
    return (
        "CREATE VIEW IF NOT EXISTS baselines AS\nSELECT\n"
        "    baseline_key,\n    any(workload_family) AS workload_family,\n"
        "    uniqExact(run_id) AS runs,\n    count() AS windows,\n"
        "    min(window_start) AS first_window,\n    max(window_end) AS last_window,\n"
        f"    {metrics}\n"
        "FROM derived_job_windows\nWHERE healthy AND baseline_key != ''\nGROUP BY baseline_key"
    )


# --- roll-ups ---------------------------------------------------------------------------------------

ROLLUP_TABLES: dict[str, str] = {
    "gpu_minute": "gpu_samples",
    "job_step_minute": "steps",
    "run_step_progress": "steps",  # efficiency: sinks/efficiency_sql.py
    "gpu_energy_minute": "gpu_samples",
    **PAGE_ROLLUPS,  # the job page's panels: sinks/page_rollups.py
}


def _rollup_sql(ttl_days: int | None) -> list[str]:
    ttl_gpu = _ttl_clause("minute", ttl_days)
    settings = f"\nSETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}"
    # The roll-up tables carry the dedup window too: without it a retried (deduplicated) insert into the
    # raw table would still be counted twice by the materialized view.
    return [
        "CREATE TABLE IF NOT EXISTS gpu_minute (\n"
        "    cluster LowCardinality(String), node LowCardinality(String), gpu_index Int32,\n"
        "    minute DateTime('UTC'),\n"
        "    samples SimpleAggregateFunction(sum, UInt64),\n"
        "    gpu_util_pct_avg AggregateFunction(avg, Nullable(Float64)),\n"
        "    mem_util_pct_avg AggregateFunction(avg, Nullable(Float64)),\n"
        "    power_w_avg AggregateFunction(avg, Nullable(Float64)),\n"
        "    sm_clock_mhz_avg AggregateFunction(avg, Nullable(Int32)),\n"
        "    temp_gpu_c_max SimpleAggregateFunction(max, Nullable(Float64)),\n"
        "    mem_used_bytes_max SimpleAggregateFunction(max, Nullable(Int64))\n"
        ")\nENGINE = AggregatingMergeTree\nPARTITION BY toDate(minute)\n"
        f"ORDER BY (cluster, node, gpu_index, minute){ttl_gpu}{settings}",
        "CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_minute_mv TO gpu_minute AS\n"
        "SELECT cluster, node, gpu_index, toStartOfMinute(toDateTime(ts)) AS minute,\n"
        "    count() AS samples, avgState(gpu_util_pct) AS gpu_util_pct_avg, avgState(mem_util_pct) AS mem_util_pct_avg,\n"
        "    avgState(power_w) AS power_w_avg, avgState(sm_clock_mhz) AS sm_clock_mhz_avg,\n"
        "    max(temp_gpu_c) AS temp_gpu_c_max, max(mem_used_bytes) AS mem_used_bytes_max\n"
        "FROM gpu_samples GROUP BY cluster, node, gpu_index, minute",
        "CREATE TABLE IF NOT EXISTS job_step_minute (\n"
        "    job_id LowCardinality(String), run_id LowCardinality(String), minute DateTime('UTC'),\n"
        "    steps SimpleAggregateFunction(sum, UInt64),\n"
        "    last_step SimpleAggregateFunction(max, Int64),\n"
        "    ranks AggregateFunction(uniq, Int32),\n"
        "    step_time_s_avg AggregateFunction(avg, Float64),\n"
        "    step_time_s_max SimpleAggregateFunction(max, Float64),\n"
        "    samples SimpleAggregateFunction(sum, Int64),\n"
        "    tokens SimpleAggregateFunction(sum, Int64),\n"
        "    loss_avg AggregateFunction(avg, Nullable(Float64)),\n"
        "    data_wait_s_avg AggregateFunction(avg, Nullable(Float64)),\n"
        "    skipped SimpleAggregateFunction(sum, UInt64)\n"
        ")\nENGINE = AggregatingMergeTree\nPARTITION BY toDate(minute)\n"
        f"ORDER BY (job_id, run_id, minute){ttl_gpu}{settings}",
        "CREATE MATERIALIZED VIEW IF NOT EXISTS job_step_minute_mv TO job_step_minute AS\n"
        "SELECT job_id, run_id, toStartOfMinute(toDateTime(ts)) AS minute,\n"
        "    count() AS steps, max(step) AS last_step, uniqState(rank) AS ranks,\n"
        "    avgState(step_time_s) AS step_time_s_avg, max(step_time_s) AS step_time_s_max,\n"
        "    sum(ifNull(samples, 0)) AS samples, sum(ifNull(tokens, 0)) AS tokens,\n"
        "    avgState(loss) AS loss_avg, avgState(data_wait_s) AS data_wait_s_avg, countIf(skipped) AS skipped\n"
        "FROM steps GROUP BY job_id, run_id, minute",
    ]


# --- migrations -------------------------------------------------------------------------------------

_DERIVED_TYPES = ("RankWindowStats", "JobWindowStats", "Alert")
_RAW_TYPES = tuple(t for t in RECORD_TYPES if t not in _DERIVED_TYPES)


@dataclass(frozen=True)
class Migration:
    """One schema version: its number, what it does and its statements (given the TTL in days)."""

    version: int
    description: str
    statements: Callable[[int | None], Sequence[str]]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "raw record tables", lambda ttl: [create_table_sql(table_for(t), ttl) for t in _RAW_TYPES]),
    Migration(
        2,
        "derived window tables and alerts",
        lambda ttl: [create_table_sql(table_for(t), ttl) for t in _DERIVED_TYPES],
    ),
    Migration(3, "baselines view", lambda ttl: [_baselines_sql()]),
    Migration(4, "per-minute GPU and job step roll-ups", _rollup_sql),
    # Tables of record types added since version 1 (CREATE ... IF NOT EXISTS: a fresh database
    # already made them in version 1). Fields added to existing records arrive by `_sync_columns`.
    Migration(5, "evaluation events", lambda ttl: [create_table_sql(table_for("EvaluationEvent"), ttl)]),
    Migration(6, "checkpoint restore tests", lambda ttl: [create_table_sql(table_for("RestoreTest"), ttl)]),
    # Version 7 made the efficiency views over the raw tables; version 9 replaces them (views hold
    # no data), so a fresh store goes straight to the roll-ups.
    Migration(7, "efficiency and goodput views (replaced by version 9)", lambda ttl: []),
    Migration(8, "remediation decisions", lambda ttl: [create_table_sql(table_for("ActionTaken"), ttl)]),
    Migration(
        9,
        "efficiency roll-ups fed by inserts (per-step run progress, per-minute GPU energy), views over them",
        lambda ttl: [*rollup_sql(ttl, DEDUP_WINDOW), *backfill_sql(), *rollup_view_sql(), *view_sql()],
    ),
    Migration(
        10,
        "job page roll-ups per minute (rank windows per block of ranks, data loader, collectives, GPM per node)",
        lambda ttl: [*page_rollup_sql(ttl, DEDUP_WINDOW), *page_backfill_sql(), *page_view_sql()],
    ),
)

_MIGRATIONS_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_migrations (\n"
    "    version UInt32, description String, applied_at DateTime64(3, 'UTC')\n"
    ") ENGINE = ReplacingMergeTree(applied_at) ORDER BY version"
)


def applied_versions(client: Client) -> set[int]:
    """Schema versions already applied (empty on a fresh database)."""
    client.command(_MIGRATIONS_TABLE)
    return {int(row[0]) for row in client.query("SELECT DISTINCT version FROM schema_migrations").result_rows}


def migrate(client: Client, ttl_days: int | None = 30) -> list[int]:
    """Apply the missing schema versions and bring the TTL to `ttl_days`; returns the versions applied now.

    On a cluster made by `sinks.cluster_ddl` it changes nothing, and raises when a version is missing.
    """
    applied: list[int] = []
    try:
        done = applied_versions(client)
        if _is_cluster(client):
            # A cluster's schema (`sinks.cluster_ddl`) changes only through its own DDL, ON CLUSTER: a
            # statement run here would reach this host alone, and a materialized view over a
            # Distributed table would count rows twice.
            missing = [str(m.version) for m in MIGRATIONS if m.version not in done]
            if missing:
                raise ClickHouseError(
                    f"this ClickHouse store is a cluster without schema version(s) {', '.join(missing)}: "
                    "apply them on one of its hosts with `ranksight sql --ddl --cluster <name> | "
                    "clickhouse-client --multiquery`, then start again"
                )
            return applied
        # Existing tables first get the columns their records gained: a later version's views read them.
        _sync_columns(client)
        for migration in MIGRATIONS:
            if migration.version in done:
                continue
            for statement in migration.statements(ttl_days):
                client.command(statement)
            client.insert(
                "schema_migrations",
                [[migration.version, migration.description, datetime.now(UTC)]],
                column_names=["version", "description", "applied_at"],
            )
            applied.append(migration.version)
        _sync_columns(client)
        _sync_ttl(client, ttl_days)
    except _DriverError as exc:
        raise ClickHouseError(f"schema migration failed: {exc}") from exc
    return applied


def _is_cluster(client: Client) -> bool:
    # The cluster DDL makes `schema_migrations` a Distributed table; `applied_versions` made it here otherwise.
    rows = client.query(
        "SELECT engine FROM system.tables WHERE database = currentDatabase() AND name = 'schema_migrations'"
    ).result_rows
    return bool(rows) and rows[0][0] == "Distributed"


_TTL_RE = re.compile(r"toIntervalDay\((\d+)\)")


def _ttl_tables() -> dict[str, str]:
    tables = {spec.name: spec.time_column for spec in table_specs().values()}
    tables.update({"gpu_minute": "minute", "job_step_minute": "minute", **ROLLUP_TIME_COLUMNS})
    tables.update(dict.fromkeys(PAGE_ROLLUPS, "minute"))
    return tables


def _sync_columns(client: Client) -> None:
    # A field added to a record (with its Avro default) is a column added to its table: data
    # already stored reads the column's default, new rows carry the value.
    specs = {spec.name: spec for spec in table_specs().values()}
    existing: dict[str, set[str]] = {}
    for table, column in client.query(
        "SELECT table, name FROM system.columns WHERE database = currentDatabase() AND table IN %(names)s",
        parameters={"names": list(specs)},
    ).result_rows:
        existing.setdefault(table, set()).add(column.split(".", 1)[0])
    for name, columns in existing.items():
        for definition in specs[name].definitions:
            column = definition.split("`")[1]
            if column not in columns:
                client.command(f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS {definition}")


def _sync_ttl(client: Client, ttl_days: int | None) -> None:
    # Retention is a setting, not a schema version: an existing table is altered when it changes.
    # Only tables that store rows: on a cluster (`sinks.cluster_ddl`) these names are Distributed
    # tables, which take no TTL (their shards' local tables have the one the DDL was made with).
    tables = _ttl_tables()
    rows = client.query(
        "SELECT name, engine_full FROM system.tables WHERE database = currentDatabase() AND name IN %(names)s"
        " AND engine LIKE '%%MergeTree'",
        parameters={"names": list(tables)},
    ).result_rows
    for name, engine_full in rows:
        match = _TTL_RE.search(engine_full)
        current = int(match.group(1)) if match else None
        wanted = int(ttl_days) if ttl_days else None
        if current == wanted:
            continue
        if wanted is None:
            client.command(f"ALTER TABLE {name} REMOVE TTL")
        else:
            client.command(
                f"ALTER TABLE {name} MODIFY TTL toDateTime({tables[name]}) + INTERVAL {wanted} DAY"
            )


# --- efficiency and goodput (docs/efficiency.md; the SQL lives in sinks/efficiency_sql.py) ----------

EFFICIENCY_VIEWS: tuple[str, ...] = ("run_efficiency", "job_efficiency")
