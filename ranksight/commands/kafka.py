"""`ranksight kafka fetch|up|down|status|topics|acls`: a local KRaft broker, or a cluster of several; topics and ACLs."""

from __future__ import annotations

import typer

from ranksight.console import console, err_console, fail, user_errors

__all__ = ["register"]

kafka_app = typer.Typer(
    help="Run a local Apache Kafka (KRaft, jars from Maven Central) for development and demos."
)


def _progress(message: str) -> None:
    err_console.print(f"[dim]{message}[/]", highlight=False)


@kafka_app.command("fetch")
def fetch() -> None:
    """Download the Kafka jars once (Maven Central) into the cache."""
    from infra.kafka import local

    with user_errors():
        libs = local.ensure_jars(progress=_progress)
    console.print(f"Kafka jars ready in {libs}")


@kafka_app.command("up")
def up(
    create: bool = typer.Option(True, help="Also create the rs.* topics."),
    brokers: int = typer.Option(
        1,
        "--brokers",
        min=1,
        max=9,
        help="Nodes on 127.0.0.1, each a broker+controller JVM; 3 gives topics replication factor 3 and "
        "min.insync.replicas 2, so one node may fail.",
    ),
) -> None:
    """Start the local broker (or a cluster of --brokers nodes) in the background (idempotent); print its bootstrap."""
    from infra.kafka import local
    from infra.kafka.topics import create_topics
    from ranksight.settings import load_settings

    settings = load_settings()
    with user_errors():
        bootstrap = local.up(settings.kafka_state_dir, progress=_progress, brokers=brokers)
        if create:
            create_topics(bootstrap, prefix=settings.topic_prefix)
    if brokers > 1:
        console.print(
            f"Kafka cluster of {brokers} nodes is up (replication factor {min(brokers, 3)}, "
            f"min.insync.replicas {2 if brokers >= 3 else 1}): [bold]{bootstrap}[/]",
            highlight=False,
        )
        console.print(
            "  workers create their own topics: start them with --replication-factor "
            f"{min(brokers, 3)} (or RANKSIGHT_REPLICATION_FACTOR={min(brokers, 3)})",
            highlight=False,
        )
    else:
        console.print(f"Kafka is up: [bold]{bootstrap}[/]")
    console.print("  every ranksight command finds it; for other tools:", highlight=False)
    console.print(f"  export KAFKA_BOOTSTRAP={bootstrap}", highlight=False)


@kafka_app.command("down")
def down() -> None:
    """Stop the local broker (or cluster) started by `up`."""
    from infra.kafka import local
    from ranksight.settings import load_settings

    settings = load_settings()
    with user_errors():
        stopped = local.down(settings.kafka_state_dir)
    console.print("Kafka stopped" if stopped else "no local Kafka was running")


@kafka_app.command("status")
def status() -> None:
    """Say whether the local broker (each node of a cluster) runs and answers."""
    from infra.kafka import local
    from ranksight.settings import load_settings

    settings = load_settings()
    with user_errors():
        info = local.status(settings.kafka_state_dir)
    if info is None:
        fail("no local Kafka is running (start one with `ranksight kafka up`)", code=3)
    console.print_json(data=info)


@kafka_app.command("topics")
def topics() -> None:
    """Create the rs.* topics on KAFKA_BOOTSTRAP (or the local broker) with their partitions and retention."""
    from infra.kafka.topics import create_topics
    from ranksight.broker import check_broker, kafka_settings

    with user_errors():
        settings = kafka_settings()
        assert settings.kafka_bootstrap is not None
        check_broker(settings)
        bootstrap = settings.kafka_bootstrap
        created = create_topics(bootstrap, prefix=settings.topic_prefix, conf=settings.kafka_config())
    console.print(f"topics ready: {', '.join(created)}")


@kafka_app.command("acls")
def acls(
    apply: bool = typer.Option(
        False,
        "--apply",
        help="Create the ACLs on KAFKA_BOOTSTRAP (as an admin principal); without it, print them.",
    ),
    principal: list[str] = typer.Option(
        [],
        "--principal",
        help="ROLE=PRINCIPAL, repeatable (roles: agent, sdk, scheduler, worker, remediate, sink, reader; "
        "default User:ranksight-<role>).",
    ),
    app_id: str = typer.Option(
        "ranksight-detect", "--app-id", help="The worker's application id (its group)."
    ),
) -> None:
    """Who may write what (docs/security.md): render the Kafka ACLs of each ranksight principal, or --apply them."""
    from infra.kafka.acls import Principals, grants, render
    from ranksight.settings import load_settings

    settings = load_settings()
    with user_errors():
        model = grants(Principals.parse(principal), prefix=settings.topic_prefix, app_id=app_id)
        if not apply:
            console.print(render(model), highlight=False, markup=False, soft_wrap=True)
            return
        from infra.kafka.acls import apply as create_acls
        from ranksight.broker import check_broker, kafka_settings

        kafka = kafka_settings()
        check_broker(kafka)
        created = create_acls(kafka.kafka_config(), model)
    console.print(
        f"{created} ACL bindings in place on {kafka.kafka_bootstrap}", highlight=False, markup=False
    )


def register(app: typer.Typer) -> None:
    """Add the `kafka` group."""
    app.add_typer(kafka_app, name="kafka")
