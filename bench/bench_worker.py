"""Events/s of `ranksight worker` through Kafka next to a bare loop doing the same work, and the offline engine.

All on the same events in the same run. The events are published first (a backlog an hour old).
Then the bare loop drains them (`_BareStages`, issue 37.2): one `confluent_kafka` consumer of the
worker's source topics, decoding and checking each record as the worker does, one event-time merge
of every source partition (0 dropped as late), and the worker's own engines: per partition one
rank-stage and one job-stage `StageEngine`, with the side path's routes for unattributed telemetry
and GPU faults. Every record the worker produces (alerts and derived records, the job copies,
re-keyed telemetry, bindings, summaries, markers, learned baselines) is encoded and produced to the
loop's own topics; what the worker reads back through Kafka the loop hands on in memory, and it
takes no checkpoint. Then `ranksight worker` (one or `--workers N` in a group, each runtime of
`--runtime`) drains its own copy; each is timed from its partition assignment to its last event.
After one direct worker, every internal round trip it made is read back from its topics and
accounted for (`_round_trips`: records, bytes, and the time to produce, read and decode them; a
checkpoint's snapshot encoding). Printed: every rate and CPU time, the worker's ratio to the bare
loop (issue 37.2 target: >= 0.85), the offline engine on the events in memory, and the Faust read
limit when the Faust runtime is measured.

Usage: KAFKA_BOOTSTRAP=127.0.0.1:9092 python bench/bench_worker.py [--scenario nan_loss] [--workers 1,2]
       [--runtime direct,faust] [--profile prof.raw]   # the (first) worker under py-spy
       [--cprofile worker.prof]   # the (first) worker under cProfile
       python bench/bench_worker.py --giant 4096:20   # one job of 4,096 ranks, 20 s of event time
       BENCH_WORKER_ARGS="--checkpoint-events 5000" python bench/bench_worker.py ...   # worker flags
       BENCH_WORKER_PYTHONPATH=/path/to/other/checkout python bench/bench_worker.py ...   # its worker
(without KAFKA_BOOTSTRAP a local broker is started in a temporary directory and stopped after).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import heapq
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from infra.kafka.topics import TopicSpec, create_topics, delete_topics, prefixed
from producers.publisher import open_publisher
from producers.simulator import load_scenario, simulate
from ranksight.signals import run_main
from schemas.codec import Codec
from schemas.eventtime import MIN_EVENT_TS, event_ts, reference_ms
from schemas.records import Event
from schemas.topics import (
    TELEMETRY_UNATTRIBUTED,
    WORKER_SOURCES,
    key_for,
    telemetry_copies,
    topic_for,
)
from streams import gc_policy
from streams.alerting.routing import load_router
from streams.config import load_config
from streams.offline.detection import DEFAULT_PARTITIONS, DetectionEngine
from streams.runtime.aligner import Aligner
from streams.runtime.changelog import SNAPSHOT_TABLE, changelog_topic, topic_specs
from streams.runtime.intake import align_ts, check_record
from streams.runtime.options import (
    BINDINGS,
    CONTROL,
    DEFAULT_APP_ID,
    SUMMARIES,
    TELEMETRY_BY_JOB,
    env_options,
)
from streams.runtime.task import decode_snapshot_meta
from streams.stages.engine import StageEngine, tiebreak
from streams.stages.placement import BROADCAST, FaultCopies, Placement
from streams.stages.routes import NodeRoutes

_DONE = re.compile(r"^\[([\d-]+ [\d:,]+)\].*worker: ([\d,]+) source events handled", re.M)
_ASSIGNED_AT = re.compile(r"^\[([\d-]+ [\d:,]+)\].*assigned partitions \[", re.M)
# The topics a worker of group ranksight-detect creates for itself (Faust's leader topic too).
_WORKER_OWN = ("engine-snapshot-changelog", "node-routes-changelog", "__assignor-__leader")
_ASSIGNED = re.compile(r"assigned partitions \[([\d, ]*)\]")
_PARTITIONS = DEFAULT_PARTITIONS  # the worker's default `--partitions`, which the topics get
# The round trip each record of the worker's internal topics makes, by topic and record type.
_TRIPS_BY_TOPIC: dict[str, Callable[[str], str]] = {
    CONTROL: lambda _: "job copies",
    TELEMETRY_BY_JOB: lambda _: "re-keyed telemetry",
    BINDINGS: lambda _: "bindings and faults",
    SUMMARIES: lambda kind: {"StageProgress": "markers", "BaselineRun": "learned baselines"}.get(
        kind, "summaries"
    ),
}


def _subscribed(bootstrap: str, group: str, topics: list[str], assigned_at: list[float]) -> Any:
    """A consumer of `topics` from the earliest offset, noting in `assigned_at` when it got partitions."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(topics, on_assign=lambda c, p: assigned_at.append(time.perf_counter()))
    return consumer


