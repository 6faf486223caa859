"""Codec: both framings round-trip every record; unknown schemas and corrupt bodies fail clearly."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import SINGLE_OBJECT_MAGIC, AvroDeserializer, AvroSerializer, Codec, codec_from_settings
from schemas.errors import DecodeError, EncodeError, UnknownSchemaError
from schemas.files import JsonlFormat
from schemas.records import RECORD_TYPES, Event, SchemaSet, crc64_avro, default_schemas
from tests.unit.schemas.strategies import event_of

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "schemas"
FMT = JsonlFormat()


def same(a: Event, b: Event) -> bool:
    """Equality that treats NaN as equal to NaN (compares the canonical JSON form)."""
    return FMT.to_line(a) == FMT.to_line(b)


@pytest.fixture(scope="module")
def registry_codec() -> Codec:
    return codec_from_settings("mock://codec-tests")


@pytest.mark.parametrize("record_type", RECORD_TYPES)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_record_round_trips_through_single_object_encoding(
    record_type: str, data: st.DataObject
) -> None:
    event = data.draw(event_of(record_type))
    codec = Codec()
    encoded = codec.encode(event)
    assert encoded[:2] == SINGLE_OBJECT_MAGIC
    assert encoded[2:10] == default_schemas().record(record_type).fingerprint
    assert same(codec.decode(encoded), event)


@pytest.mark.parametrize("record_type", RECORD_TYPES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_record_round_trips_through_the_confluent_wire_format(
    record_type: str, data: st.DataObject, registry_codec: Codec
) -> None:
    event = data.draw(event_of(record_type))
    encoded = registry_codec.encode(event)
    assert encoded[0] == 0
    assert same(registry_codec.decode(encoded), event)


def test_a_reader_accepts_both_framings_whatever_it_writes(registry_codec: Codec) -> None:
    event = Event("RankBound", {"ts": 1, "job_id": "j", "rank": 3, "node": "n", "pid": 42})
    plain = Codec()
    assert registry_codec.decode(plain.encode(event)).record["rank"] == 3
    assert registry_codec.decode(registry_codec.encode(event)).record["pid"] == 42


def test_fingerprint_is_the_spec_crc64_avro_in_little_endian() -> None:
    from fastavro.schema import to_parsing_canonical_form

    for record in default_schemas().records.values():
        canonical = to_parsing_canonical_form(record.parsed_logical).encode()
        assert record.fingerprint == crc64_avro(canonical).to_bytes(8, "little")


def test_crc64_avro_matches_the_java_reference_vector() -> None:
    # Avro's share/test/data/schema-tests.txt: the 64-bit Rabin fingerprint of "int"
    assert crc64_avro(b'"int"') == 0x7275D51A3F395C8F == 8247732601305521295


def test_unknown_fingerprint_names_the_fingerprint() -> None:
    data = SINGLE_OBJECT_MAGIC + bytes.fromhex("0102030405060708") + b"\x00"
    with pytest.raises(UnknownSchemaError) as err:
        Codec().decode(data)
    assert err.value.fingerprint == "0102030405060708"
    assert "0102030405060708" in str(err.value)


def test_unknown_registry_id_names_the_id(registry_codec: Codec) -> None:
    with pytest.raises(UnknownSchemaError) as err:
        registry_codec.decode(b"\x00" + (987654).to_bytes(4, "big") + b"\x02")
    assert err.value.schema_id == 987654
    assert "987654" in str(err.value)


def test_confluent_framing_without_a_registry_is_a_clear_error() -> None:
    with pytest.raises(DecodeError, match="SCHEMA_REGISTRY_URL"):
        Codec().decode(b"\x00\x00\x00\x00\x01\x02")


@pytest.mark.parametrize("garbage", [b"", b"x", b"\xc3", b'{"json": true}', b"\xc3\x01\x00"])
def test_garbage_is_a_decode_error_not_a_crash(garbage: bytes) -> None:
    with pytest.raises(DecodeError) as err:
        Codec().decode(garbage)
    assert err.value.data == garbage


def test_a_truncated_body_is_a_decode_error_that_keeps_the_bytes() -> None:
    event = Event("StepCompleted", {"ts": 5, "job_id": "job", "rank": 0, "step": 7, "step_time_s": 1.5})
    data = Codec().encode(event)[:-3]
    with pytest.raises(DecodeError, match="corrupt") as err:
        Codec().decode(data)
    assert err.value.data == data
    located = err.value.located("rs.training.steps", 2, 99)
    assert "rs.training.steps[2]@99" in str(located)


def test_no_value_and_an_empty_value_are_decode_errors() -> None:
    with pytest.raises(DecodeError, match="tombstone"):
        Codec().decode(None)
    with pytest.raises(DecodeError, match="empty value"):
        Codec().decode(b"")


@pytest.mark.parametrize("junk", [b"\x00", b"junk bytes", b"\xff" * 300])
def test_a_valid_body_followed_by_junk_is_a_decode_error_in_both_framings(
    junk: bytes, registry_codec: Codec
) -> None:
    event = Event("StepCompleted", {"ts": 5, "job_id": "job", "rank": 0, "step": 7, "step_time_s": 1.5})
    for codec in (Codec(), registry_codec):
        data = codec.encode(event)
        assert codec.decode(data).record["step"] == 7
        with pytest.raises(DecodeError, match=f"followed by {len(junk)} unexpected byte") as err:
            codec.decode(data + junk)
        assert err.value.data == data + junk


def test_encoding_a_record_that_breaks_its_schema_is_an_encode_error() -> None:
    with pytest.raises(EncodeError, match="StepCompleted"):
        Codec().encode(Event("StepCompleted", {"ts": "yesterday", "job_id": "j", "rank": 0, "step": 1}))
    with pytest.raises(EncodeError, match="not a ranksight record"):
        Codec().encode(Event("Nope", {}))


def test_data_written_with_an_older_schema_reads_with_the_current_one() -> None:
    old_json = json.loads((FIXTURES / "ranksight.v1.StepCompleted.v0.avsc").read_text())
    old_fields = {f["name"] for f in old_json["fields"]}
    assert "skipped" not in old_fields and "run_id" not in old_fields  # a real older version
    schemas = SchemaSet()
    old = schemas.add_writer_version(old_json)
    body = io.BytesIO()
    fastavro.schemaless_writer(
        body,
        old.parsed,
        {"ts": 1_700_000_000_000, "job_id": "j", "rank": 2, "step": 10, "loss": 2.5, "step_time_s": 0.9},
    )
    event = Codec(schemas).decode(SINGLE_OBJECT_MAGIC + old.fingerprint + body.getvalue())
    assert event.type == "StepCompleted"
    assert event.record["loss"] == 2.5 and event.record["step"] == 10
    assert (
        event.record["skipped"] is False and event.record["run_id"] == "" and event.record["tokens"] is None
    )


def test_registry_data_written_with_an_older_schema_reads_with_the_current_one(registry_codec: Codec) -> None:
    from confluent_kafka.schema_registry import Schema

    old_json = json.loads((FIXTURES / "ranksight.v1.StepCompleted.v0.avsc").read_text())
    client = registry_codec.registry._client  # type: ignore[union-attr]
    old_id = client.register_schema("ranksight.v1.StepCompleted-old", Schema(json.dumps(old_json), "AVRO"))
    body = io.BytesIO()
    fastavro.schemaless_writer(
        body,
        fastavro.parse_schema(old_json),
        {"ts": 7, "job_id": "j", "rank": 1, "step": 3, "step_time_s": 2.0},
    )
    event = registry_codec.decode(b"\x00" + old_id.to_bytes(4, "big") + body.getvalue())
    assert event.record["step"] == 3 and event.record["checkpoint_s"] is None


def test_serializer_callables_carry_the_topic_into_errors() -> None:
    class Ctx:
        topic = "rs.telemetry.gpu"

    codec = Codec()
    ser, de = AvroSerializer(codec), AvroDeserializer(codec)
    event = Event("HostSample", {"ts": 1, "cluster": "c", "node": "n"})
    assert de(ser(event, Ctx()), Ctx()).record["node"] == "n"
    with pytest.raises(DecodeError) as err:
        de(b"nope", Ctx())
    assert err.value.topic == "rs.telemetry.gpu"


def test_schemas_are_parsed_once_per_process() -> None:
    assert default_schemas() is default_schemas()
