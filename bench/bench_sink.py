"""Sink throughput: Kafka -> decode -> ClickHouse (chDB), next to a bare loop doing the same work, and scale-out.

Starts its own broker (infra/kafka/local.py) and chDB in a temporary directory, produces N
GpuSample and N StepCompleted events, then measures, one after the other:
  (a) a bare clickhouse-connect column insert of the same rows (copies of the tables, no views),
  (b) a bare confluent-kafka consumer loop reading the messages without decoding,
  (c) bare fastavro decoding of the message bodies,
  (e) a bare consume + decode + insert loop: the same messages, poll size, batches per
      topic-partition cut the same way (size, or 1 s old) and tables (the real ones, with their
      materialized views) as the sink, without offsets, commits, dedup tokens or checks,
  (d) the sink (`SinkConsumer`) end to end, with the time bound `ranksight sink` applies,
(e) and (d) alternating `--rounds` times, each in a fresh process with its own new chDB directory
(in one process both slowed down round after round), and prints (d) / (e) by wall time and by CPU
time (on a shared machine CPU time is the steadier figure). Then scale-out on ONE job: M
StepCompleted of one 512-rank job keyed by job and rank group (`job/group`, 8 ranks a group), so the job's steps spread over every partition
of a 6-partition topic, stored by 1 and then by 2 sink processes (one consumer group; each
process with its own chDB directory, as chDB allows one process per directory: with a ClickHouse
server they would share one). Each process waits until the group has assigned every partition
before the data is produced; rows/s = all rows / (last insert - first record read). Prints
rows/s, CPU seconds and peak RSS. Not part of the test suite.

    .venv/bin/python bench/bench_sink.py [--events 100000] [--batch-size 5000] [--rounds 2] [--scale-steps 200000]
"""

from __future__ import annotations

import argparse
import functools
import gc
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from fastavro import schemaless_reader

from infra.kafka.local import LocalKafka, ensure_jars
from infra.kafka.topics import TopicSpec, create_topics
from ranksight.signals import run_main
from schemas.codec import Codec
from schemas.eventtime import TimeBound
from schemas.records import Event, default_schemas
from schemas.topics import DEADLETTER, TELEMETRY_GPU, TRAINING_STEPS, key_for, topic_for
from sinks.clickhouse import close, connect
from sinks.consumer import SinkConsumer
from sinks.ddl import migrate, table_for
from sinks.rows import event_row
from sinks.samples import sample_events
from streams.config import load_config

POLL_BATCH = 1000  # the sink's default `poll_batch`: the bare loop polls the same
BATCH_INTERVAL_S = 1.0  # the sink's default `batch_interval_s`: the bare loop cuts batches the same way


@functools.cache
def _time_bound() -> TimeBound:
    """The bound `ranksight sink` applies: the shipped detector config's clock knobs."""
    engine = load_config(None)
    return TimeBound(engine.max_clock_skew_ms, engine.max_record_age_ms)


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
            f"{self.name:<44} {self.rows / self.wall:>12,.0f} rows/s  {self.wall:7.2f} s wall  "
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
    parser.add_argument(
        "--scale-steps", type=int, default=200_000, help="steps of the one job for scale-out (0: skip)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of (e) and (d); best of each")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: one sink process of the scale-out
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        _phase(spec) if "phase" in spec else _child(spec)
        return

    with tempfile.TemporaryDirectory(prefix="rs-bench-") as tmp:
        kafka = LocalKafka(Path(tmp) / "kafka", libs=ensure_jars())
        kafka.start()
        try:
            if args.events:
                _run(kafka.bootstrap, Path(tmp), args.events, args.batch_size, args.rounds)
            if args.scale_steps:
                _scale_out(kafka.bootstrap, Path(tmp), args.scale_steps, args.batch_size)
        finally:
            kafka.stop()


