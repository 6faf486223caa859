"""The short metric history every finding carries: a condition keeps its last points next to its state.

Helper for the rules, not a rule: `add_point(cond, ts, value)` appends (or, at the same event time,
replaces) a point in `cond["points"]`, keeps the last `POINTS`, and returns them in the form
`Finding.history` takes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["POINTS", "add_point", "points_of"]

POINTS = 10


def add_point(cond: dict[str, Any], ts: int, value: float) -> tuple[tuple[int, float], ...]:
    """Record one point of a condition's metric; returns the condition's history."""
    points: list[list[Any]] = cond.setdefault("points", [])
    if points and points[-1][0] == ts:
        points[-1][1] = float(value)
    else:
        points.append([int(ts), float(value)])
    del points[:-POINTS]
    return points_of(cond)


def points_of(cond: dict[str, Any] | None) -> tuple[tuple[int, float], ...]:
    """A condition's history as `Finding.history` takes it (empty when it has none)."""
    return tuple((int(t), float(v)) for t, v in (cond or {}).get("points", ()))
