"""Publish -> alert latency of `ranksight worker` for an XID at a steady input rate (issue 9.3).

Usage: KAFKA_BOOTSTRAP=127.0.0.1:9092 python bench/bench_latency.py [--nodes 16] [--seconds 90]
(without KAFKA_BOOTSTRAP a local broker is started in a temporary directory and stopped after).

A live job on `--nodes` nodes x 8 GPUs is simulated from now on and published in real time (its
events at their event time: about 17 events/s per GPU-node pair of steps, GPU and host samples).
Every second one more GPU reports an XID in its sample: each is a new `xid_error` alert. The bench
notes when each XID sample was handed to the producer and when its alert arrived on rs.alerts,
and prints p50/p95/p99, the input rate, and the worker's lag at the end. The target in the issue:
p50 <= 1 s, p95 <= 5 s.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from infra.kafka.topics import create_topics, delete_topics, prefixed
from producers.publisher import open_publisher
from producers.simulator import load_scenario, simulate
from schemas.codec import Codec
from schemas.records import Event
from schemas.topics import ALERTS

_ASSIGNED = re.compile(r"assigned partitions \[([\d, ]*)\]")
_SCENARIO = """
name: latency
description: "A live job for the latency bench."
duration: {seconds}s
start: "{start}"
cluster: {{name: sim-a, nodes: {nodes}, gpus_per_node: 8, gpu_class: H100-80GB}}
jobs:
  - {{id: pretrain-0001, team: llm-pretrain, owner: alice, nodes: {nodes}}}
"""


def _events(nodes: int, seconds: int, lead_s: float) -> list[Event]:
    """The live job starting `lead_s` from now; GPU k of the job reports XID 79 from second 10 + k."""
    start_ms = int((time.time() + lead_s) * 1000)
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start_ms / 1000)) + f".{start_ms % 1000:03d}Z"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "latency.yaml"
        path.write_text(_SCENARIO.format(seconds=seconds, start=start, nodes=nodes))
        events = list(simulate(load_scenario(path), seed=0).events())
    events.sort(key=lambda e: int(e.record.get("ts", 0)))
    t0 = int(events[0].record["ts"])
    gpus = sorted({(e.record["node"], e.record["gpu_index"]) for e in events if e.type == "GpuSample"})
    chosen: set[tuple[str, int]] = set()
    out = []
    for e in events:
        if e.type == "GpuSample":
            k = (int(e.record["ts"]) - t0) // 1000 - 10
            gpu = (e.record["node"], e.record["gpu_index"])
            if 0 <= k < len(gpus) and gpus[k] == gpu and gpu not in chosen:
                chosen.add(gpu)
                e = Event("GpuSample", {**e.record, "xid": 79})
        out.append(e)
    return out


def _bench(bootstrap: str, nodes: int, seconds: int, timeout_s: float) -> None:
    prefix = f"lat{uuid.uuid4().hex[:6]}."
    create_topics(bootstrap, prefix=prefix)
    proc = None
    try:
        with tempfile.TemporaryDirectory() as home:
            log_path = Path(home) / "worker.log"
            env = {
                **os.environ,
                "KAFKA_BOOTSTRAP": bootstrap,
                "RANKSIGHT_TOPIC_PREFIX": prefix,
                "RANKSIGHT_HOME": home,
            }
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [str(Path(sys.executable).parent / "ranksight"), "worker", "--log-level", "info",
                     "--stats-interval", "5"],
                    env=env, stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
            began = time.monotonic()
            while time.monotonic() - began < timeout_s:
                found = _ASSIGNED.findall(log_path.read_text(errors="replace"))
                if found and len([p for p in found[-1].split(",") if p.strip()]) == 6:
                    break
                time.sleep(0.5)
            print(f"worker: group settled {time.monotonic() - began:.1f} s after start")
            events = _events(nodes, seconds, lead_s=2.0)
            xids = {(e.record["node"], e.record["gpu_index"]) for e in events if e.record.get("xid")}
            published: dict[tuple[str, int], float] = {}
            arrived: dict[tuple[str, int], float] = {}
            stop = threading.Event()

            def read_alerts() -> None:
                consumer = Consumer(
                    {"bootstrap.servers": bootstrap, "group.id": f"{prefix}reader", "log_level": 0}
                )
                topic = prefix + ALERTS
                parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
                consumer.assign([TopicPartition(topic, p, 0) for p in parts])
                codec = Codec()
                while not stop.is_set():
                    msg = consumer.poll(0.1)
                    if msg is None or msg.error() is not None:
                        continue
                    r = codec.decode(msg.value() or b"").record
                    if r["rule"] == "xid_error" and r["status"] == "firing":
                        arrived.setdefault((r["node"], r["gpu_index"]), time.time())
                consumer.close()

            reader = threading.Thread(target=read_alerts, daemon=True)
            reader.start()
            pub = open_publisher(
                "kafka", kafka_conf={"bootstrap.servers": bootstrap, "linger.ms": 5}, topic_prefix=prefix
            )
            t_start = time.time()
            for e in events:
                delay = int(e.record["ts"]) / 1000 - time.time()
                if delay > 0:
                    time.sleep(delay)  # real time: each event when its event time comes
                pub.publish(e)
                if e.record.get("xid"):
                    published[(e.record["node"], e.record["gpu_index"])] = time.time()
            pub.flush(60)
            pub.close()
            rate = len(events) / (time.time() - t_start)
            deadline = time.time() + 60
            while len(arrived) < len(xids) and time.time() < deadline:
                time.sleep(0.2)
            stop.set()
            reader.join(10)
            lat = sorted(arrived[k] - published[k] for k in arrived if k in published)
            lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if "worker: " in ln]
            print(
                f"input: {len(events):,} events in real time at {rate:,.0f} events/s ({nodes} nodes x 8 GPUs)"
            )
            print(f"xid alerts: {len(lat)} of {len(xids)} arrived")
            if lat:
                q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else [lat[0]] * 99
                print(
                    f"publish -> alert: p50 {q[49]:.2f} s, p95 {q[94]:.2f} s, p99 {q[98]:.2f} s, max {lat[-1]:.2f} s"
                    " (issue 9.3 target: p50 <= 1 s, p95 <= 5 s)"
                )
            print("last progress line:", lines[-1].split("] ", 3)[-1] if lines else "none")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        delete_topics(bootstrap, prefixed(prefix).values())


def main() -> None:
    """Run the benchmark once and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=90)
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        _bench(bootstrap, args.nodes, args.seconds, args.timeout)
        return
    from infra.kafka.local import LocalKafka, ensure_jars

    with tempfile.TemporaryDirectory() as tmp, LocalKafka(Path(tmp), libs=ensure_jars()) as broker:
        _bench(broker.bootstrap, args.nodes, args.seconds, args.timeout)


if __name__ == "__main__":
    main()
