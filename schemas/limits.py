"""Per-record caps applied at decode: what one record can make a reader hold.

Anyone who can publish can put anything in a record under Kafka's message size: a JobStarted with
0.94 MB of labels, a node list of 100k names, a megabyte job id. Every reader of the input topics
(worker, sink, replay, the CLI) decodes through `Codec.decode`, which checks each input record
against these caps; one over them is a `RecordTooLarge` (a `DecodeError`), so it is dead-lettered
once, by its topic's owner, with the reason, and never reaches detector state or a snapshot.

Records ranksight writes itself (alerts, summaries, progress, baselines, actions) are built from
capped input and are not checked: per-rank summaries of a 100k-rank job are legitimately long.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.errors import DecodeError
from schemas.records import RECORD_TYPES

__all__ = ["DEFAULT_LIMITS", "INPUT_TYPES", "RecordLimits", "RecordTooLarge", "check_record"]

# The record types node agents, the SDK, importers and the scheduler watcher publish.
INPUT_TYPES = frozenset(RECORD_TYPES) - {"RankWindowStats", "JobWindowStats", "Alert", "ActionTaken"}


class RecordTooLarge(DecodeError):
    """A record over a per-record cap: dead-lettered with the cap it broke."""


@dataclass(frozen=True)
class RecordLimits:
    """Caps on one input record (characters, entries, items)."""

    max_string_chars: int = 16_384  # any string field: ids, names, messages, locations
    max_labels: int = 64  # entries of a labels map
    max_labels_chars: int = 16_384  # names and values of a labels map together
    max_list_items: int = 32_768  # any list: a JobStarted's nodes (a 100k-GPU job has ~12.5k nodes)

    def smallest(self) -> int:
        """Below this many bytes no string, list or labels map can break a cap (only a label count can)."""
        return min(self.max_string_chars, self.max_labels_chars, self.max_list_items)


DEFAULT_LIMITS = RecordLimits()


def check_record(name: str, record: dict[str, Any], size: int, limits: RecordLimits = DEFAULT_LIMITS) -> None:
    """Raise `RecordTooLarge` when an input record of `size` encoded bytes breaks a cap.

    Linear in the record, and nearly free for the usual record: under `limits.smallest()` bytes
    only a labels map's entry count is checked (an entry can be 2 bytes).
    """
    if name not in INPUT_TYPES:
        return
    labels = record.get("labels")
    if isinstance(labels, dict) and len(labels) > limits.max_labels:
        raise RecordTooLarge(f"{name} has {len(labels)} labels, more than the {limits.max_labels} allowed")
    if size < limits.smallest():
        return
    for field, value in record.items():
        _check(name, field, value, limits)


def _check(name: str, field: str, value: Any, limits: RecordLimits) -> None:
    if isinstance(value, str):
        if len(value) > limits.max_string_chars:
            raise RecordTooLarge(
                f"{name} field {field!r} is {len(value):,} characters, more than the {limits.max_string_chars:,} allowed"
            )
    elif isinstance(value, list):
        if len(value) > limits.max_list_items:
            raise RecordTooLarge(
                f"{name} field {field!r} lists {len(value):,} items, more than the {limits.max_list_items:,} allowed"
            )
        for item in value:
            _check(name, field, item, limits)
    elif isinstance(value, dict):
        if field == "labels":
            chars = sum(len(str(k)) + len(str(v)) for k, v in value.items())
            if chars > limits.max_labels_chars:
                raise RecordTooLarge(
                    f"{name} labels hold {chars:,} characters, more than the {limits.max_labels_chars:,} allowed"
                )
        for key, item in value.items():
            _check(name, f"{field}.{key}"[:80], item, limits)
