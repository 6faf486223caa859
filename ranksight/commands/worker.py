"""`ranksight worker`: the stream worker that runs the detectors and publishes alerts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ranksight.console import console, literal, user_errors

__all__ = ["register"]


_Workdir = Annotated[
    Path | None, typer.Option("--workdir", help="Local state of the worker (default <home>/worker).")
]
_Group = Annotated[
    str, typer.Option("--group", help="Consumer group; run several workers with the same group to scale out.")
]
_Config = Annotated[
    Path | None, typer.Option("--config", help="Detector thresholds YAML (default: shipped).")
]
_Routing = Annotated[Path | None, typer.Option("--routing", help="Alert routing YAML (default: shipped).")]
_CheckpointIntervalMs = Annotated[
    int,
    typer.Option(
        "--checkpoint-interval-ms",
        min=100,
        help="Snapshot each partition's engine at least every N ms of processing (wall clock).",
    ),
]
_CheckpointEvents = Annotated[int, typer.Option("--checkpoint-events", min=1, help="... and every N events.")]
_Partitions = Annotated[
    int, typer.Option("--partitions", min=1, help="Partitions of the source and internal topics.")
]
_LogLevel = Annotated[str, typer.Option("--log-level", help="Worker log level (info: progress lines).")]
_StatsIntervalS = Annotated[
    float, typer.Option("--stats-interval", min=0.1, help="Progress line every N seconds (info).")
]
_AlignIdleS = Annotated[
    float,
    typer.Option(
        "--align-idle", min=0.1, help="A source partition silent this long stops holding event time back."
    ),
]
_FinishIdleS = Annotated[
    float,
    typer.Option(
        "--finish-idle",
        min=0.0,
        help="Every input read to its end and silent this long (s): the engines move to the newest event "
        "time read and release what they hold, as a replay's end (0: never; keep it above the group's 10 s "
        "session timeout, so a dead peer's partitions are reassigned first).",
    ),
]
_AlignPauseAt = Annotated[
    int,
    typer.Option(
        "--align-pause-at",
        min=100,
        help="Records held of one input partition (ahead of a slower one) before it is paused (backpressure).",
    ),
]
_ReleaseBatch = Annotated[
    int,
    typer.Option(
        "--release-batch",
        min=1,
        help="Records a rank-stage partition feeds its engine before the worker sends what they produced.",
    ),
]
_GuardS = Annotated[
    float,
    typer.Option(
        "--guard",
        min=0,
        help="All input of a partition silent this many seconds while live: advance event time with the wall clock (0: off).",
    ),
]
_ReplicationFactor = Annotated[
    int,
    typer.Option(
        "--replication-factor",
        min=-1,
        envvar="RANKSIGHT_REPLICATION_FACTOR",
        help="Replication factor of the topics the worker creates (internal, changelogs); -1: the broker's"
        " default.replication.factor (3 on a 3-broker cluster).",
    ),
]
_MaxHeld = Annotated[
    int,
    typer.Option(
        "--max-held",
        min=100,
        help="Records a partition task holds for event-time alignment before the oldest leave (possibly late).",
    ),
]
_MetricsPort = Annotated[
    int,
    typer.Option(
        "--metrics-port",
        min=0,
        max=65535,
        envvar="RANKSIGHT_WORKER_METRICS_PORT",
        help="Serve Prometheus /metrics on this port (0: off; one port per worker process).",
    ),
]
_Runtime = Annotated[
    str,
    typer.Option(
        "--runtime",
        envvar="RANKSIGHT_WORKER_RUNTIME",
        help="direct (the default): librdkafka batches with explicit commits; faust: the same core driven"
        " by a Faust agent, 2.2-2.9x slower (docs/worker.md). Same topics and state: a stopped group can switch.",
    ),
]
_JobStates = Annotated[
    str,
    typer.Option(
        "--job-states",
        envvar="RANKSIGHT_JOB_STATES",
        help="Whose job states end a job: any (the SDK's on rs.training.events and the scheduler's) or"
        " scheduler (only rs.scheduler.states, which only `ranksight scheduler` may write under the Kafka"
        " ACLs; docs/security.md). Use scheduler where a scheduler watcher runs.",
    ),
]
_UnboundIntervalMs = Annotated[
    int,
    typer.Option(
        "--unbound-interval-ms",
        min=0,
        help="Telemetry of GPUs/nodes with no job: forward one sample per GPU/node per N ms (0: all).",
    ),
]


def worker(
    workdir: _Workdir = None,
    group: _Group = "ranksight-detect",
    config: _Config = None,
    routing: _Routing = None,
    checkpoint_interval_ms: _CheckpointIntervalMs = 10_000,
    checkpoint_events: _CheckpointEvents = 50_000,
    partitions: _Partitions = 6,
    log_level: _LogLevel = "warning",
    stats_interval_s: _StatsIntervalS = 30.0,
    align_idle_s: _AlignIdleS = 2.0,
    finish_idle_s: _FinishIdleS = 20.0,
    align_pause_at: _AlignPauseAt = 20_000,
    release_batch: _ReleaseBatch = 2_000,
    guard_s: _GuardS = 120.0,
    replication_factor: _ReplicationFactor = -1,
    max_held: _MaxHeld = 200_000,
    metrics_port: _MetricsPort = 0,
    runtime: _Runtime = "direct",
    job_states: _JobStates = "any",
    unbound_interval_ms: _UnboundIntervalMs = 10_000,
) -> None:
    """Consume telemetry and training events, detect, publish alerts to rs.alerts and stats to rs.derived.*."""
    from ranksight.broker import check_broker, check_group_runtime, kafka_settings
    from streams.runtime.options import JOB_STATES, RUNTIMES

    if runtime not in RUNTIMES:
        console.print(f"[red]error:[/] unknown --runtime {runtime!r}: use direct or faust")
        raise typer.Exit(2)
    if job_states not in JOB_STATES:
        console.print(f"[red]error:[/] unknown --job-states {literal(job_states)}: use any or scheduler")
        raise typer.Exit(2)
    with user_errors():
        settings = kafka_settings()
        # Before any client starts: a closed port would be a long traceback or a silent wait.
        check_broker(settings)
        from infra.kafka.topics import COPARTITIONED, check_partitions
        from streams.runtime.changelog import ROUTES_TABLE, SNAPSHOT_TABLE, changelog_topic
        from streams.runtime.options import BINDINGS, CONTROL, SUMMARIES, TELEMETRY_BY_JOB

        prefix = settings.topic_prefix
        joined = [prefix + t for t in (*COPARTITIONED, BINDINGS, TELEMETRY_BY_JOB, CONTROL, SUMMARIES)]
        joined += [prefix + changelog_topic(group, table) for table in (SNAPSHOT_TABLE, ROUTES_TABLE)]
        check_partitions(settings.kafka_config(), joined, partitions)
        check_group_runtime(settings.kafka_config(), prefix + group, runtime)
    assert settings.kafka_bootstrap is not None

    from streams.runtime.options import WorkerOptions

    options = WorkerOptions(
        bootstrap=settings.kafka_bootstrap,
        workdir=(workdir or settings.home / "worker").resolve(),
        app_id=group,
        topic_prefix=settings.topic_prefix,
        runtime=runtime,  # checked against RUNTIMES above
        job_states=job_states,  # checked against JOB_STATES above
        partitions=partitions,
        config_path=config,
        routing_path=routing,
        checkpoint_interval_ms=checkpoint_interval_ms,
        checkpoint_events=checkpoint_events,
        log_level=log_level,
        stats_interval_s=stats_interval_s,
        align_idle_s=align_idle_s,
        finish_idle_s=finish_idle_s,
        align_pause_at=align_pause_at,
        release_batch=release_batch,
        align_max_buffer=max_held,
        guard_s=guard_s,
        unbound_interval_ms=unbound_interval_ms,
        schema_registry_url=settings.schema_registry_url,
        replication_factor=replication_factor,
        metrics_port=metrics_port,
        security_protocol=settings.kafka_security_protocol,
        sasl_mechanism=settings.kafka_sasl_mechanism,
        sasl_username=settings.kafka_sasl_username,
        sasl_password=(
            settings.kafka_sasl_password.get_secret_value() if settings.kafka_sasl_password else None
        ),
        ssl_ca_location=str(settings.kafka_ssl_ca_location) if settings.kafka_ssl_ca_location else None,
    )
    console.print(
        f"{runtime} worker [bold]{settings.topic_prefix}{group}[/] on {settings.kafka_bootstrap} "
        f"(prefix {settings.topic_prefix!r}, state in {options.workdir}); Ctrl-C stops it",
        highlight=False,
    )
    with user_errors():
        from streams.runtime.run import run_worker

        run_worker(options)


def register(app: typer.Typer) -> None:
    """Add the `worker` command."""
    app.command("worker")(worker)
