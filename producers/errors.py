"""Errors of the producers: the publisher, its spool, the node agent and the training SDK."""

from __future__ import annotations

from schemas.errors import RanksightError

__all__ = [
    "DestinationError",
    "NvmlUnavailableError",
    "ProducerError",
    "PublisherClosedError",
    "SpoolError",
    "SpoolLockedError",
]


class ProducerError(RanksightError):
    """Root of the producer errors."""


class DestinationError(ProducerError):
    """A publisher destination string or its settings cannot be used."""


class PublisherClosedError(ProducerError):
    """An event was published after the publisher was closed."""


class SpoolError(ProducerError):
    """The disk spool cannot be opened or written."""


class SpoolLockedError(SpoolError):
    """Another publisher holds the spool directory."""

    def __init__(self, directory: str) -> None:
        super().__init__(
            f"the spool {directory} is in use by another publisher; give each producer its own spool directory"
        )
        self.directory = directory


class NvmlUnavailableError(ProducerError):
    """NVML (the NVIDIA driver library) cannot be used on this node."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"cannot read the GPUs: NVML says {reason!r} (no NVIDIA driver on this node?); "
            "run `ranksight agent --simulate` to use simulated GPUs"
        )
        self.reason = reason
