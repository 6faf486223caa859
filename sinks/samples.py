"""Deterministic sample events of every record type, built from the Avro schemas (benchmarks, tests, demos).

Every field gets a value of its schema type that varies with the index `i`; optional fields are
null on every fifth event and optional doubles are NaN on every seventh, so nulls and NaN travel
the whole path. Timestamps are `now_ms + i` milliseconds (recent, so the tables' TTL keeps them).
"""

from __future__ import annotations

import time
from typing import Any

from schemas.records import Event, default_schemas

__all__ = ["sample_event", "sample_events"]

_UNIQUE = frozenset({"alert_id", "fingerprint", "checkpoint_id"})


def _value(avro: Any, name: str, i: int, now_ms: int) -> Any:
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if len(branches) < len(avro):
            if i % 5 == 0:
                return None
            if branches[0] == "double" and i % 7 == 3:
                return float("nan")
        return _value(branches[0], name, i, now_ms)
    if isinstance(avro, dict):
        kind = avro["type"]
        if avro.get("logicalType") == "timestamp-millis":
            return now_ms + i + (60_000 if name in ("window_end", "ends_at") else 0)
        if kind == "enum":
            return avro["symbols"][i % len(avro["symbols"])]
        if kind == "array":
            return [_value(avro["items"], name, i + k, now_ms) for k in range(i % 3)]
        if kind == "map":
            return {f"k{k}": _value(avro["values"], name, i + k, now_ms) for k in range(i % 3)}
        if kind == "record":
            return {f["name"]: _value(f["type"], f["name"], i, now_ms) for f in avro["fields"]}
        return _value(kind, name, i, now_ms)
    if avro == "string":
        # Identifiers are unique (alerts collapse on (team, fingerprint, alert_id, status)); names repeat.
        return f"{name}-{i}" if name in _UNIQUE else f"{name}-{i % 4}"
    if avro == "int":
        return i % 1000
    if avro == "long":
        return i
    if avro in ("double", "float"):
        return i * 0.5
    if avro == "boolean":
        return i % 2 == 0
    if avro == "bytes":
        return bytes([i % 256])
    raise ValueError(f"no sample for Avro type {avro!r}")


def sample_event(record_type: str, i: int, now_ms: int | None = None) -> Event:
    """The `i`-th sample event of a record type."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    schema = default_schemas().record(record_type).json
    return Event(record_type, {f["name"]: _value(f["type"], f["name"], i, now_ms) for f in schema["fields"]})


def sample_events(record_type: str, n: int, now_ms: int | None = None) -> list[Event]:
    """`n` sample events of a record type."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return [sample_event(record_type, i, now_ms) for i in range(n)]
