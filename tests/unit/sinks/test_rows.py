"""Event -> row conversion: nulls, NaN, arrays, maps, the nested alert history, invalid records."""

from __future__ import annotations

import math

import pytest

from schemas.codec import Codec
from schemas.records import RECORD_TYPES, Event
from sinks.ddl import table_for
from sinks.errors import InvalidRecordError
from sinks.rows import event_row
from sinks.samples import sample_event

NOW = 1_750_000_000_000


def _row(event: Event) -> dict[str, object]:
    spec, row = event_row(event)
    return dict(zip([c.name for c in spec.columns], row, strict=True))


@pytest.mark.parametrize("record_type", RECORD_TYPES)
def test_every_record_type_converts_after_an_avro_round_trip(record_type: str) -> None:
    codec = Codec()
    for i in range(12):
        event = codec.decode(codec.encode(sample_event(record_type, i, NOW)))
        spec, row = event_row(event)
        assert spec is table_for(record_type)
        assert len(row) == len(spec.columns)


def test_step_keeps_ints_nulls_and_nan() -> None:
    record = sample_event("StepCompleted", 3, NOW).record | {"loss": float("nan"), "grad_norm": None}
    row = _row(Event("StepCompleted", record))
    assert row["ts"] == NOW + 3  # int milliseconds: written as DateTime64(3) ticks as they are
    assert math.isnan(row["loss"])  # type: ignore[arg-type]
    assert row["grad_norm"] is None
    assert row["skipped"] is False


def test_missing_optional_field_takes_the_avro_default() -> None:
    record = {"ts": NOW, "job_id": "j", "rank": 0, "step": 1, "step_time_s": 0.5}
    row = _row(Event("StepCompleted", record))
    assert row["run_id"] == ""
    assert row["loss"] is None
    assert row["skipped"] is False


def test_arrays_and_maps_pass_through() -> None:
    gpu = sample_event("GpuSample", 1, NOW).record | {"pids": [11, 12]}
    assert _row(Event("GpuSample", gpu))["pids"] == [11, 12]
    validation = sample_event("ValidationResult", 1, NOW).record | {
        "metrics": {"acc": 0.9, "nan": float("nan")}
    }
    metrics = _row(Event("ValidationResult", validation))["metrics"]
    assert isinstance(metrics, dict)
    assert metrics["acc"] == 0.9
    assert math.isnan(metrics["nan"])


def test_alert_history_becomes_two_parallel_arrays() -> None:
    history = [{"ts": NOW, "value": 1.0}, {"ts": NOW + 1000, "value": float("inf")}]
    row = _row(Event("Alert", sample_event("Alert", 1, NOW).record | {"history": history}))
    assert row["history.ts"] == [NOW, NOW + 1000]
    assert row["history.value"] == [1.0, float("inf")]


def test_empty_alert_history_gives_empty_arrays() -> None:
    row = _row(Event("Alert", sample_event("Alert", 1, NOW).record | {"history": []}))
    assert row["history.ts"] == []
    assert row["history.value"] == []


def test_missing_required_field_is_rejected() -> None:
    record = sample_event("StepCompleted", 1, NOW).record
    del record["job_id"]
    with pytest.raises(InvalidRecordError, match="job_id"):
        event_row(Event("StepCompleted", record))


@pytest.mark.parametrize("ts", [0, 1_750_000_000, 10**15])
def test_timestamps_outside_2000_to_2200_are_rejected(ts: int) -> None:
    with pytest.raises(InvalidRecordError, match="outside"):
        event_row(Event("HostSample", sample_event("HostSample", 1, NOW).record | {"ts": ts}))


def test_non_integer_timestamp_is_rejected() -> None:
    with pytest.raises(InvalidRecordError, match="int milliseconds"):
        event_row(Event("HostSample", sample_event("HostSample", 1, NOW).record | {"ts": "2025-01-01"}))


def test_unknown_record_type_is_rejected() -> None:
    with pytest.raises(InvalidRecordError, match="not a ranksight record"):
        event_row(Event("Bogus", {}))
