"""Per-step cost of the training SDK on the training thread: a step with 4 segments + record, vs an empty loop.

    .venv/bin/python bench/bench_sdk.py [--steps 200000]

The reporter publishes to an in-memory publisher, so only the SDK's own work is measured (the
background thread still converts and validates each event, competing for the GIL as it would).
"""

from __future__ import annotations

import argparse
import time

from producers.publisher import MemoryPublisher
from producers.training import Reporter


def _empty(steps: int) -> float:
    t0 = time.perf_counter()
    for step in range(steps):
        for _ in range(4):
            pass
        _ = step
    return time.perf_counter() - t0


def _reported(reporter: Reporter, steps: int) -> float:
    t0 = time.perf_counter()
    for step in range(steps):
        with reporter.step(step) as s:
            with s.segment("data_wait"):
                pass
            with s.segment("forward"):
                pass
            with s.segment("backward"):
                pass
            with s.segment("optimizer"):
                pass
            s.record(loss=0.5, lr=1e-4, grad_norm=1.0, samples=32, tokens=4096)
    return time.perf_counter() - t0


def main() -> None:
    """Print microseconds per step, with and without the SDK."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200_000)
    args = parser.parse_args()
    publisher = MemoryPublisher(validate=False)
    reporter = Reporter("bench", 0, publisher=publisher, bind=False, env={}, max_pending=10_000_000)
    _reported(reporter, 2000)  # warm-up
    empty = _empty(args.steps)
    sdk = _reported(reporter, args.steps)
    # Again with the background thread parked: the training thread's own work, without GIL sharing
    # (in real training the publisher thread mostly runs while the training thread is inside torch ops).
    alone = Reporter("bench", 0, publisher=publisher, bind=False, env={}, max_pending=10_000_000)
    alone._stop.set()
    alone._thread.join()
    own = _reported(alone, args.steps)
    alone._drain()
    reporter.close(timeout=120)
    per_step = (sdk - empty) / args.steps * 1e6
    print(f"steps: {args.steps}")
    print(f"empty loop:                         {empty / args.steps * 1e6:8.2f} us/step")
    print(f"step + 4 segments + record:         {sdk / args.steps * 1e6:8.2f} us/step")
    print(f"SDK overhead (with publish thread): {per_step:8.2f} us/step (target < 50)")
    print(f"SDK overhead (training thread only):{(own - empty) / args.steps * 1e6:8.2f} us/step")
    print(f"events published:      {reporter.stats['published']}, sdk_errors {reporter.stats['sdk_errors']}")


if __name__ == "__main__":
    main()
