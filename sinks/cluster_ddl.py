"""The ranksight schema for a ClickHouse cluster: replicated local tables behind `Distributed` tables.

`cluster_statements` renders every statement of `sinks.ddl.MIGRATIONS` for a cluster:

- each table `<name>` becomes `<name>_local ON CLUSTER <c>` with the `Replicated*` form of its engine
  (`MergeTree` -> `ReplicatedMergeTree('<path>/<name>_local', '{replica}')`, `ReplacingMergeTree(ts)`
  -> `ReplicatedReplacingMergeTree(<path>, '{replica}', ts)`, `AggregatingMergeTree` likewise) and
  `replicated_deduplication_window` where the single node has `non_replicated_deduplication_window`,
  plus `<name> ON CLUSTER <c> AS <name>_local ENGINE = Distributed(<c>, currentDatabase(),
  <name>_local[, <sharding key>])`, so everything that reads or writes `<name>` (the sink, the UI,
  the views) works unchanged through the Distributed table;
- each record table's columns follow as `ALTER ... ON CLUSTER ... ADD COLUMN IF NOT EXISTS` (the
  local table, then the Distributed one): no-ops on a new cluster, and the columns a record gained
  when a newer ranksight's output is applied to an existing one (`_sync_columns` on a single node);
- a materialized view reads the shard's local raw table and writes the shard's local roll-up
  (`ON CLUSTER`, `TO <rollup>_local`, `FROM <raw>_local`): each shard rolls up its own rows;
- plain views are created `ON CLUSTER` over the Distributed names;
- the backfills are left out: a new cluster has nothing stored to backfill;
- `schema_migrations` is replicated too, and the last statement records every version in it:
  `sinks.ddl.migrate` (run by `ranksight sink` and `ranksight sql` at start) sees a cluster by its
  Distributed `schema_migrations`, changes nothing there, and refuses to start while a version of
  the running ranksight is missing (apply that version's output of this module first).

The statements are rewritten from the single node's, not generated a second time: the roll-ups'
SQL is written by hand (`sinks.ddl`, `sinks.efficiency_sql`), so one rewrite of every statement
keeps the cluster's columns, sorting keys, partitions and TTLs those of the single node by
construction. Each rewrite anchors on the form those modules print and raises `SinkError` when a
statement lacks it (or a table has no sharding key here), so a changed migration cannot slip
through half-converted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from sinks.ddl import _MIGRATIONS_TABLE, MIGRATIONS, ROLLUP_TABLES, TABLE_NAMES, table_specs
from sinks.efficiency_sql import ENERGY_ROLLUP, STEP_ROLLUP
from sinks.errors import SinkError
from sinks.page_rollups import GPM_ROLLUP, PAGE_ROLLUPS

__all__ = ["DEFAULT_SHARDS_PATH", "SHARDING_KEYS", "cluster_statements"]

# Where each replicated table keeps its Keeper state: one path per shard and table, the replica
# named by the `{replica}` macro (the usual layout of ClickHouse's own examples).
DEFAULT_SHARDS_PATH = "/clickhouse/tables/{shard}/{database}"

_BY_NODE = "cityHash64(cluster, node)"
_BY_RANK = "cityHash64(job_id, rank)"
_BY_JOB = "cityHash64(job_id)"

# The sharding key of each Distributed table: which shard stores a row. None: no key, so the
# Distributed table only reads (ClickHouse refuses an INSERT into a multi-shard Distributed table
# without one) and its rows are written by materialized views on the shards.
#
# Correctness needs co-location only where a table collapses rows at merge time and is read with
# FINAL: `alerts` (ReplacingMergeTree) and `schema_migrations`. Roll-ups (AggregatingMergeTree)
# may hold partial states of one key on several shards: every reader aggregates them again
# (`sum`, `max`, `avgMerge`, `uniqMerge` under GROUP BY), which a Distributed SELECT does across
# shards, as one shard does across unmerged parts.
SHARDING_KEYS: dict[str, str | None] = {
    # Node telemetry by node: a GPU's samples, and so each (GPU, minute) of the roll-ups fed from
    # them, stay on one shard, while the fleet's nodes spread over all shards.
    TABLE_NAMES["GpuSample"]: _BY_NODE,
    TABLE_NAMES["HostSample"]: _BY_NODE,
    # The roll-ups of GPU samples are written by the materialized views of the shard whose
    # `gpu_samples_local` received the sample: the same key describes where their rows are.
    "gpu_minute": _BY_NODE,
    ENERGY_ROLLUP: _BY_NODE,
    GPM_ROLLUP: _BY_NODE,
    # Per-rank records by (job, rank): one big job's steps spread over every shard (a 16,384-rank
    # job is ~42,000 steps/s, more than one shard should take alone, and its page reads in
    # parallel), and each rank's series stays whole on one shard in its (job_id, rank, ts) order.
    # Not by (job, node): `node` is optional in several of these records, and a job's rows
    # without it would all land on one shard.
    TABLE_NAMES["StepCompleted"]: _BY_RANK,
    TABLE_NAMES["RankBound"]: _BY_RANK,
    TABLE_NAMES["RankFault"]: _BY_RANK,
    TABLE_NAMES["DataLoaderSample"]: _BY_RANK,
    TABLE_NAMES["CollectiveSample"]: _BY_RANK,
    TABLE_NAMES["RankWindowStats"]: _BY_RANK,
    # The roll-ups of steps are keyed by (job, run, minute) and (job, run, step), with no rank: a
    # key's ranks sit on several shards, each shard's view writes its partial state, and readers
    # merge them (see above). No key can name that placement, so none is given.
    "job_step_minute": None,
    STEP_ROLLUP: None,
    # The job page's roll-ups (`sinks.page_rollups`) likewise: keyed by job and minute (and a block of
    # ranks, or an op), fed from per-rank rows spread by (job, rank).
    **dict.fromkeys(name for name in PAGE_ROLLUPS if name != GPM_ROLLUP),
    # Job-level records are few (a job's lifecycle, checkpoints, evaluations, windows): by job.
    TABLE_NAMES["JobStarted"]: _BY_JOB,
    TABLE_NAMES["JobStateChanged"]: _BY_JOB,
    TABLE_NAMES["CheckpointEvent"]: _BY_JOB,
    TABLE_NAMES["ValidationResult"]: _BY_JOB,
    TABLE_NAMES["EvaluationEvent"]: _BY_JOB,
    TABLE_NAMES["RestoreTest"]: _BY_JOB,
    TABLE_NAMES["JobWindowStats"]: _BY_JOB,
    TABLE_NAMES["ActionTaken"]: _BY_JOB,
    # ReplacingMergeTree ordered by (team, fingerprint, alert_id, status) collapses re-delivered
    # copies of an alert only within one shard: every copy of an alert has its alert_id, so
    # sharding by it puts them together and `alerts FINAL` stays exact through the Distributed table.
    TABLE_NAMES["Alert"]: "cityHash64(alert_id)",
    # ReplacingMergeTree ordered by version: a version recorded twice lands on one shard.
    "schema_migrations": "version",
}

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_TABLE_RE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) \(")
_ENGINE_RE = re.compile(r"(\s)ENGINE = (\w*)MergeTree(?:\(([^()]*)\))?(\s)")
_SINGLE_DEDUP = "SETTINGS non_replicated_deduplication_window = "
_REPLICATED_DEDUP = "SETTINGS replicated_deduplication_window = "
_MV_RE = re.compile(r"CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+) TO (\w+) AS\n")
_VIEW_RE = re.compile(r"CREATE (OR REPLACE VIEW|VIEW IF NOT EXISTS) (\w+) AS\n")


def _cluster_name(cluster: str) -> str:
    # Not a value from a record, but still never pasted into SQL unchecked.
    if not _NAME_RE.fullmatch(cluster):
        raise SinkError(
            f"cluster name {cluster!r} is not one ranksight can write into DDL: "
            "use letters, digits, '_', '.' and '-' as in the server's <remote_servers>"
        )
    return cluster if _IDENTIFIER_RE.fullmatch(cluster) else f"'{cluster}'"


def _keeper_path(shards_path: str) -> str:
    if not shards_path.startswith("/") or any(c in shards_path for c in "'\\\n"):
        raise SinkError(
            f"shards path {shards_path!r} must be an absolute Keeper path without quotes or "
            "backslashes, e.g. /clickhouse/tables/{shard}/{database}"
        )
    return shards_path.rstrip("/")


def _one(pattern: re.Pattern[str], statement: str, what: str) -> re.Match[str]:
    matches = list(pattern.finditer(statement))
    if len(matches) != 1:
        raise SinkError(f"cannot render for a cluster: expected one {what} in:\n{statement[:300]}")
    return matches[0]


def _local_table(statement: str, name: str, on: str, path: str | None) -> str:
    """The shard-local form of one `CREATE TABLE`: renamed, `ON CLUSTER`, replicated engine."""
    head = _one(_TABLE_RE, statement, "CREATE TABLE head")
    statement = (
        f"{statement[: head.start()]}CREATE TABLE IF NOT EXISTS {name}_local ON CLUSTER {on} ("
        f"{statement[head.end() :]}"
    )
    engine = _one(_ENGINE_RE, statement, "*MergeTree engine")
    if path is None:  # shards without replicas: the single node's engine
        return statement
    variant, args = engine.group(2), engine.group(3)
    replicated_args = [f"'{path}/{name}_local'", "'{replica}'"]
    if args:
        replicated_args.append(args)
    replaced = f"{engine.group(1)}ENGINE = Replicated{variant}MergeTree({', '.join(replicated_args)}){engine.group(4)}"
    statement = f"{statement[: engine.start()]}{replaced}{statement[engine.end() :]}"
    # Replicated tables keep their deduplication log in Keeper, sized by this setting; a table
    # without the single node's setting keeps the server's default window.
    return statement.replace(_SINGLE_DEDUP, _REPLICATED_DEDUP)


def _distributed_table(name: str, on: str) -> str:
    if name not in SHARDING_KEYS:
        raise SinkError(
            f"cannot render for a cluster: table {name!r} has no sharding key in sinks.cluster_ddl"
        )
    key = SHARDING_KEYS[name]
    args = [on, "currentDatabase()", f"{name}_local", *([key] if key else [])]
    return (
        f"CREATE TABLE IF NOT EXISTS {name} ON CLUSTER {on} AS {name}_local\n"
        f"ENGINE = Distributed({', '.join(args)})"
    )


def _added_columns(name: str, on: str) -> Iterator[str]:
    """Columns a record gained since its table was made (`_sync_columns` on a single node): on the
    shards' tables first, then on the Distributed table; nothing changes where they exist."""
    spec = next((s for s in table_specs().values() if s.name == name), None)
    if spec is None:
        return  # a roll-up or the migrations table: their columns change only with a new version
    columns = ",\n    ".join(f"ADD COLUMN IF NOT EXISTS {d}" for d in spec.definitions)
    for table in (f"{name}_local", name):
        yield f"ALTER TABLE {table} ON CLUSTER {on}\n    {columns}"