def _produce(bootstrap: str, messages: list[tuple[str, bytes | None, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    for topic, key, value in messages:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0


def _run(bootstrap: str, tmp: Path, n: int, batch_size: int, rounds: int) -> None:
    prefix = "bench."
    create_topics(bootstrap, prefix=prefix)
    now = int(time.time() * 1000)
    events = sample_events("GpuSample", n, now) + sample_events("StepCompleted", n, now)
    codec = Codec()
    values = [codec.encode(e) for e in events]
    total = len(events)
    print(
        f"{total:,} events ({n:,} GpuSample + {n:,} StepCompleted), {sum(map(len, values)) / total:.0f} B each, "
        f"batch {batch_size} per topic-partition, poll {POLL_BATCH}"
    )
    _produce(
        bootstrap,
        [
            (prefix + topic_for(e.type), key_for(topic_for(e.type), e.record), v)
            for e, v in zip(events, values, strict=True)
        ],
    )
    topics = [prefix + TELEMETRY_GPU, prefix + TRAINING_STEPS]

    dsn = f"chdb://{tmp / 'chdb'}"
    client = connect(dsn)
    migrate(client)
    results: list[Phase] = []

    # (a) bare column insert of the same rows (copies of the tables: no materialized views)
    columns: dict[str, list[list[Any]]] = {}
    for offset, event in enumerate(events):
        spec, row = event_row(event)
        cols = columns.setdefault(spec.name, [[] for _ in spec.column_names])
        for col, v in zip(cols, [*row, "t", 0, offset], strict=True):
            col.append(v)
    for table in columns:
        client.command(f"CREATE TABLE bench_{table} AS {table}")
    with Phase(f"(a) bare chDB insert, {batch_size}/insert, no views", total) as phase:
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
    consumer.subscribe(topics)
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

    close(dsn)

    # (e) and (d), alternating `rounds` times, each in a fresh process with its own fresh chDB directory
    # (in one process both slowed down round after round, whichever came first in a round won).
    bares: list[dict[str, Any]] = []
    sinks: list[dict[str, Any]] = []
    for r in range(rounds):
        for kind in ("bare", "sink") if r % 2 == 0 else ("sink", "bare"):
            phase_spec = {"phase": kind, "bootstrap": bootstrap, "topics": topics, "group": f"bench-{kind}-{r}",
                          "chdb": str(tmp / f"chdb-{kind}-{r}"), "batch_size": batch_size, "total": total,
                          "deadletter": prefix + DEADLETTER}  # fmt: skip
            (bares if kind == "bare" else sinks).append(_in_child(phase_spec))
        print(
            f"round {r + 1}: bare {bares[-1]['wall']:.2f} s wall {bares[-1]['cpu']:.2f} s CPU "
            f"({bares[-1]['inserts']} inserts), sink {sinks[-1]['wall']:.2f} s wall {sinks[-1]['cpu']:.2f} s CPU "
            f"({sinks[-1]['inserts']} inserts, {sinks[-1]['insert_s']:.2f} s inside them)"
        )
    for result in results:
        print(result.line())
    for name, runs in (
        ("(e) bare consume + decode + insert loop", bares),
        ("(d) sink: Kafka -> decode -> chDB", sinks),
    ):
        best = min(runs, key=lambda x: x["wall"])
        print(
            f"{name:<44} {total / best['wall']:>12,.0f} rows/s  {best['wall']:7.2f} s wall  "
            f"{min(x['cpu'] for x in runs):7.2f} s CPU (best of {rounds}; process of its own)"
        )
    wall = min(x["wall"] for x in bares) / min(x["wall"] for x in sinks)
    cpu = min(x["cpu"] for x in bares) / min(x["cpu"] for x in sinks)
    median_cpu = statistics.median(b["cpu"] for b in bares) / statistics.median(x["cpu"] for x in sinks)
    print(
        f"sink / bare loop: {wall:.2f}x by wall time, {cpu:.2f}x by CPU time (best of {rounds}; "
        f"{median_cpu:.2f}x median CPU; {min(x['cpu'] for x in sinks) / total * 1e6:.1f} vs "
        f"{min(x['cpu'] for x in bares) / total * 1e6:.1f} µs CPU per row) (target >= 0.8x); "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )


def _in_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measured phase in a fresh process; its JSON result."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _phase(spec: dict[str, Any]) -> None:
    """One (e) or (d) phase in this fresh process: set up, then time only the work."""
    dsn = f"chdb://{spec['chdb']}"
    client = connect(dsn)
    migrate(client)
    total, topics = int(spec["total"]), list(spec["topics"])
    sink = None
    if spec["phase"] == "sink":
        sink = SinkConsumer(
            {"bootstrap.servers": spec["bootstrap"]},
            client,
            topics,
            spec["group"],
            deadletter_topic=spec["deadletter"],
            batch_size=spec["batch_size"],
            batch_interval_s=BATCH_INTERVAL_S,
            poll_batch=POLL_BATCH,
            progress_interval_s=3600,
            time_bound=_time_bound(),
        )
    gc.collect()
    wall, cpu = time.perf_counter(), _cpu()
    if sink is None:
        inserts = _bare_loop(spec["bootstrap"], client, topics, spec["batch_size"], total, spec["group"])
        insert_s = 0.0
    else:
        # Until every message is read and stored (an idle timeout cut runs short on a loaded machine).
        while sink.counters["consumed"] < total:
            sink.poll_once()
        sink.close()  # flushes and commits what is pending
        inserts, insert_s = sink.stats()["inserts"], sink.stats()["insert_s"]
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    _assert_stored(client, total, spec["phase"])
    close(dsn)
    print(json.dumps({"wall": wall, "cpu": cpu, "inserts": inserts, "insert_s": insert_s}))


def _assert_stored(client: Any, total: int, who: str) -> None:
    stored = sum(
        int(client.query(f"SELECT count() FROM {t}").result_rows[0][0]) for t in ("gpu_samples", "steps")
    )
    assert stored == total, f"{who} stored {stored} of {total}"


def _bare_loop(
    bootstrap: str, client: Any, topics: list[str], batch_size: int, total: int, group: str
) -> int:
    """Consume, decode, convert and insert per topic-partition batch; no commits, tokens or checks.

    Batches are cut as the sink cuts them (`batch_size` messages, or `BATCH_INTERVAL_S` old after a
    poll), so both make inserts of the same sizes; returns how many inserts it made.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(topics)
    codec = Codec()
    batches: dict[tuple[str, int], tuple[str, list[list[Any]], float]] = {}
    names: dict[str, list[str]] = {}
    inserts = 0

    def insert(tp: tuple[str, int]) -> None:
        nonlocal inserts
        table, cols, _ = batches.pop(tp)
        client.insert(table, data=cols, column_names=names[table], column_oriented=True)
        inserts += 1

    seen = 0
    while seen < total:
        for msg in consumer.consume(POLL_BATCH, 0.2):
            if msg.error() is not None:
                continue
            seen += 1
            tp = (msg.topic() or "", msg.partition() or 0)
            spec, row = event_row(codec.decode(msg.value()))
            entry = batches.get(tp)
            if entry is None:
                entry = batches[tp] = (spec.name, [[] for _ in spec.column_names], time.monotonic())
                names.setdefault(spec.name, list(spec.column_names))
            cols = entry[1]
            for col, value in zip(cols, row, strict=False):
                col.append(value)
            cols[-3].append(tp[0])
            cols[-2].append(tp[1])
            cols[-1].append(msg.offset())
            if len(cols[-1]) >= batch_size:
                insert(tp)
        now = time.monotonic()
        for tp in [tp for tp, (_, _, created) in batches.items() if now - created >= BATCH_INTERVAL_S]:
            insert(tp)
    for tp in list(batches):
        insert(tp)
    consumer.close()
    return inserts


# --- scale-out: one job's steps over every partition, 1 and 2 sink processes -------------------------

RANKS = 512
RANK_GROUP = 8
PARTITIONS = 6


def _scale_out(bootstrap: str, tmp: Path, n: int, batch_size: int) -> None:
    now = int(time.time() * 1000)
    job = "one-big-job"
    codec = Codec()
    events = [
        Event("StepCompleted", e.record | {"job_id": job, "rank": i % RANKS, "step": i // RANKS})
        for i, e in enumerate(sample_events("StepCompleted", n, now))
    ]
    values = [codec.encode(e) for e in events]
    keys = [f"{job}/{e.record['rank'] // RANK_GROUP}".encode() for e in events]
    print(
        f"\nscale-out: {n:,} StepCompleted of one {RANKS}-rank job keyed by job/rank group "
        f"({RANKS // RANK_GROUP} keys) over {PARTITIONS} partitions, batch {batch_size}"
    )
    rates: dict[int, float] = {}
    for processes in (1, 2):
        topic = f"bench.scale{processes}.{TRAINING_STEPS}"
        create_topics(bootstrap, [TopicSpec(topic, PARTITIONS, 86_400_000)])
        go = tmp / f"go-{processes}"
        children = []
        for k in range(processes):
            spec = {
                "bootstrap": bootstrap,
                "topic": topic,
                "group": f"bench-scale-{processes}",
                "chdb": str(tmp / f"chdb-scale-{processes}-{k}"),
                "batch_size": batch_size,
                "go": str(go),
                "partitions": PARTITIONS,
                "members": processes,
            }
            children.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--child", json.dumps(spec)],
                    stdout=subprocess.PIPE,
                    text=True,
                    env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
                )
            )
        for child in children:  # each says "ready" once the group gave out every partition
            line = child.stdout.readline() if child.stdout else ""
            assert line.startswith("ready"), line
        _produce(bootstrap, [(topic, k, v) for k, v in zip(keys, values, strict=True)])
        # The go signal carries each partition's end offset: a process is done when it read its own.
        probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-probe"})
        ends = {
            p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)
        }
        probe.close()
        go.with_suffix(".tmp").write_text(json.dumps(ends))
        go.with_suffix(".tmp").rename(go)
        results = []
        for child in children:
            out, _ = child.communicate(timeout=600)
            assert child.returncode == 0, out
            results.append(json.loads(out.strip().splitlines()[-1]))
        rows = sum(r["rows"] for r in results)
        assert rows == n, f"{processes} process(es) stored {rows} of {n}"
        span = max(r["last_insert"] for r in results) - min(r["first_read"] for r in results)
        rates[processes] = rows / span
        detail = ", ".join(
            f"[{', '.join(map(str, r['partitions']))}] {r['rows']:,} rows {r['rows'] / (r['last_insert'] - r['first_read']):,.0f}/s "
            f"{r['cpu_s']:.1f} s CPU"
            for r in results
        )
        print(f"{processes} sink process(es): {rates[processes]:>10,.0f} rows/s  {span:6.2f} s  ({detail})")
    print(f"2 processes / 1 process: {rates[2] / rates[1]:.2f}x (target >= 1.7x)")


def _child(spec: dict[str, Any]) -> None:
    """One sink process of the scale-out: join, say ready, wait for the data, store it, report."""
    dsn = f"chdb://{spec['chdb']}"
    client = connect(dsn)
    migrate(client)
    sink = SinkConsumer(
        {"bootstrap.servers": spec["bootstrap"]},
        client,
        [spec["topic"]],
        spec["group"],
        batch_size=spec["batch_size"],
        poll_batch=POLL_BATCH,
        progress_interval_s=3600,
        time_bound=_time_bound(),
    )
    # Ready once the group has settled: this member holds its share of the partitions.
    share = spec["partitions"] // spec["members"]
    while len(sink.assignment()) != share:
        sink.poll_once()
    partitions = [p for _, p in sink.assignment()]
    print("ready", flush=True)
    go = Path(spec["go"])
    parent = os.getppid()
    while not go.exists():
        if os.getppid() != parent:  # the bench died: do not wait forever
            sys.exit(1)
        time.sleep(0.01)
    cpu0 = _cpu()
    first_read = 0.0
    ends = json.loads(go.read_text())
    # Done when this member's partitions are read to their end and stored (not after a quiet spell:
    # on a loaded machine a fetch can stall for seconds).
    expected = sum(int(ends[str(p)]) for p in partitions)
    while sink.counters["consumed"] < expected:
        if sink.poll_once() and not first_read:
            first_read = time.time()
    sink.close()  # flushes and commits the last batches at once
    last_insert = time.time()
    rows = sink.stats()["inserted_rows"]
    cpu = _cpu() - cpu0
    close(dsn)
    print(json.dumps({"rows": int(rows), "first_read": first_read, "last_insert": last_insert,
                      "cpu_s": cpu, "partitions": partitions}))  # fmt: skip


if __name__ == "__main__":
    # SIGINT/SIGTERM unwind through the finally blocks that stop the broker and the processes.
    run_main(main, name="bench_sink")
