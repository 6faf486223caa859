"""Event -> ClickHouse row: a plain function per table, no I/O.

Timestamps stay int UTC milliseconds: clickhouse-connect writes ints into `DateTime64(3)` as raw
ticks, which is both exact and the fastest path (no datetime objects on the hot path).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from schemas.eventtime import MAX_EVENT_TS, MIN_EVENT_TS
from schemas.records import Event
from sinks.ddl import TableSpec, table_specs
from sinks.errors import InvalidRecordError

__all__ = ["MAX_TS_MS", "MIN_TS_MS", "event_row", "row_converter"]

# Every timestamp field outside 2000-01-01 .. 2200-01-01 is a producer bug (seconds for milliseconds,
# zero); storing it would also create a partition per bogus day. The same range as the worker's
# (`schemas.eventtime`); the record's event time is further bounded by its arrival (`sinks.consumer`).
MIN_TS_MS = MIN_EVENT_TS
MAX_TS_MS = MAX_EVENT_TS

RowConverter = Callable[[dict[str, Any]], list[Any]]


@cache
def row_converter(record_type: str) -> RowConverter:
    """A function turning one record dict into the values of its table's record columns, in order."""
    spec: TableSpec = table_specs()[record_type]
    plain = [(c.field, c.default) for c in spec.columns]
    required = [i for i, c in enumerate(spec.columns) if c.required]
    items = [(i, c.field, c.item) for i, c in enumerate(spec.columns) if c.item is not None]
    timestamps = [(i, c.name) for i, c in enumerate(spec.columns) if c.timestamp]

    def convert(record: dict[str, Any]) -> list[Any]:
        get = record.get
        row = [get(name, default) for name, default in plain]
        for i in required:
            if row[i] is None:
                raise InvalidRecordError(record_type, f"required field {spec.columns[i].field!r} is missing")
        for i, name, sub in items:
            try:
                row[i] = [item[sub] for item in (row[i] or ())]
            except (KeyError, TypeError) as exc:
                raise InvalidRecordError(record_type, f"field {name!r}: malformed item ({exc})") from None
        for i, name in timestamps:
            value = row[i]
            if value is None:
                continue
            if type(value) is not int:
                raise InvalidRecordError(
                    record_type, f"field {name!r}: expected int milliseconds, got {value!r}"
                )
            if not MIN_TS_MS <= value < MAX_TS_MS:
                raise InvalidRecordError(
                    record_type, f"field {name!r}: {value} ms is outside 2000..2200 (seconds instead of ms?)"
                )
        return row

    return convert


def event_row(event: Event) -> tuple[TableSpec, list[Any]]:
    """The table of an event and its row values (record columns only, no Kafka position)."""
    try:
        spec = table_specs()[event.type]
    except KeyError:
        raise InvalidRecordError(event.type, "not a ranksight record type") from None
    return spec, row_converter(event.type)(event.record)