def _materialized_view(statement: str, on: str) -> str:
    head = _one(_MV_RE, statement, "materialized view head")
    view, target = head.group(1), head.group(2)
    if target not in ROLLUP_TABLES:
        raise SinkError(
            f"cannot render for a cluster: materialized view {view} writes {target}, not a roll-up"
        )
    source = ROLLUP_TABLES[target]
    body = statement[head.end() :]
    # The view's trigger: the raw table the shard inserts into; and where it writes: the shard's roll-up.
    from_re = re.compile(rf"\bFROM {source}\b")
    _one(from_re, body, f"FROM {source}")
    body = from_re.sub(f"FROM {source}_local", body)
    return f"CREATE MATERIALIZED VIEW IF NOT EXISTS {view} ON CLUSTER {on} TO {target}_local AS\n{body}"


def _view(statement: str, on: str) -> str:
    head = _one(_VIEW_RE, statement, "view head")
    return f"CREATE {head.group(1)} {head.group(2)} ON CLUSTER {on} AS\n{statement[head.end() :]}"


def _render(statement: str, on: str, path: str | None) -> Iterator[str]:
    text = statement.lstrip()
    if text.startswith("INSERT INTO "):
        return  # a backfill of rows stored before a roll-up existed: a new cluster has none
    if text.startswith("CREATE TABLE "):
        name = _one(_TABLE_RE, statement, "CREATE TABLE head").group(1)
        yield _local_table(statement, name, on, path)
        yield _distributed_table(name, on)
        yield from _added_columns(name, on)
    elif text.startswith("CREATE MATERIALIZED VIEW "):
        yield _materialized_view(statement, on)
    elif text.startswith(("CREATE VIEW ", "CREATE OR REPLACE VIEW ")):
        yield _view(statement, on)
    else:
        raise SinkError(f"cannot render for a cluster: unknown kind of statement:\n{statement[:300]}")


