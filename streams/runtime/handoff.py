"""What a rank stage sends to a job stage of the same process, handed over without decoding it again.

The rank stage's summaries travel through `rs.internal.summaries` so that another worker's job stage
can read them, and so that a restart finds them (the topic is the truth: the job stage releases
only what it read from Kafka, in its order, after every marker). When this process also runs the
job stage that reads them, it reads back the bytes it wrote: decoding them again was ~10 % of a
worker's CPU time on one 4,096-rank job (`bench_worker.py --giant 4096:20`, issue 37.2). The rank
stage leaves the record it encoded here, keyed by those bytes; the job stage takes it when the same
bytes come back from Kafka, and decodes as before when they do not (another worker's, a restart's,
or one this bounded table had no room for). Only the decoding is skipped: what is read, in which
order, and when it is released stay the consumer's.

The in-memory record is the one the offline replay hands its job stages (`DetectionEngine`), so the
job stage sees the same values either way.
"""

from __future__ import annotations

from collections.abc import Container

from schemas.records import Event

__all__ = ["Handoff"]

# Records waiting to be read back at most; past it the rest are decoded as before (a job stage that
# stops reading, or a partition revoked before they came back, must not grow this without bound).
MAX_WAITING = 20_000


class Handoff:
    """Encoded bytes -> the record they encode, for the job-stage partitions this process runs."""

    def __init__(self, local: Container[int], max_waiting: int = MAX_WAITING) -> None:
        self.local = local  # the job-stage partitions of this process (a live view)
        self.max_waiting = max_waiting
        self._waiting: dict[bytes, Event] = {}
        self.taken = 0  # records read back without decoding

    def __len__(self) -> int:
        return len(self._waiting)

    def put(self, partition: int, value: bytes, event: Event) -> None:
        """The rank stage sent `event` as `value` to job-stage `partition`."""
        if partition in self.local and len(self._waiting) < self.max_waiting:
            self._waiting[value] = event

    def take(self, value: bytes | None) -> Event | None:
        """The record these bytes encode when this process sent them (once), else None."""
        if not value or not self._waiting:
            return None
        event = self._waiting.pop(value, None)
        if event is not None:
            self.taken += 1
        return event

    def clear(self) -> None:
        """Partitions gone: what they would have read back is read by their next owner."""
        self._waiting.clear()
