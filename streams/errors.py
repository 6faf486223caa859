"""Errors of the stream layer: bad engine configuration, bad routing rules, unreadable replays."""

from __future__ import annotations

from schemas.errors import RanksightError

__all__ = ["ConfigError", "EvaluationError", "ReplayError", "RoutingError", "StreamsError"]


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