def _record_versions() -> str:
    def quoted(text: str) -> str:
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"

    rows = ",\n    ".join(f"({m.version}, {quoted(m.description)}, now64(3))" for m in MIGRATIONS)
    # In the foreground, so the statement returns once every shard has the rows.
    return (
        "INSERT INTO schema_migrations (version, description, applied_at)\n"
        f"SETTINGS distributed_foreground_insert = 1\nVALUES\n    {rows}"
    )


def cluster_statements(
    cluster: str,
    ttl_days: int | None = 30,
    shards_path: str = DEFAULT_SHARDS_PATH,
    *,
    replicated: bool = True,
) -> list[str]:
    """Every migration's statements for the cluster `cluster` (`<remote_servers>` name), in order.

    Apply them once on any one host of the cluster (`clickhouse-client --multiquery`): every
    `CREATE` runs `ON CLUSTER`, the closing `INSERT` records the schema versions. `ttl_days` None
    or 0 means no TTL. `shards_path` is the Keeper path prefix of the replicated tables (macros
    `{shard}`, `{database}` expanded by each host). `replicated=False` renders plain MergeTree
    shards (one replica each, no Keeper) with the single node's deduplication setting.
    """
    on = _cluster_name(cluster)
    path = _keeper_path(shards_path) if replicated else None
    statements = list(_render(_MIGRATIONS_TABLE, on, path))
    for migration in MIGRATIONS:
        for statement in migration.statements(ttl_days):
            # Versions 5, 6 and 8 create tables that version 1 makes in a new store: once is enough.
            statements.extend(s for s in _render(statement, on, path) if s not in statements)
    statements.append(_record_versions())
    return statements
