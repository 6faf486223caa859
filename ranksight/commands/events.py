"""`ranksight events load|dump`: JSON Lines <-> Avro container files of events."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from ranksight.console import console, fail, user_errors

__all__ = ["register"]

events_app = typer.Typer(help="Convert events between JSON Lines (human form) and Avro container files.")


@events_app.command("load")
def load(
    src: Path = typer.Argument(
        ..., help='JSON Lines file, one event per line: {"type": "StepCompleted", ...}.'
    ),
    out: Path = typer.Option(..., "-o", "--out", help="Avro container file to write."),
) -> None:
    """Validate every line and write an Avro container file of events (nothing is written on error)."""
    from schemas.files import MIN_TS_MS, read_jsonl, write_container

    with user_errors():
        events = read_jsonl(src, min_ts_ms=MIN_TS_MS)
        if not events:
            # An empty container would look like a successful load to the next step of a script.
            fail(
                f"{src} holds no events (it is empty or blank): nothing written to {out}; give one JSON "
                'object per line, e.g. {"type": "StepCompleted", "ts": ..., ...}'
            )
        count = write_container(out, events)
    console.print(f"wrote {count} events to {out}")


@events_app.command("dump")
def dump(src: list[Path] = typer.Argument(..., help="Avro container files of events.")) -> None:
    """Print events as JSON Lines."""
    from schemas.files import JsonlFormat, iter_container

    fmt = JsonlFormat()
    write = sys.stdout.write
    with user_errors():
        for path in src:
            for event in iter_container(path):
                write(fmt.to_line(event))
                write("\n")


def register(app: typer.Typer) -> None:
    """Add the `events` group."""
    app.add_typer(events_app, name="events")
