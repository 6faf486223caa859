"""What the deployment files may run: a `ranksight` command line the real CLI accepts, and environment
variables that ranksight (or that command) reads. Shared by the Kubernetes, compose, systemd and
Containerfile checks.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Iterator
from typing import Any

import typer

from ranksight.cli import app
from ranksight.settings import ENV, Settings
from streams.alerting.routing import RUNBOOK_BASE_ENV

__all__ = [
    "ROOT_COMMAND",
    "command_envvars",
    "parse_invocation",
    "ranksight_lines",
    "settings_envvars",
    "unknown_envvars",
]

ROOT_COMMAND = typer.main.get_command(app)


def parse_invocation(argv: list[str]) -> list[str]:
    """Parse `ranksight <argv>` as the CLI would, without running it; the command path, e.g. ["alerts", "forward"].

    Raises click's `UsageError` (typer's copy of click: an unknown command or option, a bad value,
    a missing required option).
    """
    assert argv, "an empty ranksight command line"
    path: list[str] = []
    ctx = ROOT_COMMAND.make_context("ranksight", list(argv), resilient_parsing=False)
    command: Any = ROOT_COMMAND
    with ctx:
        while hasattr(command, "resolve_command"):  # a group: resolve the subcommand, parse its options
            rest = [*ctx._protected_args, *ctx.args] if hasattr(ctx, "_protected_args") else ctx.args
            name, sub, rest = command.resolve_command(ctx, rest)
            assert sub is not None and name is not None
            path.append(name)
            ctx = sub.make_context(name, list(rest), parent=ctx, resilient_parsing=False)
            command = sub
    return path


def _command(path: list[str]) -> Any:
    command: Any = ROOT_COMMAND
    for name in path:
        sub = command.get_command(command.context_class(command), name)
        assert sub is not None, name
        command = sub
    return command


def command_envvars(path: list[str]) -> set[str]:
    """The environment variables the options of `ranksight <path>` read (typer's `envvar=`)."""
    names: set[str] = set()
    for param in _command(path).params:
        envvar = getattr(param, "envvar", None)
        if isinstance(envvar, str):
            names.add(envvar)
        elif envvar:
            names.update(envvar)
    return names


def settings_envvars() -> set[str]:
    """Every environment variable `ranksight.settings.Settings` reads (prefix + field, and the aliases)."""
    prefix = Settings.model_config.get("env_prefix", "")
    names = set(ENV.values()) | {RUNBOOK_BASE_ENV}
    for name, field in Settings.model_fields.items():
        names.add(f"{prefix}{name}".upper())
        alias = field.validation_alias
        for choice in getattr(alias, "choices", ()) or ():
            if isinstance(choice, str):
                names.add(choice)
    return names


def ranksight_lines(script: str) -> Iterator[list[str]]:
    """The argv (after `ranksight`) of each `ranksight ...` command in a shell line, up to a redirect or pipe."""
    for segment in re.split(r"&&|\|\||;|\n", script):
        words = shlex.split(segment, comments=True)
        cut = next((i for i, w in enumerate(words) if w in {">", ">>", "|", "<", "2>&1"}), len(words))
        words = words[:cut]
        for i, word in enumerate(words):
            if word == "ranksight" or word.endswith("/ranksight"):
                yield words[i + 1 :]
                break


def unknown_envvars(names: Iterable[str], path: list[str], args: Iterable[str] = ()) -> set[str]:
    """Names ranksight (and `ranksight <path>`) does not read, and no `$(NAME)` in the args expands."""
    expanded = {m for a in args for m in re.findall(r"\$\((\w+)\)", a)}
    return set(names) - settings_envvars() - command_envvars(path) - expanded
