"""`ranksight spool list|drain`: events that producers kept on disk while Kafka was unreachable."""

from __future__ import annotations

import typer

from ranksight.console import console, fail, user_errors

__all__ = ["register"]

spool_app = typer.Typer(
    help="Events producers spooled to <home>/spool/<producer> while Kafka was unreachable: list or send them."
)


@spool_app.command("list")
def list_() -> None:
    """One line per producer spool: events and bytes waiting, and whether a running producer holds it."""
    from producers.spool import list_spools
    from ranksight.settings import load_settings

    settings = load_settings()
    spools = list_spools(settings.spool_root)
    if not any(s.events for s in spools):
        console.print(f"no spooled events in {settings.spool_root}", highlight=False)
        return
    for info in spools:
        if info.events:
            held = " (held by a running producer)" if info.in_use else ""
            console.print(
                f"{info.name}: {info.events:,} events, {info.size / 1024:,.0f} KiB in {info.directory}{held}",
                highlight=False,
                soft_wrap=True,
            )


@spool_app.command("drain")
def drain(
    producer: list[str] | None = typer.Argument(None, help="Producer spools to drain (default: all)."),
    timeout: float = typer.Option(60.0, "--timeout", min=1.0, help="Seconds to wait for delivery per spool."),
) -> None:
    """Send every spooled event to Kafka (KAFKA_BOOTSTRAP or the local broker), oldest first."""
    from producers.publisher import drain_spools
    from producers.spool import list_spools
    from ranksight.broker import check_broker, kafka_settings
    from schemas.codec import codec_from_settings

    with user_errors():
        settings = kafka_settings()
        names = {s.name for s in list_spools(settings.spool_root) if s.events}
        wanted = set(producer or names)
        if unknown := wanted - names:
            fail(f"no spooled events for {', '.join(sorted(unknown))} in {settings.spool_root}")
        if not wanted:
            console.print(f"no spooled events in {settings.spool_root}", highlight=False)
            return
        check_broker(settings)
        results = drain_spools(
            settings.spool_root,
            settings.kafka_config(),
            codec=codec_from_settings(settings.schema_registry_url),
            topic_prefix=settings.topic_prefix,
            exclude=tuple(names - wanted),
            timeout=timeout,
        )
    left = 0
    for r in results:
        if r.in_use:
            console.print(f"{r.directory.name}: held by a running producer, which drains it itself")
            continue
        left += r.left
        console.print(
            f"{r.directory.name}: sent {r.delivered:,} of {r.waiting:,} events to {settings.kafka_bootstrap}"
            + (f"; {r.left:,} still spooled" if r.left else ""),
            highlight=False,
        )
    if left:
        fail(f"{left:,} events are still spooled; run `ranksight spool drain` again once Kafka answers")


def register(app: typer.Typer) -> None:
    """Add the `spool` group."""
    app.add_typer(spool_app, name="spool")
