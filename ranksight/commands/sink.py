"""`ranksight sink`: store every ranksight topic in ClickHouse until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ranksight.console import console, err_console, fail, say_store, user_errors
from ranksight.signals import stop_signals

if TYPE_CHECKING:
    from schemas.eventtime import TimeBound
    from sinks.consumer import SinkConsumer

__all__ = ["register", "sink_time_bound"]


def sink_time_bound(config: Path | None = None) -> TimeBound:
    """The worker's bound on event times (`engine.max_clock_skew_s`, `max_record_age_s`) from its config file."""
    from schemas.eventtime import TimeBound
    from streams.config import load_config

    engine = load_config(config)
    return TimeBound(engine.max_clock_skew_ms, engine.max_record_age_ms)


def _prefixed(topic: str, prefix: str) -> str:
    return topic if not prefix or topic.startswith(prefix) else prefix + topic


def _topic_list(values: list[str] | None) -> list[str]:
    from sinks.consumer import SINK_TOPICS

    names = [name.strip() for value in values or [] for name in value.split(",") if name.strip()]
    return names or list(SINK_TOPICS)


def _expired_text(expired: int) -> str:
    return f", {expired:,} dropped by the TTL (older than the retention)" if expired else ""


def _print_progress(stats: dict[str, Any], expired: int = 0) -> None:
    elapsed = max(stats["elapsed_s"], 1e-9)
    console.print(
        f"sink: consumed {stats['consumed']:,}, inserted {stats['inserted_rows']:,} rows "
        f"({stats['inserted_rows'] / elapsed:,.0f}/s) in {stats['batches']:,} batches"
        f"{_expired_text(expired)}, dead-lettered {stats['deadlettered']:,}, retries {stats['retries']:,}",
        highlight=False,
        soft_wrap=True,
    )


def _expired(consumer: SinkConsumer) -> int:
    return sum(consumer.sink.stats.expired_by_table.values())


def sink(
    topics: list[str] | None = typer.Option(
        None,
        "--topics",
        help="Topics to store (repeat or comma-separate); default: every topic with a table.",
    ),
    group: str = typer.Option("ranksight-sink", "--group", help="Consumer group (prefixed like the topics)."),
    batch_size: int = typer.Option(
        5000, "--batch-size", min=1, help="Flush a partition's batch at this many messages."
    ),
    batch_interval: float = typer.Option(
        1.0, "--batch-interval", min=0.0, help="...or when it is this many seconds old."
    ),
    idle_exit: float | None = typer.Option(
        None, "--idle-exit", help="Exit after this many seconds without messages (backfills, tests)."
    ),
    metrics_port: int = typer.Option(
        0,
        "--metrics-port",
        min=0,
        max=65535,
        envvar="RANKSIGHT_SINK_METRICS_PORT",
        help="Serve Prometheus /metrics on this port (0: off).",
    ),
    progress_interval: float = typer.Option(
        10.0, "--progress-interval", help="Seconds between progress lines."
    ),
    session_timeout: float = typer.Option(
        45.0,
        "--session-timeout",
        min=6.0,
        help="Seconds before a crashed sink's partitions move to another member.",
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="The worker's detector config YAML (default: shipped): its engine.max_clock_skew_s and "
        "engine.max_record_age_s bound the event times the sink stores.",
    ),
) -> None:
    """Consume ranksight topics and write every record to its ClickHouse table; commit offsets after the insert."""
    from infra.kafka.quiet import quiet_logger
    from ranksight.broker import check_broker, kafka_settings
    from schemas.codec import codec_from_settings
    from schemas.topics import DEADLETTER
    from sinks.clickhouse import connect, describe_dsn
    from sinks.consumer import SinkConsumer
    from sinks.ddl import migrate
    from sinks.errors import ClickHouseLockedError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # The consumer logs librdkafka through this logger: with Kafka away, one line per state change.
    quiet_logger("sinks.kafka")
    with user_errors():
        settings = kafka_settings()
        check_broker(settings)  # wrong credentials or an untrusted certificate: one sentence, now
        prefix = settings.topic_prefix
        kafka_conf = settings.kafka_config()
        kafka_conf["session.timeout.ms"] = int(session_timeout * 1000)
        dsn = settings.clickhouse_dsn()
        try:
            client = connect(dsn)
        except ClickHouseLockedError as exc:
            fail(str(exc), code=2)
        say_store(dsn)
        migrate(client, settings.ttl_days)
        bound = sink_time_bound(config)
        names = [_prefixed(t, prefix) for t in _topic_list(topics)]
        consumer = SinkConsumer(
            kafka_conf,
            client,
            names,
            _prefixed(group, prefix),
            codec=codec_from_settings(settings.schema_registry_url),
            deadletter_topic=prefix + DEADLETTER,
            batch_size=batch_size,
            batch_interval_s=batch_interval,
            progress_interval_s=progress_interval,
            progress=lambda stats: _print_progress(stats, _expired(consumer)),
            on_health=_metrics_publisher(metrics_port, prefix),
            time_bound=bound,
        )
        stop = threading.Event()
        # Ctrl-C and SIGTERM (also when started with SIGINT ignored) end the loop; run() then
        # flushes, commits and leaves the group.
        with stop_signals(on_stop=stop.set, name="sink"):
            err_console.print(
                f"sink: {len(names)} topics from {settings.kafka_bootstrap} -> {describe_dsn(dsn)} "
                f"(group {_prefixed(group, prefix)}, batch {batch_size} / {batch_interval} s); Ctrl-C to stop",
                highlight=False,
                soft_wrap=True,
            )
            stats = consumer.run(stop=stop, idle_exit_s=idle_exit)
    console.print(
        f"sink stopped: inserted {stats['inserted_rows']:,} rows{_expired_text(_expired(consumer))}, "
        f"skipped {stats['skipped_stored']:,} already stored, dead-lettered {stats['deadlettered']:,}",
        highlight=False,
        soft_wrap=True,
    )


def _metrics_publisher(port: int, prefix: str) -> Any:
    """`on_health` for the sink: serve its health on /metrics (None when `port` is 0)."""
    if not port:
        return None
    from infra.metrics import MetricsServer
    from sinks.metrics import sink_metrics

    server = MetricsServer(port)
    return lambda health: server.publish(sink_metrics(health, prefix))


def register(app: typer.Typer) -> None:
    """Add the `sink` command."""
    app.command("sink")(sink)
