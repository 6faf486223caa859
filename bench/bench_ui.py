"""UI latency: the job page of a 512-rank job over 2 hours, next to a bare query on the same rows.

Fills a temporary chDB store with ClickHouse's own generators (`INSERT ... SELECT FROM numbers`,
so the materialized roll-ups fill as they would from the sink): 512 ranks on 64 nodes for two
hours of 1.5 s steps (~2.5 M step rows), 10 s GPU, host, data-loader and collective samples, the
detectors' 30 s rank windows and a few alerts. Then measures, warm, median of --repeat runs:
  (a) baseline: one bare aggregate over the job's step rows (`count(), avg(step_time_s)`),
  (b) `ui.queries.job_page` (every panel's query, what /api/jobs/<job> runs),
  (c) the same over HTTP (`/api/jobs/<job>`, aiohttp + JSON), as a browser would fetch it,
  (d) the fleet page and a 10-minute zoom,
  (e) the efficiency panel (`job_efficiency` + `run_efficiency`) and the fleet's goodput column,
      which the pages fetch after they render (`/api/jobs/<job>/efficiency`, `/api/fleet/goodput`),
      uncached (`ui.queries`) and cached by the server (60 s),
  (f) the compare page's JSON (`/api/compare?job=`),
  (g) overload: --burst (200) concurrent page loads against the default gate (4 queries at once,
      8 waiting up to 5 s): how many answered 200 and 503, and the slowest answer,
  (h) the page once the job completed: a cache hit.
Target: (c) under 500 ms on this machine. Not part of the test suite.

    .venv/bin/python bench/bench_ui.py [--ranks 512] [--hours 2] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from sinks.clickhouse import close, connect
from sinks.ddl import migrate
from sinks.efficiency import PriceList
from ui import queries
from ui.server import UiServer

JOB = "bench-512"
START = "2026-01-01 00:00:00"


def _fill(client: Any, ranks: int, hours: float) -> dict[str, int]:
    nodes = max(1, ranks // 8)
    seconds = int(hours * 3600)
    steps = int(seconds / 1.5)
    t = f"toDateTime64('{START}', 3, 'UTC')"
    client.command(
        "INSERT INTO job_started (ts, job_id, run_id, owner, team, cluster, model_name, model_version, "
        "dataset_version, workload_family, world_size, nodes, data_parallel, tensor_parallel, pipeline_parallel, "
        "gpu_class) SELECT "
        f"{t}, '{JOB}', '{JOB}-r0', 'bench', 'llm-pretrain', 'bench', 'llama', 'v1', 'd1', 'llama-pretrain', "
        f"{ranks}, arrayMap(i -> concat('node-', leftPad(toString(i), 3, '0')), range({nodes})), {ranks}, 1, 1, 'H100'"
    )
    client.command(
        "INSERT INTO rank_bound (ts, job_id, run_id, rank, local_rank, node, gpu_index, pid) "
        f"SELECT {t}, '{JOB}', '{JOB}-r0', number, number % 8, "
        f"concat('node-', leftPad(toString(intDiv(number, 8)), 3, '0')), number % 8, 1000 + number FROM numbers({ranks})"
    )
    # Rank 137 is a straggler in the second hour.
    client.command(
        "INSERT INTO steps (ts, job_id, run_id, rank, step, samples, tokens, loss, lr, grad_norm, step_time_s, "
        "data_wait_s, forward_s, backward_s, optimizer_s, comm_s, checkpoint_s, skipped) "
        f"SELECT {t} + toIntervalMillisecond(intDiv(number, {ranks}) * 1500 + number % {ranks}), '{JOB}', '{JOB}-r0', "
        f"number % {ranks} AS r, intDiv(number, {ranks}) AS s, 8, 32768, 3 - s / {steps}, 3e-4, 1 + rand() / 4e9, 1.5, "
        "0.02, 0.4 * if(r = 137 AND s > " + str(steps // 2) + ", 1.4, 1), 0.8, 0.1, 0.18, 0, false "
        f"FROM numbers({steps * ranks})"
    )
    samples = seconds // 10
    client.command(
        "INSERT INTO gpu_samples (ts, cluster, node, gpu_index, gpu_uuid, gpu_util_pct, mem_util_pct, mem_used_bytes, "
        "power_w, sm_clock_mhz, temp_gpu_c) "
        f"SELECT {t} + toIntervalSecond(intDiv(number, {ranks}) * 10), 'bench', "
        f"concat('node-', leftPad(toString(intDiv(number % {ranks}, 8)), 3, '0')), number % 8, 'GPU-x', "
        "95 + rand() % 5, 60, 70e9, 650 + rand() % 50, 1980, 70 "
        f"FROM numbers({samples * ranks})"
    )
    client.command(
        "INSERT INTO host_samples (ts, cluster, node, cpu_util_pct, mem_used_bytes, mem_total_bytes, tcp_retrans_segs_s) "
        f"SELECT {t} + toIntervalSecond(intDiv(number, {nodes}) * 10), 'bench', "
        f"concat('node-', leftPad(toString(number % {nodes}), 3, '0')), 40, 200e9, 1000e9, rand() % 5 "
        f"FROM numbers({samples * nodes})"
    )
    for table, extra_cols, extra_vals in (
        ("dataloader_samples", "interval_s, wait_s, queue_depth, workers", "10, 0.2, 8, 4"),
        ("collective_samples", "op, interval_s, count, time_s, bus_bw_gbps", "'allreduce', 10, 7, 1.2, 180"),
    ):
        client.command(
            f"INSERT INTO {table} (ts, job_id, run_id, rank, {extra_cols}) "
            f"SELECT {t} + toIntervalSecond(intDiv(number, {ranks}) * 10), '{JOB}', '{JOB}-r0', number % {ranks}, "
            f"{extra_vals} FROM numbers({samples * ranks})"
        )
    windows = seconds // 30
    client.command(
        "INSERT INTO derived_rank_windows (window_start, window_end, job_id, run_id, rank, steps, step_time_s, "
        "compute_s, data_wait_s, comm_s, straggler_score) "
        f"SELECT {t} + toIntervalSecond(intDiv(number, {ranks}) * 30), "
        f"{t} + toIntervalSecond(intDiv(number, {ranks}) * 30 + 60), '{JOB}', '{JOB}-r0', number % {ranks}, 40, 1.5, "
        f"1.3 * if(number % {ranks} = 137 AND intDiv(number, {ranks}) > {windows // 2}, 1.4, 1), 0.02, 0.18, 1 "
        f"FROM numbers({windows * ranks})"
    )
    client.command(
        "INSERT INTO alerts (alert_id, fingerprint, rule, category, severity, status, ts, starts_at, team, receiver, "
        "summary, owner, job_id, run_id, model_version, dataset_version, workload_family, cluster, node, rank, "
        "gpu_index, invariant, suspected_layer, history_metric, runbook_url) "
        f"SELECT concat('a', toString(number)), concat('f', toString(number)), 'straggler', 'platform', 'warning', "
        f"'firing', {t} + toIntervalSecond(3700 + number * 60), {t} + toIntervalSecond(3700 + number * 60), "
        f"'llm-pretrain', 'default', 'rank 137 is a straggler', 'bench', '{JOB}', '{JOB}-r0', 'v1', 'd1', 'llama', "
        "'bench', 'node-017', 137, 1, 'score >= 0.75', 'gpu', 'straggler_score', '' FROM numbers(5)"
    )
    return {
        "steps": steps * ranks,
        "gpu_samples": samples * ranks,
        "derived_rank_windows": windows * ranks,
    }


_CPU: dict[str, float] = {}


def _median_ms(fn: Callable[[], Any], repeat: int, name: str = "") -> tuple[float, Any]:
    """Median wall ms of `fn` (warm); its median process CPU ms goes to _CPU[name] (chDB runs in process)."""
    fn()  # warm: first query of a table loads its marks
    times, cpu, result = [], [], None
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), time.process_time()
        result = fn()
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - cpu_started) * 1000)
    _CPU[name] = statistics.median(cpu)
    return statistics.median(times), result


def _burst(url: str, n: int) -> dict[str, Any]:
    """`n` concurrent GETs: how many got 200 and 503, the slowest answer, the whole burst's time."""
    import concurrent.futures

    def one(_: int) -> tuple[int, float, str]:
        started = time.perf_counter()
        with httpx.Client(timeout=300) as http:
            response = http.get(url)
        return response.status_code, time.perf_counter() - started, response.headers.get("Retry-After", "")

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    return {
        "ok": sum(1 for code, _, _ in results if code == 200),
        "busy": sum(1 for code, _, _ in results if code == 503),
        "retry_after": next((ra for code, _, ra in results if code == 503), "-"),
        "slowest_s": max(t for _, t, _ in results),
        "slowest_busy_s": max((t for code, t, _ in results if code == 503), default=0.0),
        "wall_s": time.perf_counter() - started,
    }


