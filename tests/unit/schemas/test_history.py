"""Records that gained fields still decode what their earlier versions wrote."""

from __future__ import annotations

import io
import json

import pytest
from fastavro import parse_schema, schemaless_writer

from schemas.codec import Codec
from schemas.records import HISTORY_DIR, NAMESPACE, default_schemas, strip_logical_types

_OLD = sorted(HISTORY_DIR.glob(f"{NAMESPACE}.*.avsc"))


@pytest.mark.parametrize("path", _OLD, ids=lambda p: p.name)
def test_an_earlier_version_decodes_into_the_current_record(path) -> None:
    old_json = json.loads(path.read_text())
    name = old_json["name"]
    current = default_schemas().record(name)
    old = default_schemas().by_fingerprint
    old_fp = next(fp for fp, r in old.items() if r.name == name and r.json == old_json)
    assert old_fp != current.fingerprint, "a history entry must differ from the current schema"
    record = _minimal(old_json)
    body = io.BytesIO()
    schemaless_writer(body, parse_schema(strip_logical_types(old_json)), record)
    event = Codec().decode(b"\xc3\x01" + old_fp + body.getvalue())
    assert event.type == name
    added = {f["name"] for f in current.json["fields"]} - {f["name"] for f in old_json["fields"]}
    assert added, "the current schema added fields"
    for field in current.json["fields"]:
        if field["name"] in added:
            assert event.record[field["name"]] == field["default"]
    for key, value in record.items():
        assert event.record[key] == value


def _minimal(schema: dict) -> dict:
    """A valid record of `schema`: defaults where they exist, a plain value of the type otherwise."""
    plain = {"string": "x", "int": 1, "long": 1_700_000_000_000, "double": 1.0, "boolean": True}
    out = {}
    for field in schema["fields"]:
        if "default" in field:
            out[field["name"]] = field["default"]
            continue
        kind = field["type"]
        if isinstance(kind, dict):
            kind = kind["symbols"][0] if kind.get("type") == "enum" else kind["type"]
            out[field["name"]] = plain.get(kind, kind)
        else:
            out[field["name"]] = plain[kind]
    return out
