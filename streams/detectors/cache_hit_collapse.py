"""Rule `cache_hit_collapse`: the share of reads a rank's local cache serves fell far below the run's normal.

Category `data`, suspected layer `storage`. Per rank (or per node: a node-local cache lost,
evicted or remounted), from DataLoaderSample `cache_hit_ratio`: the recent ratio is at least
`drop` (absolute) below the run's normal and below `relative` x it, for `sustain_samples` samples
in a row. Every miss is a read from remote storage: the alert says whether the GPUs already wait
for it. See `loader_signal.py` for the baseline, grouping and GPU-wait verdict.
"""

from __future__ import annotations

from typing import Any, ClassVar

from streams.detectors.catalogue import catalogued
from streams.detectors.loader_signal import LOADER_DEFAULTS, LoaderSignalDetector

__all__ = ["DEFAULTS", "CacheHitCollapseDetector"]

DEFAULTS: dict[str, Any] = {
    **LOADER_DEFAULTS,  # the shared knobs (baseline, sustain, node grouping, GPU wait)
    "drop": 0.25,  # the hit ratio fell at least this much (absolute, 0..1)...
    "relative": 0.75,  # ...and below this fraction of its normal
}


CACHE_HIT_COLLAPSE = catalogued("cache_hit_collapse")


class CacheHitCollapseDetector(LoaderSignalDetector, rule=CACHE_HIT_COLLAPSE, stage="rank"):
    """The cache-hit ratio collapsing against the run's own baseline, per rank or node."""

    metrics: ClassVar[tuple[str, ...]] = ("cache_hit_ratio",)

    def deviates(self, metric: str, recent: float, ref: float) -> bool:
        """At least `drop` lower and below `relative` x the normal."""
        return ref - recent >= float(self.p["drop"]) and recent <= ref * float(self.p["relative"])

    def describe(self, metric: str, recent: float, ref: float) -> str:
        """`cache hits 21 % of reads, normally 92 %`."""
        return f"cache hits {recent:.0%} of reads, normally {ref:.0%}"
