"""The pipeline's one bound on event times (`schemas.eventtime`), shared by the worker and the sink."""

from __future__ import annotations

import pytest

from schemas.eventtime import MAX_EVENT_TS, MIN_EVENT_TS, TimeBound, record_time, reference_ms, time_verdict

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
Y2199 = 7_226_582_400_000
Y1970 = 5_000
SKEW = 300_000


def test_the_reference_is_the_kafka_timestamp_capped_at_the_readers_clock() -> None:
    assert reference_ms(NOW - 60_000, NOW) == NOW - 60_000
    # A producer whose clock jumped stamps its Kafka timestamps from the same clock.
    assert reference_ms(Y2199, NOW) == NOW
    # No timestamp (-1), none at all, or one from 1970: the reader's clock, the record's arrival.
    assert reference_ms(-1, NOW) == reference_ms(None, NOW) == reference_ms(Y1970, NOW) == NOW


@pytest.mark.parametrize(
    ("ts", "reference", "max_age", "verdict"),
    [
        (NOW, NOW, 0, None),
        (NOW + SKEW, NOW, 0, None),  # exactly the skew ahead is still believable
        (NOW + SKEW + 1, NOW, 0, "clock_ahead"),
        (Y2199, NOW, 0, "clock_ahead"),
        (Y1970, NOW, 0, "out_of_range"),
        (MIN_EVENT_TS - 1, NOW, 0, "out_of_range"),
        (MAX_EVENT_TS, MAX_EVENT_TS, 0, "out_of_range"),
        (MIN_EVENT_TS, NOW, 0, None),  # an old record: the age check is off by default
        (NOW - 3_600_001, NOW, 3_600_000, "clock_behind"),
        (NOW - 3_600_000, NOW, 3_600_000, None),
    ],
)
def test_a_verdict_names_why_a_time_is_refused(
    ts: int, reference: int, max_age: int, verdict: str | None
) -> None:
    assert time_verdict(ts, reference, SKEW, max_age) == verdict


def test_a_bound_checks_against_the_capped_kafka_timestamp() -> None:
    bound = TimeBound(SKEW)
    # Read an hour after it was produced: bounded by its Kafka time, not by the reader's clock.
    assert bound.verdict(NOW + SKEW + 1, NOW, NOW + 3_600_000) == "clock_ahead"
    assert bound.verdict(NOW + SKEW, NOW, NOW + 3_600_000) is None
    # A 2199 Kafka timestamp does not make a 2199 event time believable.
    assert bound.verdict(Y2199, Y2199, NOW) == "clock_ahead"
    with pytest.raises(ValueError, match="max_skew_ms"):
        TimeBound(0)


def test_the_event_time_of_a_record_is_ts_or_its_window_end() -> None:
    assert record_time({"ts": NOW}) == NOW
    assert record_time({"window_start": NOW - 60_000, "window_end": NOW}) == NOW
    assert record_time({"ts": None, "window_end": None}) is None
    assert record_time({"ts": 1.5}) is None
