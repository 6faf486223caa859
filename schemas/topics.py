"""Kafka topic names, which record types travel on each (DESIGN.md, "Topics"), and how they are keyed and partitioned."""

from __future__ import annotations

from functools import lru_cache

__all__ = [
    "ACTIONS",
    "ALERTS",
    "ALERTS_REPLAY",
    "DEADLETTER",
    "DERIVED_JOB",
    "DERIVED_RANK",
    "RECORD_TOPIC",
    "SCHEDULER_RECORD_TOPIC",
    "SCHEDULER_STATES",
    "SINK_TOPICS",
    "TELEMETRY_GPU",
    "TELEMETRY_HOST",
    "TELEMETRY_JOB",
    "TELEMETRY_UNATTRIBUTED",
    "TOPICS",
    "TRAINING_EVENTS",
    "TRAINING_STEPS",
    "WORKER_SOURCES",
    "canonical_topic",
    "deadletter_headers",
    "job_keys",
    "key_for",
    "murmur2",
    "off_topic_reason",
    "partition_for",
    "shard_key",
    "telemetry_copies",
    "topic_for",
]

TELEMETRY_GPU = "rs.telemetry.gpu"
TELEMETRY_HOST = "rs.telemetry.host"
# Job-attributed telemetry again, keyed by job: the worker's detect path reads it directly
# (co-partitioned with rs.training.*). The sink stores telemetry once, from the node-keyed topics.
TELEMETRY_JOB = "rs.telemetry.job"
# Telemetry attributed to no job (an idle GPU, an agent that knows no jobs), again, keyed by node:
# the worker's side path for node-level rules reads it, so it never reads the node-keyed topics.
TELEMETRY_UNATTRIBUTED = "rs.telemetry.unattributed"
TRAINING_STEPS = "rs.training.steps"
TRAINING_EVENTS = "rs.training.events"
# Job states as the scheduler itself reports them (`ranksight scheduler`): JobStateChanged records
# only the scheduler watcher's principal may write (the Kafka ACLs), keyed by job like the training
# events, so a job's state meets its records in one partition. The SDK's own states stay on
# rs.training.events; a worker run with `--job-states scheduler` believes only this topic.
SCHEDULER_STATES = "rs.scheduler.states"
ALERTS = "rs.alerts"
ALERTS_REPLAY = "rs.alerts.replay"
DERIVED_RANK = "rs.derived.rank"
DERIVED_JOB = "rs.derived.job"
DEADLETTER = "rs.deadletter"
# Remediation decisions (`ranksight remediate`): one ActionTaken per decision, keyed by job.
ACTIONS = "rs.actions"

TOPICS: tuple[str, ...] = (
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TELEMETRY_JOB,
    TELEMETRY_UNATTRIBUTED,
    TRAINING_STEPS,
    TRAINING_EVENTS,
    SCHEDULER_STATES,
    ALERTS,
    ALERTS_REPLAY,
    DERIVED_RANK,
    DERIVED_JOB,
    DEADLETTER,
    ACTIONS,
)

# What producers write that the stream worker reads (every record once): training records, and the
# worker's copy of each telemetry sample (`telemetry_copies`). It never reads rs.telemetry.gpu/host.
WORKER_SOURCES: tuple[str, ...] = (
    TRAINING_STEPS,
    TRAINING_EVENTS,
    SCHEDULER_STATES,
    TELEMETRY_JOB,
    TELEMETRY_UNATTRIBUTED,
)

# What the ClickHouse sink stores (a table per record type): every canonical topic but the replayed
# alerts and the dead letters, and not rs.telemetry.job/unattributed (the worker's copies of samples
# already on rs.telemetry.gpu/host: each sample is stored once).
SINK_TOPICS: tuple[str, ...] = (
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TRAINING_STEPS,
    TRAINING_EVENTS,
    SCHEDULER_STATES,  # the scheduler's job states (ranksight scheduler): table `job_states` too
    DERIVED_RANK,
    DERIVED_JOB,
    ALERTS,
    ACTIONS,  # remediation decisions (ranksight remediate): table `actions`
)

# Record short name -> topic. Telemetry is keyed by node, training by job, alerts by team.
RECORD_TOPIC: dict[str, str] = {
    "GpuSample": TELEMETRY_GPU,
    "HostSample": TELEMETRY_HOST,
    "StepCompleted": TRAINING_STEPS,
    "JobStarted": TRAINING_EVENTS,
    "RankBound": TRAINING_EVENTS,
    "CheckpointEvent": TRAINING_EVENTS,
    "JobStateChanged": TRAINING_EVENTS,
    "RankFault": TRAINING_EVENTS,
    "DataLoaderSample": TRAINING_EVENTS,
    "CollectiveSample": TRAINING_EVENTS,
    "ValidationResult": TRAINING_EVENTS,
    "EvaluationEvent": TRAINING_EVENTS,
    "RestoreTest": TRAINING_EVENTS,
    "Alert": ALERTS,
    "RankWindowStats": DERIVED_RANK,
    "JobWindowStats": DERIVED_JOB,
    "ActionTaken": ACTIONS,
}

# What the scheduler watcher writes where `RECORD_TOPIC` would send it elsewhere (its producer's
# `topics`, and the drain of a spool it left behind).
SCHEDULER_RECORD_TOPIC: dict[str, str] = {"JobStateChanged": SCHEDULER_STATES}

_KEY_FIELD: dict[str, str] = {
    TELEMETRY_GPU: "node",
    TELEMETRY_HOST: "node",
    TELEMETRY_JOB: "job_id",
    TELEMETRY_UNATTRIBUTED: "node",
    TRAINING_STEPS: "job_id",
    TRAINING_EVENTS: "job_id",
    SCHEDULER_STATES: "job_id",
    ALERTS: "team",
    ALERTS_REPLAY: "team",
    DERIVED_RANK: "job_id",
    DERIVED_JOB: "job_id",
    ACTIONS: "job_id",
}