class _BareStages:
    """The worker's engines without the worker: per partition one rank-stage and one job-stage
    `StageEngine` (`streams.stages`), fed in one event-time order of every source partition.

    What the worker sends through Kafka and reads back (control copies of a job's start and state,
    unattributed telemetry re-keyed by job, bindings and GPU faults for the side path, the rank
    stages' summaries and markers, learned baselines) is encoded and produced here as the worker
    produces it, to this loop's own topics, and handed on in memory: the produce half of each
    internal round trip is in this loop's time, the read-back half is not (`_round_trips` measures it).
    No checkpoint, no changelog, no commit.
    """

    def __init__(self, produce: Callable[[str, str, bytes | None, bytes, int | None], None]) -> None:
        config, router = load_config(), load_router()
        self.config = config
        self.codec = Codec()
        self.place = Placement(_PARTITIONS)
        self.rank = [StageEngine(config, router, "rank", self.place.holder(p)) for p in range(_PARTITIONS)]
        self.job = [StageEngine(config, router, "job") for _ in range(_PARTITIONS)]
        self.routes = NodeRoutes(10_000)  # the side path's node -> job routes, from the bindings
        self.faults: FaultCopies[tuple[Event, bytes]] = FaultCopies()
        self.produce = produce  # (round trip, topic, key, value, partition)
        self.end_states = frozenset(config.job_end_states)
        self.telemetry_front: int | None = None
        self.marker_sent: list[int | None] = [None] * _PARTITIONS
        self._to_job: list[tuple[int, tuple[Any, ...], int, Event]] = []
        self._seq = 0
        self.newest: int | None = None

    def take(self, topic: str, p: int, key: bytes | None, value: bytes, event: Event, reference: int) -> None:
        """One released source record, where the worker sends it (its task or the side path)."""
        kind, r = event.type, event.record
        if kind in ("GpuSample", "HostSample"):
            ts = int(r["ts"])
            if self.telemetry_front is None or ts > self.telemetry_front:
                self.telemetry_front = ts
        if topic == TELEMETRY_UNATTRIBUTED:
            parts = self.place.routed(self.routes, event)
            for q, job_key in sorted(parts.items()):
                self.produce("re-keyed telemetry", TELEMETRY_BY_JOB, job_key.encode(), value, q)
                self._rank(q, event, reference)
            if kind == "GpuSample":
                self._share_fault(event, value, parts, reference, through_side_path=False)
            return
        self._rank(p, event, reference)
        if kind == "GpuSample":  # attributed: a fault goes through the side path to the node's other jobs
            self._share_fault(event, value, [p], reference, through_side_path=True)
        elif kind == "RankBound":
            self.routes.bind(r)
            self.produce(
                "bindings and faults", BINDINGS, str(r["node"]).encode(), value, self.place.node(r["node"])
            )
        elif kind in BROADCAST:
            if kind == "JobStateChanged" and r["state"] in self.end_states:
                self.routes.end_job(str(r["job_id"]))
                for q in self.place.every():
                    self.produce("bindings and faults", BINDINGS, str(r["job_id"]).encode(), value, q)
            for q in self.place.copies(event, p):
                self.produce("job copies", CONTROL, key, value, q)
                self.rank[q].process(event, received_ts=reference, forward=False)

    def _share_fault(
        self, event: Event, value: bytes, own: Any, reference: int, *, through_side_path: bool
    ) -> None:
        """A GPU fault (after the GPU's last healthy sample) to the node's other jobs, as the side
        path shares it: an attributed one after a trip through its node's partition of the bindings
        topic, an unattributed one naming the GPU's job."""
        copies = self.faults.copies(event.record, (event, value))
        shared = self.place.shared(self.routes, event, own) if copies else {}
        node = str(event.record["node"])
        for copy, copy_value in copies:
            if through_side_path:
                self.produce(
                    "bindings and faults", BINDINGS, node.encode(), copy_value, self.place.node(node)
                )
            else:
                named = self.routes.with_holder(copy)
                if named is not copy:
                    copy, copy_value = named, self.codec.encode(named)
            for q, key in sorted(shared.items()):
                self.produce("re-keyed telemetry", TELEMETRY_BY_JOB, key.encode(), copy_value, q)
                self.rank[q].process(copy, received_ts=reference, shared=True)

    def _rank(self, p: int, event: Event, reference: int) -> None:
        self._out(self.rank[p].process(event, received_ts=reference))

    def step(self, newest: int) -> None:
        """After a released batch: the rank stages follow the newest event time (as the worker's
        idle tasks follow their worker's), what they pass on goes to the job stages."""
        for eng in self.rank:
            eng.topology.telemetry_front = self.telemetry_front
        if self.newest is None or newest > self.newest:
            self.newest = newest
            for eng in self.rank:
                self._out(eng.advance(newest - self.config.allowed_lateness_ms))
        self._to_job_stage(final=False)

    def finish(self) -> None:
        """The end of the input: every stage moves to its newest event time (`WorkerCore.finish`)."""
        for eng in self.rank:
            self._out(eng.finish())
        self._to_job_stage(final=True)
        for p, eng in enumerate(self.job):
            self._job_out(p, eng.finish())

    def _to_job_stage(self, *, final: bool) -> None:
        """Summaries and markers produced as the rank-stage tasks send them; the job stages fed in
        event-time order as far as every rank stage released (the markers' front)."""
        bucket = self.config.summary_bucket_ms
        for p, eng in enumerate(self.rank):
            for item in eng.drain_forwarded():
                job = str(item.record.get("job_id") or "")
                self.produce(
                    "summaries", SUMMARIES, job.encode(), self.codec.encode(item), self.place.job(job)
                )
                self._seq += 1
                heapq.heappush(self._to_job, (event_ts(item), tiebreak(item), self._seq, item))
            front, last = eng.release_front(), self.marker_sent[p]
            if front is not None and (last is None or front >= last + bucket):
                self.marker_sent[p] = front
                marker = self.codec.encode(Event("StageProgress", {"ts": front, "source": p, "idle": False}))
                for q in self.place.every():
                    self.produce("markers", SUMMARIES, None, marker, q)
        fronts = [eng.release_front() for eng in self.rank]
        front = None if final or None in fronts else min(f for f in fronts if f is not None)
        if not final and front is None:
            return
        heap = self._to_job
        while heap and (front is None or heap[0][0] <= front):
            item = heapq.heappop(heap)[3]
            q = self.place.job(item.record.get("job_id"))
            self._job_out(q, self.job[q].process(item))
        if front is not None:
            for q, eng in enumerate(self.job):
                self._job_out(q, eng.advance(front))

    def _job_out(self, p: int, outputs: list[Event]) -> None:
        for out in outputs:
            if out.type != "BaselineRun":
                self._out([out])
                continue
            shared = Event("BaselineRun", {**out.record, "source": p})
            value = self.codec.encode(shared)
            for q in self.place.others(p):
                self.produce("learned baselines", SUMMARIES, None, value, q)
                self.job[q].process(shared)

    def _out(self, outputs: list[Event]) -> None:
        for out in outputs:
            name = topic_for(out.type)
            self.produce(
                "outputs (alerts, derived)", name, key_for(name, out.record), self.codec.encode(out), None
            )

    def late(self) -> int:
        """Records any engine dropped as late (the bare loop's promise: none)."""
        return sum(e.stats["late_dropped"] for e in (*self.rank, *self.job))


