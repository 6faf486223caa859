"""Detector throughput in offline replay, next to bare container decoding of the same file (the limit).

    .venv/bin/python bench/bench_detectors.py [--scenario mixed] [--seed 0]

Prints events/s for: decoding the Avro container file alone, and decoding plus the whole
detection engine (every detector, the alert tracker, routing, window statistics).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from producers.simulator import load_scenario, simulate
from schemas.files import iter_container, write_container
from streams.config import load_config
from streams.engine import DetectionEngine
from streams.replay import replay_offline
from streams.routing import load_router


def main() -> None:
    """Simulate a scenario to a file, then time decode-only and decode+detect over it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="mixed")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.avro"
        n = write_container(path, simulate(load_scenario(args.scenario), args.seed).events())
        print(f"scenario {args.scenario}: {n:,} events, {path.stat().st_size / 2**20:.1f} MiB")

        t = time.perf_counter()
        count = sum(1 for _ in iter_container(path))
        decode_s = time.perf_counter() - t
        print(f"decode only (iter_container):  {count / decode_s:>10,.0f} events/s  ({decode_s:.2f} s)")

        engine = DetectionEngine(load_config(None), load_router())
        t = time.perf_counter()
        outputs = sum(1 for _ in replay_offline([path], engine=engine))
        replay_s = time.perf_counter() - t
        print(f"decode + detect (replay):      {count / replay_s:>10,.0f} events/s  ({replay_s:.2f} s)")
        detect_s = max(replay_s - decode_s, 1e-9)
        print(f"detectors alone (difference):  {count / detect_s:>10,.0f} events/s")
        print(
            f"outputs: {outputs:,} (alerts firing {engine.stats['alerts_firing']}, derived {engine.stats['derived']:,})"
        )
        print(f"snapshot: {len(engine.snapshot()) / 1024:.1f} KiB compressed")


if __name__ == "__main__":
    main()
