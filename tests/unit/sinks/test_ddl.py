"""DDL generated from the Avro schemas: every field has a column of the right type."""

from __future__ import annotations

import pytest

from schemas.records import RECORD_TYPES, default_schemas
from sinks.ddl import (
    DEDUP_WINDOW,
    KAFKA_COLUMNS,
    MIGRATIONS,
    TABLE_NAMES,
    clickhouse_type,
    create_table_sql,
    table_for,
)


@pytest.mark.parametrize("record_type", RECORD_TYPES)
def test_every_avro_field_has_a_column(record_type: str) -> None:
    spec = table_for(record_type)
    fields = [f["name"] for f in default_schemas().record(record_type).json["fields"]]
    sources = {c.field for c in spec.columns}
    assert sources == set(fields)
    sql = create_table_sql(spec)
    for name in fields:
        assert f"`{name}`" in sql
    for name, _ in KAFKA_COLUMNS:
        assert f"`{name}`" in sql


@pytest.mark.parametrize("record_type", RECORD_TYPES)
def test_every_table_deduplicates_partitions_by_day_and_expires(record_type: str) -> None:
    spec = table_for(record_type)
    sql = create_table_sql(spec, ttl_days=9)
    assert f"non_replicated_deduplication_window = {DEDUP_WINDOW}" in sql
    assert f"PARTITION BY toDate({spec.time_column})" in sql
    assert f"TTL toDateTime({spec.time_column}) + INTERVAL 9 DAY" in sql
    assert f"`{spec.time_column}` DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1))" in sql


def test_no_ttl_when_retention_is_off() -> None:
    assert "TTL" not in create_table_sql(table_for("StepCompleted"), ttl_days=None)


def test_table_names_and_sorting_keys_match_the_queries_users_run() -> None:
    assert {t: table_for(t).name for t in RECORD_TYPES} == TABLE_NAMES
    assert table_for("StepCompleted").order_by == ("job_id", "rank", "ts")
    assert table_for("GpuSample").order_by == ("cluster", "node", "gpu_index", "ts")
    assert table_for("HostSample").order_by == ("cluster", "node", "ts")
    alerts = create_table_sql(table_for("Alert"))
    assert "ReplacingMergeTree" in alerts
    assert "ORDER BY (team, fingerprint, alert_id, status)" in alerts


@pytest.mark.parametrize(
    ("avro", "name", "expected"),
    [
        ("string", "summary", "String"),
        ("string", "job_id", "LowCardinality(String)"),
        (["null", "string"], "node", "LowCardinality(Nullable(String))"),
        ("int", "rank", "Int32"),
        ("long", "step", "Int64"),
        ("double", "loss", "Float64"),
        ("float", "x", "Float32"),
        ("boolean", "skipped", "Bool"),
        (["null", "double"], "loss", "Nullable(Float64)"),
        ({"type": "long", "logicalType": "timestamp-millis"}, "ts", "DateTime64(3, 'UTC')"),
        (
            ["null", {"type": "long", "logicalType": "timestamp-millis"}],
            "ends_at",
            "Nullable(DateTime64(3, 'UTC'))",
        ),
        ({"type": "enum", "name": "S", "symbols": ["a", "b"]}, "status", "LowCardinality(String)"),
        ({"type": "array", "items": "int"}, "pids", "Array(Int32)"),
        ({"type": "map", "values": "double"}, "metrics", "Map(LowCardinality(String), Float64)"),
        ({"type": "map", "values": "string"}, "labels", "Map(LowCardinality(String), String)"),
    ],
)
def test_avro_types_map_to_clickhouse_types(avro: object, name: str, expected: str) -> None:
    assert clickhouse_type(avro, name) == expected


def test_unsupported_union_is_refused_with_the_field_name() -> None:
    with pytest.raises(ValueError, match="'x'"):
        clickhouse_type(["null", "string", "int"], "x")


def test_alert_history_is_nested_with_one_array_per_subfield() -> None:
    spec = table_for("Alert")
    history = [c for c in spec.columns if c.field == "history"]
    assert [(c.name, c.type) for c in history] == [
        ("history.ts", "Array(DateTime64(3, 'UTC'))"),
        ("history.value", "Array(Float64)"),
    ]
    assert "`history` Nested(`ts` DateTime64(3, 'UTC'), `value` Float64)" in create_table_sql(spec)


def test_nullable_columns_follow_the_avro_unions() -> None:
    columns = {c.name: c for c in table_for("StepCompleted").columns}
    assert columns["loss"].type == "Nullable(Float64)"
    assert columns["step_time_s"].type == "Float64"
    assert columns["step_time_s"].required
    assert not columns["loss"].required


def test_migration_versions_are_increasing_and_every_statement_is_idempotent() -> None:
    versions = [m.version for m in MIGRATIONS]
    assert versions == sorted(set(versions))
    for migration in MIGRATIONS:
        for statement in migration.statements(30):
            # A view is replaced as a whole; a roll-up's backfill only fills an empty roll-up.
            assert any(
                guard in statement
                for guard in ("IF NOT EXISTS", "CREATE OR REPLACE VIEW", "NOT EXISTS (SELECT 1 FROM")
            )
