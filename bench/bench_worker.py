"""Events/s of `ranksight worker` through Kafka next to a bare loop doing the same work, and the offline engine.

All on the same events in the same run. The events are published first (a backlog an hour old).
Then the bare loop drains them: one `confluent_kafka` consumer of the worker's topics, decoding,
one `Aligner` + `DetectionEngine` per partition (event-time order: 0 dropped as late), every output
encoded and produced; no state, no checkpoints, no side path: the work the worker cannot avoid.
Then `ranksight worker` (one or `--workers N` in a group, each runtime of `--runtime`) drains its
own copy; each is timed from its partition assignment to its last event. Printed: every rate, the
worker's ratio to the bare loop (issue 18.5 target: >= 0.8), the offline engine on the events in
memory, and the Faust read limit when the Faust runtime is measured.

Usage: KAFKA_BOOTSTRAP=127.0.0.1:9092 python bench/bench_worker.py [--scenario nan_loss] [--workers 1,2]
       [--runtime direct,faust] [--profile prof.raw]   # the (first) worker under py-spy
       python bench/bench_worker.py --giant 16384:30 --workers 1,2   # one job of 16,384 ranks (issue 19.3)
(without KAFKA_BOOTSTRAP a local broker is started in a temporary directory and stopped after).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from infra.kafka.topics import create_topics, delete_topics, prefixed
from producers.publisher import open_publisher
from producers.simulator import load_scenario, simulate
from ranksight.signals import run_main
from schemas.codec import Codec
from schemas.eventtime import event_ts, reference_ms
from schemas.records import Event
from schemas.topics import (
    WORKER_SOURCES,
    key_for,
    telemetry_copies,
    topic_for,
)
from streams.offline.detection import DetectionEngine
from streams.runtime.aligner import Aligner
from streams.runtime.options import BINDINGS, CONTROL, SUMMARIES, TELEMETRY_BY_JOB

_DONE = re.compile(r"^\[([\d-]+ [\d:,]+)\].*worker: ([\d,]+) source events handled", re.M)
_ASSIGNED_AT = re.compile(r"^\[([\d-]+ [\d:,]+)\].*assigned partitions \[", re.M)
# The topics a worker of group ranksight-detect creates for itself (Faust's leader topic too).
_WORKER_OWN = ("engine-snapshot-changelog", "node-routes-changelog", "__assignor-__leader")
_ASSIGNED = re.compile(r"assigned partitions \[([\d, ]*)\]")


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


def _bare_loop(bootstrap: str, prefix: str, records: int, timeout_s: float) -> float:
    """Records/s of the bare loop: the worker's topics, one `Aligner` and one `DetectionEngine` per
    partition (event-time order, nothing dropped as late), every output encoded and produced; no
    state, no checkpoints. Timed from assignment to the last record."""
    from confluent_kafka import Producer, TopicPartition

    assigned_at: list[float] = []
    consumer = _subscribed(bootstrap, f"{prefix}bare-loop", [prefix + t for t in WORKER_SOURCES], assigned_at)

    def lag(tp: str, last: int | None) -> int | None:
        topic, _, part = tp.rpartition(":")
        _, high = consumer.get_watermark_offsets(TopicPartition(prefix + topic, int(part)), cached=True)
        return None if high < 0 else max(0, high - ((-1 if last is None else last) + 1))

    codec = Codec()
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4", "acks": "all"}
    )
    aligners: dict[int, Aligner] = {}
    engines: dict[int, DetectionEngine] = {}
    done = produced = 0
    start = time.perf_counter()
    try:
        while done < records and time.perf_counter() - start < timeout_s:
            now = time.monotonic()
            for msg in consumer.consume(5_000, 0.1):
                if msg.error() is not None:
                    continue
                p, topic = msg.partition() or 0, (msg.topic() or "")[len(prefix) :]
                aligner = aligners.get(p)
                if aligner is None:
                    aligner = aligners[p] = Aligner(2.0, 200_000, end_grace_s=0.5)
                    aligner.expect([f"{t}:{p}" for t in WORKER_SOURCES], now)
                    engines[p] = DetectionEngine()
                event = codec.decode(msg.value() or b"")
                reference = reference_ms(msg.timestamp()[1], int(time.time() * 1000))
                aligner.push(f"{topic}:{p}", msg.offset() or 0, event_ts(event), (event, reference), now)
            for p, aligner in aligners.items():
                for _, _, (event, reference) in aligner.pop_ready(time.monotonic(), lag):
                    for out in engines[p].process(event, received_ts=reference):
                        name = topic_for(out.type)
                        producer.produce(prefix + name, codec.encode(out), key_for(name, out.record))
                        produced += 1
                    done += 1
            producer.poll(0)
        producer.flush(60)
        elapsed = time.perf_counter() - (assigned_at[0] if assigned_at else start)
    finally:
        consumer.close()
    late = sum(e.stats["late_dropped"] for e in engines.values())
    print(
        f"bare loop (consume, decode, aligner + engine per partition, outputs produced): {done:,} records"
        f" in {elapsed:.2f} s = {done / elapsed:,.0f} records/s ({late:,} dropped as late, {produced:,}"
        " outputs produced; no state, no checkpoints)"
    )
    return done / elapsed


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
) -> float | None:
    """Events/s of `workers` `ranksight worker --runtime runtime` processes draining the backlog."""
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
                log_path = Path(home) / f"worker-{i}.log"
                logs.append(log_path)
                spy = []
                if profile is not None and i == 0:
                    # Spawned under py-spy (attaching to a running process does not work everywhere).
                    spy = [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw"]
                    spy += ["--rate", "50", "-o", str(profile), "--"]
                    if not Path(spy[0]).exists():
                        raise SystemExit("--profile needs py-spy: pip install py-spy")
                with open(log_path, "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            [
                                *spy,
                                str(Path(sys.executable).parent / "ranksight"),
                                "worker",
                                "--runtime",
                                runtime,
                                "--log-level",
                                os.environ.get("BENCH_WORKER_LOG_LEVEL", "info"),
                                "--stats-interval",
                                "0.1",
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
            return rate
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
    try:
        records = sum(len(telemetry_copies(e.type, e.record)) or 1 for e in events)
        bare_rate = _bare_loop(bootstrap, prefix, records, timeout_s) * len(events) / records
        faust_rate = _faust_read(bootstrap, prefix, events, timeout_s) if "faust" in runtimes else None
        runs = [(runtime, n) for runtime in runtimes for n in workers]
        for i, (runtime, n) in enumerate(runs):
            if i:
                _drop(bootstrap, prefix)
                prefix = _publish(bootstrap, events)
            rates[(runtime, n)] = _workers_rate(
                bootstrap, prefix, events, runtime, n, timeout_s, profile if i == 0 else None
            )
    finally:
        _drop(bootstrap, prefix)
    for (runtime, n), rate in rates.items():
        if rate is None:
            continue
        one = rates.get((runtime, 1))
        print(
            f"{n} {runtime} worker(s): {rate:,.0f} events/s, {rate / n:,.0f} per worker;"
            f" / bare loop doing the same work: {rate / bare_rate:.2f} (issue 18.5 target:"
            " >= 0.8 for one worker of the default runtime)"
            + (
                f"; / one worker: {rate / one:.2f}x (issue 19.3 target: >= 1.7 for 2)"
                if one and n > 1
                else ""
            )
            + (f"; / do-nothing Faust agent: {rate / faust_rate:.2f}" if faust_rate else "")
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
    args = parser.parse_args()
    runtimes = [r.strip() for r in args.runtime.split(",") if r.strip()]
    workers = [int(n) for n in args.workers.split(",")]
    giant = None
    if args.giant:
        ranks, _, seconds = args.giant.partition(":")
        giant = (int(ranks), int(seconds or 30))
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        _bench(bootstrap, args.scenario, args.timeout, workers, runtimes, args.profile, giant)
        return
    from infra.kafka.local import LocalKafka, ensure_jars

    with tempfile.TemporaryDirectory() as tmp, LocalKafka(Path(tmp), libs=ensure_jars()) as broker:
        _bench(broker.bootstrap, args.scenario, args.timeout, workers, runtimes, args.profile, giant)


if __name__ == "__main__":
    # SIGINT/SIGTERM unwind through the finally blocks that stop the broker and the processes.
    run_main(main, name="bench_worker")
