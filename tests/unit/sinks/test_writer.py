"""Batching of the ClickHouse writer, against an in-memory client that records inserts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from sinks.errors import InvalidRecordError, SinkBackpressureError, SinkWriteError
from sinks.samples import sample_event
from sinks.writer import ClickHouseSink, dedup_token

NOW = 1_750_000_000_000


@dataclass
class _Result:
    result_rows: list[tuple[Any, ...]]


@dataclass
class RecordingClient:
    """Stands in for a clickhouse-connect client: keeps inserts, answers the stored-offset query."""

    inserts: list[dict[str, Any]] = field(default_factory=list)
    stored: dict[tuple[str, str, int], int] = field(default_factory=dict)
    fail_with: Exception | None = None
    ttl_days: int | None = None

    def insert(
        self, table: str, data: Any, column_names: list[str], column_oriented: bool, settings: dict
    ) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        assert column_oriented
        self.inserts.append(
            {"table": table, "columns": dict(zip(column_names, data, strict=True)), "settings": settings}
        )

    def query(self, sql: str, parameters: dict[str, Any]) -> _Result:
        if "system.tables" in sql:
            # What ClickHouse shows in engine_full for a table created with a TTL.
            ttl = f" TTL toDateTime(ts) + toIntervalDay({self.ttl_days})" if self.ttl_days else ""
            return _Result([(f"MergeTree ORDER BY ts{ttl} SETTINGS index_granularity = 8192",)])
        table = sql.split(" FROM ")[1].split()[0]
        key = (table, parameters["topic"], parameters["partition"])
        return _Result([(1, self.stored[key])] if key in self.stored else [(0, 0)])


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _sink(client: RecordingClient, clock: FakeClock | None = None, **kw: Any) -> ClickHouseSink:
    return ClickHouseSink(client, clock=clock or FakeClock(), **kw)  # type: ignore[arg-type]


def test_a_batch_is_full_at_batch_size_messages() -> None:
    sink = _sink(RecordingClient(), batch_size=3)
    for offset in range(2):
        sink.add("t", 0, offset, sample_event("StepCompleted", offset, NOW))
    assert not sink.is_full("t", 0)
    assert sink.ready() == []
    sink.add("t", 0, 2, sample_event("StepCompleted", 2, NOW))
    assert sink.is_full("t", 0)
    assert sink.ready() == [("t", 0)]


def test_a_batch_is_due_after_the_interval() -> None:
    clock = FakeClock()
    sink = _sink(RecordingClient(), clock, batch_size=100, batch_interval_s=1.0)
    sink.add("t", 0, 0, sample_event("StepCompleted", 0, NOW))
    clock.now += 0.5
    sink.add("t", 1, 0, sample_event("StepCompleted", 1, NOW))
    assert sink.ready() == []
    clock.now += 0.6
    assert sink.ready() == [("t", 0)]
    clock.now += 0.5
    assert sorted(sink.ready()) == [("t", 0), ("t", 1)]


def test_flush_inserts_columns_per_table_with_the_offset_range_as_dedup_token() -> None:
    client = RecordingClient()
    sink = _sink(client)
    sink.add("p.rs.training.events", 2, 10, sample_event("JobStarted", 1, NOW))
    sink.add("p.rs.training.events", 2, 11, sample_event("RankBound", 1, NOW))
    sink.add("p.rs.training.events", 2, 12, sample_event("RankBound", 2, NOW))
    batch = sink.flush("p.rs.training.events", 2)
    assert batch is not None
    assert (batch.first_offset, batch.last_offset, batch.rows) == (10, 12, 3)
    assert [i["table"] for i in client.inserts] == ["job_started", "rank_bound"]
    for insert in client.inserts:
        assert insert["settings"]["insert_deduplication_token"] == "p.rs.training.events:2:10-12"
    rank_bound = client.inserts[1]["columns"]
    assert rank_bound["_offset"] == [11, 12]
    assert rank_bound["_partition"] == [2, 2]
    assert rank_bound["_topic"] == ["p.rs.training.events"] * 2
    assert rank_bound["rank"] == [1, 2]
    assert sink.pending() == []
    assert sink.stats.rows_by_table == {"job_started": 1, "rank_bound": 2}


def test_dedup_token_names_topic_partition_and_offsets() -> None:
    assert dedup_token("rs.telemetry.gpu", 3, 100, 199) == "rs.telemetry.gpu:3:100-199"


def test_batch_is_cleared_when_the_insert_fails() -> None:
    client = RecordingClient(fail_with=DatabaseError("Code: 60. DB::Exception: Unknown table steps"))
    sink = _sink(client)
    sink.add("t", 0, 0, sample_event("StepCompleted", 0, NOW))
    with pytest.raises(SinkWriteError, match="steps"):
        sink.flush("t", 0)
    assert sink.pending() == []
    assert sink.flush("t", 0) is None


@pytest.mark.parametrize(
    "error",
    [
        OperationalError("connection refused"),
        DatabaseError(
            "Code: 252. DB::Exception: Too many parts (300). Merges are processing significantly slower"
        ),
        DatabaseError("Code: 241. DB::Exception: Memory limit (total) exceeded"),
    ],
)
def test_transient_insert_failures_are_backpressure_with_retry_after(error: Exception) -> None:
    sink = _sink(RecordingClient(fail_with=error), backpressure_s=2.0)
    sink.add("t", 4, 7, sample_event("StepCompleted", 0, NOW))
    with pytest.raises(SinkBackpressureError) as caught:
        sink.flush("t", 4)
    assert caught.value.retry_after >= 2.0
    assert (caught.value.topic, caught.value.partition) == ("t", 4)
    assert sink.pending() == []


def test_offsets_a_table_already_stores_are_skipped() -> None:
    client = RecordingClient(stored={("steps", "t", 0): 5})
    sink = _sink(client)
    added = [sink.add("t", 0, offset, sample_event("StepCompleted", offset, NOW)) for offset in range(4, 8)]
    assert added == [False, False, True, True]
    batch = sink.flush("t", 0)
    assert batch is not None and batch.first_offset == 4
    assert client.inserts[0]["columns"]["_offset"] == [6, 7]
    assert sink.stats.skipped_stored == 2


def test_after_a_flush_the_stored_offset_is_remembered_without_asking_again() -> None:
    client = RecordingClient()
    sink = _sink(client)
    sink.add("t", 0, 0, sample_event("StepCompleted", 0, NOW))
    sink.flush("t", 0)
    assert sink.add("t", 0, 0, sample_event("StepCompleted", 0, NOW)) is False
    assert sink.add("t", 0, 1, sample_event("StepCompleted", 1, NOW)) is True


def test_skipped_message_extends_the_offset_range_without_a_row() -> None:
    client = RecordingClient()
    sink = _sink(client)
    sink.add("t", 0, 0, sample_event("StepCompleted", 0, NOW))
    sink.skip("t", 0, 1)
    batch = sink.flush("t", 0)
    assert batch is not None
    assert (batch.last_offset, batch.messages, batch.rows) == (1, 2, 1)


def test_invalid_record_leaves_no_trace_in_the_batch() -> None:
    sink = _sink(RecordingClient())
    bad = sample_event("StepCompleted", 0, NOW)
    bad.record["ts"] = 5
    with pytest.raises(InvalidRecordError):
        sink.add("t", 0, 0, bad)
    assert sink.pending() == []


def test_forget_drops_batch_and_known_offsets() -> None:
    client = RecordingClient()
    sink = _sink(client)
    sink.add("t", 0, 0, sample_event("StepCompleted", 0, NOW))
    sink.flush("t", 0)
    sink.add("t", 0, 1, sample_event("StepCompleted", 1, NOW))
    sink.forget("t", 0)
    assert sink.pending() == []
    client.stored[("steps", "t", 0)] = 9  # another consumer stored more meanwhile
    assert sink.add("t", 0, 9, sample_event("StepCompleted", 9, NOW)) is False


def test_batch_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        _sink(RecordingClient(), batch_size=0)


def test_rows_older_than_the_ttl_are_counted_as_expired_not_stored() -> None:
    """Rows the TTL drops on insert are counted apart; only rows that stay are reported as stored."""
    client = RecordingClient(ttl_days=30)
    day_s = 86_400
    now_s = NOW / 1000 + 31 * day_s  # the events are 31 days old
    sink = _sink(client, wall_clock=lambda: now_s)
    for offset in range(3):
        sink.add("t", 0, offset, sample_event("StepCompleted", offset, NOW))
    sink.flush("t", 0)
    sink.add("t", 0, 3, sample_event("StepCompleted", 3, NOW))
    sink.add("t", 0, 4, sample_event("StepCompleted", 4, int(now_s * 1000)))  # a fresh one is stored
    sink.flush("t", 0)
    assert sink.stats.expired_by_table == {"steps": 4}
    assert sink.stats.rows_by_table == {"steps": 1}


def test_a_table_without_ttl_never_expires_rows() -> None:
    client = RecordingClient(ttl_days=None)
    sink = _sink(client, wall_clock=lambda: NOW / 1000 + 10_000 * 86_400)
    sink.add("t", 0, 0, sample_event("StepCompleted", 0, NOW))
    sink.flush("t", 0)
    assert sink.stats.rows_by_table == {"steps": 1}
    assert not sink.stats.expired_by_table


def test_the_ttl_warning_names_the_table_once(caplog: pytest.LogCaptureFixture) -> None:
    client = RecordingClient(ttl_days=30)
    sink = _sink(client, wall_clock=lambda: NOW / 1000 + 60 * 86_400)
    with caplog.at_level("WARNING", logger="sinks.writer"):
        for offset in range(5):
            sink.add("t", 0, offset, sample_event("StepCompleted", offset, NOW))
            sink.flush("t", 0)
    warnings = [r.getMessage() for r in caplog.records if "TTL" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].startswith("steps: 1 of 1 rows are older than the table's 30-day TTL")
    assert sink.stats.expired_by_table == {"steps": 5}
