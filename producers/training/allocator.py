"""The CUDA caching allocator's health, read from `torch.cuda.memory_stats()` at a bounded cost.

An allocation the caching allocator cannot serve from its cache makes it free every cached block
and retry `cudaMalloc` (`num_alloc_retries`): a run near its memory limit or fragmenting its cache
(reserved far above allocated) does this over and over, each retry a device-wide synchronisation,
long before a CUDA OOM. The probe reads the counters on the training thread at most once per
`interval_s` (default 10 s, `RANKSIGHT_ALLOCATOR_S`; 0 turns it off): one C++ call returning a
dict, no device synchronisation. It never imports torch: a process that has not imported it, has
no CUDA or has not initialised it reports nothing. The values ride on the next StepCompleted
(`alloc_retries` cumulative since the process started, `mem_allocated_bytes`,
`mem_reserved_bytes`); the `allocator_churn` rule pages on retries that keep growing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["AllocatorProbe", "torch_memory_stats"]

# memory_stats() key -> StepCompleted field
_FIELDS = {
    "num_alloc_retries": "alloc_retries",
    "allocated_bytes.all.current": "mem_allocated_bytes",
    "reserved_bytes.all.current": "mem_reserved_bytes",
}


def torch_memory_stats() -> Mapping[str, Any] | None:
    """The current device's allocator counters, or None when torch/CUDA is not in use in this process."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return None
    try:
        if not cuda.is_available() or not cuda.is_initialized():
            return None
        stats: Mapping[str, Any] = cuda.memory_stats()
    except Exception:  # a driver error here must not reach the training loop
        return None
    return stats


class AllocatorProbe:
    """At most one allocator read per interval; the fields for the step it lands on."""

    def __init__(
        self,
        mono_ns: Callable[[], int],
        *,
        interval_s: float = 10.0,
        stats: Callable[[], Mapping[str, Any] | None] = torch_memory_stats,
    ) -> None:
        self._mono_ns = mono_ns
        self._interval_ns = int(interval_s * 1e9)
        self._stats = stats
        self._next_ns: int | None = None
        self.reads = 0  # how many times the allocator was read (the cost is bounded by the interval)

    def sample(self) -> dict[str, int] | None:
        """The allocator fields when a read is due and the allocator answers; else None."""
        if self._interval_ns <= 0:
            return None
        now = self._mono_ns()
        if self._next_ns is not None and now < self._next_ns:
            return None
        self._next_ns = now + self._interval_ns
        self.reads += 1
        try:
            stats = self._stats()
        except Exception:  # whatever the reader raises never reaches the training loop
            return None
        if not stats:
            return None
        out = {
            field: int(stats[key])
            for key, field in _FIELDS.items()
            if isinstance(stats.get(key), (int, float)) and stats[key] >= 0
        }
        return out or None
