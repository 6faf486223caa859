"""UI latency: the job page of a 512-rank (or a 16,384-rank) job over 2 hours, next to bare queries on the same rows.

Fills a temporary chDB store with ClickHouse's own generators (`INSERT ... SELECT FROM numbers`,
so the materialized roll-ups fill as they would from the sink): 512 ranks on 64 nodes for two
hours of 1.5 s steps (~2.5 M step rows), 10 s GPU, host, data-loader and collective samples, the
detectors' 30 s rank windows and a few alerts. Then measures, warm, median of --repeat runs:
  (a) baselines: one bare aggregate over the job's step rows (`count(), avg(step_time_s)`) and one
      over its rank windows (the rows the heatmap reads),
  (b) `ui.pages.job.job_page` (every panel's query, what /api/jobs/<job> runs; above 512 ranks its GPU,
      host and loader panels are `ui.pages.job.job_details`, /api/jobs/<job>/details, timed apart),
      and both again over the raw rows instead of the page's per-minute roll-ups (`sinks.page_rollups`),
  (c) the same over HTTP (`/api/jobs/<job>`, aiohttp + JSON), as a browser would fetch it,
  (d) the fleet page and a 10-minute zoom,
  (e) the efficiency panel (`job_efficiency` + `run_efficiency`) and the fleet's goodput column,
      which the pages fetch after they render (`/api/jobs/<job>/efficiency`, `/api/fleet/goodput`),
      uncached (`ui.pages`) and cached by the server (60 s),
  (f) the compare page's JSON (`/api/compare?job=`),
  (g) overload: --burst (200) concurrent page loads against the default gate (4 queries at once,
      8 waiting up to 5 s): how many answered 200 and 503, and the slowest answer,
  (h) the page once the job completed: a cache hit.
Above 512 ranks steps come every 30 s and samples every 60 s (--step-s, --sample-s): 16,384 ranks x
2 h is then 3.9 M step rows and 3.9 M rank windows. Also times the drill-down to one node's ranks.
Target: (c) under 500 ms at 512 ranks, under 1 s at 16,384. Not part of the test suite.
With --browser, (i) the same page in headless Chromium (the system's, RANKSIGHT_CHROMIUM): from
navigation to the first render (the page's `ranksight.ready`), to its GPU, host and loader panels
(`detailsReady`) and its efficiency panel (`efficiencyReady`), for the whole job and for one
node's drill-down; the first load (efficiency uncached) and the median of --repeat more.
Issue 34.5's targets at 16,384 ranks x 2 h: first render < 1 s, every panel < 2 s, drill-down < 1 s.

    .venv/bin/python bench/bench_ui.py [--ranks 512] [--hours 2] [--repeat 5]
    .venv/bin/python bench/bench_ui.py --ranks 16384 --page-only [--browser]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from sinks.clickhouse import close, connect
from sinks.ddl import migrate
from sinks.efficiency import PriceList
from ui.pages import job_details as job_detail_panels
from ui.pages import job_steps
from ui.pages.compare import compare
from ui.pages.efficiency import efficiency, fleet_goodput
from ui.pages.job import job_details, job_page
from ui.server import UiServer

START = "2026-01-01 00:00:00"
GPUS_PER_NODE = 8


def job_name(ranks: int) -> str:
    """The synthetic job's id."""
    return f"bench-{ranks}"


def node_of(rank: int) -> str:
    """The node a synthetic rank runs on (8 per node, in rank order)."""
    return f"node-{rank // GPUS_PER_NODE:04d}"


