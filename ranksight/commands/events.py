"""`ranksight events load|dump`: JSON Lines <-> Avro container files of events."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from ranksight.console import console, user_errors

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
    from schemas.files import load_jsonl

    with user_errors():
        count = load_jsonl(src, out)
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
