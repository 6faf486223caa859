"""The record schemas shipped in `schemas/`, parsed once, and the in-memory `Event` form.

In memory an event is `Event(type, record)`: the short record name and a plain dict whose
timestamps are integers (UTC milliseconds). The `.avsc` files keep `timestamp-millis`
logical types for other readers; ranksight decodes with the logical types stripped, which
leaves the binary encoding and the fingerprint (computed over the Parsing Canonical Form,
which has no logical types) unchanged and avoids a datetime per field on the hot path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

__all__ = [
    "EVENT_SCHEMA_NAME",
    "HISTORY_DIR",
    "INTERNAL_RECORD_TYPES",
    "NAMESPACE",
    "RECORD_TYPES",
    "SCHEMA_DIR",
    "Event",
    "RecordSchema",
    "SchemaSet",
    "crc64_avro",
    "default_schemas",
    "strip_logical_types",
]

NAMESPACE = "ranksight.v1"
SCHEMA_DIR = Path(__file__).resolve().parent
# Earlier versions of records that have since gained fields: data they wrote (an agent not yet
# upgraded, an old recording) still decodes into the current schema by Avro schema resolution.
HISTORY_DIR = SCHEMA_DIR / "history"
EVENT_SCHEMA_NAME = f"{NAMESPACE}.Event"

RECORD_TYPES: tuple[str, ...] = (
    "GpuSample",
    "HostSample",
    "StepCompleted",
    "JobStarted",
    "RankBound",
    "CheckpointEvent",
    "JobStateChanged",
    "RankFault",
    "DataLoaderSample",
    "CollectiveSample",
    "ValidationResult",
    "EvaluationEvent",
    "RestoreTest",
    "RankWindowStats",
    "JobWindowStats",
    "Alert",
    "ActionTaken",
)
# Records only the worker's stages exchange (rs.internal.summaries): known to the codec, not part
# of the Event union of container files, and stored by no sink.
INTERNAL_RECORD_TYPES: tuple[str, ...] = ("RankSummary", "StageProgress", "BaselineRun")


class Event(NamedTuple):
    """One ranksight record with its short type name, e.g. `Event("StepCompleted", {...})`."""

    type: str
    record: dict[str, Any]


_EMPTY64 = 0xC15D213AA4D7A795


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY64 & -(fp & 1))
        table.append(fp)
    return table


_CRC64_TABLE = _crc64_table()


def crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO (Rabin) fingerprint of canonical-form bytes, as the Avro specification defines it."""
    fp = _EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ _CRC64_TABLE[(fp ^ byte) & 0xFF]
    return fp


def strip_logical_types(schema: Any) -> Any:
    """A copy of a schema (JSON form) without `logicalType` annotations."""
    if isinstance(schema, dict):
        return {k: strip_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [strip_logical_types(v) for v in schema]
    return schema


@dataclass(frozen=True)
class RecordSchema:
    """One record schema: its JSON, its parsed forms and its 8-byte single-object fingerprint."""

    name: str
    fullname: str
    json: dict[str, Any]
    schema_str: str
    parsed: Any  # logical types stripped: what ranksight encodes and decodes with
    parsed_logical: Any  # as written in the file: for container files other tools read
    fingerprint: bytes  # little-endian CRC-64-AVRO, as in the single-object header

    @property
    def fingerprint_hex(self) -> str:
        """Fingerprint as hex, in header byte order."""
        return self.fingerprint.hex()


def _record_schema(schema_json: dict[str, Any], named: dict[str, Any] | None = None) -> RecordSchema:
    fullname = (
        schema_json["name"]
        if "." in schema_json["name"]
        else f"{schema_json.get('namespace', '')}.{schema_json['name']}"
    )
    parsed_logical = parse_schema(schema_json, named_schemas=dict(named or {}))
    parsed = parse_schema(strip_logical_types(schema_json), named_schemas={})
    canonical = to_parsing_canonical_form(parsed_logical)
    fp = bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
    return RecordSchema(
        name=fullname.rsplit(".", 1)[-1],
        fullname=fullname,
        json=schema_json,
        schema_str=json.dumps(schema_json, separators=(",", ":")),
        parsed=parsed,
        parsed_logical=parsed_logical,
        fingerprint=fp,
    )


@dataclass
class SchemaSet:
    """Every record schema of a folder, parsed once; lookups by name and by fingerprint.

    Older versions of a record can be registered as extra writer schemas
    (`add_writer_version`): data they wrote decodes into the current reader schema.
    """

    directory: Path = SCHEMA_DIR
    records: dict[str, RecordSchema] = field(init=False)
    by_fingerprint: dict[bytes, RecordSchema] = field(init=False)
    event_parsed: Any = field(init=False)
    event_parsed_logical: Any = field(init=False)

    def __post_init__(self) -> None:
        self.records = {}
        for name in (*RECORD_TYPES, *INTERNAL_RECORD_TYPES):
            path = self.directory / f"{NAMESPACE}.{name}.avsc"
            self.records[name] = _record_schema(json.loads(path.read_text()))
        self.by_fingerprint = {r.fingerprint: r for r in self.records.values()}
        history = self.directory / "history"
        for path in sorted(history.glob(f"{NAMESPACE}.*.avsc")) if history.is_dir() else []:
            self.add_writer_version(json.loads(path.read_text()))
        event_json = json.loads((self.directory / f"{EVENT_SCHEMA_NAME}.avsc").read_text())
        event_inlined = dict(event_json)
        event_inlined["fields"] = [
            {**event_json["fields"][0], "type": [self.records[n].json for n in RECORD_TYPES]}
        ]
        self.event_parsed_logical = parse_schema(event_inlined)
        self.event_parsed = parse_schema(strip_logical_types(event_inlined))

    def record(self, name: str) -> RecordSchema:
        """The current schema of a record type, by short name."""
        try:
            return self.records[name]
        except KeyError:
            raise KeyError(f"unknown record type {name!r}; known: {', '.join(RECORD_TYPES)}") from None

    def add_writer_version(self, schema_json: dict[str, Any]) -> RecordSchema:
        """Register an older (or newer) version of a known record as a writer schema."""
        version = _record_schema(schema_json)
        if version.name not in self.records:
            raise KeyError(f"{version.fullname} is not a ranksight record")
        self.by_fingerprint.setdefault(version.fingerprint, version)
        return version


@cache
def default_schemas() -> SchemaSet:
    """The schemas shipped with this package, parsed once per process."""
    return SchemaSet()
