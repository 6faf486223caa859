"""Offline simulator throughput: events/s of generation next to bare `write_container` of the same events.

Run: `.venv/bin/python bench/bench_simulator.py [scenario ...] [--seed N]` (default: healthy, mixed).
Prints numbers only; never fails on timing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from producers.simulator import load_scenario, simulate
from schemas.files import write_container


def bench(name: str, seed: int) -> None:
    """Time generation (simulate + sort) and container writing of one scenario."""
    sc = load_scenario(name)
    t0 = time.perf_counter()
    events = list(simulate(sc, seed).events())
    gen_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.avro"
        t1 = time.perf_counter()
        write_container(path, events)
        write_s = time.perf_counter() - t1
        size = path.stat().st_size
    n = len(events)
    print(
        f"{name:24s} {n:>9,} events ({sc.duration / 60:g} min, {sum(j.world_size for j in sc.jobs)} ranks)  "
        f"generate {gen_s:6.2f}s = {n / gen_s:>9,.0f} ev/s   "
        f"write_container {write_s:6.2f}s = {n / write_s:>9,.0f} ev/s   "
        f"end-to-end {n / (gen_s + write_s):>9,.0f} ev/s   file {size / 1e6:.1f} MB"
    )


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scenarios", nargs="*", default=["healthy", "mixed"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name in args.scenarios:
        bench(name, args.seed)


if __name__ == "__main__":
    main()
