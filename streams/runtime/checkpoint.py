"""What the worker core asks of Kafka (`Send`, `Checkpoint`), and the one order a checkpoint follows.

The core (partition tasks, side path) never talks to Kafka: it returns actions, and a runtime
carries them out in order with `perform` through its `WorkerIO`. A checkpoint is always, for every
runtime (Kafka Streams' task commit, quix-streams' `Checkpoint.commit`):

1. every record sent so far delivered (outputs, forwards, dead letters);
2. the state's changelog records sent (a partition's engine snapshot, which names the offsets it
   covers) and delivered;
3. only then the offsets committed.

A crash between any two steps repeats work, never loses it: offsets never run ahead of durable
state, and a restored snapshot skips the records it already holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Action", "Checkpoint", "Flow", "Send", "WorkerIO", "perform"]


@dataclass(slots=True)
class Send:
    """One record to produce (topic without the deployment's prefix)."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None  # None: the Java partitioner on the key
    timestamp_ms: int | None = None
    headers: list[tuple[str, bytes]] | None = None
    # An `InFlight` entry the runtime tells the record's offset once Kafka acknowledged it.
    flight: list[Any] | None = None


class WorkerIO(Protocol):
    """What a runtime provides to carry out the core's actions."""

    def send(self, record: Send) -> None:
        """Produce one record (asynchronously; delivery is awaited by `flush`)."""

    def flush(self, what: str) -> None:
        """Block until every record sent so far is acknowledged; raise if Kafka refused one."""

    def commit(self, offsets: dict[str, int]) -> None:
        """Commit these next offsets ("topic:p" -> offset) of the worker's group."""

    def pause(self, tps: list[str]) -> None:
        """Stop fetching these partitions ("topic:p"); reading resumes at the next unread offset."""

    def resume(self, tps: list[str]) -> None:
        """Fetch these partitions again."""


@dataclass
class Checkpoint:
    """One partition's (or the side path's) commit: the records sent, then its state, then its offsets."""

    what: str  # "partition 3", "the side path": for errors and logs
    offsets: dict[str, int]  # next offset per input partition ("topic:p") the state covers
    changelog: list[Send] = field(default_factory=list)  # state records, written after the outputs
    outputs: list[Send] = field(default_factory=list)  # made while taking the state (evictions' resolutions)

    def run(self, io: WorkerIO) -> None:
        """Carry the checkpoint out in the only safe order (module docstring)."""
        for record in self.outputs:
            io.send(record)
        io.flush(f"the outputs of {self.what}")
        if self.changelog:
            for record in self.changelog:
                io.send(record)
            io.flush(f"the state of {self.what}")
        io.commit(self.offsets)


@dataclass
class Flow:
    """Backpressure: stop fetching partitions far ahead of the others, fetch them again once drained."""

    pause: list[str] = field(default_factory=list)
    resume: list[str] = field(default_factory=list)

    def run(self, io: WorkerIO) -> None:
        """Resume first: a partition is never left paused by a change that also resumes it."""
        if self.resume:
            io.resume(self.resume)
        if self.pause:
            io.pause(self.pause)


Action = Send | Checkpoint | Flow


def perform(actions: Iterable[Action], io: WorkerIO) -> None:
    """Carry out the core's actions in their order."""
    for action in actions:
        if isinstance(action, Send):
            io.send(action)
        else:
            action.run(io)
