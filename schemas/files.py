"""Events on disk: JSON Lines (the human form) and Avro Object Container Files of `Event`.

A JSON line is `{"type": "StepCompleted", ...fields}` with timestamps as ISO-8601 UTC strings
(`2026-11-30T07:00:00.123Z`) and non-finite floats as `NaN` / `Infinity` (as Python's json
writes them). Reading checks every field against the schema and names the line, the field
and the reason; writing a container file goes to a temporary file renamed at the end, so a
failure leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, cast

import fastavro
from fastavro import schemaless_reader
from fastavro.read import SchemaResolutionError
from fastavro.schema import to_parsing_canonical_form

from schemas.errors import InvalidEventError, RanksightError
from schemas.eventtime import MIN_EVENT_TS
from schemas.records import NAMESPACE, Event, SchemaSet, default_schemas, strip_logical_types

__all__ = [
    "MIN_TS_MS",
    "EventFileError",
    "JsonlFormat",
    "format_ts",
    "iter_container",
    "load_jsonl",
    "parse_ts",
    "read_jsonl",
    "write_container",
]

# Event time before 2000 is a producer bug, almost always seconds written where milliseconds belong.
MIN_TS_MS = MIN_EVENT_TS  # the pipeline's one bound (`schemas.eventtime`)
_EVENT_NAME = f"{NAMESPACE}.Event"
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


class EventFileError(RanksightError):
    """An events file could not be read or written; lists the offending lines."""

    def __init__(self, path: str, problems: list[InvalidEventError]) -> None:
        self.path = path
        self.problems = problems
        shown = "\n".join(f"  {p}" for p in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{path}: {len(problems)} invalid line(s), nothing written:\n{shown}{more}")


def format_ts(ms: int) -> str:
    """UTC milliseconds -> `2026-11-30T07:00:00.123Z`."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def parse_ts(value: Any) -> int:
    """ISO-8601 string (UTC if no offset) or integer milliseconds -> UTC milliseconds."""
    if isinstance(value, bool):
        raise ValueError("expected a timestamp, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        dt = datetime.fromisoformat(text)
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
        return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    raise ValueError(f"expected an ISO-8601 time or integer milliseconds, got {type(value).__name__}")


Converter = Callable[[Any, str], Any]


def _compile(schema: Any, to_json: bool) -> Converter:
    """A function converting one value of `schema` between the JSON form and the in-memory form."""
    if isinstance(schema, str):
        schema = {"type": schema}
    if isinstance(schema, list):
        return _compile_union(schema, to_json)
    kind = schema["type"]
    if isinstance(kind, dict | list):
        return _compile(kind, to_json)
    logical = schema.get("logicalType")
    if kind == "long" and logical == "timestamp-millis":
        if to_json:
            return lambda v, p: format_ts(v)

        def ts(v: Any, path: str) -> int:
            try:
                ms = parse_ts(v)
            except ValueError as exc:
                raise InvalidEventError(path, str(exc)) from None
            return ms

        return ts
    if kind in ("int", "long"):
        lo, hi = _INT32 if kind == "int" else _INT64
        if to_json:
            return lambda v, p: v

        def integer(v: Any, path: str) -> int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidEventError(path, f"expected an integer, got {json.dumps(v)}")
            if not lo <= v <= hi:
                raise InvalidEventError(path, f"{v} is out of range for {kind}")
            return v

        return integer
    if kind in ("double", "float"):
        if to_json:
            return lambda v, p: v

        def number(v: Any, path: str) -> float:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise InvalidEventError(path, f"expected a number, got {json.dumps(v)}")
            return float(v)

        return number
    if kind == "boolean":
        if to_json:
            return lambda v, p: v

        def boolean(v: Any, path: str) -> bool:
            if not isinstance(v, bool):
                raise InvalidEventError(path, f"expected true or false, got {json.dumps(v)}")
            return v

        return boolean
    if kind == "string":
        if to_json:
            return lambda v, p: v

        def string(v: Any, path: str) -> str:
            if not isinstance(v, str):
                raise InvalidEventError(path, f"expected a string, got {json.dumps(v)}")
            return v

        return string
    if kind == "null":

        def null(v: Any, path: str) -> None:
            if v is not None:
                raise InvalidEventError(path, "expected null")
            return None

        return null
    if kind == "enum":
        symbols = set(schema["symbols"])
        if to_json:
            return lambda v, p: v

        def enum(v: Any, path: str) -> str:
            if v not in symbols:
                raise InvalidEventError(path, f"{json.dumps(v)} is not one of {', '.join(schema['symbols'])}")
            return str(v)

        return enum
    if kind == "array":
        item = _compile(schema["items"], to_json)

        def array(v: Any, path: str) -> list[Any]:
            if not isinstance(v, list):
                raise InvalidEventError(path, f"expected a list, got {json.dumps(v)}")
            return [item(x, f"{path}[{i}]") for i, x in enumerate(v)]

        return array
    if kind == "map":
        value = _compile(schema["values"], to_json)

        def mapping(v: Any, path: str) -> dict[str, Any]:
            if not isinstance(v, dict):
                raise InvalidEventError(path, f"expected an object, got {json.dumps(v)}")
            return {str(k): value(x, f"{path}.{k}") for k, x in v.items()}

        return mapping
    if kind == "record":
        return _compile_record(schema, to_json)
    raise TypeError(f"unsupported Avro type {kind!r}")


def _compile_union(schema: list[Any], to_json: bool) -> Converter:
    """A union's converter: null where the union allows it, else the first branch that accepts the value."""
    branches = [(b, _compile(b, to_json)) for b in schema]
    nullable = any((b == "null" or (isinstance(b, dict) and b.get("type") == "null")) for b in schema)
    others = [c for b, c in branches if b != "null"]

    def union(v: Any, path: str) -> Any:
        if v is None:
            if nullable:
                return None
            raise InvalidEventError(path, "must not be null")
        errors = []
        for conv in others:
            try:
                return conv(v, path)
            except InvalidEventError as exc:
                errors.append(exc.reason)
        raise InvalidEventError(path, "; ".join(errors))

    return union


_MISSING = object()
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def _inline_named(schema: Any, named: dict[str, Any] | None = None, namespace: str = "") -> Any:
    """A copy of a schema (JSON form) whose references to named types it defined are replaced by
    their definitions (the converters compile by structure, not by name)."""
    named = {} if named is None else named
    if isinstance(schema, str):
        return named.get(schema, schema) if schema not in _PRIMITIVES else schema
    if isinstance(schema, list):
        return [_inline_named(b, named, namespace) for b in schema]
    if not isinstance(schema, dict):
        return schema
    namespace = schema.get("namespace", namespace)
    out = {
        k: _inline_named(v, named, namespace) if k in ("type", "items", "values") else v
        for k, v in schema.items()
    }
    if out.get("type") == "record":
        out["fields"] = [{**f, "type": _inline_named(f["type"], named, namespace)} for f in schema["fields"]]
        name = schema.get("name")
        if name:
            named[name] = out
            if namespace and "." not in name:
                named[f"{namespace}.{name}"] = out
    return out


def _compile_record(schema: dict[str, Any], to_json: bool) -> Converter:
    fields = [(f["name"], _compile(f["type"], to_json), f.get("default", _MISSING)) for f in schema["fields"]]
    names = {name for name, _, _ in fields}

    def record(v: Any, path: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise InvalidEventError(path or "(record)", f"expected an object, got {json.dumps(v)}")
        if not to_json:
            unknown = sorted(set(v) - names - ({"type"} if not path else set()))
            if unknown:
                raise InvalidEventError(
                    f"{path}{unknown[0]}" if not path else f"{path}.{unknown[0]}", "unknown field"
                )
        out: dict[str, Any] = {}
        for name, conv, default in fields:
            where = f"{path}.{name}" if path else name
            if name in v:
                out[name] = conv(v[name], where)
            elif default is not _MISSING and not to_json:
                out[name] = default if not isinstance(default, list | dict) else type(default)(default)
            else:
                raise InvalidEventError(where, "missing (required, no default)")
        return out

    return record


class JsonlFormat:
    """Converts `Event`s to and from their JSON-line form, checking fields against the schemas."""

    def __init__(self, schemas: SchemaSet | None = None) -> None:
        self.schemas = schemas or default_schemas()
        self._to_json = {
            n: _compile_record(_inline_named(r.json), True) for n, r in self.schemas.records.items()
        }
        self._from_json = {
            n: _compile_record(_inline_named(r.json), False) for n, r in self.schemas.records.items()
        }

    def to_line(self, event: Event) -> str:
        """One JSON line (no newline) for an event; field order is the schema's."""
        body = self._to_json[event.type](event.record, "")
        return json.dumps({"type": event.type, **body}, separators=(", ", ": "), allow_nan=True)

    def from_obj(self, obj: Any, line: int | None = None) -> Event:
        """An event from a parsed JSON object; raises `InvalidEventError` naming the field."""
        try:
            if not isinstance(obj, dict):
                raise InvalidEventError("(line)", "expected a JSON object")
            kind = obj.get("type")
            if not isinstance(kind, str) or kind not in self._from_json:
                raise InvalidEventError("type", f"{json.dumps(kind)} is not a record type")
            return Event(kind, self._from_json[kind](obj, ""))
        except InvalidEventError as exc:
            exc.line = line
            exc.args = (str(InvalidEventError(exc.field, exc.reason, line=line)),)
            raise

    def from_line(self, text: str, line: int | None = None) -> Event:
        """An event from one JSON line."""
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidEventError(
                "(line)", f"not JSON: {exc.msg} at column {exc.colno}", line=line
            ) from None
        return self.from_obj(obj, line)


def read_jsonl(
    path: str | Path, fmt: JsonlFormat | None = None, *, min_ts_ms: int | None = None
) -> list[Event]:
    """Every event of a JSONL file, or `EventFileError` listing every invalid line.

    With `min_ts_ms`, an event stamped earlier is invalid: a `ts` of 1.7e9 is seconds, not 1970.
    """
    fmt = fmt or JsonlFormat()
    events: list[Event] = []
    problems: list[InvalidEventError] = []
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                reason = f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"
                problems.append(InvalidEventError("(line)", reason, line=number))
                continue
            if not text.strip():
                continue
            try:
                event = fmt.from_line(text, number)
            except InvalidEventError as exc:
                problems.append(exc)
                continue
            if min_ts_ms is not None and event.record["ts"] < min_ts_ms:
                problems.append(_too_old(event.record["ts"], min_ts_ms, number))
                continue
            events.append(event)
    if problems:
        raise EventFileError(str(path), problems)
    return events


def _too_old(ts: int, min_ts_ms: int, line: int) -> InvalidEventError:
    hint = "looks like seconds: ts is UTC milliseconds" if ts * 1000 >= min_ts_ms else "too old"
    return InvalidEventError(
        "ts", f"{ts} is {format_ts(ts)}, before {format_ts(min_ts_ms)} ({hint})", line=line
    )


def write_container(
    path: str | Path, events: Iterable[Event], schemas: SchemaSet | None = None, *, codec: str = "deflate"
) -> int:
    """Write events to an Avro Object Container File atomically; returns how many were written."""
    schemas = schemas or default_schemas()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    count = 0

    def rows() -> Iterator[dict[str, Any]]:
        nonlocal count
        for event in events:
            count += 1
            yield {"event": (f"{NAMESPACE}.{event.type}", event.record)}

    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fastavro.writer(fh, schemas.event_parsed_logical, rows(), codec=codec)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return count


def iter_container(source: str | Path | IO[bytes], schemas: SchemaSet | None = None) -> Iterator[Event]:
    """Events of an Avro container file of `Event`s, timestamps as UTC milliseconds.

    Blocks are decoded with the file's schema minus its logical types (same binary encoding), so
    no datetime is built per timestamp; a file written by another version of `Event` is resolved
    into the current one.
    """
    schemas = schemas or default_schemas()
    fh = open(source, "rb") if isinstance(source, str | Path) else source  # noqa: SIM115
    try:
        blocks = fastavro.block_reader(fh)
        writer_json = strip_logical_types(json.loads(blocks.metadata["avro.schema"]))
        name = writer_json.get("name") if isinstance(writer_json, dict) else None
        if isinstance(name, str) and "." not in name and isinstance(writer_json, dict):
            name = f"{writer_json.get('namespace', '')}.{name}".lstrip(".")
        if name != _EVENT_NAME:
            raise RanksightError(
                f"{source}: not a file of ranksight events (its Avro schema is {name or 'unnamed'!s}, "
                f"not {_EVENT_NAME}); write one with `ranksight simulate --out` or `ranksight events load`"
            )
        writer = fastavro.parse_schema(writer_json)
        current = to_parsing_canonical_form(schemas.event_parsed) == to_parsing_canonical_form(writer)
        reader = None if current else schemas.event_parsed
        for block in blocks:
            data = cast(Any, block).bytes_  # the decompressed block; not in fastavro's type stubs
            for _ in range(block.num_records):
                row = schemaless_reader(data, writer, reader, return_record_name=True)
                name, record = cast(dict[str, Any], row)["event"]
                yield Event(name.rsplit(".", 1)[-1], record)
    except SchemaResolutionError as exc:
        # Its message dumps both schemas (tens of kB): the user needs the sentence, not the dump.
        raise RanksightError(
            f"{source}: its events were written with a {_EVENT_NAME} schema this version cannot read"
        ) from exc
    except (ValueError, EOFError, StopIteration, KeyError, TypeError) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise RanksightError(f"{source}: not a readable Avro container file of events ({reason})") from exc
    finally:
        if fh is not source:
            fh.close()


def load_jsonl(src: str | Path, dst: str | Path, *, min_ts_ms: int | None = MIN_TS_MS) -> int:
    """`ranksight events load`: validate every line of `src`, then write `dst` atomically.

    Events before `min_ts_ms` (default 2000-01-01) are rejected: almost always seconds for milliseconds.
    """
    events = read_jsonl(src, min_ts_ms=min_ts_ms)
    return write_container(dst, events)
