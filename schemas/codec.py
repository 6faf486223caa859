"""Avro codec for Kafka messages: single-object encoding by default, Confluent wire format with a registry.

- Single-object encoding (Avro spec): `C3 01` + 8-byte little-endian CRC-64-AVRO fingerprint + body.
- Confluent wire format: magic `00` + 4-byte big-endian schema id + body, ids from
  `confluent_kafka.schema_registry` (subject = record full name, so one topic may carry many types).

Readers accept both framings whatever they write. Schemas are parsed once; the hot path is a
dict lookup and one fastavro call.
"""

from __future__ import annotations

import io
import json
from typing import Any, Protocol, cast

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from schemas.errors import DecodeError, EncodeError, UnknownSchemaError
from schemas.limits import DEFAULT_LIMITS, RecordLimits, RecordTooLarge, check_record
from schemas.records import Event, RecordSchema, SchemaSet, default_schemas, strip_logical_types

__all__ = [
    "CONFLUENT_MAGIC",
    "SINGLE_OBJECT_MAGIC",
    "AvroDeserializer",
    "AvroSerializer",
    "Codec",
    "RegistryFraming",
    "SerializationContext",
    "codec_from_settings",
]

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = 0


class SerializationContext(Protocol):
    """What confluent-kafka passes to serialisers: topic, field and headers."""

    topic: str


class RegistryFraming:
    """Confluent wire format through a `confluent_kafka.schema_registry.SchemaRegistryClient`."""

    def __init__(self, client: Any, schemas: SchemaSet) -> None:
        self._client = client
        self._schemas = schemas
        self._id_by_name: dict[str, int] = {}
        self._writer_by_id: dict[int, tuple[Any, RecordSchema]] = {}

    @classmethod
    def from_url(cls, url: str, schemas: SchemaSet, **conf: Any) -> RegistryFraming:
        """Connect to a registry (`mock://name` gives confluent-kafka's in-memory registry)."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        return cls(SchemaRegistryClient.new_client({"url": url, **conf}), schemas)

    def schema_id(self, record: RecordSchema) -> int:
        """The registry id of a record's current schema, registered on first use."""
        sid = self._id_by_name.get(record.name)
        if sid is None:
            from confluent_kafka.schema_registry import Schema

            sid = self._client.register_schema(record.fullname, Schema(record.schema_str, "AVRO"))
            self._id_by_name[record.name] = sid
            self._writer_by_id[sid] = (record.parsed, record)
        return sid

    def writer(self, schema_id: int, data: bytes) -> tuple[Any, RecordSchema]:
        """The writer schema of an id, fetched once, and the current reader schema of its record."""
        hit = self._writer_by_id.get(schema_id)
        if hit is not None:
            return hit
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            registered = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if getattr(exc, "http_status_code", None) == 404 or "not found" in str(exc).lower():
                raise UnknownSchemaError(schema_id=schema_id, data=data) from exc
            raise DecodeError(f"schema registry lookup of id {schema_id} failed: {exc}", data) from exc
        writer_json = json.loads(registered.schema_str)
        name = writer_json["name"].rsplit(".", 1)[-1]
        try:
            reader = self._schemas.record(name)
        except KeyError:
            raise UnknownSchemaError(schema_id=schema_id, data=data) from None
        hit = (parse_schema(strip_logical_types(writer_json)), reader)
        self._writer_by_id[schema_id] = hit
        return hit


