"""What the worker reads, checked before anything else: the record as read, its decoding, its time.

Pure: no Kafka or Faust here. Both runtimes turn what their client hands them into a `Record`;
`check_record` decodes it and checks its type belongs on its topic; `align_ts` says which event
time the record may move. Dead letters: each input topic has one owner (`owns_dead_letters`).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from schemas.codec import Codec
from schemas.errors import DecodeError
from schemas.eventtime import MIN_EVENT_TS, event_ts, reference_ms, time_verdict
from schemas.records import Event
from schemas.topics import (
    DEADLETTER,
    TELEMETRY_JOB,
    TELEMETRY_UNATTRIBUTED,
    deadletter_headers,
    off_topic_reason,
)
from streams.errors import StreamsError
from streams.runtime.checkpoint import Send
from streams.runtime.options import BAD_LOG_S, BINDINGS, CONTROL, SUMMARIES, TELEMETRY_BY_JOB

__all__ = [
    "COMPONENT",
    "ClockRejected",
    "Intake",
    "Record",
    "align_ts",
    "check_record",
    "owns_dead_letters",
    "reference_ms",
]

log = logging.getLogger("ranksight.worker")

# The `x-component` header of what the worker dead-letters.
COMPONENT = "worker"

# Record types each topic the worker owns may carry. The worker dead-letters bad records of these
# only: the sink reads and dead-letters rs.training.* (once), so the worker skips theirs.
_OWNED_TYPES: dict[str, frozenset[str]] = {
    # Bindings and job ends for the side path's routes, and GPU faults to share with co-located jobs.
    BINDINGS: frozenset({"RankBound", "JobStateChanged", "GpuSample"}),
    CONTROL: frozenset({"JobStarted", "JobStateChanged"}),
    SUMMARIES: frozenset(
        {
            "RankSummary",
            "StageProgress",
            "BaselineRun",
            "JobStarted",
            "JobStateChanged",
            "CheckpointEvent",
            "EvaluationEvent",
            "ValidationResult",
            "RestoreTest",
            "RankBound",
            "RankFault",
            "StepCompleted",
            "Alert",
        }
    ),
    TELEMETRY_BY_JOB: frozenset({"GpuSample", "HostSample"}),
    # Not internal, but no sink reads them (the sink stores telemetry once, node-keyed).
    TELEMETRY_JOB: frozenset({"GpuSample", "HostSample"}),
    TELEMETRY_UNATTRIBUTED: frozenset({"GpuSample", "HostSample"}),
}


@dataclass(slots=True)
class Record:
    """One Kafka record as the worker core sees it (topic without the deployment's prefix)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None  # the Kafka timestamp (CreateTime), None when the record has none

    @property
    def tp(self) -> str:
        """The name the aligner knows its partition by: "topic:n"."""
        return f"{self.topic}:{self.partition}"


def owns_dead_letters(topic: str) -> bool:
    """True for the topics whose bad records the worker dead-letters (no sink reads them)."""
    return topic in _OWNED_TYPES


def check_record(codec: Codec, value: bytes | None, topic: str) -> Event:
    """Decode a record read from `topic` (unprefixed) and check its type belongs there.

    Raises `DecodeError` for anything the worker must not process: no value, bytes that are not
    exactly one record, or a valid record of a type that does not travel on this topic.
    """
    event = codec.decode(value)
    allowed = _OWNED_TYPES.get(topic)
    if allowed is not None:
        wrong = None if event.type in allowed else f"a {event.type} record does not belong on {topic}"
    else:
        wrong = off_topic_reason(event.type, topic)
    if wrong is not None:
        raise DecodeError(wrong, value or b"")
    return event


def align_ts(ts: int, kafka_ms: int | None, max_skew_ms: int, now_ms: int) -> int | None:
    """Event time for alignment and progress: `ts`, or None for a record the engine will reject.

    That is a record outside 2000..2200 or more than `max_skew_ms` ahead of its reference (its
    Kafka timestamp, capped at `now_ms`: `schemas.eventtime`, the bound the sink applies too). Such
    a record moves no event time: bounding it by Kafka time + skew instead let one 2199 record of an
    hour-old backlog drag every engine's watermark an hour past the data (job_stall on every job).
    """
    if time_verdict(ts, reference_ms(kafka_ms, now_ms), max_skew_ms) is not None:
        return None
    return ts


class ClockRejected(StreamsError):
    """The engine refused a record for its time (`engine.rejection`): dead-lettered with the reason."""

    def __init__(self, reason: str, event_ts: int, reference_ts: int) -> None:
        self.reason = reason
        self.event_ts = event_ts
        self.reference_ts = reference_ts
        super().__init__(
            f"{reason}: event time {event_ts} ms is {(event_ts - reference_ts) / 1000:+.0f} s from the"
            f" record's reference time {reference_ts} ms (its Kafka timestamp, capped at the worker's clock)"
        )


class Intake:
    """Decoding, time checks and dead letters of what the worker reads, shared by every stage.

    Counts into the worker's `totals` ("bad_input", "deadletter") and `dead_letters` (per reason);
    logs bad input at most once per `BAD_LOG_S` with a count. `wall_ms` is the worker's clock.
    """

    def __init__(
        self,
        codec: Codec,
        max_skew_ms: int,
        totals: dict[str, int],
        dead_letters: collections.Counter[str],
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        monotonic: Callable[[], float] = time.monotonic,
        prefix: str = "",
    ) -> None:
        self.codec = codec
        self.prefix = prefix  # the deployment's topic prefix: dead letters name the topic as read
        self.max_skew_ms = max_skew_ms
        self.totals = totals
        self.dead_letters = dead_letters
        self.time_rejected: collections.Counter[str] = collections.Counter()  # per reason
        self.wall_ms = wall_ms
        self.monotonic = monotonic
        self._bad_logged_at = -1e18
        self._bad_since = 0

    def read(self, rec: Record) -> tuple[Event | None, list[Send]]:
        """The record's event, or None and its dead letter (none for a topic the sink owns)."""
        try:
            return check_record(self.codec, rec.value, rec.topic), []
        except DecodeError as exc:
            err = exc.located(self.prefix + rec.topic, rec.partition, rec.offset)
        self.totals["bad_input"] += 1
        self._bad_since += 1
        owned = owns_dead_letters(rec.topic)
        now = self.monotonic()
        if now - self._bad_logged_at >= BAD_LOG_S:
            owner = "dead-lettered" if owned else "skipped (the sink dead-letters it)"
            log.warning(
                "bad input %s: %s (%d bad record(s) since the last such line)", owner, err, self._bad_since
            )
            self._bad_logged_at, self._bad_since = now, 0
        return None, [self.dead_letter(rec, err)] if owned else []

    def rejected_for_time(self, rec: Record, err: ClockRejected) -> list[Send]:
        """A record the engine refused for its time: counted, never dead-lettered here. The sink
        applies the same bound (`schemas.eventtime`) to the raw topics it stores and dead-letters
        the record there, once; what the worker reads is that record or a copy of it (job-keyed and
        unattributed telemetry, the internal topics)."""
        self.time_rejected[err.reason] += 1
        return []

    def dead_letter(self, rec: Record, err: Exception) -> Send:
        """The record as read, to `rs.deadletter` with why (headers)."""
        headers = deadletter_headers(
            err, self.prefix + rec.topic, rec.partition, rec.offset, component=COMPONENT
        )
        self.totals["deadletter"] += 1
        self.dead_letters["decode"] += 1
        return Send(DEADLETTER, rec.key, rec.value, headers=headers)

    def reference(self, rec: Record) -> int:
        """The time the record's event time is checked against (`reference_ms`)."""
        return reference_ms(rec.timestamp_ms, self.wall_ms())

    def held_ts(self, rec: Record, event: Event) -> int:
        """The event time the record is aligned by; a record the engine will reject for its time
        moves no event time and leaves the aligner at once (MIN)."""
        ts = align_ts(event_ts(event), rec.timestamp_ms, self.max_skew_ms, self.wall_ms())
        return MIN_EVENT_TS if ts is None else ts
