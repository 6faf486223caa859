"""Offline replay: container files of events -> the detection engine -> alerts and derived events.

Files are merged in event-time order (each file is expected to be in event-time order, as the
simulator and the sinks' exports write them; ties go to the earlier file, then to the earlier
position). A record stamped far ahead of its neighbours (a node whose clock jumped) keeps its
position in its file instead of holding the rest of that file back behind every other file; the
engine then rejects it (`streams.stages.engine`). The same files with the same configuration always give
the same output.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path

from schemas.errors import RanksightError
from schemas.eventtime import event_ts
from schemas.files import iter_container
from schemas.records import Event
from streams.alerting.routing import Router
from streams.config import EngineConfig
from streams.detectors.stats import median
from streams.errors import ReplayError
from streams.offline.detection import DetectionEngine

__all__ = ["PROGRESS_EVERY", "ProgressFn", "merged_events", "replay_offline"]

ProgressFn = Callable[[int, int], None]  # (events read so far, event time of the latest, UTC ms)
PROGRESS_EVERY = 20_000
# A record more than the skew ahead of the file so far is a spike (a bad clock) when the file
# returns to its old time within this many records; a genuine gap does not return.
SPIKE_LOOKAHEAD = 64


def _keyed(path: Path, index: int, skew_ms: int) -> Iterator[tuple[int, int, int, Event, int]]:
    """(merge key, file index, position, event, reference time) of each record of one file.

    Key and reference are the event time, except for a spike (a record more than the skew ahead
    of the file so far, after which the file returns to its old time): its key keeps its place in
    the file, and its reference is the time the file had reached, so the engine rejects it. A
    first record far ahead of the records after it is a spike too (measured against their median).
    """
    records = enumerate(iter_container(path))
    ahead: deque[tuple[int, int, Event]] = deque(
        (event_ts(event), position, event) for position, event in islice(records, SPIKE_LOOKAHEAD)
    )
    last: int | None = None  # event time of the latest record that was no spike

    def judged() -> tuple[int, int, int, Event, int]:
        nonlocal last
        ts, position, event = ahead.popleft()
        if last is not None and ts <= last + skew_ms:  # the common case
            if ts > last:
                last = ts
            return ts, index, position, event, ts
        if last is None:
            later = median([float(t) for t, _, _ in ahead]) if ahead else None
            if later is not None and ts > later + skew_ms:
                return int(later), index, position, event, int(later)
        elif any(t <= last + skew_ms for t, _, _ in ahead):
            return last, index, position, event, last  # a spike: keep its place in the file
        last = ts if last is None else max(last, ts)
        return ts, index, position, event, ts

    for position, event in records:
        ahead.append((event_ts(event), position, event))
        yield judged()
    while ahead:
        yield judged()


def _merged(paths: list[Path], skew_ms: int) -> Iterator[tuple[Event, int]]:
    for path in paths:
        if not Path(path).is_file():
            raise ReplayError(f"no such events file: {path}")
    streams = [_keyed(Path(p), i, skew_ms) for i, p in enumerate(paths)]
    for _, _, _, event, reference in heapq.merge(*streams, key=lambda item: (item[0], item[1], item[2])):
        yield event, reference


def merged_events(paths: list[Path], skew_ms: int | None = None) -> Iterator[Event]:
    """Events of several container files merged by event time (stable: file order, then position)."""
    skew = EngineConfig().max_clock_skew_ms if skew_ms is None else skew_ms
    for event, _ in _merged(paths, skew):
        yield event


def replay_offline(
    paths: list[Path],
    config: EngineConfig | None = None,
    router: Router | None = None,
    *,
    on_progress: ProgressFn | None = None,
    engine: DetectionEngine | None = None,
) -> Iterator[Event]:
    """Feed the files through a fresh engine (or `engine`); yield Alert and derived events, then finish.

    Each record is judged against its file's own time (see `_keyed`), as a live record is against
    its Kafka timestamp: one record from a jumped clock is rejected, a gap in the file is not.
    """
    if not paths:
        raise ReplayError("nothing to replay: pass at least one events file")
    eng = engine if engine is not None else DetectionEngine(config, router)
    count = 0
    last_ts = 0
    try:
        for event, reference in _merged(list(paths), eng.config.max_clock_skew_ms):
            count += 1
            last_ts = max(last_ts, reference)  # a spike's own time is not progress
            # The file's own time is the reference a Kafka timestamp is live: a spike is rejected.
            yield from eng.process(event, received_ts=reference)
            if on_progress is not None and count % PROGRESS_EVERY == 0:
                on_progress(count, last_ts)
    except ReplayError:
        raise
    except RanksightError as exc:
        raise ReplayError(str(exc)) from exc
    yield from eng.finish()
    if on_progress is not None:
        on_progress(count, last_ts)
