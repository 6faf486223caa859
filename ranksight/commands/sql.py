"""`ranksight sql`: run one SQL statement against ranksight's ClickHouse (chDB or a server)."""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from datetime import date, datetime
from enum import StrEnum
from typing import Any

import typer

from ranksight.console import console, fail, literal, say_store, user_errors

__all__ = ["register"]

_ROW_STATEMENTS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS", "(")


class OutputFormat(StrEnum):
    """How `ranksight sql` prints rows."""

    table = "table"
    jsonl = "jsonl"
    csv = "csv"


def _plain(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN or infinity
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _parameters(pairs: list[str], statement: str) -> dict[str, str]:
    """`--param NAME=VALUE` pairs as query parameters: each must fill a `{NAME:Type}` of the statement.

    Values travel apart from the SQL (ClickHouse binds them on the server by their declared type):
    a job id is never pasted into SQL text. A name the statement does not use is refused, since
    clickhouse-connect would otherwise format the statement itself.
    """
    params: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not _PARAM_NAME.fullmatch(name):
            fail(f"--param takes NAME=VALUE (e.g. --param job_id=pretrain-7b), not {pair!r}")
        if "{" + name + ":" not in statement:
            fail(
                f"--param {name}: the statement has no {{{name}:Type}} placeholder (e.g. WHERE job_id = {{{name}:String}})"
            )
        params[name] = value
    return params


def _print_ddl(cluster: str | None, ttl_days: int | None, replicas: bool) -> None:
    """The schema as SQL statements, each ended by `;` and a blank line (clickhouse-client --multiquery)."""
    from sinks.cluster_ddl import cluster_statements
    from sinks.ddl import MIGRATIONS

    if cluster is None:
        statements = [s for migration in MIGRATIONS for s in migration.statements(ttl_days)]
    else:
        statements = cluster_statements(cluster, ttl_days, replicated=replicas)
    sys.stdout.write(";\n\n".join(statements) + ";\n")


def sql(
    statement: str | None = typer.Argument(
        None, help='One SQL statement, e.g. "SELECT count() FROM steps" (none with --ddl).'
    ),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help="table, jsonl or csv."),
    demo: bool = typer.Option(
        False, "--demo", help="Query the store of the last `ranksight demo` (<home>/demo/chdb)."
    ),
    ddl: bool = typer.Option(
        False,
        "--ddl",
        help="Print the schema's DDL instead (what migrations apply; connects to nothing).",
    ),
    cluster: str | None = typer.Option(
        None,
        "--cluster",
        help="With --ddl: for this <remote_servers> cluster (replicated local tables behind Distributed ones).",
    ),
    ttl_days: int | None = typer.Option(
        None,
        "--ttl-days",
        min=0,
        help="With --ddl: retention in days, 0 for none (default RANKSIGHT_TTL_DAYS).",
    ),
    replicas: bool = typer.Option(
        True,
        "--replicas/--no-replicas",
        help="With --cluster: Replicated* engines (Keeper), or plain shards.",
    ),
    param: list[str] = typer.Option(
        [],
        "--param",
        "-p",
        help="NAME=VALUE for a {NAME:Type} placeholder of the statement, bound by ClickHouse (repeatable); "
        "the runbooks' queries take job_id, node, rank, gpu_index.",
    ),
) -> None:
    """Run SQL on ranksight's ClickHouse (applies pending migrations first, so a fresh home works)."""
    from clickhouse_connect.driver.exceptions import ClickHouseError as _DriverError
    from rich.table import Table

    from ranksight.settings import load_settings
    from sinks.clickhouse import connect
    from sinks.ddl import migrate
    from sinks.errors import ClickHouseLockedError, QueryError

    settings = load_settings()
    with user_errors():
        if ddl:
            if statement is not None or demo or param:
                fail("--ddl prints the schema: give it no statement, no --param and no --demo")
            _print_ddl(cluster, settings.ttl_days if ttl_days is None else ttl_days or None, replicas)
            return
        if cluster is not None or ttl_days is not None or not replicas:
            fail("--cluster, --ttl-days and --no-replicas go with --ddl")
        if statement is None:
            fail('give one SQL statement, e.g. ranksight sql "SELECT count() FROM steps", or --ddl')
        params = _parameters(param, statement)
        if demo:
            if settings.clickhouse_url is not None:
                fail("--demo reads the demo's chDB store; unset CLICKHOUSE_URL to use it")
            if not settings.demo_chdb_path.is_dir():
                fail(f"no demo store at {settings.demo_chdb_path}: run `ranksight demo` first")
            dsn = f"chdb://{settings.demo_chdb_path.resolve()}"
        else:
            dsn = settings.clickhouse_dsn()
        try:
            client = connect(dsn)
        except ClickHouseLockedError as exc:
            fail(str(exc), code=2)
        say_store(dsn)
        migrate(client, settings.ttl_days)
        try:
            if statement.lstrip().upper().startswith(_ROW_STATEMENTS):
                result = client.query(statement, parameters=params or None)
                columns, rows = list(result.column_names), result.result_rows
            else:
                client.command(statement, parameters=params or None)
                console.print("ok")
                return
        except _DriverError as exc:
            raise QueryError(str(exc).strip().splitlines()[0]) from exc
    if fmt is OutputFormat.jsonl:
        for row in rows:
            sys.stdout.write(json.dumps(dict(zip(columns, _plain(list(row)), strict=True))) + "\n")
    elif fmt is OutputFormat.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(row for row in rows)
    else:
        table = Table(*(literal(c) for c in columns), show_lines=False)
        for row in rows:
            table.add_row(*(literal(v) for v in row))
        console.print(table)
        console.print(f"{len(rows)} row{'s' if len(rows) != 1 else ''}", style="dim", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the `sql` command."""
    app.command("sql")(sql)
