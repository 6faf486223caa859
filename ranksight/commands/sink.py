"""`ranksight sink`: store every ranksight topic in ClickHouse until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import typer

from ranksight.console import console, err_console, fail, user_errors
from ranksight.settings import load_settings
from schemas.codec import codec_from_settings
from schemas.topics import DEADLETTER
from sinks.clickhouse import connect, describe_dsn
from sinks.consumer import SINK_TOPICS, SinkConsumer
from sinks.ddl import migrate
from sinks.errors import ClickHouseLockedError

__all__ = ["register"]


def _prefixed(topic: str, prefix: str) -> str:
    return topic if not prefix or topic.startswith(prefix) else prefix + topic


def _topic_list(values: list[str] | None) -> list[str]:
    names = [name.strip() for value in values or [] for name in value.split(",") if name.strip()]
    return names or list(SINK_TOPICS)


def _print_progress(stats: dict[str, Any]) -> None:
    elapsed = max(stats["elapsed_s"], 1e-9)
    console.print(
        f"sink: consumed {stats['consumed']:,}, inserted {stats['inserted_rows']:,} rows "
        f"({stats['inserted_rows'] / elapsed:,.0f}/s) in {stats['batches']:,} batches, "
        f"dead-lettered {stats['deadlettered']:,}, retries {stats['retries']:,}",
        highlight=False,
        soft_wrap=True,
    )


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
    progress_interval: float = typer.Option(
        10.0, "--progress-interval", help="Seconds between progress lines."
    ),
    session_timeout: float = typer.Option(
        45.0,
        "--session-timeout",
        min=6.0,
        help="Seconds before a crashed sink's partitions move to another member.",
    ),
) -> None:
    """Consume ranksight topics and write every record to its ClickHouse table; commit offsets after the insert."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings = load_settings()
    prefix = settings.topic_prefix
    with user_errors():
        try:
            kafka_conf = settings.kafka_config()
        except ValueError as exc:
            fail(str(exc))
        kafka_conf["session.timeout.ms"] = int(session_timeout * 1000)
        dsn = settings.clickhouse_dsn()
        try:
            client = connect(dsn)
        except ClickHouseLockedError as exc:
            fail(str(exc), code=2)
        migrate(client, settings.ttl_days)
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
            progress=_print_progress,
        )
        stop = threading.Event()
        # Ctrl-C and SIGTERM both end the loop; run() then flushes, commits and leaves the group.
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        err_console.print(
            f"sink: {len(names)} topics from {settings.kafka_bootstrap} -> {describe_dsn(dsn)} "
            f"(group {_prefixed(group, prefix)}, batch {batch_size} / {batch_interval} s); Ctrl-C to stop",
            highlight=False,
            soft_wrap=True,
        )
        stats = consumer.run(stop=stop, idle_exit_s=idle_exit)
    console.print(
        f"sink stopped: inserted {stats['inserted_rows']:,} rows, skipped {stats['skipped_stored']:,} already stored, "
        f"dead-lettered {stats['deadlettered']:,}",
        highlight=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add the `sink` command."""
    app.command("sink")(sink)
