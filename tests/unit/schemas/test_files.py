"""JSON Lines and container files: exact round trips, field-level errors, nothing half-written."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.errors import InvalidEventError, RanksightError
from schemas.files import (
    EventFileError,
    JsonlFormat,
    format_ts,
    iter_container,
    load_jsonl,
    parse_ts,
    write_container,
)
from tests.unit.schemas.strategies import events

FMT = JsonlFormat()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(events, min_size=1, max_size=8))
def test_jsonl_and_container_files_round_trip_exactly(batch: list, tmp_path: Path) -> None:
    lines = [FMT.to_line(e) for e in batch]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.avro"
    # Every valid Avro timestamp round-trips; the 2000-01-01 floor of `events load` is tested apart.
    assert load_jsonl(src, out, min_ts_ms=None) == len(batch)
    assert [FMT.to_line(e) for e in iter_container(out)] == lines


def test_timestamps_are_iso_utc_with_milliseconds() -> None:
    assert format_ts(1_764_486_000_123) == "2025-11-30T07:00:00.123Z"
    assert parse_ts("2025-11-30T07:00:00.123Z") == 1_764_486_000_123
    assert parse_ts("2025-11-30T08:00:00.123+01:00") == 1_764_486_000_123
    assert parse_ts(5) == 5


def test_an_invalid_line_is_reported_with_line_field_and_reason_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    good = '{"type": "RankBound", "ts": 1764486000123, "job_id": "j", "rank": 0, "node": "n", "pid": 1}'
    src = tmp_path / "in.jsonl"
    src.write_text(
        "\n".join(
            [
                good,
                '{"type": "RankBound", "ts": 1, "job_id": "j", "rank": "zero", "node": "n", "pid": 1}',
                "",
                '{"type": "Unheard", "ts": 1}',
                "not json",
                good,
            ]
        )
    )
    out = tmp_path / "out.avro"
    with pytest.raises(EventFileError) as err:
        load_jsonl(src, out)
    problems = {(p.line, p.field) for p in err.value.problems}
    assert problems == {(2, "rank"), (4, "type"), (5, "(line)")}
    assert "line 2: field 'rank': expected an integer" in str(err.value)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [src]  # no temporary file left behind


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ('{"type": "StepCompleted", "job_id": "j", "rank": 0, "step": 1, "step_time_s": 1}', "ts", "missing"),
        (
            '{"type": "RankBound", "ts": 1, "job_id": "j", "rank": 0, "node": "n", "pid": 1, "gpu": 0}',
            "gpu",
            "unknown",
        ),
        ('{"type": "JobStateChanged", "ts": 1, "job_id": "j", "state": "sleeping"}', "state", "not one of"),
        (
            '{"type": "RankBound", "ts": 1, "job_id": "j", "rank": 4294967296, "node": "n", "pid": 1}',
            "rank",
            "range",
        ),
        (
            '{"type": "GpuSample", "ts": 1, "cluster": "c", "node": "n", "gpu_index": 0, "gpu_uuid": "u", "pids": [1, true]}',
            "pids[1]",
            "integer",
        ),
    ],
)
def test_field_errors_name_the_field(line: str, field: str, reason: str) -> None:
    with pytest.raises(InvalidEventError) as err:
        FMT.from_line(line, 7)
    assert err.value.field == field and err.value.line == 7
    assert reason in err.value.reason


def test_optional_fields_may_be_omitted_and_take_their_defaults() -> None:
    event = FMT.from_line('{"type": "HostSample", "ts": "2026-01-01T00:00:00Z", "cluster": "c", "node": "n"}')
    assert event.record["cpu_util_pct"] is None and event.record["ts"] == 1_767_225_600_000


def test_non_finite_floats_survive_the_human_form(tmp_path: Path) -> None:
    line = FMT.to_line(
        FMT.from_line(
            '{"type": "StepCompleted", "ts": 1, "job_id": "j", "rank": 0, "step": 1, "step_time_s": 1, "loss": NaN, "grad_norm": Infinity}'
        )
    )
    assert '"loss": NaN' in line and '"grad_norm": Infinity' in line
    out = tmp_path / "x.avro"
    write_container(out, [FMT.from_line(line)])
    assert FMT.to_line(next(iter_container(out))) == line


def test_a_file_that_is_not_avro_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.avro"
    bogus.write_text("hello")
    from schemas.errors import RanksightError

    with pytest.raises(RanksightError, match="not a readable Avro container file"):
        list(iter_container(bogus))


def test_a_file_written_with_an_older_event_schema_reads_into_the_current_one(tmp_path: Path) -> None:
    """Recordings outlive schema versions: an Event file whose StepCompleted is v0 still reads."""
    import json

    import fastavro

    from schemas.records import RECORD_TYPES, default_schemas

    old_step = json.loads(
        (
            Path(__file__).resolve().parents[2]
            / "fixtures"
            / "schemas"
            / "ranksight.v1.StepCompleted.v0.avsc"
        ).read_text()
    )
    current = default_schemas()
    branches = [old_step if name == "StepCompleted" else current.record(name).json for name in RECORD_TYPES]
    old_event = {
        "type": "record",
        "name": "Event",
        "namespace": "ranksight.v1",
        "fields": [{"name": "event", "type": branches}],
    }
    path = tmp_path / "old.avro"
    with path.open("wb") as fh:
        fastavro.writer(
            fh,
            fastavro.parse_schema(old_event),
            [
                {
                    "event": (
                        "ranksight.v1.StepCompleted",
                        {
                            "ts": 1_700_000_000_000,
                            "job_id": "j",
                            "rank": 1,
                            "step": 5,
                            "loss": 1.5,
                            "step_time_s": 0.5,
                        },
                    )
                }
            ],
        )
    (event,) = list(iter_container(path))
    assert event.type == "StepCompleted"
    assert event.record["ts"] == 1_700_000_000_000 and event.record["step"] == 5
    assert (
        event.record["skipped"] is False and event.record["tokens"] is None and event.record["run_id"] == ""
    )


def test_a_timestamp_in_seconds_is_rejected_with_a_hint(tmp_path: Path) -> None:
    """1764486000 is 2025-11-30 in seconds but 1970-01-21 in milliseconds: `events load` refuses it."""
    src = tmp_path / "in.jsonl"
    src.write_text(
        '{"type": "RankBound", "ts": 1764486000, "job_id": "j", "rank": 0, "node": "n", "pid": 1}\n'
    )
    with pytest.raises(EventFileError) as err:
        load_jsonl(src, tmp_path / "out.avro")
    assert "line 1: field 'ts': 1764486000 is 1970-01-21T10:08:06.000Z" in str(err.value)
    assert "looks like seconds" in str(err.value)


def test_a_timestamp_after_2000_in_milliseconds_loads(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(
        '{"type": "RankBound", "ts": 946684800000, "job_id": "j", "rank": 0, "node": "n", "pid": 1}\n'
    )
    assert load_jsonl(src, tmp_path / "out.avro") == 1


def test_a_line_that_is_not_utf8_is_named_not_a_traceback(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(
        b'{"type": "RankBound", "ts": 1764486000123, "job_id": "j", "rank": 0, "node": "n", "pid": 1}\n'
        b'{"type": "RankBound", "ts": 1764486000123, "job_id": "\xff", "rank": 0, "node": "n", "pid": 1}\n'
    )
    with pytest.raises(EventFileError) as err:
        load_jsonl(src, tmp_path / "out.avro")
    assert [(p.line, p.reason) for p in err.value.problems] == [(2, "not UTF-8 text: byte 0xff at column 55")]


def test_a_container_of_foreign_records_is_one_sentence_without_the_schema(tmp_path: Path) -> None:
    import fastavro

    path = tmp_path / "foreign.avro"
    with path.open("wb") as fh:
        fastavro.writer(
            fh, {"type": "record", "name": "Foo", "fields": [{"name": "x", "type": "int"}]}, [{"x": 1}]
        )
    with pytest.raises(RanksightError) as err:
        list(iter_container(path))
    assert str(err.value) == (
        f"{path}: not a file of ranksight events (its Avro schema is Foo, not ranksight.v1.Event); "
        "write one with `ranksight simulate --out` or `ranksight events load`"
    )


def test_an_event_schema_that_cannot_be_resolved_is_one_short_sentence(tmp_path: Path) -> None:
    """Same name, incompatible content: fastavro's error dumps both schemas; ours names the file only."""
    import fastavro

    schema = {
        "type": "record",
        "name": "Event",
        "namespace": "ranksight.v1",
        "fields": [
            {
                "name": "event",
                "type": {"type": "record", "name": "Alien", "fields": [{"name": "x", "type": "int"}]},
            }
        ],
    }
    path = tmp_path / "alien.avro"
    with path.open("wb") as fh:
        fastavro.writer(fh, schema, [{"event": {"x": 1}}])
    with pytest.raises(RanksightError) as err:
        list(iter_container(path))
    message = str(err.value)
    assert message.startswith(f"{path}: ")
    assert len(message) < 300
    assert "\n" not in message
