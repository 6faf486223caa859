"""Sink throughput: Kafka -> decode -> ClickHouse (chDB), next to its parts measured bare.

Starts its own broker (infra/kafka/local.py) and chDB in a temporary directory, produces N
GpuSample and N StepCompleted events, then measures, one after the other:
  (a) a bare clickhouse-connect column insert of the same rows into chDB,
  (b) a bare confluent-kafka consumer loop reading the messages without decoding,
  (c) bare fastavro decoding of the message bodies,
  (d) the sink (`SinkConsumer`) end to end.
Prints rows/s, CPU seconds and peak RSS. Not part of the test suite.

    .venv/bin/python bench/bench_sink.py [--events 100000] [--batch-size 5000]
"""

from __future__ import annotations

import argparse
import io
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from fastavro import schemaless_reader

from infra.kafka.local import LocalKafka, ensure_jars
from infra.kafka.topics import create_topics
from schemas.codec import Codec
from schemas.records import default_schemas
from schemas.topics import DEADLETTER, TELEMETRY_GPU, TRAINING_STEPS, key_for, topic_for
from sinks.clickhouse import close, connect
from sinks.consumer import SinkConsumer
from sinks.ddl import migrate, table_for
from sinks.rows import event_row
from sinks.samples import sample_events


class Phase:
    """Wall time, CPU time and peak RSS of one measured phase."""

    def __init__(self, name: str, rows: int) -> None:
        self.name, self.rows = name, rows

    def __enter__(self) -> Phase:
        self._cpu = _cpu()
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = _cpu() - self._cpu
        self.rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def line(self) -> str:
        return (
            f"{self.name:<38} {self.rows / self.wall:>12,.0f} rows/s  {self.wall:7.2f} s wall  "
            f"{self.cpu:7.2f} s CPU  peak RSS {self.rss_mb:,.0f} MiB"
        )


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000, help="events per record type (2 types)")
    parser.add_argument("--batch-size", type=int, default=5000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rs-bench-") as tmp:
        kafka = LocalKafka(Path(tmp) / "kafka", libs=ensure_jars())
        kafka.start()
        try:
            _run(kafka.bootstrap, Path(tmp), args.events, args.batch_size)
        finally:
            kafka.stop()


def _run(bootstrap: str, tmp: Path, n: int, batch_size: int) -> None:
    prefix = "bench."
    create_topics(bootstrap, prefix=prefix)
    now = int(time.time() * 1000)
    events = sample_events("GpuSample", n, now) + sample_events("StepCompleted", n, now)
    codec = Codec()
    values = [codec.encode(e) for e in events]
    total = len(events)
    print(
        f"{total:,} events ({n:,} GpuSample + {n:,} StepCompleted), {sum(map(len, values)) / total:.0f} B each"
    )

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    for event, value in zip(events, values, strict=True):
        topic = topic_for(event.type)
        producer.produce(prefix + topic, key=key_for(topic, event.record), value=value)
        producer.poll(0)
    producer.flush(60)

    dsn = f"chdb://{tmp / 'chdb'}"
    client = connect(dsn)
    migrate(client)
    results: list[Phase] = []

    # (a) bare column insert of the same rows (tables shaped like the real ones)
    columns: dict[str, list[list[Any]]] = {}
    for offset, event in enumerate(events):
        spec, row = event_row(event)
        cols = columns.setdefault(spec.name, [[] for _ in spec.column_names])
        for col, v in zip(cols, [*row, "t", 0, offset], strict=True):
            col.append(v)
    for table in columns:
        client.command(f"CREATE TABLE bench_{table} AS {table}")
    with Phase(f"(a) bare chDB insert, {batch_size}/insert", total) as phase:
        for table, cols in columns.items():
            names = list(table_for("GpuSample" if table == "gpu_samples" else "StepCompleted").column_names)
            for start in range(0, len(cols[0]), batch_size):
                chunk = [c[start : start + batch_size] for c in cols]
                client.insert(f"bench_{table}", data=chunk, column_names=names, column_oriented=True)
    results.append(phase)
    del columns

    # (b) bare consumer loop, no decoding
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-bare", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([prefix + TELEMETRY_GPU, prefix + TRAINING_STEPS])
    seen = 0
    with Phase("(b) bare confluent-kafka consume", total) as phase:
        while seen < total:
            seen += sum(1 for m in consumer.consume(5000, 1.0) if m.error() is None)
    results.append(phase)
    consumer.close()

    # (c) bare fastavro decode of the bodies (single-object header skipped)
    schemas = default_schemas()
    parsed = {r.fingerprint: r.parsed for r in schemas.records.values()}
    with Phase("(c) bare fastavro decode", total) as phase:
        for value in values:
            schemaless_reader(io.BytesIO(value[10:]), parsed[value[2:10]], None)
    results.append(phase)

    # (d) the sink end to end
    idle = 1.0
    sink = SinkConsumer(
        {"bootstrap.servers": bootstrap},
        client,
        [prefix + TELEMETRY_GPU, prefix + TRAINING_STEPS],
        "bench-sink",
        deadletter_topic=prefix + DEADLETTER,
        batch_size=batch_size,
        progress_interval_s=3600,
    )
    with Phase("(d) sink: Kafka -> decode -> chDB", total) as phase:
        stats = sink.run(idle_exit_s=idle)
    phase.wall -= idle  # the idle tail before exit is not work
    results.append(phase)
    stored = sum(
        int(client.query(f"SELECT count() FROM {t}").result_rows[0][0]) for t in ("gpu_samples", "steps")
    )
    assert stored == total, f"stored {stored} of {total}"
    print(
        f"sink: {stats['batches']} batches, {stats['inserts']} inserts, {stats['insert_s']:.2f} s inside inserts"
    )
    for result in results:
        print(result.line())
    close(dsn)


if __name__ == "__main__":
    main()
