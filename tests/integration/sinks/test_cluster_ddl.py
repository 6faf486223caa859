"""The cluster DDL (`sinks.cluster_ddl`, `ranksight sql --ddl --cluster`) runs on chDB with a cluster config.

chDB takes a server config through its connection string. The one written here gives it an
in-memory Keeper (testkeeper), `{shard}`/`{replica}` macros, `tcp_port` 9000 and two clusters:
`one`, a single shard at 127.0.0.1:9000 (this very engine, so Distributed reads and writes run
locally without a socket), and `two`, that shard plus an unreachable second one.

What chDB can check, and this file does: every statement parses with its `ON CLUSTER`; every
statement runs (the clause removed, as each host's DDL worker runs it); replicated local tables
get their Keeper paths and have the single node's columns, codecs, keys, partitions and TTL;
with plain shards the sink's own writer stores every record type through the Distributed tables
and every roll-up, view and alert read answers as on a single node; inserts straight into the
local tables fill the local roll-ups; a retried insert (same token) is stored once, through the
Distributed table and directly; on two shards the efficiency views need
`distributed_product_mode = 'global'`; `migrate()` leaves a cluster alone. What it cannot:
`ON CLUSTER` itself (no DDL worker), writes into Replicated* tables (chDB has no interserver
address, so they stay read-only), and a second shard that holds rows.

chDB runs one engine per process and this config must not leak into other tests: the checks run
in a child process (this file, run as a script) that writes its findings as JSON.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ranksight.cli import app
from sinks.cluster_ddl import SHARDING_KEYS, cluster_statements
from sinks.ddl import MIGRATIONS, ROLLUP_TABLES, table_specs

_ROOT = Path(__file__).resolve().parents[3]

_CONFIG = """<clickhouse>
  <tcp_port>9000</tcp_port>
  <zookeeper><implementation>testkeeper</implementation></zookeeper>
  <macros><shard>01</shard><replica>r1</replica></macros>
  <remote_servers>
    <one><shard><replica><host>127.0.0.1</host><port>9000</port></replica></shard></one>
    <two>
      <shard><replica><host>127.0.0.1</host><port>9000</port></replica></shard>
      <shard><replica><host>127.0.0.2</host><port>9000</port></replica></shard>
    </two>
  </remote_servers>
</clickhouse>
"""

# What a ranksight user on a cluster has in its settings profile (docs/sinks.md, "A ClickHouse cluster").
_CLUSTER_PROFILE = {"distributed_foreground_insert": 1, "distributed_product_mode": "global"}


def _strip_on_cluster(statement: str, cluster: str) -> str:
    # What the DDL worker runs on each host: the statement without its ON CLUSTER clause.
    return statement.replace(f" ON CLUSTER {cluster}", "")


# --- the CLI (no chDB) -----------------------------------------------------------------------------


def test_single_node_ddl_is_exactly_what_migrate_runs() -> None:
    """`ranksight sql --ddl` prints the migrations' statements unchanged, each ended by `;` and a blank line."""
    result = CliRunner().invoke(app, ["sql", "--ddl", "--ttl-days", "7"])
    assert result.exit_code == 0, result.output
    statements = [s for m in MIGRATIONS for s in m.statements(7)]
    assert result.stdout == ";\n\n".join(statements) + ";\n"


def test_cluster_ddl_is_printed_for_multiquery_and_bad_names_are_refused() -> None:
    """`--cluster` prints `cluster_statements`; a name that is not a cluster name is one sentence, exit 1."""
    result = CliRunner().invoke(app, ["sql", "--ddl", "--cluster", "prod-ch", "--ttl-days", "0"])
    assert result.exit_code == 0, result.output
    statements = cluster_statements("prod-ch", None)
    assert result.stdout == ";\n\n".join(statements) + ";\n"
    assert "ON CLUSTER 'prod-ch'" in statements[0] and "TTL" not in result.stdout
    bad = CliRunner().invoke(app, ["sql", "--ddl", "--cluster", "x; DROP TABLE steps"])
    assert bad.exit_code == 1 and "cluster name" in bad.output and "Traceback" not in bad.output
    alone = CliRunner().invoke(app, ["sql", "--cluster", "prod"])
    assert alone.exit_code == 1 and "--ddl" in alone.output


