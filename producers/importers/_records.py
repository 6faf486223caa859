"""Complete records from the schemas: importers set what they know, the schema defaults the rest."""

from __future__ import annotations

from functools import cache
from typing import Any

from schemas.records import Event, default_schemas

__all__ = ["make_event"]

_MISSING = object()


@cache
def _defaults(record_type: str) -> tuple[tuple[str, Any], ...]:
    fields = default_schemas().records[record_type].json["fields"]
    return tuple((f["name"], f.get("default", _MISSING)) for f in fields)


def make_event(record_type: str, **values: Any) -> Event:
    """An Event whose record has every schema field: the given values, else the schema default."""
    record: dict[str, Any] = {}
    for name, default in _defaults(record_type):
        if name in values:
            record[name] = values[name]
        elif default is _MISSING:
            raise KeyError(f"{record_type}.{name} is required")
        else:
            # Copy mutable defaults ([] / {}) so records never share them.
            record[name] = type(default)() if isinstance(default, list | dict) else default
    return Event(record_type, record)
