"""Events/s of `ranksight worker` through Kafka vs the offline engine on the same events (the limit).

Usage: KAFKA_BOOTSTRAP=127.0.0.1:9092 python bench/bench_worker.py [--scenario nan_loss] [--workers 2]
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

_DONE = re.compile(r"'source_events': (\d+)")
_ASSIGNED = re.compile(r"assigned partitions \[([\d, ]*)\]")


def _bench(bootstrap: str, scenario: str, timeout_s: float, workers: int) -> None:
    sc = load_scenario(scenario)
    # Ending an hour ago: the worker rejects records more than a week behind their Kafka time.
    sc = sc.with_overrides(start_ms=int(time.time() * 1000) - int(sc.duration * 1000) - 3_600_000)
    events = list(simulate(sc, seed=0).events())
    t0 = time.perf_counter()
    DetectionEngine().run(events)
    offline_s = time.perf_counter() - t0
    print(
        f"offline engine: {len(events)} events in {offline_s:.2f} s = {len(events) / offline_s:,.0f} events/s"
    )

    prefix = f"bench{uuid.uuid4().hex[:6]}."
    create_topics(bootstrap, prefix=prefix)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with tempfile.TemporaryDirectory() as home:
            logs = []
            start = time.perf_counter()
            for i in range(workers):
                env = {
                    **os.environ,
                    "KAFKA_BOOTSTRAP": bootstrap,
                    "RANKSIGHT_TOPIC_PREFIX": prefix,
                    "RANKSIGHT_HOME": str(Path(home) / f"w{i}"),
                }
                log_path = Path(home) / f"worker-{i}.log"
                logs.append(log_path)
                with open(log_path, "wb") as log:
                    procs.append(
                        subprocess.Popen(
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
                    )

            def held() -> list[set[int]]:
                out = []
                for path in logs:
                    found = _ASSIGNED.findall(path.read_text(errors="replace")) if path.exists() else []
                    out.append({int(p) for p in found[-1].split(",") if p.strip()} if found else set())
                return out

            # Wait until the group is settled: every partition held by exactly one worker.
            while time.perf_counter() - start < timeout_s:
                parts = held()
                if all(parts) and sum(len(p) for p in parts) == 6 and len(set().union(*parts)) == 6:
                    break
                time.sleep(0.5)
            joined = time.perf_counter() - start
            print(f"{workers} worker(s): group settled {joined:.1f} s after start; partitions {held()}")
            pub = open_publisher("kafka", kafka_conf={"bootstrap.servers": bootstrap}, topic_prefix=prefix)
            t0 = time.perf_counter()
            for e in events:
                pub.publish(e)
            pub.flush(120)
            pub.close()
            print(f"publish: {len(events) / (time.perf_counter() - t0):,.0f} events/s")
            done = 0
            while time.perf_counter() - t0 < timeout_s:
                time.sleep(0.5)
                done = 0
                for path in logs:
                    counts = [int(m) for m in _DONE.findall(path.read_text(errors="replace"))]
                    done += counts[-1] if counts else 0
                if done >= len(events):
                    break
            end = time.perf_counter()
            if done < len(events):
                print(f"workers did not finish in {timeout_s:.0f} s ({done} of {len(events)} handled)")
                return
            # Progress lines come once a second: the timings are +-1 s.
            print(
                f"{workers} worker(s): {len(events)} events handled {end - t0:.1f} s after publishing started"
                f" = {len(events) / (end - t0):,.0f} events/s"
            )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        delete_topics(bootstrap, prefixed(prefix).values())


def main() -> None:
    """Run the benchmark once and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", default="nan_loss")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--workers", type=int, default=1, help="workers in the same group")
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        _bench(bootstrap, args.scenario, args.timeout, args.workers)
        return
    from infra.kafka.local import LocalKafka, ensure_jars

    with tempfile.TemporaryDirectory() as tmp, LocalKafka(Path(tmp), libs=ensure_jars()) as broker:
        _bench(broker.bootstrap, args.scenario, args.timeout, args.workers)


if __name__ == "__main__":
    main()
