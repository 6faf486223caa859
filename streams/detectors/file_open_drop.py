"""Rule `file_open_drop`: a rank's loader opens files (or objects) far more slowly than the run's normal.

Category `data`, suspected layer `storage`. Per rank (or per node), from DataLoaderSample
`file_opens_s`: the recent rate is at most `ratio` x the run's normal for `sustain_samples`
samples in a row, while the loop is asking for data (a sample with no batch, an evaluation or a
checkpoint pause, is not judged). A mount that hangs on `open()`, a metadata server that throttles,
or a listing that stalls all show here before the loader runs dry; the alert says whether the GPUs
already wait. See `loader_signal.py` for the baseline, grouping and GPU-wait verdict.
"""

from __future__ import annotations

from typing import Any, ClassVar

from streams.detectors.loader_signal import LOADER_DEFAULTS, LoaderSignalDetector

__all__ = ["DEFAULTS", "FileOpenDropDetector"]

DEFAULTS: dict[str, Any] = {
    **LOADER_DEFAULTS,  # the shared knobs (baseline, sustain, node grouping, GPU wait)
    "ratio": 0.4,  # file opens per second at most this fraction of the run's normal is a drop
    "min_normal_per_s": 0.2,  # a loader that normally opens fewer files per second is not judged
}


class FileOpenDropDetector(LoaderSignalDetector):
    """The file-open rate dropping against the run's own baseline, per rank or node."""

    rule: ClassVar[str] = "file_open_drop"
    stage: ClassVar[str] = "rank"
    rules: ClassVar[tuple[str, ...]] = ("file_open_drop",)
    metrics: ClassVar[tuple[str, ...]] = ("file_opens_s",)
    layer: ClassVar[str] = "storage"
    invariant: ClassVar[str] = "a rank's loader keeps opening files at the run's own normal rate"

    def defaults(self) -> dict[str, Any]:
        """This rule's knobs."""
        return DEFAULTS

    def deviates(self, metric: str, recent: float, ref: float) -> bool:
        """At most `ratio` x a normal rate that is worth judging."""
        return ref >= float(self.p["min_normal_per_s"]) and recent <= ref * float(self.p["ratio"])

    def describe(self, metric: str, recent: float, ref: float) -> str:
        """`file opens 0.4/s, 12 % of the run's normal 3.3/s`."""
        return f"file opens {recent:.3g}/s, {recent / ref:.0%} of the run's normal {ref:.3g}/s"
