"""Rule `file_open_drop`: a rank's loader opens files (or objects) far more slowly than the run's normal.

Category `data`, suspected layer `storage`. Per rank (or per node), from DataLoaderSample
`file_opens_s`: the files opened per batch the loop took (`file_opens_s x interval_s / batches`)
are at most `ratio` x the run's normal for `sustain_samples` samples in a row, while the loop is
asking for data (a sample with no batch, an evaluation or a checkpoint pause, is not judged). Per
batch, not per second: a job slowed by anything else (a straggler, contention, a slow collective)
takes fewer batches and so opens fewer files, which is no storage fault (per second, 5 of 1,000
generated cases paged the data team for it). A mount that hangs on `open()`, a metadata server that throttles,
or a listing that stalls all show here before the loader runs dry; the alert says whether the GPUs
already wait. See `loader_signal.py` for the baseline, grouping and GPU-wait verdict.
"""

from __future__ import annotations

from typing import Any, ClassVar

from streams.detectors.catalogue import catalogued
from streams.detectors.loader_signal import LOADER_DEFAULTS, LoaderSignalDetector

__all__ = ["DEFAULTS", "FileOpenDropDetector"]

DEFAULTS: dict[str, Any] = {
    **LOADER_DEFAULTS,  # the shared knobs (baseline, sustain, node grouping, GPU wait)
    "ratio": 0.4,  # file opens per batch at most this fraction of the run's normal is a drop
    "min_normal_per_s": 0.2,  # a loader that normally opens fewer files per second (at the sample's pace) is not judged
}


FILE_OPEN_DROP = catalogued("file_open_drop")


class FileOpenDropDetector(LoaderSignalDetector, rule=FILE_OPEN_DROP, stage="rank"):
    """The file-open rate dropping against the run's own baseline, per rank or node."""

    metrics: ClassVar[tuple[str, ...]] = ("file_opens_s",)

    def metric_value(self, metric: str, r: dict[str, Any]) -> float | None:
        """Files opened per batch taken in the sample (None without batches: nothing asked for)."""
        opens, batches, interval = r.get(metric), r.get("batches"), r.get("interval_s")
        if opens is None or not batches or not interval:
            return None
        return float(opens) * float(interval) / float(batches)

    def reference(self, metric: str, hist: list[float], r: dict[str, Any]) -> float | None:
        """The run's normal opens per batch, where that is a rate worth judging at the sample's pace."""
        ref = super().reference(metric, hist, r)
        if ref is None:
            return None
        rate = ref * float(r.get("batches") or 0) / float(r.get("interval_s") or 1.0)
        return ref if rate >= float(self.p["min_normal_per_s"]) else None

    def deviates(self, metric: str, recent: float, ref: float) -> bool:
        """At most `ratio` x the normal opens per batch."""
        return recent <= ref * float(self.p["ratio"])

    def describe(self, metric: str, recent: float, ref: float) -> str:
        """`file opens 0.4 per batch, 12 % of the run's normal 3.3`."""
        return (
            f"file opens {recent:.3g} per batch, {recent / ref:.0%} of the run's normal {ref:.3g} per batch"
        )
