"""Efficiency on a simulated cluster: the job page's efficiency panel next to a bare scan of the job's rows.

Simulates a scenario (a built-in name, default `mixed`, or a YAML file such as
bench/scenarios/efficiency_512.yaml: one 512-rank job for two hours with a 6-minute stall inside
one step), stores its events in chDB through the sink's writer (so the materialized roll-ups fill
as inserts arrive, as from `ranksight sink`), then times, each `--repeat` times (best and first):
  (a) the baseline: `SELECT count(), sum(step_time_s) FROM steps WHERE job_id = ...`, one scan of the
      biggest job's raw step rows (what any query over raw rows at least reads),
  (b) the job page's efficiency panel, `ui.pages.efficiency.efficiency(client, job)` (job and run rows, two
      statements today), and the same figures from one statement (`sinks.efficiency.job_and_runs`),
  (c) `SELECT * FROM job_efficiency` and `run_efficiency` over every job,
with wall and CPU seconds (chDB runs in this process: CPU time is the steadier figure on a shared
machine), and prints each job's goodput and where its GPU-hours went. Not part of the test suite.

    .venv/bin/python bench/bench_efficiency.py [--scenario mixed|FILE.yaml] [--repeat 5] [--store DIR]

`--store DIR` keeps the store (simulating and storing the 512-rank job takes minutes) and reuses
it when DIR already holds one.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from producers.simulator import builtin_scenarios, load_scenario, simulate
from schemas.topics import topic_for
from sinks.clickhouse import close, connect
from sinks.ddl import migrate
from sinks.efficiency import PriceList, job_and_runs, job_rows, run_rows
from sinks.writer import ClickHouseSink
from ui.pages.efficiency import efficiency

# Read by no efficiency figure; left out to keep the 512-rank store quick to build.
_SKIPPED = frozenset({"DataLoaderSample", "CollectiveSample", "HostSample"})


def _timed(call: Callable[[], Any], repeat: int) -> tuple[float, float, float, Any]:
    """(first wall s, best wall s, best CPU s, last result) of `repeat` calls."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = call()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return walls[0], min(walls), min(cpus), result


def _fill(client: Any, scenario: str) -> None:
    started = time.perf_counter()
    events = [e for e in simulate(load_scenario(scenario), 0).events() if e.type not in _SKIPPED]
    simulated = time.perf_counter() - started
    sink = ClickHouseSink(client, batch_size=100_000)
    started = time.perf_counter()
    for offset, event in enumerate(events):
        topic = topic_for(event.type)
        sink.add(topic, 0, offset, event)
        if sink.is_full(topic, 0):
            sink.flush(topic, 0)
    for topic, partition in sink.pending():
        sink.flush(topic, partition)
    print(
        f"simulated {len(events):,} events in {simulated:.0f} s, stored in {time.perf_counter() - started:.0f} s "
        f"(without {', '.join(sorted(_SKIPPED))}: no efficiency figure reads them)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenario", default="mixed", help=f"{', '.join(builtin_scenarios())} or a YAML file"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--store", type=Path, help="keep the store here (reused when it exists)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.store or Path(tmp) / "chdb"
        fresh = not (path / "metadata").exists()
        dsn = f"chdb://{path}"
        client = connect(dsn)
        migrate(client, None)
        if fresh:
            _fill(client, args.scenario)
        _measure(client, args.repeat)
        close(dsn)


def _measure(client: Any, repeat: int) -> None:
    steps, gpu = (
        int(client.query(f"SELECT count() FROM {t}").result_rows[0][0]) for t in ("steps", "gpu_samples")
    )
    rolled = int(client.query("SELECT count() FROM run_step_progress").result_rows[0][0])
    job, ranks, job_steps = client.query(
        "SELECT job_id, uniqExact(rank), count() FROM steps GROUP BY job_id ORDER BY count() DESC LIMIT 1"
    ).result_rows[0]
    print(
        f"store: {steps:,} step rows, {gpu:,} GPU samples; roll-up: {rolled:,} (job, run, step) rows; "
        f"biggest job {job}: {ranks} ranks, {job_steps:,} step rows"
    )
    parameters = {"job": job}
    base = _timed(
        lambda: client.query(
            "SELECT count(), sum(step_time_s) FROM steps WHERE job_id = %(job)s", parameters=parameters
        ),
        repeat,
    )
    panel = _timed(lambda: efficiency(client, job), repeat)
    only_job = _timed(lambda: job_rows(client, PriceList(), job=job), repeat)
    only_runs = _timed(lambda: run_rows(client, job=job), repeat)
    combined = _timed(lambda: job_and_runs(client, PriceList(), job), repeat)
    every_job = _timed(lambda: client.query("SELECT * FROM job_efficiency"), repeat)
    every_run = _timed(lambda: client.query("SELECT * FROM run_efficiency"), repeat)
    print(f"{'':52} {'first':>9} {'best':>9} {'best CPU':>9}")
    for name, (first, best, cpu, _) in (
        ("(a) baseline: scan of the job's raw step rows", base),
        ("(b) job page efficiency panel (ui.pages.efficiency.efficiency)", panel),
        ("    of it: job_rows(job=...)", only_job),
        ("    of it: run_rows(job=...)", only_runs),
        ("    the same from one statement: job_and_runs", combined),
        ("(c) SELECT * FROM job_efficiency (every job)", every_job),
        ("    SELECT * FROM run_efficiency (every run)", every_run),
    ):
        print(f"{name:52} {first * 1000:7.0f}ms {best * 1000:7.0f}ms {cpu * 1000:7.0f}ms")
    print(f"panel / baseline scan: {panel[1] / base[1]:.1f}x (best wall)")
    rows = job_rows(client, PriceList())
    print("job, outcome, GPU-h, goodput %, productive / stall / restart / checkpoint / evaluation GPU-h, kWh")
    for r in rows:
        print(
            f"  {r['job_id']} {r['outcome']} {r['allocated_gpu_h'] or 0:.2f} {r['goodput_pct'] or 0:.2f} "
            f"{r['productive_gpu_h'] or 0:.2f} / {r['stall_gpu_h'] or 0:.2f} / {r['restart_gpu_h'] or 0:.2f} / "
            f"{r['checkpoint_gpu_h'] or 0:.2f} / {r['evaluation_gpu_h'] or 0:.2f}, {r['energy_kwh'] or 0:.1f}"
        )


if __name__ == "__main__":
    main()
