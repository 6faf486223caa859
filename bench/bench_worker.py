"""Events/s of `ranksight worker` through Kafka, of a bare consumer loop + engine, and of the offline engine.

All three on the same events in the same run. The events are published first (a backlog an hour
old); then a bare `confluent_kafka` consumer loop that decodes them and feeds one `DetectionEngine`
(what the worker wraps) drains them, then `ranksight worker` (one or `--workers N` in a group)
drains them again; each is timed from its partition assignment to its last event. Printed: both
rates, their ratio (issue 9.1 target: >= 50 %), and the offline engine on the events in memory.

Usage: KAFKA_BOOTSTRAP=127.0.0.1:9092 python bench/bench_worker.py [--scenario nan_loss] [--workers 2]
       [--profile prof.raw]   # the (first) worker under py-spy: its top frames are printed
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
from schemas.codec import Codec
from schemas.records import Event
from schemas.topics import (
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TRAINING_EVENTS,
    TRAINING_STEPS,
    WORKER_SOURCES,
    telemetry_copies,
)
from streams.aligner import Aligner
from streams.app import BINDINGS, TELEMETRY_BY_JOB, reference_ms
from streams.engine import DetectionEngine, event_ts

_DONE = re.compile(r"^\[([\d-]+ [\d:,]+)\].*worker: ([\d,]+) source events handled", re.M)
_ASSIGNED_AT = re.compile(r"^\[([\d-]+ [\d:,]+)\].*assigned partitions \[", re.M)
# What the producers wrote, node-keyed: the bare loop reads every event once from these.
NODE_KEYED_SOURCES = (TELEMETRY_GPU, TELEMETRY_HOST, TRAINING_STEPS, TRAINING_EVENTS)
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


def _bare_loop(bootstrap: str, prefix: str, expected: int, timeout_s: float) -> float:
    """Events/s of a plain consumer loop: poll, decode, `engine.process`, as the worker does per record.

    Timed from its partition assignment (the group join is excluded, as for the worker) to the
    last event processed.
    """
    assigned_at: list[float] = []
    consumer = _subscribed(
        bootstrap, f"{prefix}bare-loop", [prefix + t for t in NODE_KEYED_SOURCES], assigned_at
    )
    codec, engine = Codec(), DetectionEngine()
    done = 0
    start = time.perf_counter()
    try:
        while done < expected and time.perf_counter() - start < timeout_s:
            for msg in consumer.consume(5_000, 0.5):
                if msg.error() is not None:
                    continue
                event = codec.decode(msg.value() or b"")
                engine.process(event, received_ts=reference_ms(msg.timestamp()[1], int(time.time() * 1000)))
                done += 1
        elapsed = time.perf_counter() - (assigned_at[0] if assigned_at else start)
    finally:
        consumer.close()
    late = engine.stats["late_dropped"]
    print(
        f"bare consumer loop + engine: {done} events in {elapsed:.2f} s = {done / elapsed:,.0f} events/s"
        f" (one consumer, no alignment, no state, no outputs sent; read out of event-time order, the"
        f" engine dropped {late:,} of them as late, {100 * late / max(done, 1):.0f} %, which costs it little)"
    )
    return done / elapsed


def _aligned_loop(bootstrap: str, prefix: str, records: int, timeout_s: float) -> float:
    """Events/s of a bare loop that does the worker's work without Faust: the worker's topics, one
    `Aligner` and one `DetectionEngine` per partition (so the engine gets event-time order and
    drops nothing as late), no state, no outputs sent. Timed from assignment to the last record."""
    from confluent_kafka import TopicPartition

    assigned_at: list[float] = []
    consumer = _subscribed(
        bootstrap, f"{prefix}aligned-loop", [prefix + t for t in WORKER_SOURCES], assigned_at
    )

    def lag(tp: str, last: int | None) -> int | None:
        topic, _, part = tp.rpartition(":")
        _, high = consumer.get_watermark_offsets(TopicPartition(prefix + topic, int(part)), cached=True)
        return None if high < 0 else max(0, high - ((-1 if last is None else last) + 1))

    codec = Codec()
    aligners: dict[int, Aligner] = {}
    engines: dict[int, DetectionEngine] = {}
    done = 0
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
                    engines[p].process(event, received_ts=reference)
                    done += 1
        elapsed = time.perf_counter() - (assigned_at[0] if assigned_at else start)
    finally:
        consumer.close()
    late = sum(e.stats["late_dropped"] for e in engines.values())
    print(
        f"bare consumer loop + aligner + engine per partition: {done} records in {elapsed:.2f} s ="
        f" {done / elapsed:,.0f} records/s (the worker's work without Faust: event-time order, {late:,}"
        " dropped as late; no state, no outputs sent)"
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
    internal = [prefix + t for t in (BINDINGS, TELEMETRY_BY_JOB)]
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
            while time.perf_counter() - start < timeout_s:
                time.sleep(0.5)
                done = sum(h[-1][1] if (h := handled(t)) else 0 for t in texts())
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
            parts = [_ASSIGNED.findall(t)[-1] for t in logs_now]
            # From the moment the last worker got its partitions (the group settled) to the moment the
            # last one had handled its final count (progress lines every 0.1 s: +-0.1 s).
            settled = max(_log_time(_ASSIGNED_AT.findall(t)[-1]) for t in logs_now)
            finished = max(next(ts for ts, c in handled(t) if c == handled(t)[-1][1]) for t in logs_now)
            lines = [line for line in logs_now[0].splitlines() if "worker: " in line]
            print("last progress line of worker 0:", lines[-1].split("] ", 3)[-1] if lines else "none")
            rate = len(events) / (finished - settled)
            print(
                f"{workers} {runtime} worker(s) (partitions {', '.join(f'[{p}]' for p in parts)}):"
                f" {len(events)} events in {finished - settled:.2f} s after the group settled"
                f" = {rate:,.0f} events/s"
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


def _bench(
    bootstrap: str,
    scenario: str,
    timeout_s: float,
    workers: int,
    runtimes: list[str],
    profile: Path | None = None,
) -> None:
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
    rates: dict[str, float | None] = {}
    try:
        bare_rate = _bare_loop(bootstrap, prefix, len(events), timeout_s)
        records = sum(len(telemetry_copies(e.type, e.record)) or 1 for e in events)
        aligned_rate = _aligned_loop(bootstrap, prefix, records, timeout_s) * len(events) / records
        faust_rate = _faust_read(bootstrap, prefix, events, timeout_s)
        for i, runtime in enumerate(runtimes):
            if i:
                _drop(bootstrap, prefix)
                prefix = _publish(bootstrap, events)
            rates[runtime] = _workers_rate(
                bootstrap, prefix, events, runtime, workers, timeout_s, profile if i == 0 else None
            )
    finally:
        _drop(bootstrap, prefix)
    for runtime, rate in rates.items():
        if rate is None:
            continue
        print(
            f"{runtime} worker / bare loop: {100 * rate / bare_rate:.0f} % (issue 9.1 target: >= 50 %);"
            f" / bare loop with the aligner: {100 * rate / aligned_rate:.0f} %"
            + (f"; / do-nothing Faust agent: {100 * rate / faust_rate:.0f} %" if faust_rate else "")
        )


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
    parser.add_argument("--workers", type=int, default=1, help="workers in the same group")
    parser.add_argument(
        "--runtime",
        default="faust,direct",
        help="comma-separated worker runtimes to measure, each on its own copy of the backlog",
    )
    parser.add_argument("--profile", type=Path, help="run the first worker under py-spy, raw stacks here")
    args = parser.parse_args()
    runtimes = [r.strip() for r in args.runtime.split(",") if r.strip()]
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        _bench(bootstrap, args.scenario, args.timeout, args.workers, runtimes, args.profile)
        return
    from infra.kafka.local import LocalKafka, ensure_jars

    with tempfile.TemporaryDirectory() as tmp, LocalKafka(Path(tmp), libs=ensure_jars()) as broker:
        _bench(broker.bootstrap, args.scenario, args.timeout, args.workers, runtimes, args.profile)


if __name__ == "__main__":
    main()
