"""Per-batch cost of `reporter.wrap_loader` on the training thread, with and without fingerprints, vs a bare loop.

    .venv/bin/python bench/bench_loader.py [--batches 20000]

Batches are what a language-model DataLoader hands out: a dict of int64 `input_ids` and
`attention_mask` (8 x 4096) and a list of 8 source names, as numpy arrays (torch is not needed;
a torch tensor is sampled the same way, on its device). The reporter publishes to an in-memory
publisher, so only the SDK's own work is measured. Baseline: the SDK's 50 µs per-step target.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from producers.publisher import MemoryPublisher
from producers.training import Reporter
from producers.training.loader import batch_fingerprint

TARGET_US = 50.0


def _batches(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    distinct = [
        {
            "input_ids": rng.integers(0, 32000, size=(8, 4096), dtype=np.int64),
            "attention_mask": np.ones((8, 4096), dtype=np.int64),
            "source": [f"shard-{k}/doc-{j}" for j in range(8)],
        }
        for k in range(64)
    ]
    return [distinct[i % len(distinct)] for i in range(n)]


def _loop(loader: Any) -> float:
    t0 = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=20000)
    n = parser.parse_args().batches
    batches = _batches(n)
    bare = _loop(batches)
    reporter = Reporter("bench", 0, node="n", publisher=MemoryPublisher(), bind=False, env={})
    try:
        plain = _loop(reporter.wrap_loader(batches, fingerprint=False))
        hashed = _loop(reporter.wrap_loader(batches))
    finally:
        reporter.close()
    t0 = time.perf_counter()
    for b in batches[:2000]:
        batch_fingerprint(b)
    fp_us = (time.perf_counter() - t0) / min(n, 2000) * 1e6
    per = lambda s: (s - bare) / n * 1e6  # noqa: E731
    print(f"batches: {n} (dict of 2 x int64[8, 4096] + 8 strings)")
    print(f"wrap_loader, no fingerprint: {per(plain):.1f} µs per batch over a bare loop")
    print(
        f"wrap_loader, fingerprint:    {per(hashed):.1f} µs per batch (batch_fingerprint alone {fp_us:.1f} µs)"
    )
    print(f"baseline: {TARGET_US:.0f} µs per step (the SDK's target on the training thread)")


if __name__ == "__main__":
    main()
