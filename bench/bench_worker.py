"""Events/s of `ranksight worker` through Kafka vs the offline engine on the same events (the limit).

Usage: KAFKA_BOOTSTRAP=127.0.0.1:9092 python bench/bench_worker.py [--scenario nan_loss]
(without KAFKA_BOOTSTRAP a local broker is started in a temporary directory and stopped after).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from infra.kafka.topics import create_topics, delete_topics, prefixed
from producers.publisher import open_publisher
from producers.simulator import load_scenario, simulate
from streams.engine import DetectionEngine

_PROCESSED = re.compile(r"'processed': (\d+)")


def _bench(bootstrap: str, scenario: str, timeout_s: float) -> None:
    events = list(simulate(load_scenario(scenario), seed=0).events())
    t0 = time.perf_counter()
    DetectionEngine().run(events)
    offline_s = time.perf_counter() - t0
    print(
        f"offline engine: {len(events)} events in {offline_s:.2f} s = {len(events) / offline_s:,.0f} events/s"
    )

    prefix = f"bench{uuid.uuid4().hex[:6]}."
    create_topics(bootstrap, prefix=prefix)
    try:
        pub = open_publisher("kafka", kafka_conf={"bootstrap.servers": bootstrap}, topic_prefix=prefix)
        t0 = time.perf_counter()
        for e in events:
            pub.publish(e)
        pub.flush(120)
        pub.close()
        print(f"publish: {len(events) / (time.perf_counter() - t0):,.0f} events/s")
        with tempfile.TemporaryDirectory() as home:
            env = {
                **os.environ,
                "KAFKA_BOOTSTRAP": bootstrap,
                "RANKSIGHT_TOPIC_PREFIX": prefix,
                "RANKSIGHT_HOME": home,
            }
            log_path = Path(home) / "worker.log"
            with open(log_path, "wb") as log:
                start = time.perf_counter()
                proc = subprocess.Popen(
                    [
                        str(Path(sys.executable).parent / "ranksight"),
                        "worker",
                        "--log-level",
                        "info",
                        "--stats-interval",
                        "1",
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            first = None
            try:
                while time.perf_counter() - start < timeout_s:
                    time.sleep(0.5)
                    counts = [int(m) for m in _PROCESSED.findall(log_path.read_text(errors="replace"))]
                    done = counts[-1] if counts else 0
                    if done and first is None:
                        first = time.perf_counter()
                    if done >= len(events):
                        break
                end = time.perf_counter()
            finally:
                proc.terminate()
                proc.wait(30)
            if first is None or done < len(events):
                print(f"worker did not finish in {timeout_s:.0f} s ({done} of {len(events)} processed)")
                return
            # Progress lines come once a second: the timings are +-1 s.
            print(f"worker: first event processed {first - start:.1f} s after start (startup + recovery)")
            print(
                f"worker: {len(events)} events in {end - start:.1f} s from start = {len(events) / (end - start):,.0f} events/s;"
                f" {len(events) / max(end - first, 1e-9):,.0f} events/s after startup"
            )
    finally:
        delete_topics(bootstrap, prefixed(prefix).values())


def main() -> None:
    """Run the benchmark once and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", default="nan_loss")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        _bench(bootstrap, args.scenario, args.timeout)
        return
    from infra.kafka.local import LocalKafka, ensure_jars

    with tempfile.TemporaryDirectory() as tmp, LocalKafka(Path(tmp), libs=ensure_jars()) as broker:
        _bench(broker.bootstrap, args.scenario, args.timeout)


if __name__ == "__main__":
    main()