def fill_job(
    client: Any,
    ranks: int,
    hours: float,
    *,
    step_s: float = 1.5,
    sample_s: int = 10,
    straggler: int = 137,
    job: str | None = None,
    cluster: str = "bench",
) -> dict[str, int]:
    """One job straight into a store with ClickHouse's own generators (`INSERT ... SELECT FROM numbers`, so
    the materialized roll-ups fill as they would from the sink): `ranks` ranks on nodes of 8 GPUs for
    `hours` of steps every `step_s` seconds, GPU, host, data-loader and collective samples every
    `sample_s` seconds, the detectors' 30 s rank windows, checkpoints every 30 minutes, a target of
    twice the steps stored, and a straggler (`straggler`, compute 1.4x, its GPU's SM clock down) in
    the second half with its alerts. Returns the rows written per table.
    """
    job = job or job_name(ranks)
    nodes = max(1, -(-ranks // GPUS_PER_NODE))
    seconds = int(hours * 3600)
    steps = int(seconds / step_s)
    step_ms = int(step_s * 1000)
    node = "concat('node-', leftPad(toString({}), 4, '0'))"
    t = f"toDateTime64('{START}', 3, 'UTC')"
    half = seconds // 2
    client.command(
        "INSERT INTO job_started (ts, job_id, run_id, owner, team, cluster, model_name, model_version, "
        "dataset_version, workload_family, world_size, nodes, data_parallel, tensor_parallel, pipeline_parallel, "
        "gpu_class, checkpoint_max_age_s, target_steps) SELECT "
        f"{t}, '{job}', '{job}-r0', 'bench', 'llm-pretrain', '{cluster}', 'llama', 'v1', 'd1', 'llama-pretrain', "
        f"{ranks}, arrayMap(i -> {node.format('i')}, range({nodes})), {ranks}, 1, 1, 'H100', 3600, {2 * steps}"
    )
    client.command(
        "INSERT INTO rank_bound (ts, job_id, run_id, rank, local_rank, node, gpu_index, pid) "
        f"SELECT {t}, '{job}', '{job}-r0', number, number % {GPUS_PER_NODE}, "
        f"{node.format(f'intDiv(number, {GPUS_PER_NODE})')}, number % {GPUS_PER_NODE}, 1000 + number "
        f"FROM numbers({ranks})"
    )
    slow = f"if(r = {straggler} AND s * {step_ms} > {half * 1000}, 1.4, 1)"
    client.command(
        "INSERT INTO steps (ts, job_id, run_id, rank, step, samples, tokens, loss, lr, grad_norm, step_time_s, "
        "data_wait_s, forward_s, backward_s, optimizer_s, comm_s, checkpoint_s, skipped, epoch) "
        f"SELECT {t} + toIntervalMillisecond(intDiv(number, {ranks}) * {step_ms} + number % {ranks}), '{job}', "
        f"'{job}-r0', number % {ranks} AS r, intDiv(number, {ranks}) AS s, 8, 32768, 3 - s / {steps}, 3e-4, "
        f"1 + rand() / 4e9, 1.5, 0.02, 0.4 * {slow}, 0.8, 0.1, 0.18, 0, false, intDiv(s, 100) "
        f"FROM numbers({steps * ranks})"
    )
    samples = seconds // sample_s
    gpu = f"number % {ranks}"
    client.command(
        "INSERT INTO gpu_samples (ts, cluster, node, gpu_index, gpu_uuid, gpu_util_pct, mem_util_pct, mem_used_bytes, "
        "power_w, sm_clock_mhz, temp_gpu_c, sm_active_pct, tensor_active_pct, job_id) "
        f"SELECT {t} + toIntervalSecond(intDiv(number, {ranks}) * {sample_s}) AS ts, '{cluster}', "
        f"{node.format(f'intDiv({gpu}, {GPUS_PER_NODE})')}, {gpu} % {GPUS_PER_NODE}, "
        f"concat('GPU-', toString({gpu})), 95 + rand() % 5, 60, 70e9, 650 + rand() % 50, "
        f"if({gpu} = {straggler} AND intDiv(number, {ranks}) * {sample_s} > {half}, 1500, 1980), 70, "
        f"88 + rand() % 5, 61 + rand() % 5, '{job}' FROM numbers({samples * ranks})"
    )
    client.command(
        "INSERT INTO host_samples (ts, cluster, node, cpu_util_pct, mem_used_bytes, mem_total_bytes, tcp_retrans_segs_s) "
        f"SELECT {t} + toIntervalSecond(intDiv(number, {nodes}) * {sample_s}), '{cluster}', "
        f"{node.format(f'number % {nodes}')}, 40, 200e9, 1000e9, rand() % 5 FROM numbers({samples * nodes})"
    )
    for table, extra_cols, extra_vals in (
        (
            "dataloader_samples",
            "interval_s, wait_s, queue_depth, workers, workers_expected, batch_prep_s, read_bytes_s, "
            "read_latency_s, cache_hit_ratio, file_opens_s, errors",
            f"{sample_s}, 0.2, 8, 4, 4, 0.05 + (rand() % 10) / 1000, 2e8, 0.004 + (rand() % 10) / 10000, 0.97, 3, 0",
        ),
        (
            "collective_samples",
            "op, interval_s, count, time_s, bus_bw_gbps",
            f"'allreduce', {sample_s}, 7, {sample_s * 0.12}, 180",
        ),
    ):
        client.command(
            f"INSERT INTO {table} (ts, job_id, run_id, rank, {extra_cols}) "
            f"SELECT {t} + toIntervalSecond(intDiv(number, {ranks}) * {sample_s}), '{job}', '{job}-r0', "
            f"number % {ranks}, {extra_vals} FROM numbers({samples * ranks})"
        )
    windows = seconds // 30
    client.command(
        "INSERT INTO derived_rank_windows (window_start, window_end, job_id, run_id, rank, steps, step_time_s, "
        "compute_s, data_wait_s, comm_s, straggler_score) "
        f"SELECT {t} + toIntervalSecond(intDiv(number, {ranks}) * 30), "
        f"{t} + toIntervalSecond(intDiv(number, {ranks}) * 30 + 60), '{job}', '{job}-r0', number % {ranks}, "
        f"{max(1, int(60 / step_s))}, 1.5, 1.3 * if(number % {ranks} = {straggler} "
        f"AND intDiv(number, {ranks}) * 30 > {half}, 1.4, 1) * (1 + (rand() % 100) / 5000), 0.02, 0.18, 1 "
        f"FROM numbers({windows * ranks})"
    )
    checkpoints = max(1, seconds // 1800)
    client.command(
        "INSERT INTO checkpoints (ts, job_id, run_id, checkpoint_id, step, phase, uri, bytes, duration_s, "
        "retention_keep) SELECT "
        f"{t} + toIntervalSecond(intDiv(number, 3) * 1800 + 900 + (number % 3) * 40), '{job}', '{job}-r0', "
        "concat('ckpt-', toString(intDiv(number, 3))), "
        f"toInt64(intDiv(number, 3) * 1800 / {step_s}), ['started', 'completed', 'verified'][number % 3 + 1], "
        f"concat('s3://ckpt/{job}/', toString(intDiv(number, 3))), 5e11, (number % 3) * 40, 3 "
        f"FROM numbers({checkpoints * 3})"
    )
    straggler_node = node_of(straggler)
    client.command(
        "INSERT INTO alerts (alert_id, fingerprint, rule, category, severity, status, ts, starts_at, team, receiver, "
        "summary, owner, job_id, run_id, model_version, dataset_version, workload_family, cluster, node, rank, "
        "gpu_index, invariant, suspected_layer, history_metric, runbook_url) "
        f"SELECT concat('{job}-a', toString(number)), concat('f', toString(number)), 'straggler', 'platform', "
        f"'warning', 'firing', {t} + toIntervalSecond({half + 100} + number * 60), "
        f"{t} + toIntervalSecond({half + 100} + number * 60), 'llm-pretrain', 'default', "
        f"'rank {straggler} is a straggler', 'bench', '{job}', '{job}-r0', 'v1', 'd1', 'llama', '{cluster}', "
        f"'{straggler_node}', {straggler}, {straggler % GPUS_PER_NODE}, 'score >= 0.75', 'gpu', "
        "'straggler_score', '' FROM numbers(5)"
    )
    return {
        "steps": steps * ranks,
        "gpu_samples": samples * ranks,
        "dataloader_samples": samples * ranks,
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


@contextlib.contextmanager
def _raw_rows() -> Iterator[None]:
    """The job page's panels read the raw rows, as before `sinks.page_rollups` (and as a zoomed-in page does)."""
    saved = job_steps.rollup_cut, job_detail_panels.rollup_cut

    def none(t0: int, t1: int, width: int) -> None:
        return None

    job_steps.rollup_cut = job_detail_panels.rollup_cut = none
    try:
        yield
    finally:
        job_steps.rollup_cut, job_detail_panels.rollup_cut = saved


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


# When each of the page's parts is drawn: the flags the page script sets (ui/static/app.js). A page
# whose panels all come in its first answer has no details to wait for.
_DRAWN = {
    "first render": "r.ready",
    "GPU/host/loader": "r.detailsReady || (r.ready && !document.getElementById('details-pending'))",
    "efficiency": "r.efficiencyReady",
}


def _browser(url: str, job: str, repeat: int) -> list[str]:
    """Row (i): the job page and one node's drill-down in headless Chromium, ms from navigation to each part drawn."""
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("RANKSIGHT_CHROMIUM", "/usr/bin/chromium")
    pages = {"job page": f"jobs/{job}", f"drill-down to {node_of(137)}": f"jobs/{job}?node={node_of(137)}"}
    timings: dict[str, list[dict[str, float]]] = {name: [] for name in pages}
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        for _ in range(repeat + 1):
            for name, path in pages.items():
                tab = context.new_page()
                started = time.perf_counter()
                tab.goto(url + path, wait_until="commit")
                drawn = {}
                for part, flag in _DRAWN.items():
                    tab.wait_for_function(
                        f"() => {{ const r = window.ranksight; return r && (r.error || {flag}); }}",
                        timeout=300_000,
                        polling=10,
                    )
                    drawn[part] = (time.perf_counter() - started) * 1000
                error = tab.evaluate("() => window.ranksight.error || null")
                if error:
                    raise SystemExit(f"the page failed in the browser: {error}")
                timings[name].append(drawn)
                tab.close()
        browser.close()
    lines = []
    for name, runs in timings.items():
        first, rest = runs[0], runs[1:]
        parts = ", ".join(
            f"{part} {first[part]:.0f} / {statistics.median(r[part] for r in rest):.0f} ms" for part in _DRAWN
        )
        lines.append(f"(i) Chromium, {name}, first load / median of {len(rest)}: {parts}")
    return lines


def _page_rows(page: dict[str, Any]) -> str:
    rows = page["heatmap"].get("rows") or {}
    kind = rows.get("kind", "rank")
    cells = len(json.loads(page["heatmap"]["cells"].text)[0])
    return f"{len(rows.get('labels') or page['ranks'])} {kind} rows, {cells:,} heatmap cells"


def main() -> None:
    """Fill the store, measure, print."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--step-s", type=float, help="seconds per step (default 1.5; 30 above 512 ranks)")
    parser.add_argument("--sample-s", type=int, help="seconds per sample (default 10; 60 above 512 ranks)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--burst", type=int, default=200, help="concurrent page loads of the overload row")
    parser.add_argument(
        "--page-only",
        action="store_true",
        help="only the baselines, the job page, its drill-down and the fleet",
    )
    parser.add_argument("--browser", action="store_true", help="also time the page in headless Chromium (i)")
    args = parser.parse_args()
    big = args.ranks > 512
    step_s = args.step_s or (30.0 if big else 1.5)
    sample_s = args.sample_s or (60 if big else 10)
    job = job_name(args.ranks)
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        dsn = f"chdb://{Path(tmp) / 'chdb'}"
        client = connect(dsn)
        try:
            migrate(client, ttl_days=None)
            started = time.perf_counter()
            rows = fill_job(client, args.ranks, args.hours, step_s=step_s, sample_s=sample_s)
            print(
                f"store: {args.ranks:,} ranks x {args.hours:g} h, a step every {step_s:g} s, samples every "
                f"{sample_s} s, rank windows every 30 s: "
                + ", ".join(f"{n:,} {t}" for t, n in rows.items())
                + f" (filled in {time.perf_counter() - started:.1f} s)"
            )
            bare, _ = _median_ms(
                lambda: (
                    client.query(
                        "SELECT count(), avg(step_time_s) FROM steps WHERE job_id = {j:String}",
                        parameters={"j": job},
                    ).result_rows
                ),
                args.repeat,
                "bare",
            )
            bare_windows, _ = _median_ms(
                lambda: (
                    client.query(
                        "SELECT count(), max(compute_s), avg(comm_s) FROM derived_rank_windows WHERE job_id = {j:String}",
                        parameters={"j": job},
                    ).result_rows
                ),
                args.repeat,
                "bare_windows",
            )
            # What /api/jobs/<job> answers: a big job's GPU, host and loader panels come apart (/details).
            page_ms, page = _median_ms(
                lambda: job_page(client, job, with_efficiency=False, defer_details=True),
                args.repeat,
                "page",
            )
            span = (page["range"]["from_ms"], page["range"]["to_ms"])
            details_ms, _ = _median_ms(lambda: job_details(client, job, *span), args.repeat, "details")
            # The same two answers over the raw rows (the page's roll-ups off): the baseline of issue 34.5.
            with _raw_rows():
                raw_page_ms, _ = _median_ms(
                    lambda: job_page(client, job, with_efficiency=False, defer_details=True),
                    args.repeat,
                    "raw_page",
                )
                raw_details_ms, _ = _median_ms(
                    lambda: job_details(client, job, *span), args.repeat, "raw_details"
                )
            prices = PriceList.parse(["default=2.5"])
            server = UiServer(client, "127.0.0.1", 0, prices=prices)
            url = server.start()
            try:
                with httpx.Client(timeout=300) as http:
                    http_ms, response = _median_ms(
                        lambda: http.get(f"{url}api/jobs/{job}"), args.repeat, "http"
                    )
                    http_details_ms, details = _median_ms(
                        lambda: http.get(
                            f"{url}api/jobs/{job}/details", params={"from": span[0], "to": span[1]}
                        ),
                        args.repeat,
                        "http_details",
                    )
                    drill_ms, drill = _median_ms(
                        lambda: http.get(f"{url}api/jobs/{job}", params={"node": node_of(137)}),
                        args.repeat,
                        "drill",
                    )
                    fleet_ms, _ = _median_ms(lambda: http.get(f"{url}api/fleet"), args.repeat)
                    in_browser = _browser(url, job, args.repeat) if args.browser else []
                    if not args.page_only:
                        extra = _the_rest(client, http, url, job, page, prices, args)
            finally:
                server.stop()
            load = os.getloadavg()[0]
            print(
                f"load average {load:.1f} on {os.cpu_count()} CPUs; CPU = process CPU time (chDB runs in process)"
            )
            print(
                f"(a) baseline, bare aggregate over the job's step rows       {bare:8.1f} ms  CPU {_CPU['bare']:7.1f} ms"
            )
            print(
                f"(a) baseline, bare aggregate over its rank windows          {bare_windows:8.1f} ms  "
                f"CPU {_CPU['bare_windows']:7.1f} ms"
            )
            print(
                f"(b) job page queries (heatmap from {page['heatmap']['source']}, GPUs from {page['gpus']['source'] if 'gpus' in page else 'the details'}, "
                f"bucket {page['range']['bucket_ms'] // 1000} s, {_page_rows(page)}) {page_ms:8.1f} ms  "
                f"CPU {_CPU['page']:7.1f} ms"
            )
            print(
                f"(b) the same page and panels over the raw rows (roll-ups off): {raw_page_ms:8.1f} ms  "
                f"CPU {_CPU['raw_page']:7.1f} ms; {raw_details_ms:8.1f} ms  CPU {_CPU['raw_details']:7.1f} ms"
            )
            deferred = "details" in page
            print(
                f"(b) its GPU, host and loader panels (ui.pages.job.job_details{'' if deferred else ', in the page above'}) "
                f"{details_ms:8.1f} ms  CPU {_CPU['details']:7.1f} ms"
            )
            print(
                f"(c) GET /api/jobs/{job} over HTTP ({len(response.content) / 1e6:.1f} MB JSON)        "
                f"{http_ms:8.1f} ms  CPU {_CPU['http']:7.1f} ms   target < 1 s"
            )
            if deferred:
                print(
                    f"(c) GET /api/jobs/{job}/details, fetched once the page drew ({len(details.content) / 1e6:.1f} MB) "
                    f"{http_details_ms:8.1f} ms  CPU {_CPU['http_details']:7.1f} ms"
                )
            print(
                f"(c) GET /api/jobs/{job}?node={node_of(137)} (drill-down, {len(drill.content) / 1e6:.1f} MB JSON) "
                f"{drill_ms:8.1f} ms  CPU {_CPU['drill']:7.1f} ms"
            )
            print(f"(d) GET /api/fleet                                          {fleet_ms:8.1f} ms")
            for line in in_browser:
                print(line)
            if not args.page_only:
                for line in extra:
                    print(line)
        finally:
            close(dsn)


def _the_rest(
    client: Any, http: httpx.Client, url: str, job: str, page: dict[str, Any], prices: PriceList, args: Any
) -> list[str]:
    """Rows (d)-(h): zoom, efficiency, compare, overload and the finished job's cached page."""
    compare_uncached_ms, _ = _median_ms(lambda: compare(client, [job]), args.repeat, "compare")
    efficiency_ms, panel = _median_ms(lambda: efficiency(client, job, prices), args.repeat, "efficiency")
    goodput_ms, _ = _median_ms(lambda: fleet_goodput(client), args.repeat, "goodput")
    cached_ms, _ = _median_ms(lambda: http.get(f"{url}api/jobs/{job}/efficiency"), args.repeat, "cached")
    compare_ms, _ = _median_ms(lambda: http.get(f"{url}api/compare", params={"job": job}), args.repeat)
    # Overload: as many concurrent page loads as the issue measured (200), default gate.
    burst = _burst(f"{url}api/jobs/{job}", args.burst)
    t0 = page["range"]["from_ms"] + 3600_000
    zoom_ms, _ = _median_ms(
        lambda: http.get(f"{url}api/jobs/{job}", params={"from": t0, "to": t0 + 600_000}), args.repeat, "zoom"
    )
    # A finished job's page is immutable: the second read is served from the cache.
    client.command(
        "INSERT INTO job_states (ts, job_id, run_id, state, reason, restart_count) VALUES "
        f"(toDateTime64('{START}', 3, 'UTC') + toIntervalHour(3), '{job}', '{job}-r0', 'completed', 'done', 0)"
    )
    finished_first = http.get(f"{url}api/jobs/{job}")
    finished_ms, finished = _median_ms(lambda: http.get(f"{url}api/jobs/{job}"), args.repeat, "cached_page")
    return [
        f"(d) GET /api/jobs/{job} zoomed to 10 min (raw tables)       {zoom_ms:8.1f} ms  CPU {_CPU['zoom']:7.1f} ms",
        f"(e) efficiency panel, uncached (job_efficiency + run_efficiency) {efficiency_ms:8.1f} ms  "
        f"CPU {_CPU['efficiency']:7.1f} ms   goodput {panel['goodput_pct'] if panel else None}%",
        f"(e) fleet goodput column, uncached (job_efficiency)            {goodput_ms:8.1f} ms  "
        f"CPU {_CPU['goodput']:7.1f} ms",
        f"(e) GET /api/jobs/{job}/efficiency, cached by the server     {cached_ms:8.1f} ms",
        f"(f) compare page of {job} (its one run), uncached (ui.pages.compare.compare) {compare_uncached_ms:8.1f} ms  "
        f"CPU {_CPU['compare']:7.1f} ms; GET /api/compare cached 60 s {compare_ms:6.1f} ms",
        f"(g) {args.burst} concurrent GET /api/jobs/{job}, --max-queries 4: "
        f"{burst['ok']} x 200, {burst['busy']} x 503 (Retry-After {burst['retry_after']}, slowest 503 "
        f"{burst['slowest_busy_s']:.2f} s), slowest answer {burst['slowest_s']:.1f} s, all in {burst['wall_s']:.1f} s",
        f"(h) GET /api/jobs/{job} once the job completed: first {finished_first.headers.get('X-Ranksight-Cache')}, "
        f"then {finished.headers.get('X-Ranksight-Cache')} in {finished_ms:8.1f} ms",
    ]


if __name__ == "__main__":
    main()
