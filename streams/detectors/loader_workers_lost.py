"""Rule `loader_workers_lost`: fewer data-loader worker processes are alive than the loader was started with.

Category `data`, suspected layer `data`. Per rank (or per node: the node's OOM killer or a
memory limit taking workers), from DataLoaderSample `workers` (live worker processes, as the SDK
counts them) against `workers_expected` (the loader's `num_workers`; when a producer does not send
it, the most workers the rank had alive in this run): at least `min_lost` fewer, for
`sustain_samples` samples in a row (a worker retiring at the end of an epoch's shard is brief).
Live worker health, not the configured number: a loader that lost workers prepares batches more
slowly, and the alert says whether the GPUs already wait for them. Samples of a loop that received
no batch are judged too: a loader whose workers all died delivers none.
"""

from __future__ import annotations

from typing import Any, ClassVar

from streams.detectors.catalogue import catalogued
from streams.detectors.loader_signal import LOADER_DEFAULTS, LoaderSignalDetector

__all__ = ["DEFAULTS", "LoaderWorkersLostDetector"]

DEFAULTS: dict[str, Any] = {
    **LOADER_DEFAULTS,  # the shared knobs (sustain, node grouping, GPU wait)
    "min_lost": 1,  # this many workers fewer than expected is a loss
    "min_history": 1,  # the reference is the configured count: one sample is enough
}


LOADER_WORKERS_LOST = catalogued("loader_workers_lost")


class LoaderWorkersLostDetector(LoaderSignalDetector, rule=LOADER_WORKERS_LOST, stage="rank"):
    """Live loader workers below the configured count (or the run's own maximum), per rank or node."""

    metrics: ClassVar[tuple[str, ...]] = ("workers",)
    needs_batches: ClassVar[bool] = False

    def reference(self, metric: str, hist: list[float], r: dict[str, Any]) -> float | None:
        """The configured worker count, else the most seen alive in this run; None for an in-process loader."""
        expected = r.get("workers_expected")
        if expected is not None:
            return float(expected) if expected > 0 else None
        return max(hist) if hist and max(hist) > 0 else None

    def deviates(self, metric: str, recent: float, ref: float) -> bool:
        """At least `min_lost` workers fewer than the reference."""
        return ref - recent >= float(self.p["min_lost"])

    def describe(self, metric: str, recent: float, ref: float) -> str:
        """`3 of 8 data-loader workers alive`."""
        return f"{recent:.0f} of {ref:.0f} data-loader workers alive"
