"""The topic table and prefixing (no broker)."""

from __future__ import annotations

import dataclasses

import pytest

from infra.kafka.topics import DEFAULT_TOPIC_SPECS, TopicSpec, prefixed
from schemas.topics import ALERTS, DEADLETTER, TELEMETRY_GPU, TOPICS, TRAINING_STEPS

_DAY_MS = 86_400_000


def _spec(name: str) -> TopicSpec:
    return next(spec for spec in DEFAULT_TOPIC_SPECS if spec.name == name)


def test_every_topic_has_exactly_one_spec() -> None:
    """Each name in schemas.topics.TOPICS is created, once, and nothing else is."""
    names = [spec.name for spec in DEFAULT_TOPIC_SPECS]
    assert sorted(names) == sorted(TOPICS)
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("name", "partitions", "days"),
    [(TELEMETRY_GPU, 6, 3), (TRAINING_STEPS, 6, 7), (ALERTS, 3, 30), (DEADLETTER, 1, 14)],
)
def test_partitions_and_retention_follow_the_topic_family(name: str, partitions: int, days: int) -> None:
    """Telemetry keeps 3 days, training 7, alerts 30, dead letters 14 on one partition."""
    spec = _spec(name)
    assert (spec.partitions, spec.retention_ms) == (partitions, days * _DAY_MS)


def test_config_carries_retention_cleanup_and_extra_settings() -> None:
    """The broker config has retention.ms, cleanup.policy and the extra entries."""
    spec = TopicSpec("x", 2, 1000, cleanup_policy="compact", extra={"min.compaction.lag.ms": "5"})
    assert spec.config() == {
        "retention.ms": "1000",
        "cleanup.policy": "compact",
        "min.compaction.lag.ms": "5",
    }


def test_prefix_renames_only() -> None:
    """A prefixed spec differs from the original in its name alone."""
    spec = _spec(ALERTS)
    copy = spec.with_prefix("t1234abcd.")
    assert copy.name == "t1234abcd." + ALERTS
    assert dataclasses.replace(copy, name=spec.name) == spec


def test_specs_are_frozen_and_hashable() -> None:
    """Specs are values: immutable and usable in sets."""
    spec = _spec(DEADLETTER)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.partitions = 2  # type: ignore[misc]
    assert len(set(DEFAULT_TOPIC_SPECS)) == len(DEFAULT_TOPIC_SPECS)


def test_prefixed_maps_every_canonical_name() -> None:
    """prefixed() maps each canonical topic to its private copy."""
    names = prefixed("t0.")
    assert set(names) == set(TOPICS)
    assert all(value == "t0." + key for key, value in names.items())
