"""Errors of the infrastructure layer (local Kafka, topics)."""

from __future__ import annotations

from pathlib import Path

from schemas.errors import RanksightError

__all__ = ["KafkaSetupError", "MetricsError"]


class KafkaSetupError(RanksightError):
    """Kafka could not be set up, started, reached or given its topics; says what to do about it."""

    def __init__(self, message: str, *, log_path: Path | None = None, log_tail: str = "") -> None:
        self.message = message
        self.log_path = log_path
        self.log_tail = log_tail
        super().__init__(message)

    def __str__(self) -> str:
        text = self.message
        if self.log_path is not None:
            text += f" (log: {self.log_path})"
        if self.log_tail:
            text += "\n" + self.log_tail
        return text


class MetricsError(RanksightError):
    """The `/metrics` endpoint cannot be served (prometheus_client missing, port taken)."""
