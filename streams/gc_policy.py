"""Garbage collection for a process that holds a large engine state (the worker, replays).

The engine's state is many small, long-lived, acyclic dicts and lists (per rank, per GPU, per
bucket); reference counting frees what it drops. Python's cyclic collector still walks all of it
whenever enough objects were allocated, so with the default thresholds the cost per record grows
with the state: measured on one job of 4,096 ranks, 55 us per record against 33 with the collector
off (bench/bench_engine_ranks.py --gc).

Much of the state lives a span of *event time* (a summary bucket, a 60 s window), which is a number
of records that grows with the job: at 16,384 ranks a window's rows outlive any young generation,
so every one was walked again by each older collection and by a full collection (then `gc.freeze`)
every 60 s of wall time, which walked all that had built up since: 17.5 us of GC per record at
16,384 ranks against 7.6 at 1,024 (issue 19; in the same work the engine with the collector off
costs the same per record at every size). Here an older collection runs only once what was allocated
since the last one is at least `_GROWTH` times what the last one froze, and freezes what survives it
at once: each long-lived object is walked once young and about once more, whatever the job's size,
while cycles among new objects are still collected (by the young collections, and by each older one
before it freezes). The young generation grows with the frozen state (`_YOUNG_SHARE`), so what lives
one summary bucket dies young at any job size; and the detectors keep what lives a window as tuples
of numbers (`streams.summary.PackedStat`), which the collector stops tracking.
"""

from __future__ import annotations

import gc
from typing import Any

__all__ = ["for_long_lived_state", "python_default", "settle"]

# Young objects are collected every this many allocations (Python's default: 700).
_YOUNG = 50_000
# ...or a quarter of the frozen state when that is more: state that lives one summary bucket is
# then gone before a young collection promotes it (16,384 ranks, 30 s of event time: 1.56M ->
# 1.27M objects frozen, the collector 8.8 -> 6.9 us per raw event).
_YOUNG_SHARE = 4
# Young collections between two older ones, at least.
_OLD_MIN = 20
# ...and at least this many times the frozen objects allocated since the last older one (with the
# young generation at a quarter of the frozen state, `_OLD_MIN` is the larger: 5 times).
_GROWTH = 2
_DEFAULT = gc.get_threshold()


def for_long_lived_state() -> None:
    """Set the collector for a process whose engine state lives as long as the process."""
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)
    _pace_older()


def python_default() -> None:
    """Python's own collector again (for measurements against it)."""
    if _freeze_survivors in gc.callbacks:
        gc.callbacks.remove(_freeze_survivors)
    gc.set_threshold(*_DEFAULT)


def settle() -> None:
    """After a large state was built at once (a restore): collect once and move every survivor out
    of the collector's reach (`gc.freeze`). Frozen objects are still freed by reference counting
    when the engine drops them."""
    gc.collect()
    gc.freeze()
    if _freeze_survivors in gc.callbacks:
        _pace_older()


def _pace_older() -> None:
    """The young generation's size, and the next older collection after `_OLD_MIN` young ones and
    `_GROWTH` times the frozen objects allocated, whichever comes later."""
    frozen = gc.get_freeze_count()
    young = max(_YOUNG, frozen // _YOUNG_SHARE)
    gc.set_threshold(young, max(_OLD_MIN, _GROWTH * frozen // young), 100)


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    """After an older collection: what survived it is long-lived state, out of the next ones' way."""
    if phase == "stop" and info["generation"] >= 1:
        gc.freeze()
        _pace_older()
