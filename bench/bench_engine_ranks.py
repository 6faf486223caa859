"""Engine events/s for one job of 32 ranks and one of 512 ranks (issue 9.4: per-event cost stays flat).

Usage: python bench/bench_engine_ranks.py [--minutes 5] [--ranks 32,512]
Simulates a straggler job of N ranks (8 GPUs per node), runs the offline `DetectionEngine` over
it, and prints events/s and microseconds per event for each size, next to the smallest size.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from producers.simulator import load_scenario, simulate
from streams.engine import DetectionEngine

_SCENARIO = """
name: ranks_{ranks}
description: "One job of {ranks} ranks with a straggler, for the engine's per-event cost."
duration: {minutes}m
cluster: {{name: sim-a, nodes: {nodes}, gpus_per_node: 8, gpu_class: H100-80GB}}
jobs:
  - {{id: pretrain-0001, team: llm-pretrain, owner: alice, nodes: {nodes}}}
faults:
  - {{type: straggler_gpu, job: pretrain-0001, rank: 5, start: 2m, duration: 2m, magnitude: 1.5}}
"""


def _run(ranks: int, minutes: float) -> tuple[int, float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenario.yaml"
        path.write_text(_SCENARIO.format(ranks=ranks, minutes=minutes, nodes=ranks // 8))
        events = list(simulate(load_scenario(path), seed=0).events())
    engine = DetectionEngine()
    t0 = time.perf_counter()
    out = engine.run(events)
    elapsed = time.perf_counter() - t0
    return len(events), elapsed, sum(1 for e in out if e.type == "Alert")


def main() -> None:
    """Run each size once and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--ranks", default="32,512", help="comma-separated rank counts (multiples of 8)")
    args = parser.parse_args()
    base: float | None = None
    for ranks in (int(r) for r in args.ranks.split(",")):
        n, elapsed, alerts = _run(ranks, args.minutes)
        per_event_us = 1e6 * elapsed / n
        base = per_event_us if base is None else base
        print(
            f"{ranks:>5} ranks: {n:,} events in {elapsed:.2f} s = {n / elapsed:,.0f} events/s,"
            f" {per_event_us:.1f} us/event ({per_event_us / base:.2f}x the smallest), {alerts} alerts"
        )


if __name__ == "__main__":
    main()
