"""Offline replay: container files of events -> the detection engine -> alerts and derived events.

Files are merged in event-time order (each file is expected to be in event-time order, as the
simulator and the sinks' exports write them; ties go to the earlier file, then to the earlier
position). The same files with the same configuration always give the same output.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from pathlib import Path

from schemas.errors import RanksightError
from schemas.files import iter_container
from schemas.records import Event
from streams.config import EngineConfig
from streams.engine import DetectionEngine, event_ts
from streams.errors import ReplayError
from streams.routing import Router

__all__ = ["PROGRESS_EVERY", "ProgressFn", "merged_events", "replay_offline"]

ProgressFn = Callable[[int, int], None]  # (events read so far, event time of the latest, UTC ms)
PROGRESS_EVERY = 20_000


def _keyed(path: Path, index: int) -> Iterator[tuple[int, int, int, Event]]:
    for position, event in enumerate(iter_container(path)):
        yield event_ts(event), index, position, event


def merged_events(paths: list[Path]) -> Iterator[Event]:
    """Events of several container files merged by event time (stable: file order, then position)."""
    for path in paths:
        if not Path(path).is_file():
            raise ReplayError(f"no such events file: {path}")
    streams = [_keyed(Path(p), i) for i, p in enumerate(paths)]
    for _, _, _, event in heapq.merge(*streams, key=lambda item: (item[0], item[1], item[2])):
        yield event


def replay_offline(
    paths: list[Path],
    config: EngineConfig | None = None,
    router: Router | None = None,
    *,
    on_progress: ProgressFn | None = None,
    engine: DetectionEngine | None = None,
) -> Iterator[Event]:
    """Feed the files through a fresh engine (or `engine`); yield Alert and derived events, then finish."""
    if not paths:
        raise ReplayError("nothing to replay: pass at least one events file")
    eng = engine if engine is not None else DetectionEngine(config, router)
    count = 0
    last_ts = 0
    try:
        for event in merged_events(list(paths)):
            count += 1
            last_ts = event_ts(event)
            yield from eng.process(event)
            if on_progress is not None and count % PROGRESS_EVERY == 0:
                on_progress(count, last_ts)
    except ReplayError:
        raise
    except RanksightError as exc:
        raise ReplayError(str(exc)) from exc
    yield from eng.finish()
    if on_progress is not None:
        on_progress(count, last_ts)
