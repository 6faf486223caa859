"""Robust statistics on short float sequences: median, MAD, quantiles, robust z-scores; and the
Stats of a rank summary (`Stat`, `PackedStat`: what the rank stage folds, the job rules read).

Pure functions, no numpy: the sequences are windows of a few dozen values, and plain Python
keeps results bit-identical across platforms (determinism under replay).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = [
    "MAD_TO_SIGMA",
    "MAX_VALUES",
    "PackedStat",
    "Stat",
    "finite",
    "mad",
    "mean",
    "median",
    "quantile",
    "robust_scorer",
    "robust_z",
    "stat_mean",
    "stat_median",
    "stat_of",
    "stat_packed",
    "weighted_median",
]

# MAD of a normal distribution times this is its standard deviation.
MAD_TO_SIGMA = 1.4826


def finite(values: Iterable[float | None]) -> list[float]:
    """The finite values of a sequence (None, NaN and infinities dropped)."""
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def median(values: Sequence[float]) -> float | None:
    """Median of the values, None when empty."""
    if not values:
        return None
    s = sorted(values)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def weighted_median(pairs: Iterable[tuple[float | None, float]]) -> float | None:
    """Median of (value, weight) pairs as if each value occurred `weight` times (finite values,
    positive weights); None when there are none. A bucket's rate weighted by its steps gives the
    median over steps that summaries no longer carry one by one."""
    items = sorted((v, w) for v, w in pairs if v is not None and math.isfinite(v) and w > 0)
    if not items:
        return None
    half = math.fsum(w for _, w in items) / 2.0
    seen = 0.0
    for i, (v, w) in enumerate(items):
        seen += w
        if seen > half:
            return v
        if seen == half:  # the middle falls between two values
            return (v + items[i + 1][0]) / 2.0 if i + 1 < len(items) else v
    return items[-1][0]


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean, None when empty."""
    if not values:
        return None
    return math.fsum(values) / len(values)


def mad(values: Sequence[float], center: float | None = None) -> float | None:
    """Median absolute deviation around `center` (default: the median), None when empty."""
    if not values:
        return None
    c = median(values) if center is None else center
    assert c is not None
    return median([abs(v - c) for v in values])


def quantile(values: Sequence[float], q: float) -> float | None:
    """Quantile `q` in [0, 1] with linear interpolation between order statistics."""
    if not values:
        return None
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    frac = pos - lo
    return s[lo] + (s[hi] - s[lo]) * frac


def robust_z(value: float, values: Sequence[float], min_scale: float = 0.0) -> float | None:
    """(value - median) / (1.4826 * MAD), with the scale floored at `min_scale`; None when empty."""
    z_of = robust_scorer(values, min_scale)
    return None if z_of is None else z_of(value)


def robust_scorer(values: Sequence[float], min_scale: float = 0.0) -> Callable[[float], float] | None:
    """`robust_z` against `values` for many values: the median and MAD are computed once (scoring
    every rank of a job against its peers per window was quadratic in the ranks)."""
    m = median(values)
    d = mad(values, m)
    if m is None or d is None:
        return None
    scale = max(MAD_TO_SIGMA * d, min_scale)

    def z_of(value: float) -> float:
        if scale <= 0.0:
            return 0.0 if value == m else math.copysign(math.inf, value - m)
        return (value - m) / scale

    return z_of


# -- the Stats of a rank summary ------------------------------------------------------
_isfinite = math.isfinite
MAX_VALUES = 8  # values kept in a Stat: up to this many, a window median over buckets is exact

Stat = dict[str, Any]  # {"n", "sum", "min", "max", "med", "values"}: see schemas RankSummary

# A Stat a detector keeps in its state: (n, sum, min, max, med, values or None). A tuple of numbers,
# which the cyclic collector stops tracking once it has looked at it; a Stat dict and its list of
# values stay tracked. Held for a 60 s window per rank, they were most of a big job's tracked
# objects (4,096 ranks, 40 s of event time: 937,000 tracked, 408,000 once packed), and the
# collector's cost per raw event grew with the job.
# After a snapshot's JSON round trip it is a list of the same items; the functions below read both.
PackedStat = tuple[int, float, float, float, float, tuple[float, ...] | None]


def stat_of(values: list[float], *, keep_values: bool = True) -> Stat | None:
    """The Stat of some values (None for none); `keep_values=False` leaves the values out (a
    field read as one bucket's median only)."""
    # A rank summary makes ~17 of these per rank per bucket: `median` inlined, on one sorted copy.
    finite = [v for v in values if v is not None and _isfinite(v)]
    n = len(finite)
    if not n:
        return None
    s = sorted(finite)
    mid = n // 2
    return {
        "n": n,
        "sum": math.fsum(finite),
        "min": min(finite),
        "max": max(finite),
        "med": s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2.0,
        "values": finite if keep_values and n <= MAX_VALUES else None,
    }


def stat_packed(stat: Stat | Sequence[Any] | None) -> PackedStat | None:
    """The form of a Stat a detector keeps (see `PackedStat`): from a Stat dict, or from a packed
    Stat read back from a snapshot (a list)."""
    if not stat:
        return None
    n, total, lo, hi, med, values = _packed(stat)
    return (int(n), float(total), float(lo), float(hi), float(med), None if values is None else tuple(values))


def _packed(stat: Stat | Sequence[Any]) -> Sequence[Any]:
    """A Stat dict or a packed one (tuple, or list after JSON) as the packed items."""
    if isinstance(stat, dict):
        return (stat["n"], stat["sum"], stat["min"], stat["max"], stat["med"], stat.get("values"))
    return stat


def stat_median(stats: Sequence[Stat | Sequence[Any] | None]) -> float | None:
    """The median over buckets (Stats, packed or not): exact from the values when every bucket
    kept them, else the count-weighted median of the buckets' medians."""
    present = [_packed(s) for s in stats if s]
    if not present:
        return None
    if all(s[5] is not None for s in present):
        return median([v for s in present for v in s[5]])
    weighted = sorted((float(s[4]), int(s[0])) for s in present)
    half = sum(n for _, n in weighted) / 2
    seen = 0
    for value, n in weighted:
        seen += n
        if seen >= half:
            return value
    return weighted[-1][0]


def stat_mean(stats: Sequence[Stat | Sequence[Any] | None]) -> float | None:
    """The mean over buckets (Stats, packed or not; exact: from sums and counts)."""
    present = [_packed(s) for s in stats if s]
    n = sum(int(s[0]) for s in present)
    return math.fsum(float(s[1]) for s in present) / n if n else None