def test_every_table_of_the_schema_has_a_local_and_a_distributed_table() -> None:
    """Each table of the migrations becomes `<t>_local` and a Distributed `<t>` with its sharding key."""
    text = "\n".join(cluster_statements("c"))
    names = {spec.name for spec in table_specs().values()} | set(ROLLUP_TABLES) | {"schema_migrations"}
    for name in names:
        key = SHARDING_KEYS[name]
        args = f"c, currentDatabase(), {name}_local" + (f", {key}" if key else "")
        assert f"CREATE TABLE IF NOT EXISTS {name}_local ON CLUSTER c (" in text
        assert (
            f"CREATE TABLE IF NOT EXISTS {name} ON CLUSTER c AS {name}_local\nENGINE = Distributed({args})"
            in text
        )
    assert "non_replicated_deduplication_window" not in text and "INSERT INTO run_step_progress" not in text


# --- on chDB (a child process) ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the checks in a child process with its own chDB directory and config; its findings."""
    work = tmp_path_factory.mktemp("cluster_ddl")
    (work / "config.xml").write_text(_CONFIG)
    printed = CliRunner().invoke(
        app, ["sql", "--ddl", "--cluster", "one", "--no-replicas", "--ttl-days", "30"]
    )
    assert printed.exit_code == 0, printed.output
    (work / "plain_shards.sql").write_text(printed.stdout)
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    started = time.monotonic()
    child = subprocess.run(
        [sys.executable, __file__, str(work)],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # generous for a busy machine: the child takes ~10 s here
        check=False,
    )
    out = work / "facts.json"
    assert child.returncode == 0 and out.exists(), (
        f"child failed:\n{child.stdout[-3000:]}\n{child.stderr[-3000:]}"
    )
    found: dict[str, Any] = json.loads(out.read_text())
    found["wall_s"] = round(time.monotonic() - started, 1)
    print(f"cluster DDL checks on chDB: {found['wall_s']} s")
    return found


def test_every_statement_parses_with_on_cluster(facts: dict[str, Any]) -> None:
    assert facts["parse_failures"] == []
    assert facts["parsed"] == len(cluster_statements("one"))
    assert facts["parse_control"].startswith("Code: 62")  # a broken statement does fail the check


def test_every_replicated_statement_runs(facts: dict[str, Any]) -> None:
    """Tables, Distributed tables, materialized views and views are created (chDB cannot ALTER or
    write a Replicated* table: those statements are the ones it only parses)."""
    assert facts["rep_failures"] == []
    not_run = facts["rep_not_run"]
    assert len(not_run) == len(table_specs()) + 1  # each record table's local ALTER, the versions' INSERT
    assert all(re.match(r"ALTER TABLE \w+_local\n", s) or s.startswith("INSERT INTO") for s in not_run)


