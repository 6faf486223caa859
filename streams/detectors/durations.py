"""Durations in words for finding summaries (`1h05m`, `4m09s`, `2d03h`).

Helper for the rules, not a rule.
"""

from __future__ import annotations

__all__ = ["age_text"]


def age_text(ms: int, *, days: bool = False) -> str:
    """A duration in milliseconds as `4m09s` or `1h05m`; with `days`, `2d03h` from one day up."""
    s = ms // 1000
    if days and s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
