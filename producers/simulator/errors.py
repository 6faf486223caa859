"""Errors of the cluster simulator."""

from __future__ import annotations

from schemas.errors import RanksightError

__all__ = ["ScenarioError", "SimulatorError"]


class SimulatorError(RanksightError):
    """Root of the simulator's errors."""


class ScenarioError(SimulatorError):
    """A scenario file is missing, unreadable or invalid; names the file and the key."""

    def __init__(self, source: str, key: str | None, reason: str) -> None:
        self.source = source
        self.key = key
        self.reason = reason
        where = f"{source}: {key}: " if key else f"{source}: "
        super().__init__(where + reason)
