"""Publisher throughput against a real broker, for a few librdkafka settings (linger, compression).

    KAFKA_BOOTSTRAP=host:9092 .venv/bin/python bench/bench_publisher.py [--events 100000]
    .venv/bin/python bench/bench_publisher.py            # starts a local broker for the run

Publishes GpuSample events (the agent's bulk) as fast as publish() accepts them, then flushes;
reports events/s end to end and the mean publish() call time on the caller's thread.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from producers.agent import FakeNvml, GpuSampler
from producers.publisher import open_publisher
from ranksight.signals import run_main
from schemas.records import Event


@contextlib.contextmanager
def _broker() -> Iterator[str]:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    from infra.kafka.local import LocalKafka, ensure_jars

    with tempfile.TemporaryDirectory() as tmp:
        broker = LocalKafka(Path(tmp) / "kafka", libs=ensure_jars())
        broker.start()
        try:
            yield broker.bootstrap
        finally:
            broker.stop()


def main() -> None:
    """Print one line per configuration."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    sampler = GpuSampler(FakeNvml(gpus=8), cluster="bench", node="bench-node")
    records = [Event("GpuSample", r) for r in sampler.sample(1_700_000_000_000, 1.0)]
    configs = [("lz4", 5), ("lz4", 20), ("zstd", 20), ("none", 20)]
    with _broker() as bootstrap:
        from infra.kafka.topics import create_topics

        for compression, linger in configs:
            prefix = f"bench{uuid.uuid4().hex[:6]}."
            create_topics(bootstrap, prefix=prefix)
            with tempfile.TemporaryDirectory() as spool:
                publisher = open_publisher(
                    "kafka",
                    kafka_conf={"bootstrap.servers": bootstrap},
                    topic_prefix=prefix,
                    spool_dir=Path(spool),
                    compression=compression,
                    linger_ms=linger,
                )
                t0 = time.perf_counter()
                for i in range(args.events):
                    publisher.publish(records[i % len(records)])
                t_publish = time.perf_counter() - t0
                left = publisher.flush(120)
                total = time.perf_counter() - t0
                stats = publisher.stats
                publisher.close()
            print(
                f"compression={compression:<5} linger.ms={linger:<3} {args.events / total:9.0f} events/s end to end, "
                f"publish() {t_publish / args.events * 1e6:5.1f} us/call, undelivered {left}, "
                f"spooled {stats['spooled']}, queue_full {stats['queue_full']}"
            )


if __name__ == "__main__":
    # SIGINT/SIGTERM unwind through the finally blocks that stop the broker and the processes.
    run_main(main, name="bench_publisher")
