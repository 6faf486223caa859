"""Segment clocks of the SDK: host clocks for CPU loops, CUDA events for loops that run on a GPU.

CUDA is asynchronous: on the host, `loss.backward()` returns once the kernels are *queued*, so a
host clock around it measures the enqueue time (on an H200: backward 1.10 ms on the host while
the GPU took 10.58 ms). A `CudaTimer` instead records a `torch.cuda.Event(enable_timing=True)` on
the current stream at each segment edge; the reporter's background thread asks the events whether
they completed (`query()`, never `synchronize()` on the training thread) and only then computes
the elapsed GPU time and publishes the step.

A timer is anything with this small surface (`SegmentTimer`), so the reporter's logic is tested
on CPU with a fake event class.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections import deque
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from typing import Any, Literal, Protocol

__all__ = ["CudaTimer", "HostTimer", "SegmentTimer", "TimingMode", "choose_timer"]

TimingMode = Literal["auto", "host", "cuda"]


class SegmentTimer(Protocol):
    """Marks points of a step on the training thread; resolves their distances later, off-thread."""

    clock: str  # "host" or "cuda": which clock the segment and step times of a StepCompleted use

    def mark(self) -> Any:
        """A point in time, taken on the training thread (must be cheap and never block)."""

    def ready(self, mark: Any) -> bool:
        """Whether the point has been reached (never blocks)."""

    def wait(self, mark: Any) -> None:
        """Block until the point has been reached (only at close, never on the training thread's hot path)."""

    def elapsed_s(self, start: Any, end: Any) -> float:
        """Seconds between two reached marks."""

    def release(self, mark: Any) -> None:
        """The mark is no longer needed (events go back to a pool)."""


class HostTimer:
    """Host monotonic clock (`perf_counter_ns`): right for CPU loops, where work is done when the call returns."""

    clock = "host"

    def __init__(self, now_ns: Callable[[], int] = perf_counter_ns) -> None:
        self._now = now_ns

    def mark(self) -> Any:
        """Now, in nanoseconds."""
        return self._now()

    def ready(self, mark: Any) -> bool:
        """Host marks are reached when taken."""
        return True

    def wait(self, mark: Any) -> None:
        """Nothing to wait for."""

    def elapsed_s(self, start: Any, end: Any) -> float:
        """(end - start) in seconds."""
        return float(end - start) / 1e9

    def release(self, mark: Any) -> None:
        """Nothing to release."""


class CudaTimer:
    """CUDA events recorded on the current stream; `event_factory` is `torch.cuda.Event` (or a fake in tests).

    Events are pooled: creating one costs a driver call, re-recording a completed one does not.
    """

    clock = "cuda"

    def __init__(self, event_factory: Callable[..., Any], *, pool_max: int = 4096) -> None:
        self._factory = event_factory
        self._pool: deque[Any] = deque()
        self._pool_max = pool_max

    def mark(self) -> Any:
        """Record an event on the current stream (asynchronous: returns at once)."""
        try:
            event = self._pool.pop()
        except IndexError:
            event = self._factory(enable_timing=True)
        event.record()
        return event

    def ready(self, mark: Any) -> bool:
        """`event.query()`: has the GPU passed this point of the stream?"""
        return bool(mark.query())

    def wait(self, mark: Any) -> None:
        """`event.synchronize()`."""
        mark.synchronize()

    def elapsed_s(self, start: Any, end: Any) -> float:
        """GPU time between two completed events (`elapsed_time` is in milliseconds)."""
        return float(start.elapsed_time(end)) / 1e3

    def release(self, mark: Any) -> None:
        """Back to the pool (deque append/pop are atomic: the training thread pops, the reporter appends)."""
        if len(self._pool) < self._pool_max:
            self._pool.append(mark)


def choose_timer(
    mode: TimingMode | SegmentTimer | None, env: Mapping[str, str] | None = None
) -> SegmentTimer:
    """The timer for `mode`: "auto" = CUDA events when torch is already imported and a GPU is available."""
    env = os.environ if env is None else env
    if mode is not None and not isinstance(mode, str):
        return mode
    mode = mode or env.get("RANKSIGHT_TIMING", "auto")  # type: ignore[assignment]
    if mode == "host":
        return HostTimer()
    if mode not in ("auto", "cuda"):
        raise ValueError(f"unknown timing {mode!r}; use auto, host or cuda")
    # Only look at torch when the training code imported it: the SDK never imports torch itself
    # in a CPU-only process (it is heavy and may not be installed).
    torch: Any = sys.modules.get("torch")
    if torch is None and mode == "cuda":
        torch = importlib.import_module("torch")
    if torch is not None and torch.cuda.is_available():
        return CudaTimer(torch.cuda.Event)
    if mode == "cuda":
        raise ValueError("timing='cuda' but torch sees no CUDA device")
    return HostTimer()
