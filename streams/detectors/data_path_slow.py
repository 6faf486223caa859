"""Rule `data_path_slow`: a rank's storage reads or batch preparation got slower than the run's own normal.

Category `data`. Per rank (or per node, when most of a node's ranks are affected: its storage or
page cache), from DataLoaderSample: `read_latency_s` (one storage read, file open or object GET
to first byte) or `batch_prep_s` (a worker fetching, decoding and collating a batch) is at least
`ratio` times its normal for the run and higher by at least `min_increase_s` (resp.
`prep_min_increase_s`), for `sustain_samples` samples in a row. The finding says whether the
GPUs waited (the steps' data wait grew) or the prefetching still hides it; suspected layer
`storage` for reads, `data` for preparation (CPU, decoding). See `loader_signal.py` for the
baseline, the node grouping and the GPU-wait verdict.
"""

from __future__ import annotations

from typing import Any, ClassVar

from streams.detectors.catalogue import catalogued
from streams.detectors.loader_signal import LOADER_DEFAULTS, LoaderSignalDetector

__all__ = ["DEFAULTS", "DataPathSlowDetector"]

DEFAULTS: dict[str, Any] = {
    **LOADER_DEFAULTS,  # the shared knobs (baseline, sustain, node grouping, GPU wait)
    "ratio": 2.0,  # a read or a batch this many times slower than the run's normal...
    "min_increase_s": 0.002,  # ...and a read at least this much slower (noise on sub-ms reads is no finding)
    "prep_min_increase_s": 0.02,  # ...or a batch at least this much slower to prepare
}

_NAMES = {"read_latency_s": "storage read latency", "batch_prep_s": "batch preparation time"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


DATA_PATH_SLOW = catalogued("data_path_slow")


class DataPathSlowDetector(LoaderSignalDetector, rule=DATA_PATH_SLOW, stage="rank"):
    """Read latency or batch preparation time rising against the run's own baseline, per rank or node."""

    metrics: ClassVar[tuple[str, ...]] = ("read_latency_s", "batch_prep_s")

    def deviates(self, metric: str, recent: float, ref: float) -> bool:
        """`ratio` x the normal and the minimum increase of the metric."""
        floor = self.p["min_increase_s"] if metric == "read_latency_s" else self.p["prep_min_increase_s"]
        return recent >= ref * float(self.p["ratio"]) and recent - ref >= float(floor)

    def describe(self, metric: str, recent: float, ref: float) -> str:
        """`storage read latency 16 ms, 4.0x the run's normal 4 ms`."""
        return f"{_NAMES[metric]} {_ms(recent)}, {recent / ref:.1f}x the run's normal {_ms(ref)}"

    def layer_of(self, metric: str) -> str:
        """Reads point at storage; preparation at the loader's CPU work."""
        return "storage" if metric == "read_latency_s" else "data"
