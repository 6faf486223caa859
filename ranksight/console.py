"""Shared console output for the CLI: one-sentence errors, no tracebacks for foreseeable conditions."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import NoReturn

import typer
from rich.console import Console

from schemas.errors import RanksightError

__all__ = ["console", "err_console", "fail", "user_errors"]

console = Console()
err_console = Console(stderr=True)


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
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
