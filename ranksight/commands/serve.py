"""`ranksight serve`: the sink and the UI in one process (chDB allows one process per store)."""

from __future__ import annotations

import logging
import threading

import typer

from ranksight.commands.ui import ALLOWED_HOST_HELP, AUTH_HEADER_HELP, AUTH_TOKEN_HELP, HOST_HELP
from ranksight.console import console, err_console, user_errors
from ranksight.signals import stop_signals

__all__ = ["register"]


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help=HOST_HELP),
    port: int = typer.Option(8088, "--port", min=0, max=65535, help="UI port (0: any free port)."),
    allowed_host: list[str] = typer.Option([], "--allowed-host", help=ALLOWED_HOST_HELP),
    auth_token: str | None = typer.Option(
        None, "--auth-token", envvar="RANKSIGHT_UI_TOKEN", help=AUTH_TOKEN_HELP
    ),
    auth_header: str | None = typer.Option(None, "--auth-header", help=AUTH_HEADER_HELP),
    group: str = typer.Option(
        "ranksight-sink", "--group", help="Sink consumer group (prefixed like the topics)."
    ),
    batch_size: int = typer.Option(
        5000, "--batch-size", min=1, help="Flush a partition's batch at this many messages."
    ),
    batch_interval: float = typer.Option(
        1.0, "--batch-interval", min=0.0, help="...or when it is this many seconds old."
    ),
) -> None:
    """Store every ranksight topic in ClickHouse and serve the UI on it, until Ctrl-C or SIGTERM."""
    from ranksight.commands.sink import sink_time_bound
    from ranksight.commands.ui import open_store, receiver_kinds, silence_creator, silence_reader
    from schemas.codec import codec_from_settings
    from schemas.topics import DEADLETTER
    from sinks.clickhouse import describe_dsn
    from sinks.consumer import SINK_TOPICS, SinkConsumer
    from sinks.ddl import migrate
    from ui.server import UiServer

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from ranksight.broker import check_broker, kafka_settings

    with user_errors():
        settings = kafka_settings()  # KAFKA_BOOTSTRAP, else the broker `ranksight kafka up` runs
        check_broker(settings)
        prefix = settings.topic_prefix
        kafka_conf = settings.kafka_config()
        client = open_store(migrate_schema=False)
        migrate(
            client, settings.ttl_days
        )  # the sink owns the schema and its retention, as `ranksight sink` does
        consumer = SinkConsumer(
            kafka_conf,
            client,
            [prefix + t for t in SINK_TOPICS],
            prefix + group,
            codec=codec_from_settings(settings.schema_registry_url),
            deadletter_topic=prefix + DEADLETTER,
            batch_size=batch_size,
            batch_interval_s=batch_interval,
            progress_interval_s=3600,
            time_bound=sink_time_bound(),  # the worker's bound on event times (shipped config)
        )
        server = UiServer(
            client,
            host,
            port,
            receivers=receiver_kinds(),
            silences=silence_reader(settings.alertmanager_url),
            allowed_hosts=allowed_host,
            silence=silence_creator(settings.alertmanager_url),
            auth_token=auth_token,
            auth_header=auth_header,
        )
        url = server.start()
        stop = threading.Event()
        with stop_signals(on_stop=stop.set, name="serve") as signals:
            err_console.print(
                f"serve: sink {settings.kafka_bootstrap} -> {describe_dsn(settings.clickhouse_dsn())}, "
                f"UI on {url}; Ctrl-C to stop",
                highlight=False,
                soft_wrap=True,
            )
            try:
                stats = consumer.run(stop=stop)
            finally:
                # The sink has flushed and committed: the UI gets what is left of the stop budget.
                server.stop(timeout=signals.remaining(floor=1.0))
    console.print(f"serve stopped: inserted {stats['inserted_rows']:,} rows", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the `serve` command."""
    app.command("serve")(serve)
