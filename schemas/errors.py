"""Errors of the contract layer; `RanksightError` is the root of every ranksight error."""

from __future__ import annotations

__all__ = [
    "DecodeError",
    "EncodeError",
    "InvalidEventError",
    "RanksightError",
    "UnknownSchemaError",
]


class RanksightError(Exception):
    """Root of every ranksight error."""


class EncodeError(RanksightError):
    """A record could not be encoded with its schema."""

    def __init__(self, record_type: str, reason: str) -> None:
        super().__init__(f"cannot encode {record_type}: {reason}")
        self.record_type = record_type
        self.reason = reason


class DecodeError(RanksightError):
    """Bytes could not be decoded; keeps the raw bytes and where they came from."""

    def __init__(
        self,
        reason: str,
        data: bytes = b"",
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.data = data
        self.topic = topic
        self.partition = partition
        self.offset = offset
        super().__init__(self._message())

    def _message(self) -> str:
        where = ""
        if self.topic is not None:
            where = f" at {self.topic}[{self.partition}]@{self.offset}"
        return f"cannot decode {len(self.data)} bytes{where}: {self.reason}"

    def located(self, topic: str, partition: int, offset: int) -> DecodeError:
        """The same error, annotated with the Kafka position of the message."""
        self.topic, self.partition, self.offset = topic, partition, offset
        self.args = (self._message(),)
        return self


class UnknownSchemaError(DecodeError):
    """The message names a schema (fingerprint or registry id) this reader does not know."""

    def __init__(
        self, *, fingerprint: str | None = None, schema_id: int | None = None, data: bytes = b""
    ) -> None:
        self.fingerprint = fingerprint
        self.schema_id = schema_id
        what = f"fingerprint {fingerprint}" if fingerprint is not None else f"schema registry id {schema_id}"
        super().__init__(f"unknown schema: {what} (is the reader older than the writer?)", data)


class InvalidEventError(RanksightError):
    """A human-written event (JSON line) does not match its schema."""

    def __init__(self, field: str, reason: str, *, line: int | None = None) -> None:
        self.field = field
        self.reason = reason
        self.line = line
        at = f"line {line}: " if line is not None else ""
        super().__init__(f"{at}field {field!r}: {reason}")
