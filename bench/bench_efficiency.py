"""Efficiency views on simulated clusters: how long `job_efficiency` takes next to a bare scan.

Simulates a built-in scenario (default `mixed`), stores every event in chDB (a temporary
directory), then times, each several times (median):
  (a) the baseline: `SELECT count(), sum(step_time_s) FROM steps` (one scan of the largest
      training table),
  (b) `SELECT * FROM run_efficiency`,
  (c) `SELECT * FROM job_efficiency`,
and prints the jobs' goodput so the numbers can be eyeballed. Not part of the test suite.

    .venv/bin/python bench/bench_efficiency.py [--scenario mixed] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from producers.simulator import builtin_scenarios, load_scenario, simulate
from schemas.topics import topic_for
from sinks.clickhouse import close, connect
from sinks.ddl import migrate
from sinks.writer import ClickHouseSink


def _median_s(client: object, sql: str, repeat: int) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        rows = len(client.query(sql).result_rows)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - start)
    return statistics.median(times), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="mixed", choices=builtin_scenarios())
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    events = list(simulate(load_scenario(args.scenario), 0).events())
    with tempfile.TemporaryDirectory() as tmp:
        dsn = f"chdb://{Path(tmp) / 'chdb'}"
        client = connect(dsn)
        migrate(client, None)
        sink = ClickHouseSink(client, batch_size=50_000)
        start = time.perf_counter()
        for offset, event in enumerate(events):
            sink.add(topic_for(event.type), 0, offset, event)
        for topic, partition in sink.pending():
            batch = sink.flush(topic, partition)
            if batch is not None:
                sink.write(batch)
        stored = time.perf_counter() - start
        steps = client.query("SELECT count() FROM steps").result_rows[0][0]
        gpu = client.query("SELECT count() FROM gpu_samples").result_rows[0][0]
        print(
            f"scenario {args.scenario}: {len(events):,} events ({steps:,} step rows, {gpu:,} GPU samples), stored in {stored:.1f} s"
        )
        base, _ = _median_s(client, "SELECT count(), sum(step_time_s) FROM steps", args.repeat)
        print(f"(a) baseline scan of steps          {base * 1000:8.1f} ms")
        for name in ("run_efficiency", "job_efficiency"):
            took, rows = _median_s(client, f"SELECT * FROM {name}", args.repeat)
            print(
                f"({'b' if name.startswith('run') else 'c'}) SELECT * FROM {name:<15} {took * 1000:8.1f} ms  {rows} rows  ({took / base:.1f}x the baseline)"
            )
        result = client.query(
            "SELECT job_id, outcome, round(allocated_gpu_h, 2), round(goodput_pct, 1), round(stall_gpu_h, 2), "
            "round(restart_gpu_h, 2), round(energy_kwh, 2), queue_s FROM job_efficiency ORDER BY job_id"
        )
        print("job, outcome, GPU-h, goodput %, stall GPU-h, restart GPU-h, kWh, queue s")
        for row in result.result_rows:
            print("  ", *row)
        close(dsn)


if __name__ == "__main__":
    main()
