"""Errors of the stream layer: bad engine configuration, bad routing rules, unreadable replays."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from schemas.errors import RanksightError

__all__ = [
    "ConfigError",
    "EvaluationError",
    "ReplayError",
    "RoutingError",
    "StreamsError",
    "refuse_unknown_keys",
]


class StreamsError(RanksightError):
    """Root of the errors raised by `streams`."""


class ConfigError(StreamsError):
    """The detector configuration file is malformed or names an unknown knob."""


class RoutingError(StreamsError):
    """The routing file is malformed (the message names the bad key)."""


class ReplayError(StreamsError):
    """An offline replay could not read its input."""


class EvaluationError(StreamsError):
    """A scenario evaluation could not run (missing simulator, no scenarios)."""


def refuse_unknown_keys(
    keys: Iterable[str], known: Collection[str], where: str, error: type[StreamsError], section: str = ""
) -> None:
    """A mapping of a file may hold only `known` keys: one sentence naming the first other one
    (`section.key` for a named top-level section) and the known ones (in their order; a set's sorted)."""
    bad = sorted(set(keys) - set(known))
    if bad:
        shown = sorted(known) if isinstance(known, (set, frozenset)) else list(known)
        key = f"{section}.{bad[0]}" if section else repr(bad[0])
        raise error(f"{where}: unknown key {key}; known: {', '.join(shown)}")
