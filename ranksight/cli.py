"""The `ranksight` command: wiring only; every command group lives in `ranksight.commands`."""

from __future__ import annotations

import importlib
import pkgutil
import warnings

import typer

import ranksight.commands

__all__ = ["app", "main"]

app = typer.Typer(
    name="ranksight",
    help="Health of distributed GPU training jobs, as a stream: Kafka in, alerts and ClickHouse out.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register_commands() -> None:
    for module in sorted(m.name for m in pkgutil.iter_modules(ranksight.commands.__path__)):
        if module.startswith("_"):
            continue
        importlib.import_module(f"ranksight.commands.{module}").register(app)


_register_commands()


def main() -> None:
    """Entry point of the `ranksight` console script."""
    # Third-party import-time deprecation chatter is not for the user of a CLI.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    app()


if __name__ == "__main__":
    main()