def test_replicated_tables_have_keeper_paths_and_the_single_node_schema(facts: dict[str, Any]) -> None:
    single, rep = facts["tables"]["single"], facts["tables"]["rep"]
    replicas = {row[0]: row[1:] for row in facts["replicas"]}
    stored = {name for name, t in single.items() if t["engine"].endswith("MergeTree")}
    assert stored and {f"{n}_local" for n in stored} == set(replicas)
    for name in stored:
        local = rep[f"{name}_local"]
        assert local["engine"] == f"Replicated{single[name]['engine']}", name
        assert replicas[f"{name}_local"] == [f"/clickhouse/tables/01/rep/{name}_local", "r1"]
        for key in ("sorting_key", "partition_key", "primary_key", "columns"):
            assert local[key] == single[name][key], (name, key)
        assert _ttl(local["engine_full"]) == _ttl(single[name]["engine_full"]), name
        # Every table the sink writes keeps its dedup window (retried inserts); schema_migrations has none.
        dedup = re.search(r"non_replicated_deduplication_window = (\d+)", single[name]["engine_full"])
        assert (dedup is None) == (name == "schema_migrations"), name
        if dedup:
            assert f" replicated_deduplication_window = {dedup.group(1)}" in local["engine_full"], name
        distributed = rep[name]
        assert distributed["engine"] == "Distributed" and distributed["columns"] == single[name]["columns"]
        sharding = SHARDING_KEYS[name]
        args = f"'one', 'rep', '{name}_local'" + (f", {sharding}" if sharding else "")
        assert distributed["engine_full"] == f"Distributed({args})", name


def test_materialized_views_read_and_write_the_shards_own_tables(facts: dict[str, Any]) -> None:
    rep = facts["tables"]["rep"]
    for target, source in ROLLUP_TABLES.items():
        view = rep[f"{target}_mv"]
        assert f"TO rep.{target}_local" in view["create"], target
        assert f"{target}_mv" in rep[f"{source}_local"]["dependencies"], target
        assert f"{target}_mv" not in rep[source]["dependencies"], target  # never on the Distributed table


def test_the_sink_through_distributed_tables_stores_what_a_single_node_stores(facts: dict[str, Any]) -> None:
    """One plain shard behind the Distributed tables: counts, roll-ups, views and alerts as on a single node."""
    assert facts["plain_script_error"] is None  # the CLI's output, run as one multiquery
    assert facts["cluster_migrate"] == []
    single, cluster = facts["answers"]["single"], facts["answers"]["cl"]
    assert set(single) == set(cluster)
    for query, rows in single.items():
        assert rows, query  # the comparison is not between two empty answers
        assert cluster[query] == rows, query
    assert facts["local_counts"]["steps_local"] == facts["local_counts"]["steps"] > 0


def test_inserts_into_local_tables_fill_the_local_rollups(facts: dict[str, Any]) -> None:
    assert facts["direct"]["single"] == facts["direct"]["local"]
    assert all(facts["direct"]["single"].values())


def test_a_retried_insert_is_stored_once_through_distributed_and_locally(facts: dict[str, Any]) -> None:
    through, local = facts["dedup_distributed"], facts["dedup_local"]
    assert through == {"gpu_samples": 30, "gpu_samples_local": 30, "gpu_minute_samples": 30}
    assert local == {"steps_local": 12, "job_step_minute_steps": 12, "run_step_progress_reports": 12}


def test_two_shards_need_global_subqueries_for_the_efficiency_views(facts: dict[str, Any]) -> None:
    two = facts["two"]
    assert "DISTRIBUTED_IN_JOIN_SUBQUERY_DENIED" in two["deny"]
    assert two["global"] == {"run_efficiency": "ok", "job_efficiency": "ok", "job_page": "ok"}


def test_migrate_refuses_a_cluster_missing_a_version(facts: dict[str, Any]) -> None:
    assert "is a cluster without schema version(s) 1, 2" in facts["two"]["migrate"]


def _ttl(engine_full: str) -> str | None:
    match = re.search(r"TTL (.*?)(?: SETTINGS|$)", engine_full)
    return match.group(1) if match else None


# --- the child ------------------------------------------------------------------------------------


def _rows(client: Any, query: str, **settings: Any) -> list[list[str]]:
    return [[repr(v) for v in row] for row in client.query(query, settings=settings or None).result_rows]


