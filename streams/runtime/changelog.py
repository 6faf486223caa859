"""The worker's state in Kafka: two compacted changelog topics, their keys, and reading them back.

* `<group>-engine-snapshot-changelog`: key `engine@p` on partition p, the snapshot of rank-stage task
  p's engine, and `jobs@p` that of job-stage task p (`streams.runtime.task` frames them: a header
  naming the offsets it covers, then the engine).
* `<group>-node-routes-changelog`: key = node, on the partition of its bindings, the side path's
  routes of that node (empty value: none).

The names and the key encoding (a JSON string) are the ones the Faust tables of earlier versions
wrote, so a group keeps its state across versions and runtimes. Compaction keeps one value per key;
small segments let it run soon. Restoring reads every key's latest value of the assigned partitions
before the worker processes anything (`restore`); that part talks to Kafka, so `confluent_kafka`
is imported there only.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from infra.kafka.retry import ask_again
from schemas.topics import partition_for
from streams.errors import StreamsError
from streams.runtime.options import INPUT_TOPICS, WorkerOptions

__all__ = [
    "MAX_SNAPSHOT_BYTES",
    "ROUTES_TABLE",
    "SNAPSHOT_TABLE",
    "Restored",
    "changelog_topic",
    "key_name",
    "restore",
    "snapshot_key",
    "state_key",
    "topic_specs",
]

log = logging.getLogger("ranksight.worker")

SNAPSHOT_TABLE = "engine-snapshot"
ROUTES_TABLE = "node-routes"
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # a large job's engine snapshot
# What one snapshot may take: the topic's limit less room for the record's key, headers and batch
# framing. A partition whose state grows past it sheds its least recently heard jobs (`checkpoint`).
MAX_SNAPSHOT_BYTES = _MAX_MESSAGE_BYTES - 64 * 1024
_COMPACTION = {"segment.ms": "600000", "min.cleanable.dirty.ratio": "0.1"}
_DAY_MS = 24 * 60 * 60 * 1000
_RESTORE_TIMEOUT_S = 120.0


def changelog_topic(app_id: str, table: str) -> str:
    """The changelog topic of one of the worker's state tables, without the deployment's prefix."""
    return f"{app_id}-{table}-changelog"


def state_key(name: str) -> bytes:
    """A changelog key as written (a JSON string, as Faust tables wrote str keys)."""
    return json.dumps(name).encode()


def snapshot_key(partition: int) -> bytes:
    """The key of task `partition`'s engine snapshot."""
    return state_key(f"engine@{partition}")


def key_name(key: bytes) -> str:
    """The name a changelog key stands for (JSON string, or raw bytes written by older versions)."""
    try:
        name = json.loads(key)
    except ValueError:
        return key.decode(errors="replace")
    return name if isinstance(name, str) else key.decode(errors="replace")


def topic_specs(options: WorkerOptions) -> list[Any]:
    """Every topic the worker reads or writes besides the outputs: its inputs and internal topics
    with `partitions` (co-partitioned), and its two compacted changelogs."""
    from infra.kafka.topics import DEFAULT_TOPIC_SPECS, TopicSpec

    n = options.partitions
    defaults = {spec.name: spec for spec in DEFAULT_TOPIC_SPECS}
    specs = [defaults.get(t) or TopicSpec(t, n, 7 * _DAY_MS) for t in INPUT_TOPICS]
    specs = [TopicSpec(s.name, n, s.retention_ms, s.cleanup_policy, s.extra) for s in specs]
    specs.append(
        TopicSpec(
            changelog_topic(options.app_id, SNAPSHOT_TABLE),
            n,
            -1,
            "compact",
            {**_COMPACTION, "max.message.bytes": str(_MAX_MESSAGE_BYTES)},
        )
    )
    specs.append(
        TopicSpec(changelog_topic(options.app_id, ROUTES_TABLE), n, -1, "compact", dict(_COMPACTION))
    )
    return specs


@dataclass
class Restored:
    """What the changelogs hold for some partitions: engine snapshots and node routes."""

    snapshots: dict[str, bytes] = field(default_factory=dict)  # "engine@p" / "jobs@p" -> snapshot value
    routes: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> routes state


def restore(conf: dict[str, Any], options: WorkerOptions, parts: set[int]) -> Restored:
    """Read the latest snapshot and routes of partitions `parts` from the changelogs (blocking)."""
    started = time.monotonic()
    out = Restored()
    prefix, n = options.topic_prefix, options.partitions
    snapshots = _latest(conf, options, prefix + changelog_topic(options.app_id, SNAPSHOT_TABLE), parts)
    for key, (p, value) in snapshots.items():
        name = key_name(key)
        if name in (f"engine@{p}", f"jobs@{p}") and value:
            out.snapshots[name] = value
    routes = _latest(conf, options, prefix + changelog_topic(options.app_id, ROUTES_TABLE), parts)
    for key, (_, value) in routes.items():
        node = key_name(key)
        if value and partition_for(node.encode(), n) in parts:
            out.routes[node] = json.loads(value)
    log.info(
        "partitions %s: %d engine snapshots and the routes of %d nodes read in %.2f s",
        sorted(parts),
        len(out.snapshots),
        len(out.routes),
        time.monotonic() - started,
    )
    return out


def _latest(
    conf: dict[str, Any], options: WorkerOptions, topic: str, parts: set[int]
) -> dict[bytes, tuple[int, bytes]]:
    """The latest value of every key on these partitions of a changelog: key -> (partition, value)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    reader = Consumer(
        {
            **conf,
            "group.id": f"{options.topic_prefix}{options.app_id}-restore",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "log_level": 3,
        }
    )
    latest: dict[bytes, tuple[int, bytes]] = {}
    try:
        todo: dict[int, int] = {}  # partition -> end offset
        start: dict[int, int] = {}  # partition -> first offset kept
        for p in sorted(parts):
            low, high = _ends(reader, TopicPartition(topic, p))
            if high > low:
                todo[p], start[p] = high, low
        if not todo:
            return latest
        reader.assign([TopicPartition(topic, p, start[p]) for p in sorted(todo)])
        started = time.monotonic()
        while todo:
            for msg in reader.consume(1_000, 0.1):
                p = msg.partition() or 0
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.pop(p, None)
                    continue
                if msg.key() is not None:
                    latest[msg.key() or b""] = (p, msg.value() or b"")
                if (msg.offset() or 0) + 1 >= todo.get(p, 0):
                    todo.pop(p, None)
            if time.monotonic() - started > _RESTORE_TIMEOUT_S:
                raise StreamsError(
                    f"restoring {topic} partitions {sorted(todo)} took over {_RESTORE_TIMEOUT_S:.0f} s"
                )
    finally:
        reader.close()
    return latest


def _ends(reader: Any, ktp: Any, timeout_s: float = 60.0) -> tuple[int, int]:
    """First and end offset of a partition, asked until its leader answers: a changelog the
    worker has just created may have no leader for a moment (NOT_LEADER_FOR_PARTITION)."""
    low, high = ask_again(
        lambda: reader.get_watermark_offsets(ktp, timeout=10.0),
        f"read the offsets of {ktp.topic}[{ktp.partition}]",
        StreamsError,
        wait_s=timeout_s,
    )
    return int(low), int(high)
