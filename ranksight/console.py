"""Shared console output for the CLI: one-sentence errors, no tracebacks for foreseeable conditions."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import NoReturn

import typer
from rich.console import Console

from ranksight.signals import StopRequested
from schemas.errors import RanksightError

__all__ = ["console", "err_console", "fail", "say_store", "user_errors"]

# Piped or redirected output has no terminal width: rich would cut tables to 80 columns and wrap
# lines. Without a terminal (and no COLUMNS set) print at natural width instead.
_PIPE_WIDTH = 10_000


def _width(stream: object) -> int | None:
    isatty = getattr(stream, "isatty", None)
    if "COLUMNS" in os.environ or (isatty is not None and isatty()):
        return None
    return _PIPE_WIDTH


console = Console(width=_width(sys.stdout))
err_console = Console(stderr=True, width=_width(sys.stderr))


def say_store(dsn: str) -> None:
    """One line on stderr naming the ClickHouse store a command opened (password hidden)."""
    from sinks.clickhouse import describe_dsn

    err_console.print(f"[dim]store: {describe_dsn(dsn)}[/]", highlight=False, soft_wrap=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one error sentence to stderr and exit."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn ranksight errors (and a missing or unreadable file) into one line on stderr and exit 1."""
    try:
        yield
    except RanksightError as exc:
        fail(str(exc))
    except FileNotFoundError as exc:
        fail(f"no such file: {exc.filename}")
    except PermissionError as exc:
        fail(f"permission denied: {exc.filename}")
    except StopRequested as exc:
        # SIGINT/SIGTERM through ranksight.signals: the stop was announced when it began.
        sys.exit(128 + exc.signum)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
