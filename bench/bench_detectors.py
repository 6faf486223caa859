"""Detector throughput in offline replay, next to bare container decoding of the same file (the limit).

    .venv/bin/python bench/bench_detectors.py [--scenario mixed] [--seed 0]

Prints events/s for: decoding the Avro container file alone, and decoding plus the whole
detection engine (every detector, the alert tracker, routing, window statistics). Then the same
file with one record stamped 2199 injected mid-stream (a node whose clock jumped): its alerts,
late drops and rejections next to the clean run's, which must match but for `clock_skew`.

The baseline printed next to the numbers was measured before the event-time guard (commit
e28cc68) on the shared 2-core development machine; wall-clock numbers there vary by +-30 % with
load, so compare runs made back to back (docs/detectors.md#benchmark).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from producers.simulator import load_scenario, simulate
from schemas.files import iter_container, write_container
from schemas.records import Event
from streams.alerting.routing import load_router
from streams.config import load_config
from streams.offline.detection import DetectionEngine
from streams.offline.replay import replay_offline

Y2199 = 7_226_582_400_000  # 2199-01-01T00:00:00Z
# Before the event-time guard (e28cc68), mixed seed 0, median of 7 runs on the shared machine.
BASELINE_REPLAY_EVENTS_S = 13_227
BASELINE_2199 = "hangs: ImbalanceDetector.advance walked window by window towards 2199 (killed after 180 s)"


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
        print(
            f"decode + detect (replay):      {count / replay_s:>10,.0f} events/s  ({replay_s:.2f} s)"
            f"   baseline {BASELINE_REPLAY_EVENTS_S:,} events/s"
        )
        detect_s = max(replay_s - decode_s, 1e-9)
        print(f"detectors alone (difference):  {count / detect_s:>10,.0f} events/s")
        print(
            f"outputs: {outputs:,} (alerts firing {engine.stats['alerts_firing']}, derived {engine.stats['derived']:,})"
        )
        print(f"snapshot: {len(engine.snapshot()) / 1024:.1f} KiB compressed")

        bad_path = Path(tmp) / "bad-clock.avro"
        events = list(iter_container(path))
        at = next(i for i in range(len(events) // 2, len(events)) if events[i].type == "StepCompleted")
        events.insert(at + 1, Event("StepCompleted", {**events[at].record, "ts": Y2199}))
        write_container(bad_path, events)
        bad = DetectionEngine(load_config(None), load_router())
        t = time.perf_counter()
        sum(1 for _ in replay_offline([bad_path], engine=bad))
        bad_s = time.perf_counter() - t
        print(f"with one 2199 record injected: {len(events) / bad_s:>10,.0f} events/s  ({bad_s:.2f} s)")
        print(f"  baseline: {BASELINE_2199}")
        for name, eng in (("clean", engine), ("2199 ", bad)):
            rules = {r: c["firing"] for r, c in sorted(eng.stats["by_rule"].items())}
            print(
                f"  {name}: firing {eng.stats['alerts_firing']}, late dropped {eng.stats['late_dropped']:,}, "
                f"rejected {eng.stats['rejected']}, by rule {rules}"
            )


if __name__ == "__main__":
    main()
