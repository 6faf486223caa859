"""One bound on time for the whole pipeline: is a record's event time believable when it arrives?

A record is rejected when its event time is outside 2000..2200 (a clock reset to the epoch,
seconds sent as milliseconds), more than `max_skew_ms` ahead of its reference time, or (when
`max_age_ms` > 0) more than that behind it. The reference is the record's Kafka timestamp capped
at the reader's wall clock (`reference_ms`): a producer whose clock jumped to 2199 stamps its
Kafka timestamps from the same clock, and no record comes from the future of the process reading
it. The worker and the sink apply this same function with the same knobs
(`engine.max_clock_skew_s`, `engine.max_record_age_s` in streams/detectors.yaml), so a record the
worker will not detect on is not stored either, and it is dead-lettered once, by the owner of
its topic. Pure: no clock is read here, the caller passes `now_ms`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.records import Event

__all__ = [
    "MAX_EVENT_TS",
    "MIN_EVENT_TS",
    "REJECT_REASONS",
    "TimeBound",
    "event_ts",
    "record_time",
    "reference_ms",
    "time_verdict",
]

# 2000-01-01 .. 2200-01-01 UTC in ms: outside it a timestamp is a producer bug, never a real time.
MIN_EVENT_TS = 946_684_800_000
MAX_EVENT_TS = 7_258_118_400_000

# Why a record's time was refused, in the order `time_verdict` checks.
REJECT_REASONS = ("out_of_range", "clock_ahead", "clock_behind")


def reference_ms(kafka_ms: int | None, now_ms: int) -> int:
    """The time a record's event time is checked against: its Kafka timestamp, never past `now_ms`.

    A Kafka timestamp that is absent (-1, 0) or itself outside 2000..2200 is no reference: the
    reader's clock (`now_ms`, the record's arrival) is used instead.
    """
    if kafka_ms is None or not MIN_EVENT_TS <= kafka_ms < MAX_EVENT_TS:
        return now_ms
    return min(kafka_ms, now_ms)


def time_verdict(ts: int, reference: int, max_skew_ms: int, max_age_ms: int = 0) -> str | None:
    """None when `ts` is believable against `reference`, else the reason (one of `REJECT_REASONS`).

    `max_age_ms` 0 switches the "too far behind" check off (replays and drained spools publish
    old event times; late records are the detectors' business).
    """
    if not MIN_EVENT_TS <= ts < MAX_EVENT_TS:
        return "out_of_range"
    if ts > reference + max_skew_ms:
        return "clock_ahead"
    if max_age_ms and ts < reference - max_age_ms:
        return "clock_behind"
    return None


def record_time(record: dict[str, Any]) -> int | None:
    """The event time of a record dict: `ts`, for window records `window_end`; None if it has neither."""
    ts = record.get("ts")
    if ts is None:
        ts = record.get("window_end")
    return ts if type(ts) is int else None


def event_ts(event: Event) -> int:
    """Event time of any ranksight record (window records: the window end; 0 if it has neither)."""
    r = event.record
    ts = r.get("ts")
    if ts is None:
        ts = r.get("window_end", 0)
    return int(ts)


@dataclass(frozen=True)
class TimeBound:
    """The two knobs of the bound, in ms (`engine.max_clock_skew_s`, `engine.max_record_age_s` x 1000)."""

    max_skew_ms: int
    max_age_ms: int = 0

    def __post_init__(self) -> None:
        if self.max_skew_ms <= 0 or self.max_age_ms < 0:
            raise ValueError("max_skew_ms must be > 0 and max_age_ms >= 0 (0: off)")

    def verdict(self, ts: int, kafka_ms: int | None, now_ms: int) -> str | None:
        """`time_verdict` of `ts` against the reference of a record with this Kafka timestamp read at `now_ms`."""
        return time_verdict(ts, reference_ms(kafka_ms, now_ms), self.max_skew_ms, self.max_age_ms)
