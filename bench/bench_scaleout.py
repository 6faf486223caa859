"""Scale-out of `ranksight worker` measured from outside (issue 37.5): only the CLI, only Kafka's view.

For each job size and worker count, on a fresh topic prefix: `ranksight kafka topics`, `ranksight
publish` of one giant job's recording (bench_engine_ranks's job: every rank's steps, its GPUs'
samples, its loader and collective samples, ending an hour ago: a backlog), then N `ranksight worker`
processes of one group with the shipped settings (checkpoint interval included). Done = the group's
committed offsets at the end of every source topic, read from the broker every 0.5 s; nothing is
read from the workers' logs. Printed per run: the time from the workers' start to done, events/s over
it, the same after the group's first commit (start-up and rebalance left out), the load average
next to it; then the ratio of 2 workers to 1 (issue target: >= 1.7).

On a shared machine the numbers are noisy: each line carries the 1-minute load average when it
finished, and the runs of one size follow each other on the same broker.

Usage: python bench/bench_scaleout.py [--ranks 4096,16384] [--seconds 20] [--workers 1,2]
(KAFKA_BOOTSTRAP: an existing broker; without it a local one is started in a temporary directory).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_worker import _drop, _giant_job

from ranksight.signals import run_main
from schemas.files import write_container
from schemas.topics import telemetry_copies
from streams.runtime.options import DEFAULT_APP_ID, SOURCE_TOPICS

_CLI = [sys.executable, "-m", "ranksight.cli"]


def _env(bootstrap: str, prefix: str, home: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "RANKSIGHT_TOPIC_PREFIX": prefix}
    if home is not None:
        env["RANKSIGHT_HOME"] = str(home)
    return env


def _lag(consumer: Consumer, group_tps: list[TopicPartition]) -> tuple[int, int] | None:
    """(records not committed, records committed) of the group on the source topics; None when the
    broker did not answer (a coordinator moving)."""
    try:
        committed = consumer.committed(group_tps, timeout=10)
        ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in group_tps]
    except KafkaException:
        return None
    done = sum(max(tp.offset, 0) for tp in committed)
    return sum(ends) - done, done


def _run(
    bootstrap: str, recording: Path, events: int, workers: int, timeout_s: float
) -> tuple[float, float] | None:
    """Seconds from the workers' start to done, and from the group's first commit to done."""
    prefix = f"scale{uuid.uuid4().hex[:6]}."
    subprocess.run([*_CLI, "kafka", "topics"], env=_env(bootstrap, prefix), check=True, capture_output=True)
    t0 = time.perf_counter()
    subprocess.run(
        [*_CLI, "publish", str(recording)], env=_env(bootstrap, prefix), check=True, capture_output=True
    )
    print(f"  publish: {events / (time.perf_counter() - t0):,.0f} events/s (ranksight publish)", flush=True)
    group = prefix + DEFAULT_APP_ID
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    names = [prefix + t for t in SOURCE_TOPICS]
    tps = [
        TopicPartition(n, p) for n in names for p in consumer.list_topics(n, timeout=10).topics[n].partitions
    ]
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as home:
        try:
            start = time.perf_counter()
            for i in range(workers):
                log = open(Path(home) / f"worker-{i}.log", "wb")  # noqa: SIM115 - the child owns it
                procs.append(
                    subprocess.Popen(
                        [*_CLI, "worker"],
                        env=_env(bootstrap, prefix, Path(home) / f"w{i}"),
                        stdout=log,
                        stderr=log,
                    )
                )
                log.close()
            first_commit: float | None = None
            while time.perf_counter() - start < timeout_s:
                time.sleep(0.5)  # poll interval of the progress check
                state = _lag(consumer, tps)
                if state is None:
                    continue
                left, done = state
                if done and first_commit is None:
                    first_commit = time.perf_counter()
                if left == 0:
                    end = time.perf_counter()
                    return end - start, end - (first_commit or start)
                if any(p.poll() is not None for p in procs):
                    print("  a worker exited:", (Path(home) / "worker-0.log").read_text()[-2000:])
                    return None
            print(f"  not done in {timeout_s:.0f} s ({_lag(consumer, tps)} records left / committed)")
            return None
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
            consumer.close()
            _drop(bootstrap, prefix)


def _bench(bootstrap: str, sizes: list[int], seconds: int, counts: list[int], timeout_s: float) -> None:
    print(
        f"{os.cpu_count()} cores; load average at start {os.getloadavg()[0]:.1f} (shared machine: noisy numbers)"
    )
    for ranks in sizes:
        events = _giant_job(ranks, seconds)
        records = sum(len(telemetry_copies(e.type, e.record)) or 1 for e in events)
        with tempfile.TemporaryDirectory() as tmp:
            recording = Path(tmp) / "job.avro"
            write_container(recording, events)
            print(
                f"one job of {ranks:,} ranks, {seconds} s of event time: {len(events):,} events ({records:,} records)"
            )
            rates: dict[int, float] = {}
            for n in counts:
                took = _run(bootstrap, recording, len(events), n, timeout_s)
                if took is None:
                    continue
                total, after = took
                rates[n] = len(events) / total
                print(
                    f"  {n} worker(s): done in {total:.1f} s = {rates[n]:,.0f} events/s"
                    f" ({len(events) / after:,.0f}/s after the first commit);"
                    f" load average {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
            if 1 in rates:
                for n, rate in rates.items():
                    if n > 1:
                        print(
                            f"  {n} workers / 1 worker: {rate / rates[1]:.2f}x (issue 37.5 target: >= 1.7 for 2)"
                        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", default="4096,16384", help="comma-separated job sizes")
    parser.add_argument("--seconds", type=int, default=20, help="seconds of event time of the job")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    sizes = [int(x) for x in args.ranks.split(",")]
    counts = [int(x) for x in args.workers.split(",")]
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        _bench(bootstrap, sizes, args.seconds, counts, args.timeout)
        return
    from infra.kafka.local import LocalKafka, ensure_jars

    with tempfile.TemporaryDirectory() as tmp, LocalKafka(Path(tmp), libs=ensure_jars()) as broker:
        _bench(broker.bootstrap, sizes, args.seconds, counts, args.timeout)


if __name__ == "__main__":
    run_main(main, name="bench_scaleout")