def main() -> None:
    """Fill the store, measure, print."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--burst", type=int, default=200, help="concurrent page loads of the overload row")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        dsn = f"chdb://{Path(tmp) / 'chdb'}"
        client = connect(dsn)
        try:
            migrate(client, ttl_days=None)
            started = time.perf_counter()
            rows = _fill(client, args.ranks, args.hours)
            print(
                f"store: {args.ranks} ranks x {args.hours:g} h: "
                + ", ".join(f"{n:,} {t}" for t, n in rows.items())
                + f" (filled in {time.perf_counter() - started:.1f} s)"
            )
            bare, _ = _median_ms(
                lambda: (
                    client.query(
                        "SELECT count(), avg(step_time_s) FROM steps WHERE job_id = %(j)s",
                        parameters={"j": JOB},
                    ).result_rows
                ),
                args.repeat,
                "bare",
            )
            prices = PriceList.parse(["default=2.5"])
            compare_uncached_ms, _ = _median_ms(
                lambda: queries.compare(client, [JOB]), args.repeat, "compare"
            )
            efficiency_ms, panel = _median_ms(
                lambda: queries.efficiency(client, JOB, prices), args.repeat, "efficiency"
            )
            goodput_ms, _ = _median_ms(lambda: queries.fleet_goodput(client), args.repeat, "goodput")
            page_ms, page = _median_ms(
                lambda: queries.job_page(client, JOB, with_efficiency=False), args.repeat, "page"
            )
            server = UiServer(client, "127.0.0.1", 0, prices=prices)
            url = server.start()
            try:
                with httpx.Client(timeout=60) as http:
                    http_ms, response = _median_ms(
                        lambda: http.get(f"{url}api/jobs/{JOB}"), args.repeat, "http"
                    )
                    fleet_ms, _ = _median_ms(lambda: http.get(f"{url}api/fleet"), args.repeat)
                    cached_ms, _ = _median_ms(
                        lambda: http.get(f"{url}api/jobs/{JOB}/efficiency"), args.repeat, "cached"
                    )
                    compare_ms, _ = _median_ms(
                        lambda: http.get(f"{url}api/compare", params={"job": JOB}), args.repeat
                    )
                    # Overload: as many concurrent page loads as the issue measured (200), default gate.
                    burst = _burst(f"{url}api/jobs/{JOB}", args.burst)
                    t0 = page["range"]["from_ms"] + 3600_000
                    zoom_ms, _ = _median_ms(
                        lambda: http.get(f"{url}api/jobs/{JOB}", params={"from": t0, "to": t0 + 600_000}),
                        args.repeat,
                        "zoom",
                    )
                    # A finished job's page is immutable: the second read is served from the cache.
                    client.command(
                        "INSERT INTO job_states (ts, job_id, run_id, state, reason, restart_count) VALUES "
                        f"(toDateTime64('{START}', 3, 'UTC') + toIntervalHour(3), '{JOB}', '{JOB}-r0', 'completed', 'done', 0)"
                    )
                    finished_first = http.get(f"{url}api/jobs/{JOB}")
                    finished_ms, finished = _median_ms(
                        lambda: http.get(f"{url}api/jobs/{JOB}"), args.repeat, "cached_page"
                    )
            finally:
                server.stop()
            cells = len(json.loads(page["heatmap"]["cells"].text)[0])
            load = os.getloadavg()[0]
            print(
                f"load average {load:.1f} on {os.cpu_count()} CPUs; CPU = process CPU time (chDB runs in process)"
            )
            print(
                f"(a) baseline, bare aggregate over the job's step rows       {bare:8.1f} ms  CPU {_CPU['bare']:7.1f} ms"
            )
            print(
                f"(b) job page queries (heatmap from {page['heatmap']['source']}, GPUs from {page['gpus']['source']}, "
                f"bucket {page['range']['bucket_ms'] // 1000} s, {cells:,} heatmap cells) {page_ms:8.1f} ms  "
                f"CPU {_CPU['page']:7.1f} ms"
            )
            print(
                f"(c) GET /api/jobs/{JOB} over HTTP ({len(response.content) / 1e6:.1f} MB JSON)        "
                f"{http_ms:8.1f} ms  CPU {_CPU['http']:7.1f} ms   target < 500 ms"
            )
            print(f"(d) GET /api/fleet                                          {fleet_ms:8.1f} ms")
            print(
                f"(d) GET /api/jobs/{JOB} zoomed to 10 min (raw tables)       {zoom_ms:8.1f} ms  CPU {_CPU['zoom']:7.1f} ms"
            )
            print(
                f"(e) efficiency panel, uncached (job_efficiency + run_efficiency) {efficiency_ms:8.1f} ms  "
                f"CPU {_CPU['efficiency']:7.1f} ms   goodput {panel['goodput_pct'] if panel else None}%"
            )
            print(
                f"(e) fleet goodput column, uncached (job_efficiency)            {goodput_ms:8.1f} ms  "
                f"CPU {_CPU['goodput']:7.1f} ms"
            )
            print(f"(e) GET /api/jobs/{JOB}/efficiency, cached by the server     {cached_ms:8.1f} ms")
            print(
                f"(f) compare page of {JOB} (its one run), uncached (ui.queries.compare) {compare_uncached_ms:8.1f} ms  "
                f"CPU {_CPU['compare']:7.1f} ms; GET /api/compare cached 60 s {compare_ms:6.1f} ms"
            )
            print(
                f"(g) {args.burst} concurrent GET /api/jobs/{JOB}, --max-queries 4: "
                f"{burst['ok']} x 200, {burst['busy']} x 503 (Retry-After {burst['retry_after']}, slowest 503 "
                f"{burst['slowest_busy_s']:.2f} s), slowest answer {burst['slowest_s']:.1f} s, all in {burst['wall_s']:.1f} s"
            )
            print(
                f"(h) GET /api/jobs/{JOB} once the job completed: first {finished_first.headers.get('X-Ranksight-Cache')}, "
                f"then {finished.headers.get('X-Ranksight-Cache')} in {finished_ms:8.1f} ms"
            )
        finally:
            close(dsn)


if __name__ == "__main__":
    main()