_ANSWERS = {
    "counts": "SELECT {tables}",
    "gpu_minute": "SELECT cluster, node, gpu_index, minute, sum(samples), avgMerge(gpu_util_pct_avg), "
    "avgMerge(power_w_avg), max(temp_gpu_c_max) FROM gpu_minute GROUP BY ALL ORDER BY ALL",
    "job_step_minute": "SELECT job_id, run_id, minute, sum(steps), max(last_step), uniqMerge(ranks), "
    "avgMerge(step_time_s_avg), sum(tokens), avgMerge(loss_avg) FROM job_step_minute GROUP BY ALL ORDER BY ALL",
    "run_step_progress": "SELECT job_id, run_id, step, sum(reports), max(step_time_s), sum(tokens), max(done_ts) "
    "FROM run_step_progress GROUP BY ALL ORDER BY ALL",
    "gpu_energy_minute": "SELECT job_id, node, gpu_index, minute, min(energy_min), max(energy_max) "
    "FROM gpu_energy_minute GROUP BY ALL ORDER BY ALL",
    "alerts_final": "SELECT alert_id, status, rule FROM alerts FINAL ORDER BY ALL",
    "baselines": "SELECT * FROM baselines ORDER BY ALL",
    "run_efficiency": "SELECT * FROM run_efficiency ORDER BY job_id, run_id",
    "job_efficiency": "SELECT * EXCEPT (queue_s) FROM job_efficiency ORDER BY job_id",  # queue_s reads now()
}