def _bare_loop(
    bootstrap: str, prefix: str, records: int, timeout_s: float
) -> tuple[float, float, dict[str, list[float]]]:
    """Records/s of the bare loop (`_BareStages`): the worker's source topics read by one consumer,
    decoded and checked as the worker does, merged in event time (one `Aligner` over every source
    partition: 0 dropped as late), the worker's engines, every output and internal record encoded and
    produced (to this loop's own topics) as the worker produces it. Timed from assignment to the last
    record and the producer's flush. Returns records/s, CPU seconds and, per internal round trip,
    [records, bytes, seconds in produce calls]."""
    from confluent_kafka import Producer, TopicPartition

    assigned_at: list[float] = []
    consumer = _subscribed(bootstrap, f"{prefix}bare-loop", [prefix + t for t in WORKER_SOURCES], assigned_at)
    own = f"{prefix}bare."  # its own output and internal topics: the worker's are the worker's
    create_topics(bootstrap, prefix=own)
    create_topics(bootstrap, topic_specs(env_options(bootstrap=bootstrap)), prefix=own)

    def lag(tp: str, last: int | None) -> int | None:
        topic, _, part = tp.rpartition(":")
        _, high = consumer.get_watermark_offsets(TopicPartition(prefix + topic, int(part)), cached=True)
        return None if high < 0 else max(0, high - ((-1 if last is None else last) + 1))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "compression.type": "lz4",
        }
    )
    trips: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0])

    def produce(trip: str, topic: str, key: bytes | None, value: bytes, partition: int | None) -> None:
        t0 = time.perf_counter()
        if partition is None:
            producer.produce(own + topic, value, key)
        else:
            producer.produce(own + topic, value, key, partition=partition)
        account = trips[trip]
        account[0] += 1
        account[1] += len(value)
        account[2] += time.perf_counter() - t0

    stages = _BareStages(produce)
    aligner = Aligner(2.0, 200_000, end_grace_s=0.5)
    aligner.expect([f"{t}:{p}" for t in WORKER_SOURCES for p in range(_PARTITIONS)], time.monotonic())
    codec = Codec()
    max_skew_ms = int(stages.config.max_clock_skew_ms)
    done = 0
    # The worker's collector (`ranksight worker` sets it): this process also holds the bench's
    # events, which Python's default collector would walk again and again on the loop's time.
    gc_policy.for_long_lived_state()
    start = time.perf_counter()
    cpu_start = time.process_time()  # this process's threads, librdkafka's included, as the worker's
    try:
        while done < records and time.perf_counter() - start < timeout_s:
            now = time.monotonic()
            wall_ms = int(time.time() * 1000)
            for msg in consumer.consume(2_000, 0.05):
                if msg.error() is not None:
                    continue
                topic = (msg.topic() or "")[len(prefix) :]
                p, offset, value = msg.partition() or 0, msg.offset() or 0, msg.value() or b""
                event = check_record(codec, value, topic)
                kafka_ms = msg.timestamp()[1]
                held = align_ts(event_ts(event), kafka_ms, max_skew_ms, wall_ms)
                item = (topic, p, msg.key(), value, event, reference_ms(kafka_ms, wall_ms))
                aligner.push(f"{topic}:{p}", offset, MIN_EVENT_TS if held is None else held, item, now)
            newest = None
            for _, _, (topic, p, key, value, event, reference) in aligner.pop_ready(time.monotonic(), lag):
                stages.take(topic, p, key, value, event, reference)
                ts = event_ts(event)
                newest = ts if newest is None or ts > newest else newest
                done += 1
            if newest is not None:
                stages.step(newest)
            producer.poll(0)
        producer.flush(60)
        elapsed = time.perf_counter() - (assigned_at[0] if assigned_at else start)
        cpu_s = time.process_time() - cpu_start
        stages.finish()
        producer.flush(60)
    finally:
        consumer.close()
        gc_policy.python_default()
    produced = sum(int(n) for n, _, _ in trips.values())
    print(
        f"bare loop (consume, decode, event-time merge, the worker's rank- and job-stage engines, outputs"
        f" and internal records produced): {done:,} records in {elapsed:.2f} s = {done / elapsed:,.0f}"
        f" records/s ({stages.late():,} dropped as late, {produced:,} records produced; no read-back of"
        f" its internal records, no checkpoints); CPU {cpu_s:.1f} s = {done / max(cpu_s, 1e-9):,.0f} records"
        f" per CPU-second; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    return done / elapsed, cpu_s, dict(trips)


def _read_topic(bootstrap: str, topic: str) -> tuple[list[tuple[bytes | None, bytes]], float]:
    """Every record of `topic` (key, value) and the seconds the consumer took to read them."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"roundtrip-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return [], 0.0
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in meta.partitions
        }
        todo = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in todo])
        out: list[tuple[bytes | None, bytes]] = []
        t0 = time.perf_counter()
        while todo and time.perf_counter() - t0 < 120:
            for msg in consumer.consume(2_000, 0.01):
                if msg.error() is not None:
                    continue
                out.append((msg.key(), msg.value() or b""))
                if (msg.offset() or 0) + 1 >= ends[msg.partition() or 0]:
                    todo.discard(msg.partition() or 0)
        return out, time.perf_counter() - t0
    finally:
        consumer.close()


def _round_trips(bootstrap: str, prefix: str, worker_s: float) -> None:
    """What each internal round trip of the worker cost in this run: its records and bytes (read back
    from the worker's own topics after it drained), and the time to produce them again (one producer
    with the worker's settings, flushed), to read them (one consumer) and to decode them (the Avro
    codec; a checkpoint: its engine snapshot encoded again from the restored state). The bare loop
    makes the produce half of the first five (not checkpoints); the worker makes all of them."""
    from confluent_kafka import Producer

    codec = Codec()
    config, router = load_config(), load_router()
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "lz4",
            "message.max.bytes": 16 * 1024 * 1024,
        }
    )
    scratch = f"{prefix}roundtrip"
    create_topics(
        bootstrap,
        [TopicSpec(scratch, _PARTITIONS, 3_600_000, "delete", {"max.message.bytes": str(16 * 1024 * 1024)})],
    )
    rows: list[tuple[str, int, int, float, float, float]] = []
    for topic in (
        CONTROL,
        TELEMETRY_BY_JOB,
        BINDINGS,
        SUMMARIES,
        changelog_topic(DEFAULT_APP_ID, SNAPSHOT_TABLE),
    ):
        values, read_s = _read_topic(bootstrap, prefix + topic)
        kinds: dict[str, list[bytes]] = collections.defaultdict(list)
        decode_s: dict[str, float] = collections.defaultdict(float)
        for key, value in values:
            t0 = time.perf_counter()
            if topic.endswith("-changelog"):
                if not value:
                    continue
                _, body = decode_snapshot_meta(value)
                kind = "job" if key and b"jobs@" in key else "rank"
                engine = StageEngine.restore(body, config, router, kind)
                t0 = time.perf_counter()  # the snapshot's encoding, as a checkpoint does it
                engine.snapshot()
                name = "checkpoints (engine snapshots)"
            else:
                event = codec.decode(value)
                name = _TRIPS_BY_TOPIC[topic](event.type)
            decode_s[name] += time.perf_counter() - t0
            kinds[name].append(value)
        for name, batch in kinds.items():
            t0 = time.perf_counter()
            for value in batch:
                producer.produce(scratch, value)
                producer.poll(0)
            producer.flush(60)
            produce_s = time.perf_counter() - t0
            share = len(batch) / max(len(values), 1)  # the topic's read time, split by records
            rows.append((name, len(batch), sum(map(len, batch)), produce_s, read_s * share, decode_s[name]))
    delete_topics(bootstrap, [scratch])
    print(
        f"the worker's internal round trips (records it wrote and read back while draining; {worker_s:.2f} s):"
    )
    total = 0.0
    for name, n, size, produce_s, read_s, coded_s in rows:
        spent = produce_s + read_s + coded_s
        total += spent
        print(
            f"  {name:32s} {n:>8,} records {size / 1e6:7.2f} MB: produce+flush {produce_s:6.2f} s,"
            f" read {read_s:5.2f} s, {'encode' if 'checkpoint' in name else 'decode'} {coded_s:5.2f} s"
            f" = {spent:6.2f} s ({1e6 * spent / max(n, 1):,.0f} us each; {100 * spent / worker_s:4.1f} % of the worker's time)"
        )
    print(f"  {'all round trips':32s} {total:6.2f} s = {100 * total / worker_s:.1f} % of the worker's time")


def _faust_read(bootstrap: str, prefix: str, events: list[Event], timeout_s: float) -> float | None:
    """Events/s of a do-nothing Faust agent on the worker's topics (bench/faust_read.py): the
    ceiling of any worker built on Faust agents, on this machine and broker."""
    # The records on the worker's topics: one per training event, one copy per job (or one
    # unattributed copy) per telemetry sample.
    records = sum(len(telemetry_copies(e.type, e.record)) or 1 for e in events)
    env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "RANKSIGHT_TOPIC_PREFIX": prefix}
    script = Path(__file__).with_name("faust_read.py")
    try:
        out = subprocess.run(
            [sys.executable, str(script), str(records)],
            env={**env, "PYTHONPATH": str(script.parent.parent)},
            capture_output=True,
            timeout=timeout_s,
            text=True,
        )
    except subprocess.TimeoutExpired:
        print(f"do-nothing Faust agent: did not read {records} records in {timeout_s:.0f} s")
        return None
    found = re.search(r"faust read: (\d+) ([\d.]+)", out.stdout + out.stderr)
    if not found:
        print("do-nothing Faust agent failed:", (out.stdout + out.stderr)[-2000:])
        return None
    n, seconds = int(found[1]), float(found[2])
    rate = len(events) / seconds
    print(
        f"do-nothing Faust agent: {n} records ({len(events)} events) in {seconds:.2f} s = {rate:,.0f} events/s"
        " (same app settings and topics as the worker, nothing done per record: the Faust limit)"
    )
    return rate


def _top_frames(raw: Path, n: int = 15) -> None:
    """Print the frames where the profiled worker spent its samples (self and inclusive)."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        samples += int(count)
        own[frames[-1]] += int(count)
        for function in {f.rsplit(":", 1)[0] + ")" for f in frames}:  # per function, not per line
            total[function] += int(count)
    print(f"py-spy: {samples} samples of the worker (active threads)")
    print("  self time:")
    for frame, hits in own.most_common(n):
        print(f"    {100 * hits / samples:5.1f} %  {frame}")
    print("  inclusive, frames of streams/ schemas/ faust/ aiokafka/:")
    shown = [
        (f, c)
        for f, c in total.most_common()
        if any(k in f for k in ("streams/", "schemas/", "faust/", "aiokafka/"))
    ]
    for frame, hits in shown[:n]:
        print(f"    {100 * hits / samples:5.1f} %  {frame}")


def _log_time(stamp: str) -> float:
    """Seconds since the epoch of a worker log timestamp ("2026-12-01 06:16:13,168", local time)."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _publish(bootstrap: str, events: list[Event]) -> str:
    """Create a fresh set of topics and publish `events` on them; returns their prefix."""
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    create_topics(bootstrap, prefix=prefix)
    pub = open_publisher("kafka", kafka_conf={"bootstrap.servers": bootstrap}, topic_prefix=prefix)
    t0 = time.perf_counter()
    for e in events:
        pub.publish(e)
    pub.flush(120)
    pub.close()
    print(f"publish: {len(events) / (time.perf_counter() - t0):,.0f} events/s")
    return prefix


def _drop(bootstrap: str, prefix: str) -> None:
    """Delete a run's topics: the canonical ones and what its workers created."""
    internal = [prefix + t for t in (BINDINGS, TELEMETRY_BY_JOB, CONTROL, SUMMARIES)]
    internal += [f"{prefix}ranksight-detect-{t}" for t in _WORKER_OWN]
    delete_topics(bootstrap, [*prefixed(prefix).values(), *internal])


def _workers_rate(
    bootstrap: str,
    prefix: str,
    events: list[Event],
    runtime: str,
    workers: int,
    timeout_s: float,
    profile: Path | None,
    cprofile: Path | None = None,
) -> tuple[float, float] | None:
    """Events/s of `workers` `ranksight worker --runtime runtime` processes draining the backlog, and
    their CPU seconds from the group settling to the end. `cprofile`: worker 0 under cProfile."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with tempfile.TemporaryDirectory() as home:
            logs = []
            for i in range(workers):
                env = {
                    **os.environ,
                    "KAFKA_BOOTSTRAP": bootstrap,
                    "RANKSIGHT_TOPIC_PREFIX": prefix,
                    "RANKSIGHT_HOME": str(Path(home) / f"w{i}"),
                }
                if os.environ.get("BENCH_WORKER_PYTHONPATH"):  # another checkout's worker (before/after)
                    env["PYTHONPATH"] = os.environ["BENCH_WORKER_PYTHONPATH"]
                log_path = Path(home) / f"worker-{i}.log"
                logs.append(log_path)
                spy = []
                if profile is not None and i == 0:
                    # Spawned under py-spy (attaching to a running process does not work everywhere).
                    spy = [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw"]
                    spy += ["--rate", "50", "-o", str(profile), "--"]
                    if not Path(spy[0]).exists():
                        raise SystemExit("--profile needs py-spy: pip install py-spy")
                command = [str(Path(sys.executable).parent / "ranksight")]
                if cprofile is not None and i == 0:
                    # Deterministic profile of the worker (written when it stops on SIGTERM).
                    command = [sys.executable, "-m", "cProfile", "-o", str(cprofile), "-m", "ranksight.cli"]
                with open(log_path, "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            [
                                *spy,
                                *command,
                                "worker",
                                "--runtime",
                                runtime,
                                "--log-level",
                                os.environ.get("BENCH_WORKER_LOG_LEVEL", "info"),
                                "--stats-interval",
                                "0.1",
                                *shlex.split(os.environ.get("BENCH_WORKER_ARGS", "")),
                            ],
                            env=env,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                        )
                    )

            def texts() -> list[str]:
                return [p.read_text(errors="replace") if p.exists() else "" for p in logs]

            def handled(text: str) -> list[tuple[float, int]]:
                return [(_log_time(t), int(c.replace(",", ""))) for t, c in _DONE.findall(text)]

            start = time.perf_counter()
            done = 0
            assignments = -1
            cpu_settled = [0.0] * len(procs)
            while time.perf_counter() - start < timeout_s:
                time.sleep(0.5)
                now_texts = texts()
                done = sum(h[-1][1] if (h := handled(t)) else 0 for t in now_texts)
                seen = sum(len(_ASSIGNED_AT.findall(t)) for t in now_texts)
                if seen != assignments:  # the group moved: CPU from here on is the backlog's (+-0.5 s)
                    assignments, cpu_settled = seen, [_cpu_s(proc) for proc in procs]
                if done >= len(events) or any(proc.poll() is not None for proc in procs):
                    break
            if done < len(events):
                print(
                    f"{runtime} workers did not finish in {timeout_s:.0f} s ({done} of {len(events)} handled)"
                )
                print("worker 0 log ends:", *texts()[0].splitlines()[-15:], sep="\n  ")
                return None
            logs_now = texts()
            if os.environ.get("BENCH_KEEP_LOGS"):
                for i, text in enumerate(logs_now):
                    Path(os.environ["BENCH_KEEP_LOGS"], f"{runtime}-worker-{i}.log").write_text(text)
            parts = [(_ASSIGNED.findall(t) or ["none yet"])[-1] for t in logs_now]
            # From the moment the last worker got its partitions (the group settled) to the moment the
            # last one had handled its final count (progress lines every 0.1 s: +-0.1 s). A worker
            # still joining when the others finished took no part.
            settled = max(_log_time(_ASSIGNED_AT.findall(t)[-1]) for t in logs_now if _ASSIGNED_AT.findall(t))
            finished = max(
                next(ts for ts, c in handled(t) if c == handled(t)[-1][1]) for t in logs_now if handled(t)
            )
            lines = [line for line in logs_now[0].splitlines() if "worker: " in line]
            print("last progress line of worker 0:", lines[-1].split("] ", 3)[-1] if lines else "none")
            rate = len(events) / (finished - settled)
            print(
                f"{workers} {runtime} worker(s) (partitions {', '.join(f'[{p}]' for p in parts)}):"
                f" {len(events)} events in {finished - settled:.2f} s after the group settled"
                f" = {rate:,.0f} events/s"
            )
            cpu = [_cpu_s(proc) - before for proc, before in zip(procs, cpu_settled, strict=True)]
            print(
                f"worker CPU after the group settled: {' + '.join(f'{c:.1f}' for c in cpu)} = {sum(cpu):.1f} s"
                f" in {finished - settled:.1f} s = {len(events) / max(sum(cpu), 1e-9):,.0f} events per"
                f" worker CPU-second; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
            )
            for proc in procs:
                _stop(proc)
            procs = []
            if profile is not None and profile.exists():
                _top_frames(profile)
            return rate, sum(cpu)
    finally:
        for proc in procs:
            _stop(proc)


def _giant_job(ranks: int, seconds: int) -> list[Event]:
    """One job of `ranks` ranks over `seconds` of event time (bench_engine_ranks.py's), ending an hour ago."""
    import random

    import bench_engine_ranks as giant

    rng = random.Random(ranks)
    events = giant._start(ranks)
    for second in range(1, seconds + 1):
        for batch in giant._second(ranks, second, seconds, rng):  # a second comes in batches
            events += batch
    shift = int(time.time() * 1000) - 3_600_000 - seconds * 1000 - giant.T0
    return [Event(e.type, {**e.record, "ts": e.record["ts"] + shift}) for e in events]


def _bench(
    bootstrap: str,
    scenario: str,
    timeout_s: float,
    workers: list[int],
    runtimes: list[str],
    profile: Path | None = None,
    giant: tuple[int, int] | None = None,
    trips: bool = True,
    cprofile: Path | None = None,
) -> None:
    if giant is not None:
        events = _giant_job(*giant)
        print(f"one job of {giant[0]:,} ranks, {giant[1]} s of event time: {len(events):,} events")
    else:
        sc = load_scenario(scenario)
        # Ending an hour ago: the events are a backlog, as after an outage or for a replay.
        sc = sc.with_overrides(start_ms=int(time.time() * 1000) - int(sc.duration * 1000) - 3_600_000)
        events = list(simulate(sc, seed=0).events())
    t0 = time.perf_counter()
    DetectionEngine().run(events)
    offline_s = time.perf_counter() - t0
    print(
        f"offline engine: {len(events)} events in {offline_s:.2f} s = {len(events) / offline_s:,.0f} events/s"
        " (no Kafka, no decoding: the limit)"
    )
    # Everything is on the broker before any reader starts: each drains the same backlog. Each
    # runtime gets its own copy of the topics (the worker's internal topics are per prefix).
    prefix = _publish(bootstrap, events)
    rates: dict[tuple[str, int], float | None] = {}
    cpus: dict[tuple[str, int], float] = {}
    try:
        records = sum(len(telemetry_copies(e.type, e.record)) or 1 for e in events)
        bare_records_s, bare_cpu_s, bare_trips = _bare_loop(bootstrap, prefix, records, timeout_s)
        bare_rate = bare_records_s * len(events) / records
        print("  of it, produced (records, MB, seconds in produce calls):")
        for trip, (n, size, spent) in sorted(bare_trips.items()):
            print(f"    {trip:32s} {int(n):>8,} records {size / 1e6:7.2f} MB {spent:6.2f} s")
        faust_rate = _faust_read(bootstrap, prefix, events, timeout_s) if "faust" in runtimes else None
        runs = [(runtime, n) for runtime in runtimes for n in workers]
        for i, (runtime, n) in enumerate(runs):
            if i:
                _drop(bootstrap, prefix)
                prefix = _publish(bootstrap, events)
            measured = _workers_rate(
                bootstrap, prefix, events, runtime, n, timeout_s, profile if i == 0 else None, cprofile
            )
            rates[(runtime, n)] = measured[0] if measured else None
            if measured:
                cpus[(runtime, n)] = measured[1]
            if measured and n == 1 and runtime == "direct" and trips:
                _round_trips(bootstrap, prefix, len(events) / measured[0])
    finally:
        _drop(bootstrap, prefix)
    for (runtime, n), rate in rates.items():
        if rate is None:
            continue
        one = rates.get((runtime, 1))
        print(
            f"{n} {runtime} worker(s): {rate:,.0f} events/s, {rate / n:,.0f} per worker;"
            f" / bare loop doing the same work: {rate / bare_rate:.2f} (issue 37.2 target:"
            " >= 0.85 for one worker of the default runtime)"
            + (
                f"; / one worker: {rate / one:.2f}x (issue 19.3 target: >= 1.7 for 2)"
                if one and n > 1
                else ""
            )
            + (f"; / do-nothing Faust agent: {rate / faust_rate:.2f}" if faust_rate else "")
        )
        if (runtime, n) in cpus:
            print(
                f"  by CPU time: the worker(s) {cpus[(runtime, n)]:.1f} s, the bare loop {bare_cpu_s:.1f} s:"
                f" {bare_cpu_s / max(cpus[(runtime, n)], 1e-9):.2f} of the bare loop's events per CPU-second"
            )


def _cpu_s(proc: subprocess.Popen[bytes]) -> float:
    """User + system CPU seconds of a worker so far (the worker itself when under py-spy)."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    pids = [int(p) for p in children.read_text().split()] if children.exists() else []
    total = 0.0
    for pid in pids or [proc.pid]:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a worker (under py-spy: stop the worker, and py-spy writes its profile and exits)."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    pids = [int(p) for p in children.read_text().split()] if children.exists() else []
    for pid in pids or [proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def main() -> None:
    """Run the benchmark once and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", default="nan_loss")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument(
        "--workers",
        default="1",
        help="workers in the same group; comma-separated counts run one after the other",
    )
    parser.add_argument(
        "--giant",
        metavar="RANKS:SECONDS",
        help="instead of a scenario: one job of RANKS ranks (bench_engine_ranks.py's) over SECONDS of event time",
    )
    parser.add_argument(
        "--runtime",
        default="direct",
        help="comma-separated worker runtimes to measure (direct, faust), each on its own copy of the backlog",
    )
    parser.add_argument("--profile", type=Path, help="run the first worker under py-spy, raw stacks here")
    parser.add_argument("--cprofile", type=Path, help="run the first worker under cProfile, its stats here")
    parser.add_argument(
        "--no-round-trips", action="store_true", help="skip reading back the worker's internal topics"
    )
    args = parser.parse_args()
    runtimes = [r.strip() for r in args.runtime.split(",") if r.strip()]
    workers = [int(n) for n in args.workers.split(",")]
    giant = None
    if args.giant:
        ranks, _, seconds = args.giant.partition(":")
        giant = (int(ranks), int(seconds or 30))
    trips = not args.no_round_trips

    def bench(bootstrap: str) -> None:
        _bench(
            bootstrap,
            args.scenario,
            args.timeout,
            workers,
            runtimes,
            args.profile,
            giant,
            trips,
            args.cprofile,
        )

    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        bench(bootstrap)
        return
    from infra.kafka.local import LocalKafka, ensure_jars

    with tempfile.TemporaryDirectory() as tmp, LocalKafka(Path(tmp), libs=ensure_jars()) as broker:
        bench(broker.bootstrap)


if __name__ == "__main__":
    # SIGINT/SIGTERM unwind through the finally blocks that stop the broker and the processes.
    run_main(main, name="bench_worker")
