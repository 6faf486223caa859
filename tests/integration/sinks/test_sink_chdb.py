"""The ClickHouse side on a real chDB: migrations, deduplicated inserts, roll-ups, the lock across processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from schemas.records import RECORD_TYPES, Event
from sinks.clickhouse import chdb_path, connect
from sinks.ddl import MIGRATIONS, TABLE_NAMES, applied_versions, migrate
from sinks.samples import sample_event, sample_events
from sinks.writer import ClickHouseSink

ROOT = Path(__file__).resolve().parents[3]
RANKSIGHT = str(Path(sys.executable).with_name("ranksight"))


def _count(client: Client, table: str) -> int:
    return int(client.query(f"SELECT count() FROM {table}").result_rows[0][0])


def test_migrate_is_idempotent_and_records_every_version(chdb: Client) -> None:
    assert migrate(chdb) == []
    assert applied_versions(chdb) == {m.version for m in MIGRATIONS}
    tables = {row[0] for row in chdb.query("SHOW TABLES").result_rows}
    assert set(TABLE_NAMES.values()) | {"baselines", "gpu_minute", "job_step_minute"} <= tables


def test_concurrent_migrations_leave_one_schema(chdb_dsn: str) -> None:
    client = connect(chdb_dsn)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            migrate(client)
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert applied_versions(client) == {m.version for m in MIGRATIONS}


def test_ttl_follows_the_setting_on_existing_tables(chdb: Client) -> None:
    migrate(chdb, ttl_days=7)
    engine = chdb.query("SELECT engine_full FROM system.tables WHERE name = 'steps'").result_rows[0][0]
    assert "toIntervalDay(7)" in engine
    migrate(chdb, ttl_days=None)
    engine = chdb.query("SELECT engine_full FROM system.tables WHERE name = 'steps'").result_rows[0][0]
    assert "TTL" not in engine


def test_same_batch_inserted_twice_with_the_same_token_is_stored_once(chdb: Client) -> None:
    sink = ClickHouseSink(chdb)
    for attempt in range(2):
        for offset, event in enumerate(sample_events("GpuSample", 50)):
            sink.add("rs.telemetry.gpu", 0, offset, event)
        batch = sink.batch("rs.telemetry.gpu", 0)
        assert batch is not None
        sink.write(batch)  # write() directly: the offset skip of add() must not hide the second insert
        sink.drop("rs.telemetry.gpu", 0)
        sink.forget("rs.telemetry.gpu", 0)
        assert _count(chdb, "gpu_samples") == 50, f"after attempt {attempt + 1}"
    # The roll-up saw the rows once too: its table carries the dedup window as well.
    assert chdb.query("SELECT sum(samples) FROM gpu_minute").result_rows[0][0] == 50


def test_a_different_token_is_not_deduplicated(chdb: Client) -> None:
    columns = [[1_750_000_000_000, 1_750_000_000_001], [1, 2]]
    chdb.command("CREATE TABLE d (ts DateTime64(3, 'UTC'), x Int32) ENGINE = MergeTree ORDER BY ts "
                 "SETTINGS non_replicated_deduplication_window = 100")  # fmt: skip
    for token in ("a", "a", "b"):
        chdb.insert("d", columns, column_names=["ts", "x"], column_oriented=True,
                    settings={"insert_deduplication_token": token})  # fmt: skip
    assert _count(chdb, "d") == 4


def test_every_record_type_round_trips_through_its_table(chdb: Client) -> None:
    now = int(time.time() * 1000)
    sink = ClickHouseSink(chdb)
    for record_type in RECORD_TYPES:
        for offset, event in enumerate(sample_events(record_type, 20, now)):
            sink.add(f"t.{record_type}", 0, offset, event)
        sink.flush(f"t.{record_type}", 0)
    for record_type in RECORD_TYPES:
        assert _count(chdb, TABLE_NAMES[record_type]) == 20
    row = chdb.query(
        "SELECT history.value, labels, ends_at, toUnixTimestamp64Milli(ts) FROM alerts WHERE alert_id = 'alert_id-2'"
    ).result_rows[0]
    assert row[0] == [1.0, 1.5]
    assert row[1] == {"k0": "labels-2", "k1": "labels-3"}
    assert row[3] == now + 2  # int milliseconds stored exactly
    assert row[2] is not None
    nulls = chdb.query("SELECT countIf(loss IS NULL), countIf(isNaN(loss)) FROM steps").result_rows[0]
    assert nulls[0] > 0 and nulls[1] > 0


def test_baselines_view_gives_runs_median_and_mad_of_healthy_windows(chdb: Client) -> None:
    base = sample_event("JobWindowStats", 1).record
    rows = []
    for i, (run, step_time, healthy) in enumerate(
        [
            ("r1", 1.0, True),
            ("r1", 2.0, True),
            ("r2", 4.0, True),
            ("r2", 100.0, False),
            ("r3", float("nan"), True),
        ]
    ):
        rows.append(Event("JobWindowStats", base | {"run_id": run, "baseline_key": "fam/a100/8", "step_time_s": step_time,
                                                   "healthy": healthy, "window_start": base["window_start"] + i}))  # fmt: skip
    sink = ClickHouseSink(chdb)
    for offset, event in enumerate(rows):
        sink.add("d", 0, offset, event)
    sink.flush("d", 0)
    runs, windows, median, mad = chdb.query(
        "SELECT runs, windows, step_time_s_median, step_time_s_mad FROM baselines WHERE baseline_key = 'fam/a100/8'"
    ).result_rows[0]
    assert (runs, windows) == (3, 4)  # the unhealthy window is out; the NaN one counts but has no value
    assert median == 2.0
    assert mad == 1.0  # |1-2|, |2-2|, |4-2| -> median 1


def test_client_is_shared_by_a_writer_thread_and_a_reader_thread(chdb: Client) -> None:
    stop = threading.Event()
    seen: list[int] = []

    def read() -> None:
        while not stop.is_set():
            seen.append(_count(chdb, "host_samples"))

    reader = threading.Thread(target=read)
    reader.start()
    sink = ClickHouseSink(chdb)
    for chunk in range(10):
        for i in range(100):
            sink.add("h", 0, chunk * 100 + i, sample_event("HostSample", i))
        sink.flush("h", 0)
    stop.set()
    reader.join()
    assert _count(chdb, "host_samples") == 1000
    assert seen == sorted(seen) and seen


@pytest.mark.parametrize("command", [["sql", "SELECT 1"], ["sink"]])
def test_commands_on_a_directory_held_by_another_process_say_so_and_exit_2(
    tmp_path: Path, command: list[str], kafka_bootstrap: str
) -> None:
    home = tmp_path / "home"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from sinks.clickhouse import connect; connect(sys.argv[1]); print('held', flush=True); time.sleep(60)",
         f"chdb://{home / 'chdb'}"],
        stdout=subprocess.PIPE, cwd=ROOT, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        # A broker that answers: the sink checks Kafka before it opens the store.
        env = {**os.environ, "RANKSIGHT_HOME": str(home), "KAFKA_BOOTSTRAP": kafka_bootstrap}
        env.pop("CLICKHOUSE_URL", None)
        started = time.monotonic()
        done = subprocess.run([RANKSIGHT, *command], env=env, capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2
    assert str(chdb_path(f"chdb://{home / 'chdb'}")) in done.stderr
    assert "ranksight sink" in done.stderr and "CLICKHOUSE_URL" in done.stderr
    assert "Traceback" not in done.stderr and "Code: 76" not in done.stderr
    assert time.monotonic() - started < 30


def test_sql_on_a_fresh_home_migrates_and_answers(tmp_path: Path) -> None:
    env = {**os.environ, "RANKSIGHT_HOME": str(tmp_path / "home")}
    env.pop("CLICKHOUSE_URL", None)
    done = subprocess.run(
        [RANKSIGHT, "sql", "SELECT count() AS n FROM steps", "--format", "jsonl"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '{"n": 0}'


@pytest.mark.parametrize("statement", ["SELECT * FROM no_such_table", "SELEC 1"])
def test_sql_error_is_one_line_exit_1(tmp_path: Path, statement: str) -> None:
    env = {**os.environ, "RANKSIGHT_HOME": str(tmp_path / "home")}
    env.pop("CLICKHOUSE_URL", None)
    done = subprocess.run([RANKSIGHT, "sql", statement], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    # One line saying which store was opened, then the error in one line.
    store, error = done.stderr.splitlines()
    assert store.startswith("store: chdb:")
    assert error.startswith("error: query failed:")


def test_fields_added_to_a_record_become_columns_of_an_existing_table(chdb_dsn: str) -> None:
    """A store made before a record gained fields gets the new columns on the next migration, before
    the versions whose views read them (the efficiency roll-ups read `gpu_samples.job_id`)."""
    chdb = connect(chdb_dsn)
    applied_versions(chdb)
    for migration in MIGRATIONS:
        if migration.version < 9:
            for statement in migration.statements(30):
                chdb.command(statement)
            chdb.command(f"INSERT INTO schema_migrations VALUES ({migration.version}, 'old', now64(3))")
    chdb.command("ALTER TABLE gpu_samples DROP COLUMN job_id")
    chdb.command("ALTER TABLE host_samples DROP COLUMN job_ids")
    assert 9 in migrate(chdb)
    columns = {
        (table, name)
        for table, name in chdb.query(
            "SELECT table, name FROM system.columns WHERE table IN ('gpu_samples', 'host_samples')"
        ).result_rows
    }
    assert ("gpu_samples", "job_id") in columns
    assert ("host_samples", "job_ids") in columns
    sink = ClickHouseSink(chdb)
    event = sample_event("GpuSample", 1)  # sample 0 has no energy reading (every fifth optional is null)
    event.record["job_id"] = "pretrain-1"
    sink.add("rs.telemetry.gpu", 0, 0, event)
    batch = sink.batch("rs.telemetry.gpu", 0)
    assert batch is not None
    sink.write(batch)
    assert chdb.query("SELECT job_id FROM gpu_samples").result_rows == [("pretrain-1",)]
    assert chdb.query("SELECT job_id FROM gpu_energy_minute").result_rows == [("pretrain-1",)]


def test_rows_older_than_the_ttl_are_dropped_by_chdb_and_counted_as_expired(chdb: Client) -> None:
    """The premise (chDB drops them on insert) and the fix (the sink does not call them stored)."""
    now_ms = int(time.time() * 1000)
    old_ms = now_ms - 40 * 86_400_000  # the tables' TTL is 30 days
    sink = ClickHouseSink(chdb)
    for offset in range(3):
        sink.add("t", 0, offset, sample_event("StepCompleted", offset, old_ms))
    sink.add("t", 0, 3, sample_event("StepCompleted", 3, now_ms))
    sink.flush("t", 0)
    assert _count(chdb, "steps") == 1
    assert sink.stats.rows_by_table == {"steps": 1}
    assert sink.stats.expired_by_table == {"steps": 3}


def test_sql_names_its_store_reaches_the_demo_store_and_keeps_full_width_when_piped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "RANKSIGHT_HOME": str(home)}
    env.pop("CLICKHOUSE_URL", None)

    def sql(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([RANKSIGHT, "sql", *args], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode in (0, 1), done.stderr
        return done

    missing = sql("--demo", "SELECT 1")
    assert missing.returncode == 1
    assert f"no demo store at {home / 'demo' / 'chdb'}: run `ranksight demo` first" in missing.stderr

    (home / "demo" / "chdb").mkdir(parents=True)
    assert sql("--demo", "CREATE TABLE marker (x UInt8) ENGINE = MergeTree ORDER BY x").returncode == 0
    assert sql("--demo", "INSERT INTO marker VALUES (7)").returncode == 0
    demo = sql("--demo", "SELECT x FROM marker", "--format", "jsonl")
    assert demo.stdout.strip() == '{"x": 7}'
    assert f"store: chdb:{home / 'demo' / 'chdb'}" in demo.stderr

    plain = sql("EXISTS TABLE marker", "--format", "jsonl")
    assert f"store: chdb:{home / 'chdb'}" in plain.stderr
    assert plain.stdout.strip() == '{"result": 0}'

    wide = sql("SELECT repeat('x', 300) AS long, 'end-of-row' AS last")
    assert "x" * 300 in wide.stdout  # stdout is a pipe: no 80-column cut
    assert "end-of-row" in wide.stdout
