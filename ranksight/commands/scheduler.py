"""`ranksight scheduler --slurm|--kubernetes`: publish job states from the scheduler as JobStateChanged."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import typer

from ranksight.console import console, err_console, fail, user_errors
from ranksight.signals import StopRequested, stop_signals

__all__ = ["register"]


def scheduler(
    slurm: bool = typer.Option(False, "--slurm", help="Follow Slurm (`squeue --json`; SLURM_CONF as usual)."),
    kubernetes: bool = typer.Option(
        False, "--kubernetes", help="Follow Kubernetes batch/v1 Jobs (needs ranksight[kubernetes])."
    ),
    teams: Path | None = typer.Option(
        None, "--teams", help="YAML: users/accounts (Slurm account or namespace) -> team, and a default."
    ),
    interval: float = typer.Option(10.0, "--interval", min=0.1, help="Seconds between polls."),
    count: int | None = typer.Option(None, "--count", min=1, help="Stop after this many polls."),
    to: str = typer.Option("kafka", "--to", help="'kafka' (KAFKA_BOOTSTRAP) or file:///path/events.avro."),
    state_file: Path | None = typer.Option(
        None,
        "--state-file",
        help="Last published state per job, kept across restarts (default: <home>/scheduler/<source>.json).",
    ),
    user: list[str] = typer.Option([], "--user", help="Slurm: only jobs of these users (repeatable)."),
    account: list[str] = typer.Option([], "--account", help="Slurm: only jobs of these accounts."),
    partition: list[str] = typer.Option([], "--partition", help="Slurm: only jobs in these partitions."),
    namespace: str | None = typer.Option(
        None, "--namespace", help="Kubernetes: one namespace (default: all)."
    ),
    selector: str | None = typer.Option(None, "--selector", help="Kubernetes: label selector of the Jobs."),
    cluster: str | None = typer.Option(
        None,
        "--cluster",
        help="Cluster name for jobs the scheduler names none for (Kubernetes, unless the Job has the "
        "ranksight.dev/cluster label; Slurm names its own).",
    ),
) -> None:
    """Poll the scheduler and publish every job state change once (pending, running, preempted, requeued, ended)."""
    from producers.publisher import SCHEDULER_SPOOL_PREFIX, open_publisher
    from producers.scheduler import StateTracker, TeamMap, follow
    from ranksight.producing import finish
    from schemas.topics import SCHEDULER_RECORD_TOPIC

    if slurm == kubernetes:
        fail("choose one source: --slurm or --kubernetes")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ranksight.settings import load_settings

    settings = load_settings()
    source: Any
    with user_errors():
        team_map = TeamMap.load(teams) if teams else TeamMap()
        if slurm:
            from producers.scheduler.slurm import SlurmSource

            source = SlurmSource(users=user, accounts=account, partitions=partition)
        else:
            from producers.scheduler.kubernetes import KubernetesSource

            source = KubernetesSource(namespace=namespace, label_selector=selector)
        kafka_conf: dict[str, Any] | None = None
        spool_dir = None
        if to == "kafka":
            from ranksight.broker import check_broker, kafka_settings
            from ranksight.errors import KafkaNotFoundError

            try:  # KAFKA_BOOTSTRAP, else the broker `ranksight kafka up` runs
                settings = kafka_settings()
            except KafkaNotFoundError as exc:
                fail(f"{exc} (or use --to file:///path.avro)")
            check_broker(settings, allow_unreachable=True)  # an absent broker: spool
            kafka_conf = settings.kafka_config()
            spool_dir = settings.home / "spool" / f"{SCHEDULER_SPOOL_PREFIX}{source.name}"
        # Job states go to rs.scheduler.states, the topic only the watcher's principal may write.
        publisher = open_publisher(
            to,
            kafka_conf=kafka_conf,
            topic_prefix=settings.topic_prefix,
            spool_dir=spool_dir,
            topics=SCHEDULER_RECORD_TOPIC,
        )
    tracker = StateTracker(source.name, team_map.team_for, cluster=cluster)
    state_path = state_file or settings.home / "scheduler" / f"{source.name}.json"
    err_console.print(f"following {source.name} every {interval:g}s -> {to}")

    def _report(stats: Any) -> None:
        if stats.published or stats.polls == 1:
            err_console.print(
                f"poll {stats.polls}: {stats.jobs} jobs listed, {stats.published} state changes published so far"
            )

    last: list[Any] = []

    def _on_poll(stats: Any) -> None:
        last[:] = [stats]
        _report(stats)

    # SIGINT/SIGTERM (also when started with SIGINT ignored) end the wait between polls: a poll
    # under way finishes (its states published and saved), then the publisher flushes and closes.
    with stop_signals(name="scheduler") as stop:
        try:
            with user_errors(), contextlib.suppress(StopRequested):
                follow(
                    source,
                    tracker,
                    publisher,
                    interval_s=interval,
                    count=count,
                    state_file=state_path,
                    sleep=stop.sleep,
                    on_poll=_on_poll,
                )
        finally:
            finish(publisher, 10.0, stop)
    if last:
        console.print(f"{last[0].polls} polls, {last[0].published} state changes published")


def register(app: typer.Typer) -> None:
    """Add the `scheduler` command."""
    app.command("scheduler")(scheduler)
