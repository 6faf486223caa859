"""`ranksight events import-pai|import-nanogpt|import-pythia`: real public training data -> Avro events."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ranksight.commands.events import events_app
from ranksight.console import console, fail, user_errors

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from schemas.records import Event

__all__ = ["register"]


def _importers() -> Any:
    import producers.importers

    return producers.importers


def _write(out: Path, convert: Callable[[], Iterable[Event]], what: str) -> None:
    """Convert and write events with a live counter (errors as one line); print what was written."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from schemas.files import format_ts, write_container

    first: list[int] = []
    last: list[int] = []

    def counted(progress: Progress, task: TaskID) -> Iterator[Event]:
        for n, event in enumerate(_spanned(convert(), first, last), 1):
            if n % 5000 == 0:
                progress.update(task, description=f"{what}: {n:,} events")
            yield event

    if not console.is_terminal:
        # A live counter is for a person watching; piped or captured, rich's transient display
        # still ends with a line break, which put a blank line before the result (issue 24.8).
        with user_errors():
            count = write_container(out, _spanned(convert(), first, last))
    else:
        with (
            user_errors(),
            Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress,
        ):
            task = progress.add_task(f"{what}: 0 events", total=None)
            count = write_container(out, counted(progress, task))
    span = f" ({format_ts(first[0])} .. {format_ts(last[0])})" if first else ""
    console.print(f"wrote {count:,} events to {out}{span}", highlight=False, soft_wrap=True)


def _spanned(events: Iterable[Event], first: list[int], last: list[int]) -> Iterator[Event]:
    """The events, noting the first and last event time on the way."""
    for event in events:
        if not first:
            first.append(event.record["ts"])
        last[:] = [event.record["ts"]]
        yield event


def _check_input(src: Path) -> None:
    if not src.is_file():
        fail(f"no such file: {src}")


@events_app.command("import-pai")
def import_pai(
    src: Path = typer.Argument(
        ..., help="Alibaba PAI mini-batch CSV (cluster-trace-gpu-v2020, job_N_norm.csv)."
    ),
    out: Path = typer.Option(..., "-o", "--out", help="Avro container file to write."),
    job_id: str | None = typer.Option(None, "--job-id", help="Job id of the events [default: pai-<file>]."),
    team: str = typer.Option("pai", "--team", help="Team the job belongs to (alert routing)."),
    scale: float = typer.Option(
        2.5, "--scale", min=0.001, help="Seconds of step time per 1000 units of batch_time_norm."
    ),
) -> None:
    """Per-worker mini-batch times -> JobStarted, RankBound, StepCompleted (no telemetry)."""
    _check_input(src)
    _write(
        out,
        lambda: _importers().convert_pai(src, job_id=job_id, team=team, seconds_per_1000=scale),
        f"importing {src.name}",
    )


@events_app.command("import-nanogpt")
def import_nanogpt(
    src: Path = typer.Argument(..., help="modded-nanogpt training log (step:N/T train_loss:... lines)."),
    out: Path = typer.Option(..., "-o", "--out", help="Avro container file to write."),
    job_id: str | None = typer.Option(
        None, "--job-id", help="Job id of the events [default: nanogpt-<file>]."
    ),
    team: str = typer.Option("nanogpt", "--team", help="Team the job belongs to (alert routing)."),
) -> None:
    """Train/val lines of a speedrun log -> StepCompleted (rank 0) and ValidationResult."""
    _check_input(src)
    _write(out, lambda: _importers().convert_nanogpt(src, job_id=job_id, team=team), f"importing {src.name}")


@events_app.command("import-pythia")
def import_pythia(
    src: Path = typer.Argument(..., help="Pythia loss CSV (step,train/lm_loss), e.g. 70m-0.csv."),
    out: Path = typer.Option(..., "-o", "--out", help="Avro container file to write."),
    every: int = typer.Option(1, "--every", min=1, help="Keep every K-th step."),
    step_time: float = typer.Option(0.5, "--step-time", min=0.001, help="Synthetic step time, seconds."),
    job_id: str | None = typer.Option(
        None, "--job-id", help="Job id of the events [default: pythia-<file>]."
    ),
    team: str = typer.Option("pythia", "--team", help="Team the job belongs to (alert routing)."),
) -> None:
    """Per-step loss -> StepCompleted with a synthetic step time (no telemetry, no grad norm)."""
    _check_input(src)
    _write(
        out,
        lambda: _importers().convert_pythia(
            src, every=every, step_time_s=step_time, job_id=job_id, team=team
        ),
        f"importing {src.name}",
    )


def register(app: typer.Typer) -> None:
    """Nothing to add at the top level: the commands above joined the `events` group on import."""
