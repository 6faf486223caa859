"""Hypothesis strategies that build valid records straight from the Avro schemas."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from schemas.records import RECORD_TYPES, Event, default_schemas

__all__ = ["event_of", "events"]

_TS = st.integers(min_value=0, max_value=2**41)  # up to year 2039-ish .. keeps ISO formatting valid
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


def _strategy(schema: Any) -> st.SearchStrategy[Any]:
    if isinstance(schema, list):
        return st.one_of(*[_strategy(s) for s in schema])
    if isinstance(schema, str):
        schema = {"type": schema}
    kind = schema["type"]
    if isinstance(kind, dict | list):
        return _strategy(kind)
    if schema.get("logicalType") == "timestamp-millis":
        return _TS
    return {
        "null": lambda: st.none(),
        "boolean": lambda: st.booleans(),
        "int": lambda: st.integers(-(2**31), 2**31 - 1),
        "long": lambda: st.integers(-(2**63), 2**63 - 1),
        "double": lambda: st.floats(allow_nan=True, allow_infinity=True),
        "string": lambda: _TEXT,
        "enum": lambda: st.sampled_from(schema["symbols"]),
        "array": lambda: st.lists(_strategy(schema["items"]), max_size=3),
        "map": lambda: st.dictionaries(_TEXT, _strategy(schema["values"]), max_size=3),
        "record": lambda: st.fixed_dictionaries({f["name"]: _strategy(f["type"]) for f in schema["fields"]}),
    }[kind]()


def event_of(record_type: str) -> st.SearchStrategy[Event]:
    """Valid events of one record type."""
    schema = default_schemas().record(record_type).json
    return _strategy(schema).map(lambda r: Event(record_type, r))


events = st.one_of(*[event_of(name) for name in RECORD_TYPES])
