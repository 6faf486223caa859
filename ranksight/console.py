"""Shared console output for the CLI: one-sentence errors, no tracebacks for foreseeable conditions."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from typing import NoReturn

import typer
from rich.console import Console

from ranksight.signals import StopRequested
from schemas.errors import RanksightError

__all__ = ["console", "err_console", "fail", "literal", "print_rows", "say_store", "user_errors"]

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


# What a terminal would act on rather than show: C0/C1 controls (ESC starts every ANSI sequence, CR
# rewrites the line), DEL, and the invisible or direction-changing format characters (bidi overrides,
# zero-width joiners, line/paragraph separators) that make a shown string read as another.
_UNSHOWABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def literal(value: object, *, markup: bool = True) -> str:
    """A record-derived value as text a terminal shows literally, never acts on.

    Every string a record carries (job id, node, rule, summary, reason, a SQL cell) goes through
    this before it is printed: control characters and escape sequences are written as escapes
    (`\\x1b`, `\\x0d`, `\\u202e`), and with `markup` (printing through a Rich console) Rich's
    markup is escaped so `[/]` or `[bold red]` is shown as typed. `markup=False` is for plain
    `print`/`sys.stdout.write` output, where brackets are already literal.
    """
    from rich.markup import escape

    text = _UNSHOWABLE.sub(_escaped, str(value))
    return escape(text) if markup else text


def print_rows(
    headers: list[str], rows: list[list[str]], title: str, *, terminal: bool | None = None
) -> None:
    """Print rows as a Rich table on a terminal, as aligned plain columns on a pipe; cells shown literally."""
    if sys.stdout.isatty() if terminal is None else terminal:
        from rich.table import Table

        table = Table(*headers, title=title)
        for row in rows:
            table.add_row(*(literal(c) for c in row))
        console.print(table)
        return
    shown = [[literal(c, markup=False) for c in row] for row in rows]
    widths = [max(len(h), *(len(row[i]) for row in shown)) for i, h in enumerate(headers)]
    sys.stdout.write("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip() + "\n")
    for row in shown:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def say_store(dsn: str) -> None:
    """One line on stderr naming the ClickHouse store a command opened (password hidden)."""
    from sinks.clickhouse import describe_dsn

    err_console.print(f"[dim]store: {describe_dsn(dsn)}[/]", highlight=False, soft_wrap=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one error sentence to stderr and exit (shown literally: errors quote records and URLs)."""
    shown = "\n".join(literal(line) for line in message.split("\n"))  # its own line breaks stay
    err_console.print(f"[bold red]error:[/] {shown}", highlight=False, soft_wrap=True)
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
