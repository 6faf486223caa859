"""Replay events at event-time pace (`speed` x real time) with an injected clock, for testability."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from schemas.records import Event

__all__ = ["paced"]


def paced(
    events: Iterable[Event],
    speed: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Event]:
    """Yield each event no earlier than its event-time offset from the first event, divided by `speed`."""
    if speed <= 0:
        raise ValueError("speed must be positive")
    t0_event: int | None = None
    t0_wall = 0.0
    for event in events:
        ts = event.record["ts"]
        if t0_event is None:
            t0_event, t0_wall = ts, clock()
        due = t0_wall + (ts - t0_event) / 1000.0 / speed
        wait = due - clock()
        if wait > 0:
            sleep(wait)
        yield event
