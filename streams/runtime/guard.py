"""The wall-clock guard: event time for an engine whose input stopped while it was live.

Pure: the worker asks it on every tick with the wall clock and the engine's times.
"""

from __future__ import annotations

__all__ = ["WallClockGuard"]


class WallClockGuard:
    """Decides when an engine whose input went silent may advance event time with the wall clock.

    Only for live data: the engine's newest event must be within `live_ms` of the wall clock, so a
    historical replay never has time invented for it. Returns the watermark to advance to.
    """

    def __init__(self, guard_s: float = 120.0, live_ms: int = 600_000, lateness_ms: int = 5_000) -> None:
        self.guard_s = guard_s
        self.live_ms = live_ms
        self.lateness_ms = lateness_ms

    def watermark(
        self, now_ms: int, silent_s: float, max_ts: int | None, current_wm: int | None
    ) -> int | None:
        """The watermark to advance to now, or None (input not silent long enough, not live, or no gain)."""
        if self.guard_s <= 0 or max_ts is None or silent_s < self.guard_s:
            return None
        if now_ms - max_ts > self.live_ms:
            return None  # historical data: the wall clock says nothing about its event time
        target = now_ms - self.lateness_ms
        if current_wm is not None and target <= current_wm:
            return None
        return target
