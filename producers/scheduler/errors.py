"""Errors of the scheduler sources: a scheduler that cannot be reached or answers nonsense."""

from __future__ import annotations

from producers.errors import ProducerError

__all__ = ["SchedulerError", "SchedulerUnavailableError", "TeamMapError"]


class SchedulerError(ProducerError):
    """Root of the scheduler-source errors."""


class SchedulerUnavailableError(SchedulerError):
    """The scheduler's command or API cannot be used (not installed, not reachable, refused)."""


class TeamMapError(SchedulerError):
    """The team mapping file cannot be read or has the wrong shape."""
