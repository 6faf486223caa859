"""The `ranksight` command: wiring only; every command group lives in `ranksight.commands`."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings

import typer

import ranksight.commands
from ranksight import __version__

__all__ = ["SERVER_MODULES", "app", "main"]

app = typer.Typer(
    name="ranksight",
    help="Health of distributed GPU training jobs, as a stream: Kafka in, alerts and ClickHouse out.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ranksight {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Health of distributed GPU training jobs, as a stream: Kafka in, alerts and ClickHouse out."""


def _register_commands() -> None:
    for module in sorted(m.name for m in pkgutil.iter_modules(ranksight.commands.__path__)):
        if module.startswith("_"):
            continue
        importlib.import_module(f"ranksight.commands.{module}").register(app)


_register_commands()


# Import names of the `server` extra's packages (and of what they bring). The light install
# (`pip install ranksight`) runs the agent, the Kafka, spool, events and status commands; a command
# that needs one of these says so in one sentence instead of an ImportError traceback.
SERVER_MODULES = frozenset(
    {
        "faust", "mode", "aiokafka", "aiohttp", "chdb", "clickhouse_connect", "yaml", "httpx", "authlib",
        "cachetools", "attrs", "cramjam", "prometheus_client", "pandas", "pyarrow", "rocksdict",
    }
)  # fmt: skip


def main() -> None:
    """Entry point of the `ranksight` console script."""
    # Third-party import-time deprecation chatter is not for the user of a CLI.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        app()
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in SERVER_MODULES:
            raise
        from ranksight.console import err_console

        err_console.print(
            f"[bold red]error:[/] this command needs ranksight's server side ({missing} is not installed "
            "here, a light install): pip install 'ranksight\\[server]'",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
