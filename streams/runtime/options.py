"""What the worker is told (`WorkerOptions`), the topics it reads and writes, and its timing knobs.

One module for every name both runtimes share, so neither imports the other's private constants.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from schemas.topics import (
    SCHEDULER_STATES,
    TELEMETRY_JOB,
    TELEMETRY_UNATTRIBUTED,
    TRAINING_EVENTS,
    TRAINING_STEPS,
    WORKER_SOURCES,
)

__all__ = [
    "ASK_ENDS_S",
    "BAD_LOG_S",
    "BINDINGS",
    "CONTROL",
    "DEFAULT_APP_ID",
    "DEFAULT_RUNTIME",
    "DELIVERY_TIMEOUT_S",
    "FORWARD_BATCH",
    "FORWARD_HOP_S",
    "INPUT_TOPICS",
    "JOB_EVENT_TOPICS",
    "JOB_STATES",
    "JOB_TOPICS",
    "METRICS_S",
    "NODE_TOPICS",
    "RUNTIMES",
    "SIDE_FRONT_S",
    "SOURCE_TOPICS",
    "STAGE_TOPICS",
    "SUMMARIES",
    "TELEMETRY_BY_JOB",
    "JobStates",
    "Runtime",
    "WorkerOptions",
    "env_options",
    "kafka_config",
]

DEFAULT_APP_ID = "ranksight-detect"
# Internal topics: bindings re-keyed by node for the side path, and unattributed telemetry it
# re-keyed by job for the partition tasks. Both have the source topics' partition count.
BINDINGS = "rs.internal.bindings"
TELEMETRY_BY_JOB = "rs.internal.telemetry-by-job"
# Two stages (issue 19): the rank stage (partition p of the job-keyed topics, a job's records keyed by
# job and node) sends each job's summaries, job-level records and alerts to `SUMMARIES` keyed by job,
# where the job stage of the job's partition reads them; JobStarted / JobStateChanged reach every
# rank-stage task through `CONTROL` (a copy per partition).
CONTROL = "rs.internal.jobs"
SUMMARIES = "rs.internal.summaries"
SOURCE_TOPICS: tuple[str, ...] = WORKER_SOURCES  # what producers write that the worker reads
# The side path (unattributed telemetry, bindings) reads these, keyed by node ...
NODE_TOPICS: tuple[str, ...] = (TELEMETRY_UNATTRIBUTED, BINDINGS)
# ... the rank-stage tasks these, keyed by job (and node): partition p of each meets in task p ...
JOB_TOPICS: tuple[str, ...] = (
    TRAINING_STEPS,
    TRAINING_EVENTS,
    SCHEDULER_STATES,
    TELEMETRY_JOB,
    TELEMETRY_BY_JOB,
    CONTROL,
)
# Job-keyed topics whose job-level records (JobStarted, JobStateChanged) every rank-stage task gets a
# copy of through CONTROL.
JOB_EVENT_TOPICS: tuple[str, ...] = (TRAINING_EVENTS, SCHEDULER_STATES)
# ... and the job-stage tasks this one.
STAGE_TOPICS: tuple[str, ...] = (SUMMARIES,)
# Everything a worker reads.
INPUT_TOPICS: tuple[str, ...] = (*NODE_TOPICS, *JOB_TOPICS, *STAGE_TOPICS)

Runtime = Literal["direct", "faust"]
# Whose job states the engines believe (issue 32.2): "any" takes JobStateChanged from the training
# events the SDK writes as well as from the scheduler topic; "scheduler" only from rs.scheduler.states,
# which only the scheduler watcher may write (a forged "completed" from a training job ends nothing).
JobStates = Literal["any", "scheduler"]
JOB_STATES: tuple[JobStates, ...] = ("any", "scheduler")
RUNTIMES: tuple[Runtime, ...] = ("direct", "faust")
# librdkafka batches with explicit commits: 2.2-2.9x the Faust adapter's events/s (docs/worker.md).
DEFAULT_RUNTIME: Runtime = "direct"

ASK_ENDS_S = 0.5  # how often the end offsets of partitions without a fetch answer are asked for
BAD_LOG_S = 10.0  # bad input: one warning per this many seconds, with a count
METRICS_S = 2.0  # how often the /metrics snapshot is refreshed
SIDE_FRONT_S = 0.05  # how often the side path's front is recomputed (it looks at every partition)
FORWARD_HOP_S = 0.5  # a send to a partition another worker reads counts as pending this long
FORWARD_BATCH = 500  # side-path records committed together once their forwards are delivered
# Sends Kafka has not acknowledged after this long mean a stuck producer (its own requests time
# out after 40 s and are retried): the worker stops, loudly, instead of holding everything silently.
DELIVERY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class WorkerOptions:
    """Everything the worker needs; the CLI fills it from settings and flags."""

    bootstrap: str
    workdir: Path
    app_id: str = DEFAULT_APP_ID
    topic_prefix: str = ""
    runtime: Runtime = DEFAULT_RUNTIME
    partitions: int = 6
    replication_factor: int = -1  # of the topics the worker creates; -1: the broker's default
    config_path: Path | None = None
    routing_path: Path | None = None
    checkpoint_interval_ms: int = 10_000
    # A checkpoint also after this many records of one partition: a bound for a partition read
    # faster than 5,000 records/s, where the interval alone would let a restart repeat more. A
    # snapshot of a 4,096-rank job's partition takes ~0.15 s to encode, so at 5,000 the rank stage
    # spent about a third of its time on snapshots (`bench_worker.py --giant 4096:20`, issue 37.2).
    checkpoint_events: int = 50_000
    log_level: str = "warning"
    align_idle_s: float = 2.0
    job_states: JobStates = "any"
    # The end of a finite input: every input partition read to its end and no record for this long
    # (wall time) -> the engines move to the newest event time read and release everything they
    # hold, as an offline replay's end does (`WorkerCore.finish`). 0: never. Longer than the consumer
    # group's session timeout (10 s): a worker that dies mid-backlog is noticed and its partitions
    # reassigned before the survivors take their own quiet input for the end of the stream.
    finish_idle_s: float = 20.0
    # A partition at its end still holds the others this long after its last record (the next
    # records of a backlog being published may be in flight): bounds out-of-order release.
    align_end_grace_s: float = 0.5
    # Records held for event-time alignment per task; past it the oldest leave (possibly late).
    # Reading never stops for it (a cap that paused fetching while the frontier waited on an
    # unfetched partition deadlocked the worker).
    align_max_buffer: int = 200_000
    # Backpressure: an input partition with this many records held (ahead of a slower one) is not
    # fetched until half of them left. The partition every other waits for holds none, so it is
    # never paused: reading what releases the held records never stops.
    align_pause_at: int = 20_000
    # Records one task feeds its engine per call before the loop sends what they produced and reads
    # again: a worker that fed a whole released backlog in one go (seconds) kept its summaries,
    # markers and routed telemetry from the other workers that wait on them (stop-and-go).
    release_batch: int = 2_000
    stats_interval_s: float = 30.0
    schema_registry_url: str | None = None
    guard_s: float = 120.0
    guard_live_ms: int = 600_000
    unbound_interval_ms: int = 10_000
    stuck_log_s: float = 30.0  # events held this long without any leaving: log which input holds them
    metrics_port: int = 0  # Prometheus /metrics on this port (0: off)
    # The same Kafka security settings as every other command (`ranksight.settings`).
    security_protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism: str | None = None  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_ca_location: str | None = None  # CA bundle that signed the brokers' certificates
    extra: dict[str, Any] = field(default_factory=dict)


def kafka_config(options: WorkerOptions) -> dict[str, Any]:
    """librdkafka settings for the worker's cluster: bootstrap and the same security settings as every command."""
    conf: dict[str, Any] = {
        "bootstrap.servers": options.bootstrap,
        "security.protocol": options.security_protocol,
    }
    if options.sasl_mechanism:
        conf["sasl.mechanism"] = options.sasl_mechanism
        conf["sasl.username"] = options.sasl_username or ""
        conf["sasl.password"] = options.sasl_password or ""
    if options.ssl_ca_location and options.security_protocol in ("SSL", "SASL_SSL"):
        conf["ssl.ca.location"] = options.ssl_ca_location
    return conf


def env_options(**overrides: Any) -> WorkerOptions:
    """Options from `KAFKA_BOOTSTRAP` / `RANKSIGHT_TOPIC_PREFIX` (for scripts and tests)."""
    base: dict[str, Any] = {
        "bootstrap": os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        "workdir": Path(os.environ.get("RANKSIGHT_HOME", "var")) / "worker",
        "topic_prefix": os.environ.get("RANKSIGHT_TOPIC_PREFIX", ""),
    }
    base.update(overrides)
    return WorkerOptions(**base)
