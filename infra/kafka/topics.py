"""The ranksight topics with their partitions and retention, and idempotent creation through the admin API."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from infra.errors import KafkaSetupError
from schemas.topics import (
    ACTIONS,
    ALERTS,
    ALERTS_REPLAY,
    DEADLETTER,
    DERIVED_JOB,
    DERIVED_RANK,
    SCHEDULER_STATES,
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TELEMETRY_JOB,
    TELEMETRY_UNATTRIBUTED,
    TOPICS,
    TRAINING_EVENTS,
    TRAINING_STEPS,
)

__all__ = [
    "COPARTITIONED",
    "DEFAULT_TOPIC_SPECS",
    "TopicSpec",
    "check_partitions",
    "create_topics",
    "delete_topics",
    "prefixed",
]

_DAY_MS = 24 * 60 * 60 * 1000


@dataclass(frozen=True)
class TopicSpec:
    """How one topic is created: partitions, retention, cleanup policy and any further topic config."""

    name: str
    partitions: int
    retention_ms: int
    cleanup_policy: str = "delete"
    extra: Mapping[str, str] = field(default_factory=dict, hash=False)

    def config(self) -> dict[str, str]:
        """The topic-level config sent to the broker."""
        return {"retention.ms": str(self.retention_ms), "cleanup.policy": self.cleanup_policy, **self.extra}

    def with_prefix(self, prefix: str) -> TopicSpec:
        """The same spec for the topic named `prefix + name`."""
        return dataclasses.replace(self, name=prefix + self.name)


def _spec(name: str, partitions: int, days: int) -> TopicSpec:
    return TopicSpec(name=name, partitions=partitions, retention_ms=days * _DAY_MS)


# Telemetry is the bulk of the bytes and only matters while an incident is fresh; alerts are kept a
# month for post-mortems; the dead letter topic has one partition so its order reads as a timeline.
DEFAULT_TOPIC_SPECS: tuple[TopicSpec, ...] = (
    _spec(TELEMETRY_GPU, 6, 3),
    _spec(TELEMETRY_HOST, 6, 3),
    _spec(TELEMETRY_JOB, 6, 3),
    _spec(TELEMETRY_UNATTRIBUTED, 6, 3),
    _spec(TRAINING_STEPS, 6, 7),
    _spec(TRAINING_EVENTS, 6, 7),
    _spec(SCHEDULER_STATES, 6, 7),
    _spec(ALERTS, 3, 30),
    _spec(ALERTS_REPLAY, 3, 30),
    _spec(DERIVED_RANK, 6, 7),
    _spec(DERIVED_JOB, 6, 7),
    _spec(DEADLETTER, 1, 14),
    # Remediation decisions are an audit trail: kept as long as the alerts they answer.
    _spec(ACTIONS, 3, 30),
)


# The worker joins these by key (a job's steps, events and telemetry meet in one engine): they must
# have the same partition count as its internal topics (`--partitions`), whoever created them.
COPARTITIONED: tuple[str, ...] = (
    TELEMETRY_JOB,
    TELEMETRY_UNATTRIBUTED,
    TRAINING_STEPS,
    TRAINING_EVENTS,
    SCHEDULER_STATES,
)


def check_partitions(
    conf: Mapping[str, Any], names: Iterable[str], partitions: int, *, timeout: float = 10
) -> None:
    """Raise `KafkaSetupError` naming the first existing topic of `names` without `partitions` partitions.

    `conf` is a librdkafka client config (bootstrap and security settings). Topics that do not
    exist yet are skipped: whoever creates them later uses the count given.
    """
    admin = AdminClient({**conf, "log_level": 0})
    names = list(names)
    deadline = time.monotonic() + timeout
    while True:
        try:
            meta = admin.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise KafkaSetupError(
                _explain(str(conf.get("bootstrap.servers")), "cannot read topic metadata", exc.args[0])
            ) from exc
        # A topic created a moment ago may have no leader yet: its metadata carries an error and
        # no reliable partition count. Ask again until it settles (a CI run once read it too early).
        settling = [n for n in names if n in meta.topics and meta.topics[n].error is not None]
        if not settling or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    counts = {name: len(t.partitions) for name, t in meta.topics.items() if t.error is None}
    wrong = [(name, counts[name]) for name in names if name in counts and counts[name] != partitions]
    if wrong:
        name, count = wrong[0]
        others = f" (also {', '.join(f'{n}: {c}' for n, c in wrong[1:])})" if wrong[1:] else ""
        raise KafkaSetupError(
            f"topic {name} has {count} partitions, but the worker joins it by key with topics of"
            f" {partitions}{others}: give every co-partitioned topic {partitions} partitions"
            f" (recreate {name}), or run the worker with --partitions {count} if all topics have {count}"
        )


def prefixed(prefix: str, names: Iterable[str] = TOPICS) -> dict[str, str]:
    """Canonical topic name -> the name carrying `prefix` (a test's private copy of every topic)."""
    return {name: prefix + name for name in names}


def _admin(bootstrap: str) -> AdminClient:
    # Errors come back as exceptions with a sentence; librdkafka's own log lines would only repeat them.
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})