# Topics whose job-keyed records are keyed by job and node when they name a node (`shard_key`).
_SHARDED = frozenset({TRAINING_STEPS, TRAINING_EVENTS, TELEMETRY_JOB})


def topic_for(record_type: str) -> str:
    """The topic a record of this short type name is published to."""
    try:
        return RECORD_TOPIC[record_type]
    except KeyError:
        raise ValueError(f"no topic for record type {record_type!r}") from None


@lru_cache(maxsize=256)
def canonical_topic(topic: str) -> str | None:
    """The ranksight topic a (possibly prefixed) topic name is, e.g. `t1.rs.telemetry.gpu` -> `rs.telemetry.gpu`."""
    for name in TOPICS:
        if topic == name or topic.endswith("." + name):
            return name
    return None


def off_topic_reason(record_type: str, topic: str) -> str | None:
    """Why a record of this type must not be read from `topic` (None: it belongs there).

    The topic map above is the contract: a record whose type does not belong to its topic (a
    StepCompleted on the GPU topic) is invalid input, dead-lettered by whoever owns the topic,
    never stored or detected on. Topics outside the map accept any type.
    """
    name = canonical_topic(topic)
    if name is None:
        return None
    if name == SCHEDULER_STATES:  # the scheduler's word on a job's state, and nothing else
        return (
            None if record_type == "JobStateChanged" else f"a {record_type} record does not belong on {name}"
        )
    if name in (TELEMETRY_JOB, TELEMETRY_UNATTRIBUTED):
        allowed = TELEMETRY_GPU if record_type == "GpuSample" else TELEMETRY_HOST
    else:
        allowed = ALERTS if name == ALERTS_REPLAY else name
    if RECORD_TOPIC.get(record_type) == allowed:
        return None
    return f"a {record_type} record does not belong on {name}"


def shard_key(job_id: str, node: str | None) -> str:
    """The key of a job's records from one node: job and node, so one job's load spreads over many
    partitions while each rank's records (all from its node) stay in order. Just the job without one."""
    return f"{job_id}/{node}" if node else str(job_id)


def key_for(topic: str, record: dict) -> bytes | None:
    """The partition key of a record on a topic: node for telemetry, job (and node, for a rank's
    records that name it: `shard_key`) for training, team for alerts."""
    field = _KEY_FIELD.get(topic)
    if field is None:
        return None
    value = record.get(field)
    if value is None:
        return None
    if topic in _SHARDED:
        return shard_key(str(value), record.get("node")).encode()
    return str(value).encode()


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of a key (`org.apache.kafka.common.utils.Utils.murmur2`), unsigned 32 bits."""
    length = len(data)
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    h = (seed ^ length) & 0xFFFFFFFF
    whole = length & ~3
    for i in range(0, whole, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    left = length & 3
    if left == 3:
        h ^= data[whole + 2] << 16
    if left >= 2:
        h ^= data[whole + 1] << 8
    if left >= 1:
        h ^= data[whole]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


@lru_cache(maxsize=131_072)
def partition_for(key: bytes, partitions: int) -> int:
    """The partition of `key` as the Java client, librdkafka `murmur2_random` and aiokafka compute it
    (cached: the hash is pure Python, and the keys of a stream repeat)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def job_keys(record_type: str, record: dict) -> list[str]:
    """The job a telemetry record is attributed to, its `rs.telemetry.job` copy (empty: none).

    A GpuSample names the job its GPU runs (`job_id`). A HostSample has none: a node's host signals
    concern every job on it, so it goes by node (`rs.telemetry.unattributed`) and the worker sends
    it to each job there, bound or named by its `job_ids`. So does unattributed telemetry (an idle
    GPU, an agent that knows no jobs); see `telemetry_copies`.
    """
    if record_type == "GpuSample":
        job = record.get("job_id")
        return [str(job)] if job else []
    return []


def telemetry_copies(record_type: str, record: dict) -> list[tuple[str, bytes]]:
    """(topic, key) of the copies the worker reads of a telemetry record, besides its node-keyed original.

    An attributed GpuSample: one on `rs.telemetry.job` keyed by its job and node (`shard_key`);
    a HostSample or an unattributed GpuSample: one on `rs.telemetry.unattributed` keyed by node.
    Training records have none.
    """
    if record_type not in ("GpuSample", "HostSample"):
        return []
    jobs = job_keys(record_type, record)
    if jobs:
        node = record.get("node")
        return [(TELEMETRY_JOB, shard_key(job, node).encode()) for job in jobs]
    return [(TELEMETRY_UNATTRIBUTED, str(record["node"]).encode())]


def deadletter_headers(
    error: BaseException, topic: str, partition: int, offset: int, *, component: str
) -> list[tuple[str, bytes]]:
    """Headers of a record sent to `rs.deadletter`: why it failed, where it came from, who sent it.

    Every component that dead-letters (`sink`, `worker`) uses these, so one consumer of the
    dead-letter topic can read them all. Each input topic has one owner that dead-letters its
    bad records (the sink for the topics it stores, the worker for its internal topics), so a
    bad record is dead-lettered once; `x-component` names that owner.
    """
    return [
        ("x-component", component.encode()),
        ("x-error", str(error).encode()),
        ("x-error-type", type(error).__name__.encode()),
        ("x-source-topic", topic.encode()),
        ("x-source-partition", str(partition).encode()),
        ("x-source-offset", str(offset).encode()),
    ]