def _child(work: Path) -> dict[str, Any]:
    import clickhouse_connect

    from schemas.records import RECORD_TYPES
    from sinks.ddl import TABLE_NAMES, migrate
    from sinks.efficiency_sql import job_efficiency_sql
    from sinks.errors import ClickHouseError
    from sinks.samples import sample_events
    from sinks.writer import ClickHouseSink

    options = {"config-file": str(work / "config.xml")}
    path = f"chdb://{work / 'chdb'}"

    def client(database: str | None = None, **settings: Any) -> Any:
        return clickhouse_connect.get_client(
            dsn=path, database=database, chdb_options=options, settings=settings
        )

    base = client()
    for database in ("single", "rep", "cl", "direct", "two"):
        base.command(f"CREATE DATABASE {database}")
    found: dict[str, Any] = {}

    # Every statement parses, ON CLUSTER included (formatQuery parses without running).
    replicated = cluster_statements("one")
    failures = []
    for statement in replicated:
        try:
            base.query("SELECT formatQuery(%(q)s)", parameters={"q": statement})
        except Exception as exc:
            failures.append(f"{statement[:80]}: {str(exc)[:300]}")
    found["parsed"], found["parse_failures"] = len(replicated) - len(failures), failures
    try:
        base.query(
            "SELECT formatQuery(%(q)s)", parameters={"q": "CREATE TABLE t ON CLUSTER one (x Int32) ENGIN"}
        )
        found["parse_control"] = "parsed"
    except Exception as exc:
        found["parse_control"] = str(exc).strip()[str(exc).find("Code:") :]

    # The single node, by migrate(), holding every record type's sample events.
    single = client("single")
    migrate(single)
    now_ms = (int(time.time()) // 60 - 90) * 60_000  # 1.5 h ago, on a minute: well inside the TTL
    # Finite values only: NaN makes `max` and `min` depend on the order rows arrive in, which
    # differs between any two plans (on one node too), so answers could not be compared exactly.
    events = {t: [_finite(e) for e in sample_events(t, 40, now_ms)] for t in RECORD_TYPES}

    def store(target: Any) -> None:
        sink = ClickHouseSink(target)
        for record_type, batch in events.items():
            for offset, event in enumerate(batch):
                sink.add(f"t.{record_type}", 0, offset, event)
            sink.flush(f"t.{record_type}", 0)

    store(single)

    # Replicated: every statement without ON CLUSTER; chDB cannot ALTER or write a Replicated* table.
    rep = client("rep")
    found["rep_failures"], found["rep_not_run"] = [], []
    for statement in replicated:
        statement = _strip_on_cluster(statement, "one")
        if re.match(r"ALTER TABLE \w+_local\b", statement) or statement.startswith("INSERT INTO"):
            found["rep_not_run"].append(statement[:60])
            continue
        try:
            rep.command(statement)
        except Exception as exc:
            found["rep_failures"].append(f"{statement[:80]}: {str(exc)[:300]}")
    found["replicas"] = _plain(
        rep.query(
            "SELECT table, zookeeper_path, replica_name FROM system.replicas WHERE database = 'rep'"
        ).result_rows
    )
    found["tables"] = {db: _tables(base, db) for db in ("single", "rep")}

    # Plain shards (cluster `one`): the CLI's printed script as one multiquery, then the sink's writer.
    cl = client("cl", **_CLUSTER_PROFILE)
    script = _strip_on_cluster((work / "plain_shards.sql").read_text(), "one")
    try:
        cl.command(script)
        found["plain_script_error"] = None
    except Exception as exc:
        found["plain_script_error"] = str(exc)[:500]
    found["cluster_migrate"] = migrate(cl)
    store(cl)
    tables = ", ".join(f"(SELECT count() FROM {name}) AS {name}" for name in TABLE_NAMES.values())
    answers: dict[str, dict[str, Any]] = {"single": {}, "cl": {}}
    for name, query in _ANSWERS.items():
        query = query.format(tables=tables)
        answers["single"][name] = _rows(single, query)
        answers["cl"][name] = _rows(cl, query)
    found["answers"] = answers
    found["local_counts"] = {
        "steps": single.query("SELECT count() FROM steps").result_rows[0][0],
        "steps_local": cl.query("SELECT count() FROM steps_local").result_rows[0][0],
    }

    # The same batch written twice (the sink's retry: same offsets, same token) through the Distributed table.
    sink = ClickHouseSink(cl)
    for _attempt in range(2):
        for offset, event in enumerate(sample_events("GpuSample", 30, now_ms + 3_600_000)):
            sink.add("dup", 0, offset, event)
        batch = sink.batch("dup", 0)
        assert batch is not None
        sink.write(batch)  # write() itself: add()'s skip of stored offsets must not hide the retry
        sink.drop("dup", 0)
        sink.forget("dup", 0)
    dup = "_topic = 'dup'"
    found["dedup_distributed"] = {
        "gpu_samples": cl.query(f"SELECT count() FROM gpu_samples WHERE {dup}").result_rows[0][0],
        "gpu_samples_local": cl.query(f"SELECT count() FROM gpu_samples_local WHERE {dup}").result_rows[0][0],
        "gpu_minute_samples": cl.query(
            "SELECT sum(samples) FROM gpu_minute_local WHERE minute >= %(m)s",
            parameters={"m": (now_ms + 3_600_000) // 1000},
        ).result_rows[0][0],
    }

    # Rows inserted straight into the shard's local tables fill its local roll-ups.
    direct = client("direct")
    for statement in cluster_statements("one", replicated=False):
        direct.command(_strip_on_cluster(statement, "one"))
    direct.command("INSERT INTO steps_local SELECT * FROM single.steps")
    direct.command("INSERT INTO gpu_samples_local SELECT * FROM single.gpu_samples")
    rollups = {
        "gpu_minute": "SELECT sum(samples), avgMerge(power_w_avg) FROM {t}",
        "job_step_minute": "SELECT sum(steps), uniqMerge(ranks), sum(tokens) FROM {t}",
        "run_step_progress": "SELECT sum(reports), max(step_time_s) FROM {t}",
        "gpu_energy_minute": "SELECT count(), max(energy_max) FROM {t}",
    }
    found["direct"] = {
        "single": {name: _rows(single, q.format(t=name)) for name, q in rollups.items()},
        "local": {name: _rows(direct, q.format(t=f"{name}_local")) for name, q in rollups.items()},
    }
    # A retried local insert (same token) is stored once, and its roll-ups count it once.
    rows = direct.query("SELECT * FROM single.steps ORDER BY _offset LIMIT 12").result_rows
    names = [c for c in direct.query("SELECT * FROM single.steps LIMIT 0").column_names]
    direct.command("TRUNCATE TABLE steps_local")
    for target in ("job_step_minute_local", "run_step_progress_local"):
        direct.command(f"TRUNCATE TABLE {target}")
    for _attempt in range(2):
        direct.insert(
            "steps_local", rows, column_names=names, settings={"insert_deduplication_token": "t:0:0-11"}
        )
    found["dedup_local"] = {
        "steps_local": direct.query("SELECT count() FROM steps_local").result_rows[0][0],
        "job_step_minute_steps": direct.query("SELECT sum(steps) FROM job_step_minute_local").result_rows[0][
            0
        ],
        "run_step_progress_reports": direct.query(
            "SELECT sum(reports) FROM run_step_progress_local"
        ).result_rows[0][0],
    }

    # Two shards (the second unreachable, skipped on reads): the views' JOIN/IN over Distributed tables.
    two = client("two", skip_unavailable_shards=1)
    statements = cluster_statements("two", replicated=False)
    for statement in statements[:-1]:  # not yet the closing INSERT of the versions
        two.command(_strip_on_cluster(statement, "two"))
    try:
        migrate(two)
        found_migrate = "applied"
    except ClickHouseError as exc:
        found_migrate = str(exc)
    results: dict[str, Any] = {"migrate": found_migrate, "global": {}}
    try:
        two.query("SELECT count() FROM run_efficiency")
        results["deny"] = "ran"
    except Exception as exc:
        results["deny"] = str(exc)[:400]
    page = job_efficiency_sql(job=True, with_runs=True)
    for name, query, params in (
        ("run_efficiency", "SELECT count() FROM run_efficiency", None),
        ("job_efficiency", "SELECT count() FROM job_efficiency", None),
        ("job_page", page, {"job": "job_id-1", "jobs": ["job_id-1"]}),
    ):
        try:
            two.query(query, parameters=params, settings={"distributed_product_mode": "global"})
            results["global"][name] = "ok"
        except Exception as exc:
            results["global"][name] = str(exc)[:400]
    found["two"] = results

    # Replicated tables kept read-only keep chDB from shutting down: drop them (the process then ends hard).
    for (name,) in base.query(
        "SELECT name FROM system.tables WHERE database = 'rep' AND engine LIKE 'Replicated%'"
    ).result_rows:
        base.command(f"DROP TABLE rep.{name} SYNC")
    return found


def _finite(event: Any) -> Any:
    record = {k: 0.25 if isinstance(v, float) and math.isnan(v) else v for k, v in event.record.items()}
    return event._replace(record=record)


def _plain(rows: Any) -> list[list[Any]]:
    return [list(row) for row in rows]


def _tables(client: Any, database: str) -> dict[str, dict[str, Any]]:
    tables: dict[str, dict[str, Any]] = {}
    for name, engine, engine_full, sorting, partition, primary, create, deps in client.query(
        "SELECT name, engine, engine_full, sorting_key, partition_key, primary_key, create_table_query, "
        "dependencies_table FROM system.tables WHERE database = %(db)s",
        parameters={"db": database},
    ).result_rows:
        tables[name] = {
            "engine": engine,
            "engine_full": engine_full,
            "sorting_key": sorting,
            "partition_key": partition,
            "primary_key": primary,
            "create": create,
            "dependencies": list(deps),
            "columns": [],
        }
    for table, column, type_, codec in client.query(
        "SELECT table, name, type, compression_codec FROM system.columns WHERE database = %(db)s ORDER BY table, position",
        parameters={"db": database},
    ).result_rows:
        tables[table]["columns"].append([column, type_, codec])
    return tables


if __name__ == "__main__":
    _work = Path(sys.argv[1])
    _found = _child(_work)
    (_work / "facts.json").write_text(json.dumps(_found, default=repr))
    sys.stdout.flush()
    os._exit(0)  # chDB's engine shutdown with a Keeper client can hang; the findings are written
