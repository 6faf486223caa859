"""Garbage collection for a process that holds a large engine state (the worker, replays).

The engine's state is many small, long-lived, acyclic dicts, lists and tuples (per rank, per GPU,
per bucket, per window); reference counting frees what it drops. The engine makes no reference
cycles (a full collection after 1.2 million records of a 16,384-rank job found the same 18
unreachable objects as after 26,000, all made at start-up by a self-calling closure since
removed; after each of the 73 shipped scenarios, run, snapshotted and restored, it finds none;
`tests/unit/streams/test_gc_policy.py` holds the engine to that on 8 of them). Python's
cyclic collector is therefore pure cost here, and that cost grows with the state: it walks
objects that live a span of event time (a 5 s summary bucket, a 60 s window), which is more records
the bigger the job, and each walk of a cold object is a trip to memory.

So a collection runs only once the process holds *twice* the container objects it held after the
last one (at least `_FLOOR` more), and everything that survives it is frozen (`gc.freeze`: out of
every later collection's reach; still freed by reference counting when the engine drops it). While
the state grows (a job starting, a window filling) that is a collection at each doubling: every
long-lived object is walked about once. Once the state is as large as it gets, the engine frees
about what it makes and the collector never runs. Should cyclic garbage appear after all, what
was made and dropped between two collections is collected at the next doubling; a cycle still
alive at a collection is frozen with the rest and, dropped later, is never collected (hence the
test that the engine makes none). Measured on CPython 3.11, whose thresholds count container
objects made minus freed, as 3.12 and 3.13 do (not measured there); 3.14's incremental collector
reads them differently, so there Python's own collector stays. A collection at a doubling walks what was made since the last one, in one pause:
the longest 1,960 ms at 16,384 ranks, 247 ms at 1,024 (the policy before this one: 3,876 ms).

Measured (bench/bench_engine_ranks.py --seconds 180): after the first 90 s of event time the
collector cost 6.0 / 9.9 / 11.4 µs per raw event at 1,024 / 4,096 / 16,384 ranks under the policy
before this one (young collections sized by the frozen state, older ones every few), and 0.0 under
this one; the engine's time per raw event went from 61.5 / 63.6 / 79.0 to 58.2 / 62.0 / 63.5 µs.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

__all__ = ["for_long_lived_state", "python_default", "settle"]

# A collection never runs before this many more container objects than after the last one.
_FLOOR = 50_000
# Older generations never run on their own: everything that survives a collection is frozen.
_NEVER = 1_000_000_000
_DEFAULT = gc.get_threshold()


def for_long_lived_state() -> None:
    """Set the collector for a process whose engine state lives as long as the process."""
    if sys.version_info >= (3, 14):
        return  # an incremental collector: these thresholds mean something else there
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)
    gc.collect()  # start-up garbage goes now; what survives (modules, configuration) is long-lived
    gc.freeze()
    _pace()


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
        _pace()


def _pace() -> None:
    """The next collection once the live container objects have doubled since the last one.

    Python counts the young generation's container objects made minus freed (never below zero);
    right after a freeze every live container object is frozen, so the frozen count is the live
    state."""
    gc.set_threshold(max(_FLOOR, gc.get_freeze_count()), _NEVER, _NEVER)


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    """After a collection: what survived it is long-lived state, out of the next ones' way."""
    if phase == "stop":
        gc.freeze()
        _pace()