class Codec:
    """Encodes `Event`s to Kafka message bytes and decodes either framing back.

    Decoded input records are checked against `limits` (`schemas.limits`; None: unchecked).
    """

    def __init__(
        self,
        schemas: SchemaSet | None = None,
        registry: RegistryFraming | None = None,
        limits: RecordLimits | None = DEFAULT_LIMITS,
    ) -> None:
        self.schemas = schemas or default_schemas()
        self.registry = registry
        self.limits = limits

    def encode(self, event: Event) -> bytes:
        """Frame and encode one event (registry framing when a registry is configured)."""
        try:
            record = self.schemas.records[event.type]
        except KeyError:
            raise EncodeError(event.type, "not a ranksight record type") from None
        buf = io.BytesIO()
        if self.registry is not None:
            buf.write(b"\x00" + self.registry.schema_id(record).to_bytes(4, "big"))
        else:
            buf.write(SINGLE_OBJECT_MAGIC + record.fingerprint)
        try:
            schemaless_writer(buf, record.parsed, event.record)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise EncodeError(event.type, str(exc)) from exc
        return buf.getvalue()

    def decode(self, data: bytes | None) -> Event:
        """Decode a message in either framing into the current reader schema of its record.

        Anything but exactly one framed record is a `DecodeError`: no value (a tombstone), an
        empty value, unknown framing, a truncated body and bytes left after the body.
        """
        if data is None:
            raise DecodeError("no value (a tombstone)", b"")
        if not data:
            raise DecodeError("empty value", data)
        if data[:2] == SINGLE_OBJECT_MAGIC and len(data) >= 10:
            fp = data[2:10]
            writer = self.schemas.by_fingerprint.get(fp)
            if writer is None:
                raise UnknownSchemaError(fingerprint=fp.hex(), data=data)
            reader = self.schemas.records[writer.name]
            writer_parsed, body = writer.parsed, 10
        elif data[:1] == b"\x00" and len(data) >= 5:
            if self.registry is None:
                raise DecodeError(
                    "Confluent-framed message but no schema registry configured (set SCHEMA_REGISTRY_URL)",
                    data,
                )
            writer_parsed, reader = self.registry.writer(int.from_bytes(data[1:5], "big"), data)
            body = 5
        else:
            raise DecodeError(f"not an Avro message: starts with {data[:2].hex() or 'nothing'}", data)
        stream = io.BytesIO(data)
        stream.seek(body)
        try:
            record = schemaless_reader(
                stream, writer_parsed, None if writer_parsed is reader.parsed else reader.parsed
            )
        except Exception as exc:  # fastavro raises many types on truncated or garbled bodies
            raise DecodeError(f"{reader.name} body is corrupt: {type(exc).__name__}: {exc}", data) from exc
        left = len(data) - stream.tell()
        if left:
            # A record followed by junk is not that record: the writer sent something else.
            raise DecodeError(f"{reader.name} body is followed by {left} unexpected byte(s)", data)
        decoded = cast(dict[str, Any], record)
        if self.limits is not None:
            try:
                check_record(reader.name, decoded, len(data), self.limits)
            except RecordTooLarge as exc:
                raise RecordTooLarge(exc.reason, data) from None
        return Event(reader.name, decoded)


class AvroSerializer:
    """confluent-kafka style serialiser: `serializer(event, ctx) -> bytes`."""

    def __init__(self, codec: Codec) -> None:
        self._codec = codec

    def __call__(self, event: Event, ctx: SerializationContext | None = None) -> bytes:
        """Encode one event; the context is accepted for interface compatibility."""
        return self._codec.encode(event)


class AvroDeserializer:
    """confluent-kafka style deserialiser: `deserializer(data, ctx) -> Event`."""

    def __init__(self, codec: Codec) -> None:
        self._codec = codec

    def __call__(self, data: bytes, ctx: SerializationContext | None = None) -> Event:
        """Decode one message; a failure carries the topic of the context."""
        try:
            return self._codec.decode(data)
        except DecodeError as exc:
            if ctx is not None and exc.topic is None:
                exc.topic = ctx.topic
            raise


def codec_from_settings(schema_registry_url: str | None, **registry_conf: Any) -> Codec:
    """The codec the settings ask for: registry framing when a URL is set, else single-object."""
    schemas = default_schemas()
    if not schema_registry_url:
        return Codec(schemas)
    return Codec(schemas, RegistryFraming.from_url(schema_registry_url, schemas, **registry_conf))