def create_topics(
    bootstrap: str,
    specs: Sequence[TopicSpec] = DEFAULT_TOPIC_SPECS,
    *,
    prefix: str = "",
    timeout: float = 30,
    conf: Mapping[str, Any] | None = None,
    replication_factor: int = -1,
) -> list[str]:
    """Create every topic of `specs` (named `prefix + name`) unless it exists; returns all their names.

    `conf`: a librdkafka client config (security settings) instead of the plain `bootstrap`;
    `replication_factor` -1 is the broker's default."""
    wanted = [spec.with_prefix(prefix) for spec in specs]
    if not wanted:
        return []
    new_topics = [
        NewTopic(
            spec.name,
            num_partitions=spec.partitions,
            replication_factor=replication_factor,
            config=spec.config(),
        )
        for spec in wanted
    ]
    admin = (
        AdminClient({**conf, "log_level": 0}) if conf else _admin(bootstrap)
    )  # kept referenced: a collected client cancels its pending futures
    futures = admin.create_topics(new_topics, operation_timeout=timeout, request_timeout=timeout)
    for name, future in futures.items():
        try:
            future.result(timeout=timeout + 5)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise KafkaSetupError(_explain(bootstrap, f"cannot create topic {name}", error)) from exc
        except TimeoutError as exc:
            raise KafkaSetupError(f"cannot create topic {name}: no answer from Kafka at {bootstrap}") from exc
    # Topics that existed keep their partition count: the co-partitioned ones must agree.
    by_name = {spec.name: spec.partitions for spec in wanted}
    joined = [prefix + name for name in COPARTITIONED if prefix + name in by_name]
    if joined:
        check_partitions(
            conf or {"bootstrap.servers": bootstrap}, joined, by_name[joined[0]], timeout=timeout
        )
    return [spec.name for spec in wanted]


def delete_topics(bootstrap: str, names: Iterable[str], *, timeout: float = 30) -> None:
    """Delete these topics; ones that do not exist are skipped."""
    names = list(names)
    if not names:
        return
    admin = _admin(bootstrap)
    futures = admin.delete_topics(names, operation_timeout=timeout, request_timeout=timeout)
    for name, future in futures.items():
        try:
            future.result(timeout=timeout + 5)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            raise KafkaSetupError(_explain(bootstrap, f"cannot delete topic {name}", error)) from exc


def _explain(bootstrap: str, what: str, error: KafkaError) -> str:
    if error.code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN):
        return (
            f"{what}: Kafka at {bootstrap} does not answer ({error.str()}); "
            "start one with `ranksight kafka up` or set KAFKA_BOOTSTRAP"
        )
    return f"{what}: {error.str()}"
