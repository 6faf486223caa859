"""Errors of the sinks package: ClickHouse access, Kafka access and the batch writer."""

from __future__ import annotations

from schemas.errors import RanksightError

__all__ = [
    "ClickHouseError",
    "ClickHouseLockedError",
    "ClickHouseUnavailableError",
    "ImplausibleTimeError",
    "InvalidRecordError",
    "KafkaUnavailableError",
    "QueryError",
    "SinkBackpressureError",
    "SinkError",
    "SinkWriteError",
]


class SinkError(RanksightError):
    """Root of the errors raised by `sinks`."""


class ClickHouseError(SinkError):
    """ClickHouse (server or chDB) could not be opened or used."""


class ClickHouseLockedError(ClickHouseError):
    """The chDB directory is held by another process (chDB allows one process per directory)."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"the chDB directory {path} is in use by another process, usually a running pipeline "
            "(`ranksight sink` or `ranksight demo`): stop it, query through that process, "
            "or point every process at a ClickHouse server with CLICKHOUSE_URL=http://host:8123"
        )


class ClickHouseUnavailableError(ClickHouseError):
    """A ClickHouse server could not be reached."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"cannot reach ClickHouse at {where} ({reason}): start it or fix CLICKHOUSE_URL")


class QueryError(ClickHouseError):
    """A SQL statement was rejected by ClickHouse."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"query failed: {reason}")


class KafkaUnavailableError(SinkError):
    """The Kafka cluster did not answer."""

    def __init__(self, bootstrap: str, reason: str) -> None:
        self.bootstrap = bootstrap
        self.reason = reason
        super().__init__(
            f"cannot reach Kafka at {bootstrap} ({reason}): start it with `ranksight kafka up` or set KAFKA_BOOTSTRAP"
        )


class InvalidRecordError(SinkError):
    """A decoded record cannot be stored (it goes to the dead-letter topic instead)."""

    def __init__(self, record_type: str, reason: str) -> None:
        self.record_type = record_type
        self.reason = reason
        super().__init__(f"cannot store {record_type}: {reason}")


class ImplausibleTimeError(InvalidRecordError):
    """A record's event time fails the pipeline's time bound (`schemas.eventtime`): dead-lettered, not stored."""

    def __init__(self, record_type: str, verdict: str, event_ts: int, reference_ts: int) -> None:
        self.verdict = verdict  # one of schemas.eventtime.REJECT_REASONS, sent as `x-reject-reason`
        self.event_ts = event_ts
        self.reference_ts = reference_ts
        super().__init__(
            record_type,
            f"{verdict}: event time {event_ts} ms is {(event_ts - reference_ts) / 1000:+.0f} s from the "
            f"record's reference time {reference_ts} ms (its Kafka timestamp, capped at the sink's clock; "
            "bounds: engine.max_clock_skew_s, engine.max_record_age_s, years 2000..2200)",
        )


class SinkBackpressureError(SinkError):
    """ClickHouse refused a batch for now; retry the same offsets after `retry_after` seconds."""

    def __init__(self, retry_after: float, topic: str, partition: int, reason: str) -> None:
        self.retry_after = retry_after
        self.topic = topic
        self.partition = partition
        self.reason = reason
        super().__init__(f"insert of {topic}[{partition}] deferred for {retry_after:.1f} s: {reason}")


class SinkWriteError(SinkError):
    """ClickHouse rejected a batch for a reason retrying will not fix (schema mismatch, missing table)."""

    def __init__(self, table: str, topic: str, partition: int, reason: str) -> None:
        self.table = table
        self.topic = topic
        self.partition = partition
        self.reason = reason
        super().__init__(
            f"insert into {table} from {topic}[{partition}] failed: {reason} "
            "(run `ranksight sql 'SELECT 1'` to apply migrations, or check the ClickHouse server)"
        )
