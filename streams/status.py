"""The pipeline's health at a glance (`ranksight status`): pure folding of what Kafka reports.

No Kafka here: the command reads offsets, committed offsets and the alert topic, and these
functions turn them into lag per group and topic, rates, and the alerts firing now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["firing_alerts", "lag_by_topic", "rates_by_topic"]

TopicPartition = tuple[str, int]


def firing_alerts(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The alerts whose last record (in topic order) is `firing`, oldest first.

    Alerts are keyed by team, so every state of one alert is on one partition, in order."""
    last: dict[str, Mapping[str, Any]] = {}
    for r in records:
        last[str(r.get("alert_id") or r.get("fingerprint"))] = r
    firing = [r for r in last.values() if r.get("status") == "firing"]
    return sorted(firing, key=lambda r: (int(r.get("ts") or 0), str(r.get("rule"))))


def lag_by_topic(
    committed: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int]
) -> dict[str, int]:
    """Records not yet committed by a group, per topic (only partitions it has committed on)."""
    out: dict[str, int] = {}
    for (topic, partition), offset in committed.items():
        end = ends.get((topic, partition))
        if end is None or offset < 0:
            continue
        out[topic] = out.get(topic, 0) + max(0, end - offset)
    return out


def rates_by_topic(
    before: Mapping[TopicPartition, int], after: Mapping[TopicPartition, int], seconds: float
) -> dict[str, float]:
    """Records per second appended to each topic between two readings of its end offsets."""
    out: dict[str, float] = {}
    for (topic, partition), end in after.items():
        start = before.get((topic, partition), end)
        out[topic] = out.get(topic, 0.0) + max(0, end - start) / max(seconds, 1e-9)
    return out
