"""`ranksight report`: one self-contained HTML file of a job or an alert, for an incident ticket."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ranksight.console import console, fail, user_errors

if TYPE_CHECKING:
    from schemas.records import Event

__all__ = ["detected", "recorded", "register", "replayed"]


def detected(
    events: Iterable[Event], *, config: Path | None = None, routing: Path | None = None
) -> Iterator[Event]:
    """Each event, then what the detectors raise on it (alerts, derived windows); at the end what they raise then.

    The UI and its reports never run the detectors themselves (`ui/` imports no engine): this layer
    replays a recording and hands them the events with their alerts and derived rows, in the order
    an offline replay (`streams.offline.replay`) produces them.
    """
    from streams.alerting.routing import load_router
    from streams.config import load_config
    from streams.offline.detection import DetectionEngine

    engine = DetectionEngine(load_config(config), load_router(routing))
    for event in events:
        yield event
        yield from engine.process(event)
    yield from engine.finish()


def recorded(paths: list[Path]) -> Iterator[Event]:
    """The recordings' events as stored, file after file (no detection, no time order: for aggregation)."""
    from schemas.files import iter_container

    for path in paths:
        yield from iter_container(Path(path))


def replayed(
    paths: list[Path], *, config: Path | None = None, routing: Path | None = None
) -> Iterator[Event]:
    """`detected` over Avro recordings merged in event-time order."""
    from streams.offline.replay import merged_events

    return detected(merged_events(paths), config=config, routing=routing)


def report(
    files: list[Path] | None = typer.Argument(
        None, help="Avro recordings to replay offline (no store needed); none: read the configured store."
    ),
    job: str | None = typer.Option(None, "--job", help="The job to report on."),
    alert: str | None = typer.Option(
        None, "--alert", help="...or the alert (its evidence panels and job alerts)."
    ),
    out: Path = typer.Option(Path("report.html"), "--out", "-o", help="Where to write the HTML file."),
    config: Path | None = typer.Option(
        None, "--config", help="With files: detector config overrides (YAML)."
    ),
    routing: Path | None = typer.Option(None, "--routing", help="With files: routing rules (YAML)."),
    price: list[str] = typer.Option(
        [], "--price", help="GPU-hour price by class for the cost, CLASS=USD (repeatable; default=USD)."
    ),
    prices: Path | None = typer.Option(None, "--prices", help="YAML: GPU class -> price per GPU-hour."),
) -> None:
    """Write one HTML file (charts and data inlined, opens offline) for --job or --alert.

    \b
    ranksight report incident.avro --job J -o report.html   replay a recording through the detectors
    ranksight report --alert ALERT_ID -o report.html        from ClickHouse (CLICKHOUSE_URL or chDB)
    """
    from ranksight.commands.ui import open_store, receiver_kinds
    from sinks.efficiency import PriceList
    from ui.report import report_from_events, write_report

    if (job is None) == (alert is None):
        fail("give one of --job and --alert")
    with user_errors():
        price_list = PriceList.parse(price, PriceList.load(prices) if prices else None)
        if files:
            for path in files:
                if not Path(path).is_file():
                    fail(f"no such recording: {path}")
            result = report_from_events(
                lambda: replayed(files, config=config, routing=routing),
                out,
                job_id=job,
                alert_id=alert,
                prices=price_list,
                sources=lambda: recorded(files),
                receivers=receiver_kinds(routing),
            )
        else:
            result = write_report(
                open_store(),
                out,
                job_id=job,
                alert_id=alert,
                prices=price_list,
                receivers=receiver_kinds(routing),
            )
    console.print(
        f"wrote {out} ({result['bytes'] / 1e6:.1f} MB, {result['alerts']} alerts); it opens without a network",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    """Add the `report` command."""
    app.command("report")(report)
