"""The polling loop: source -> tracker -> publisher, with the tracker's state saved between runs."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from producers.publisher import Publisher
from producers.scheduler.tracker import JobObservation, StateTracker

__all__ = ["FollowStats", "Source", "follow", "load_tracker_state", "poll_once", "save_tracker_state"]


class Source(Protocol):
    """A scheduler source: what it is called, a poll, and a look-up of purged jobs."""

    name: str

    def poll(self) -> list[JobObservation]:
        """Every job the scheduler lists now."""
        ...

    def lookup(self, job_ids: list[str]) -> list[JobObservation]:
        """Final states of jobs no longer listed (empty when unknown)."""
        ...


@dataclass
class FollowStats:
    """Counters of the loop."""

    polls: int = 0
    jobs: int = 0
    published: int = 0


def poll_once(source: Source, tracker: StateTracker, publisher: Publisher, now_ms: int) -> int:
    """One poll: publish the state changes; returns how many events were published."""
    observations = source.poll()
    seen = [o.job_id for o in observations]
    missing = tracker.missing(seen)
    finals = source.lookup(missing) if missing else []
    events = tracker.update([*observations, *finals], now_ms)
    for event in events:
        publisher.publish(event)
    tracker.forget_unlisted(seen)
    return len(events)


def load_tracker_state(tracker: StateTracker, path: Path | None) -> None:
    """Restore the tracker from a state file written by `save_tracker_state` (absent: start empty)."""
    if path is None or not path.exists():
        return
    try:
        tracker.load_state(json.loads(path.read_text()))
    except (json.JSONDecodeError, OSError, AttributeError):
        return  # a torn or foreign file: start empty (re-publishes at most each job's current state)


def save_tracker_state(tracker: StateTracker, path: Path | None) -> None:
    """Write the tracker's state atomically."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(tracker.state(), sort_keys=True))
    os.replace(tmp, path)


def follow(
    source: Source,
    tracker: StateTracker,
    publisher: Publisher,
    *,
    interval_s: float = 10.0,
    count: int | None = None,
    state_file: Path | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Any] = time.sleep,
    on_poll: Callable[[FollowStats], Any] | None = None,
) -> FollowStats:
    """Poll every `interval_s` seconds (`count` polls, or until interrupted); flush after each poll."""
    stats = FollowStats()
    load_tracker_state(tracker, state_file)
    while count is None or stats.polls < count:
        started = clock()
        stats.published += poll_once(source, tracker, publisher, int(started * 1000))
        publisher.flush()
        save_tracker_state(tracker, state_file)
        stats.polls += 1
        stats.jobs = len(tracker.state()["jobs"])
        if on_poll is not None:
            on_poll(stats)
        if count is not None and stats.polls >= count:
            break
        sleep(max(0.0, interval_s - (clock() - started)))
    return stats
