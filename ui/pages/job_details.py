"""The job page's GPU, GPM, host, data-loader, data-path and collective panels: SQL and recording fold (`DetailFold`).

A big job's page answers these apart (`/api/jobs/<id>/details`) so the page draws before they are
read; above `ui.rows.MAX_RANK_ROWS` ranks GPUs and hosts are drawn as bands, not one line each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clickhouse_connect.driver.client import Client

from sinks.page_rollups import (
    COLLECTIVE_ROLLUP,
    GPM_ROLLUP,
    GPM_SAMPLE,
    LOADER_ROLLUP,
    LOADER_WORST,
    rollup_rows,
    top_rank,
    top_sql,
    top_value,
)
from ui.pages.common import (
    GIB,
    JOB_WHERE,
    MINUTE_MS,
    JobFrame,
    Mean,
    PanelFold,
    RawJson,
    between,
    bucket_sql,
    ch_round,
    fetch_rows,
    json_columns,
    ms_of,
    rollup_cut,
    rollup_source,
    round_sql,
    rounded,
)
from ui.rows import RowLayout

__all__ = ["DATAPATH_METRICS", "DETAIL_PANELS", "GPU_WHERE", "DetailFold", "details_panels", "gpu_keys"]


# Node names and GPU keys are parameters like every other value (a node may be named anything).
GPU_WHERE = (
    "cluster = {cluster:String} AND node IN {nodes:Array(String)} "
    "AND (node, gpu_index) IN {keys:Array(Tuple(String, Int32))}"
)


# A node's network throughput, Ethernet and InfiniBand, in and out, in Gbit/s (issue 38.3); unknown
# when the agent measured none of them. The SQL and the recording fold say the same.
_NET_FIELDS = ("net_rx_bytes_s", "net_tx_bytes_s", "ib_rx_bytes_s", "ib_tx_bytes_s")
NET_GBPS = (
    "if("
    + " AND ".join(f"isNull({f})" for f in _NET_FIELDS)
    + ", NULL, ("
    + " + ".join(f"ifNull({f}, 0)" for f in _NET_FIELDS)
    + ") * 8 / 1e9)"
)


def net_gbps(r: dict[str, Any]) -> float | None:
    """A HostSample's network throughput in Gbit/s (None when it measured none)."""
    values = [r.get(f) for f in _NET_FIELDS]
    if all(v is None for v in values):
        return None
    return sum(float(v) for v in values if v is not None) * 8 / 1e9


def _gpu_buckets(width: int) -> tuple[str, str]:
    """The source and the SQL of per (bucket `b`, node, GPU) activity, power, SM clock, memory used (GiB)."""
    if width >= MINUTE_MS:
        return (
            "gpu_minute",
            (
                f"SELECT {bucket_sql('toUnixTimestamp(minute) * 1000')} AS b, node, gpu_index, "
                "avgMerge(gpu_util_pct_avg) AS util, avgMerge(power_w_avg) AS power, "
                "avgMerge(sm_clock_mhz_avg) AS sm_clock, max(mem_used_bytes_max) / 1073741824 AS mem_used "
                f"FROM gpu_minute WHERE {GPU_WHERE} "
                "AND minute >= toDateTime(intDiv({t0:Int64}, 1000), 'UTC') "
                "AND minute < toDateTime(intDiv({t1:Int64}, 1000), 'UTC') GROUP BY b, node, gpu_index"
            ),
        )
    return (
        "gpu_samples",
        (
            f"SELECT {bucket_sql(ms_of('ts'))} AS b, node, gpu_index, avg(gpu_util_pct) AS util, "
            "avg(power_w) AS power, avg(sm_clock_mhz) AS sm_clock, max(mem_used_bytes) / 1073741824 AS mem_used "
            f"FROM gpu_samples WHERE {GPU_WHERE} AND {between('ts')} GROUP BY b, node, gpu_index"
        ),
    )


def gpu_keys(ranks: Sequence[dict[str, Any]]) -> list[tuple[str, int]]:
    return sorted({(r["node"], int(r["gpu_index"])) for r in ranks if r["gpu_index"] is not None})


_GPU_VALUES = (("util", 1), ("power", 1), ("sm_clock", 0), ("mem_used", 2))


def _gpu_cells(
    client: Client,
    sql: str,
    keys: list[tuple[str, int]],
    values: Sequence[tuple[str, int]] = _GPU_VALUES,
    **params: Any,
) -> RawJson:
    """One row per (bucket, GPU) with every metric: the page draws the activity heatmap, the bands
    across GPUs and the line of whichever GPU an alert names from the same columns."""
    return json_columns(
        client,
        # The GPU's row: a hash look-up of "node/gpu" (a node name may hold '/', the GPU index never
        # does: the key is unambiguous); indexOf over the key array per row was 3x slower at 512 GPUs.
        "SELECT intDiv(b - {t0:Int64}, {width:Int64}) AS x, "
        "transform(concat(node, '/', toString(gpu_index)), {names:Array(String)}, "
        "range(toUInt32(length({names:Array(String)}))), -1) AS i, "
        f"{', '.join(round_sql(v, digits) for v, digits in values)} FROM ({sql}) ORDER BY x, i",
        nodes=sorted({n for n, _ in keys}),
        keys=[(n, int(g)) for n, g in keys],
        names=[f"{n}/{int(g)}" for n, g in keys],
        **params,
    )


_GPU_COLUMNS = ["bucket index", "gpu", "util", "power", "sm_clock", "mem_used"]


def _gpus(
    client: Client,
    cluster: str,
    ranks: list[dict[str, Any]],
    t0: int,
    t1: int,
    width: int,
    layout: RowLayout | None = None,
    named: Sequence[tuple[str, int]] = (),
) -> dict[str, Any]:
    """Per (bucket, GPU of the job): activity, power, SM clock and memory used (GiB), as JSON columns.

    With a grouped `layout` (`ui.rows`): per (bucket, node row) the least busy GPU's activity (and
    which GPU), power and clock bands across the job's GPUs worked out by ClickHouse, and the lines of
    the GPUs in `named` (the ones the page's alerts name).
    """
    keys = gpu_keys(ranks)
    if not keys:
        return {"source": None, "labels": [], "keys": [], "columns": [], "cells": []}
    if layout is not None and layout.grouped:
        return _gpus_grouped(client, cluster, keys, layout, named, t0, t1, width)
    rank_of = {(r["node"], r["gpu_index"]): r["rank"] for r in ranks}
    labels = [f"{node}/gpu{gpu} r{rank_of[(node, gpu)]}" for node, gpu in keys]
    source, sql = _gpu_buckets(width)
    cells = _gpu_cells(client, sql, keys, cluster=cluster, t0=t0, t1=t1, width=width)
    return {
        "source": source,
        "labels": labels,
        "keys": [[n, g] for n, g in keys],
        "columns": _GPU_COLUMNS,
        "cells": cells,
    }


_BANDED = ("power", "sm_clock", "mem_used")


def _gpus_grouped(
    client: Client,
    cluster: str,
    keys: list[tuple[str, int]],
    layout: RowLayout,
    named: Sequence[tuple[str, int]],
    t0: int,
    t1: int,
    width: int,
) -> dict[str, Any]:
    # One level over the GPU rows of the job's nodes (no per-GPU mean first, no (node, GPU) key
    # filter: both cost seconds at 16,384 GPUs): a row's cell is the least busy GPU-minute (or sample)
    # of its nodes in the bucket; the bands are taken over every GPU-minute of the bucket.
    if width >= MINUTE_MS:
        source, time_ms = "gpu_minute", "toUnixTimestamp(minute) * 1000"
        util, power, clock = (
            f"finalizeAggregation({c})" for c in ("gpu_util_pct_avg", "power_w_avg", "sm_clock_mhz_avg")
        )
        mem = "mem_used_bytes_max"
        when = (
            "minute >= toDateTime(intDiv({t0:Int64}, 1000), 'UTC') "
            "AND minute < toDateTime(intDiv({t1:Int64}, 1000), 'UTC')"
        )
    else:
        source, time_ms = "gpu_samples", ms_of("ts")
        util, power, clock, mem = "gpu_util_pct", "power_w", "sm_clock_mhz", "mem_used_bytes"
        when = between("ts")
    rows = (
        f"SELECT {time_ms} AS t, node, gpu_index, {util} AS util, {power} AS power, {clock} AS sm_clock, "
        f"{mem} / 1073741824 AS mem_used FROM {source} WHERE cluster = {{cluster:String}} "
        f"AND node IN {{nodes:Array(String)}} AND {when}"
    )
    params: dict[str, Any] = {
        "cluster": cluster,
        "nodes": layout.node_keys,
        "t0": t0,
        "t1": t1,
        "width": width,
    }
    cells = json_columns(
        client,
        # The least busy GPU's name is made once per cell, not once per GPU-minute (2 M strings at 16,384 GPUs).
        f"SELECT x, i, {round_sql('least', 1)}, if(least IS NULL, NULL, "
        "concat(tupleElement(gpu, 1), '/gpu', toString(tupleElement(gpu, 2)))) FROM ("
        "SELECT intDiv(t - {t0:Int64}, {width:Int64}) AS x, "
        "transform(node, {node_keys:Array(String)}, {node_rows:Array(Int32)}, -1) AS i, "
        f"min(util) AS least, argMin((node, gpu_index), util) AS gpu FROM ({rows}) "
        "WHERE t >= {t0:Int64} GROUP BY x, i) ORDER BY x, i",
        node_keys=layout.node_keys,
        node_rows=layout.node_rows,
        **params,
    )
    bands: dict[str, dict[str, list[list[Any]]]] = {k: {"min": [], "median": [], "max": []} for k in _BANDED}
    quantiles = ", ".join(f"min({k}), quantileExact(0.5)({k}), max({k})" for k in _BANDED)
    for row in fetch_rows(
        client, f"SELECT {bucket_sql('t')} AS b, {quantiles} FROM ({rows}) GROUP BY b ORDER BY b", **params
    ):
        for i, k in enumerate(_BANDED):
            digits = 0 if k == "sm_clock" else 2 if k == "mem_used" else 1
            for j, part in enumerate(("min", "median", "max")):
                bands[k][part].append([int(row[0]), rounded(row[1 + 3 * i + j], digits)])
    wanted = [key for key in keys if key in set(named)]
    named_sql = _gpu_buckets(width)[1]
    return {
        "source": source,
        "labels": layout.labels,
        "keys": [],
        "rows": layout.as_dict(),
        # Only activity per row: power, clock and memory are the bands (reading an avg state per
        # GPU-minute is most of this panel's cost at 16,384 GPUs).
        "columns": ["bucket index", "row", "util", "least busy gpu"],
        "cells": cells,
        "bands": bands,
        # The lines of the GPUs the page's alerts name, drawn over the bands when one is focused.
        "named": {
            "keys": [[n, g] for n, g in wanted],
            "cells": _gpu_cells(client, named_sql, wanted, cluster=cluster, t0=t0, t1=t1, width=width)
            if wanted
            else [],
        },
    }


# NVML GPM (Hopper and newer): what share of the interval the SMs and their tensor pipes were busy; a
# collective spinning on a GPU keeps `util` at 100 % with little tensor work. Null on older GPUs.
_GPM_FILTER = GPM_SAMPLE


def _gpm(
    client: Client,
    cluster: str,
    ranks: list[dict[str, Any]],
    t0: int,
    t1: int,
    width: int,
    layout: RowLayout | None = None,
) -> dict[str, Any]:
    """SM and tensor-pipe activity per (bucket, GPU) from the raw samples (`gpu_minute` holds no GPM);
    on a grouped page per (bucket, node row): its least active GPU. Empty cells where no GPU reports GPM."""
    keys = gpu_keys(ranks)
    columns = ["bucket index", "gpu", "sm_active", "tensor_active"]
    if not keys:
        return {"columns": columns, "cells": []}
    if layout is not None and layout.grouped:
        params: dict[str, Any] = {"cluster": cluster, "nodes": layout.node_keys, "t0": t0, "t1": t1}
        where = f"cluster = {{cluster:String}} AND node IN {{nodes:Array(String)}} AND {between('ts')}"
        # Most fleets have no GPM (pre-Hopper GPUs): one sample tells, before a scan of every sample.
        if not fetch_rows(
            client,
            f"SELECT count() FROM (SELECT 1 FROM gpu_samples WHERE {where} AND {_GPM_FILTER} LIMIT 1)",
            **params,
        )[0][0]:
            return {"columns": ["bucket index", "row", "sm_active", "tensor_active"], "cells": []}
        cut = rollup_cut(t0, t1, width)
        if cut is None:
            sql = (
                f"SELECT intDiv({ms_of('ts')} - {{t0:Int64}}, {{width:Int64}}) AS x, "
                "transform(node, {node_keys:Array(String)}, {node_rows:Array(Int32)}, -1) AS i, "
                f"{round_sql('min(sm_active_pct)', 1)}, {round_sql('min(tensor_active_pct)', 1)} FROM gpu_samples "
                f"WHERE {where} AND {_GPM_FILTER} GROUP BY x, i ORDER BY x, i"
            )
        else:
            # Whole minutes from `gpm_node_minute` (a node's least active GPU sample per minute), the
            # minute the range's end cuts from the raw samples.
            nodes = "cluster = {cluster:String} AND node IN {nodes:Array(String)}"
            rows = rollup_rows(
                GPM_ROLLUP,
                f"{nodes} AND gpm_samples > 0 AND minute >= toDateTime(intDiv({{t0:Int64}}, 1000), 'UTC') "
                "AND minute < toDateTime(intDiv({cut:Int64}, 1000), 'UTC')",
                f"{nodes} AND {_GPM_FILTER} AND ts >= fromUnixTimestamp64Milli({{cut:Int64}}, 'UTC') "
                "AND ts < fromUnixTimestamp64Milli({t1:Int64}, 'UTC')",
            )
            sql = (
                "SELECT intDiv(toInt64(toUnixTimestamp(minute)) * 1000 - {t0:Int64}, {width:Int64}) AS x, "
                "transform(node, {node_keys:Array(String)}, {node_rows:Array(Int32)}, -1) AS i, "
                f"{round_sql('min(sm_active_min)', 1)}, {round_sql('min(tensor_active_min)', 1)} FROM ({rows}) "
                "GROUP BY x, i ORDER BY x, i"
            )
            params["cut"] = cut
        cells = json_columns(
            client,
            sql,
            node_keys=layout.node_keys,
            node_rows=layout.node_rows,
            width=width,
            **params,
        )
        return {"columns": ["bucket index", "row", "sm_active", "tensor_active"], "cells": cells}
    sql = (
        f"SELECT {bucket_sql(ms_of('ts'))} AS b, node, gpu_index, avg(sm_active_pct) AS sm_active, "
        f"avg(tensor_active_pct) AS tensor_active FROM gpu_samples WHERE {GPU_WHERE} AND {between('ts')} "
        f"AND {_GPM_FILTER} GROUP BY b, node, gpu_index"
    )
    cells = _gpu_cells(
        client,
        sql,
        keys,
        (("sm_active", 1), ("tensor_active", 1)),
        cluster=cluster,
        t0=t0,
        t1=t1,
        width=width,
    )
    return {"columns": columns, "cells": cells}


def _hosts(
    client: Client,
    cluster: str,
    nodes: list[str],
    t0: int,
    t1: int,
    width: int,
    named: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Host CPU, memory, retransmits and IB errors per node and bucket.

    `named` (a page of many nodes): lines only for those nodes, and min / median / max bands across
    all `nodes` per bucket, worked out by ClickHouse.
    """
    if not nodes:
        return {"nodes": [], "cpu": {}, "mem_pct": {}, "retrans": {}, "ib_errors": {}, "net_gbps": {}}
    lines = sorted(nodes) if named is None else sorted(set(named) & set(nodes))
    out: dict[str, Any] = {
        "nodes": lines,
        "cpu": {},
        "mem_pct": {},
        "retrans": {},
        "ib_errors": {},
        "net_gbps": {},
    }
    per_node = (
        f"SELECT node, {bucket_sql(ms_of('ts'))} AS b, avg(cpu_util_pct) AS cpu, "
        "avg(100 * mem_used_bytes / nullIf(mem_total_bytes, 0)) AS mem, avg(tcp_retrans_segs_s) AS retrans, "
        f"max(ib_errors) AS ib, avg({NET_GBPS}) AS gbps "
        "FROM host_samples WHERE cluster = {cluster:String} AND node IN {nodes:Array(String)} "
        f"AND {between('ts')} GROUP BY node, b"
    )
    for node, b, cpu, mem, retrans, ib, gbps in (
        fetch_rows(
            client, f"{per_node} ORDER BY node, b", cluster=cluster, nodes=lines, t0=t0, t1=t1, width=width
        )
        if lines
        else []
    ):
        b = int(b)
        out["cpu"].setdefault(node, []).append([b, rounded(cpu, 1)])
        out["mem_pct"].setdefault(node, []).append([b, rounded(mem, 1)])
        out["retrans"].setdefault(node, []).append([b, rounded(retrans, 1)])
        out["ib_errors"].setdefault(node, []).append([b, None if ib is None else int(ib)])
        out["net_gbps"].setdefault(node, []).append([b, rounded(gbps, 3)])
    if named is not None:
        # Over every sample of the nodes in the bucket (one level: a per-node mean first doubles the cost).
        metrics = ("cpu", "mem_pct", "retrans", "net_gbps")
        bands: dict[str, dict[str, list[list[Any]]]] = {
            k: {"min": [], "median": [], "max": []} for k in metrics
        }
        values = (
            "cpu_util_pct",
            "100 * mem_used_bytes / nullIf(mem_total_bytes, 0)",
            "tcp_retrans_segs_s",
            NET_GBPS,
        )
        for row in fetch_rows(
            client,
            f"SELECT {bucket_sql(ms_of('ts'))} AS b, "
            + ", ".join(f"min({v}), quantileExact(0.5)({v}), max({v})" for v in values)
            + " FROM host_samples WHERE cluster = {cluster:String} AND node IN {nodes:Array(String)} "
            f"AND {between('ts')} GROUP BY b ORDER BY b",
            cluster=cluster,
            nodes=list(nodes),
            t0=t0,
            t1=t1,
            width=width,
        ):
            for i, k in enumerate(metrics):
                for j, part in enumerate(("min", "median", "max")):
                    bands[k][part].append([int(row[0]), rounded(row[1 + 3 * i + j], 1)])
        out["bands"] = bands
        out["of"] = len(nodes)
    return out


# The data-path panel: per bucket, the median rank's value and the worst rank's (which rank it was),
# "worst" being the highest latency or preparation time, or the lowest throughput, cache hit ratio or
# share of live loader workers. Name, SQL of the value, digits, whether low is worst.
_DIGITS = {
    "batch_prep_s": 4,
    "read_latency_s": 5,
    "read_mb_s": 2,
    "cache_hit_ratio": 4,
    "workers_live": 3,
    "file_opens_s": 2,
}
DATAPATH_METRICS: tuple[tuple[str, str, int, bool], ...] = tuple(
    (name, value, _DIGITS[name], low) for name, value, low in LOADER_WORST
)
# A bucket's minute roll-ups (`sinks.page_rollups`) start at the bucket's whole minute.
_MINUTE_BUCKET = "intDiv(toInt64(toUnixTimestamp(minute)) * 1000, {width:Int64}) * {width:Int64}"


def _datapath(client: Client, job_id: str, t0: int, t1: int, width: int) -> dict[str, Any]:
    """Data wait aside (the data-loader panel), the loader's own measurements: median and worst rank per
    bucket, and the loader errors summed (`DataLoaderSample`).

    Over whole minutes the worst ranks and the errors come from `loader_minute`; the medians (which no
    partial sum holds) from the raw samples, in a second query.
    """
    params = {"job": job_id, "t0": t0, "t1": t1, "width": width}
    cut = rollup_cut(t0, t1, width)
    medians = ", ".join(f"quantileExact(0.5)({value})" for _, value, _, _ in DATAPATH_METRICS)
    if cut is None:
        parts = []
        for _, value, _, low in DATAPATH_METRICS:
            kind = "min" if low else "max"
            top = top_sql(kind, value)
            parts.append(f"{top_value(top)}, {top_rank(top, kind)}")
        worst_sql = (
            f"SELECT {bucket_sql(ms_of('ts'))} AS b, {', '.join(parts)}, sum(errors), sum(file_open_errors) "
            f"FROM dataloader_samples WHERE {JOB_WHERE} AND {between('ts')} GROUP BY b ORDER BY b"
        )
    else:
        parts = []
        for name, _, _, low in DATAPATH_METRICS:
            top = f"{'min' if low else 'max'}({name}_top)"
            parts.append(f"{top_value(top)}, {top_rank(top, 'min' if low else 'max')}")
        worst_sql = (
            f"SELECT {_MINUTE_BUCKET} AS b, {', '.join(parts)}, sum(errors_sum), sum(file_open_errors_sum) "
            f"FROM ({rollup_source(LOADER_ROLLUP, 'ts')}) GROUP BY b ORDER BY b"
        )
        params["cut"] = cut
    worst_rows = fetch_rows(client, worst_sql, **params)
    median_of = {
        int(r[0]): r[1:]
        for r in fetch_rows(
            client,
            f"SELECT {bucket_sql(ms_of('ts'))} AS b, {medians} FROM dataloader_samples "
            f"WHERE {JOB_WHERE} AND {between('ts')} GROUP BY b ORDER BY b",
            job=job_id,
            t0=t0,
            t1=t1,
            width=width,
        )
    }
    out: dict[str, Any] = {}
    for i, (name, _, digits, _) in enumerate(DATAPATH_METRICS):
        median: list[list[Any]] = []
        worst: list[list[Any]] = []
        for r in worst_rows:
            b = int(r[0])
            middle = median_of.get(b, [None] * len(DATAPATH_METRICS))[i]
            value, rank = r[1 + 2 * i], r[2 + 2 * i]
            if middle is not None:
                median.append([b, rounded(middle, digits)])
            if value is not None:
                worst.append([b, rounded(value, digits), int(rank)])
        out[name] = {"median": median, "worst": worst}
    n = 1 + 2 * len(DATAPATH_METRICS)
    out["errors"] = [[int(r[0]), int(r[n] or 0), int(r[n + 1] or 0)] for r in worst_rows if r[n] or r[n + 1]]
    return out


def _dataloader(client: Client, job_id: str, t0: int, t1: int, width: int) -> dict[str, Any]:
    """Data-wait fraction (mean and worst rank) and queue depth (mean and lowest) per bucket; over whole
    minutes from `loader_minute`."""
    params = {"job": job_id, "t0": t0, "t1": t1, "width": width}
    cut = rollup_cut(t0, t1, width)
    if cut is None:
        frac = "wait_s / nullIf(interval_s, 0)"
        sql = (
            f"SELECT {bucket_sql(ms_of('ts'))} AS b, avg({frac}), {top_value(top_sql('max', frac))}, "
            f"{top_rank(top_sql('max', frac), 'max')}, "
            "avg(queue_depth), min(queue_depth) "
            f"FROM dataloader_samples WHERE {JOB_WHERE} AND {between('ts')} GROUP BY b ORDER BY b"
        )
    else:
        sql = (
            f"SELECT {_MINUTE_BUCKET} AS b, sum(wait_frac_sum) / sum(wait_frac_n), "
            f"{top_value('max(wait_frac_top)')}, {top_rank('max(wait_frac_top)', 'max')}, "
            "sum(queue_sum) / sum(queue_n), min(queue_min) "
            f"FROM ({rollup_source(LOADER_ROLLUP, 'ts')}) GROUP BY b ORDER BY b"
        )
        params["cut"] = cut
    rows = fetch_rows(client, sql, **params)
    return {
        "wait_frac_avg": [[int(r[0]), rounded(r[1])] for r in rows],
        "wait_frac_max": [[int(r[0]), rounded(r[2]), int(r[3])] for r in rows if r[2] is not None],
        "queue_depth_avg": [[int(r[0]), rounded(r[4], 2)] for r in rows],
        "queue_depth_min": [[int(r[0]), rounded(r[5], 2)] for r in rows],
    }


def _collectives(client: Client, job_id: str, t0: int, t1: int, width: int) -> dict[str, Any]:
    """Each collective op's share of the time and its bus bandwidth per bucket; over whole minutes from
    `collective_minute`."""
    params = {"job": job_id, "t0": t0, "t1": t1, "width": width}
    cut = rollup_cut(t0, t1, width)
    if cut is None:
        sql = (
            f"SELECT op, {bucket_sql(ms_of('ts'))} AS b, sum(time_s) / nullIf(sum(interval_s), 0), "
            f"avg(bus_bw_gbps) FROM collective_samples WHERE {JOB_WHERE} AND {between('ts')} "
            "GROUP BY op, b ORDER BY op, b"
        )
    else:
        sql = (
            f"SELECT op, {_MINUTE_BUCKET} AS b, sum(time_sum) / nullIf(sum(interval_sum), 0), "
            f"sum(bus_bw_sum) / sum(bus_bw_n) FROM ({rollup_source(COLLECTIVE_ROLLUP, 'ts')}) "
            "GROUP BY op, b ORDER BY op, b"
        )
        params["cut"] = cut
    out: dict[str, dict[str, list[list[Any]]]] = {}
    for op, b, frac, bw in fetch_rows(client, sql, **params):
        series = out.setdefault(op, {"time_frac": [], "bus_bw_gbps": []})
        series["time_frac"].append([int(b), rounded(frac)])
        series["bus_bw_gbps"].append([int(b), rounded(bw, 2)])
    return out


# The panels a big job's page answers apart (`job_details`): GPUs, hosts and the data loader, read
# over every GPU, node and rank (a second or more at 16,384 ranks on the 2-core build machine).
DETAIL_PANELS = ("gpus", "gpm", "hosts", "dataloader", "datapath", "collectives")


def details_panels(client: Client, f: JobFrame) -> dict[str, Any]:
    cluster = f.meta.get("cluster", "")
    alerts = f.alerts
    return {
        "gpus": _gpus(
            client,
            cluster,
            f.ranks,
            f.start,
            f.end,
            f.width,
            f.layout,
            [(a["node"], int(a["gpu_index"])) for a in alerts if a["node"] and a["gpu_index"] is not None],
        ),
        "gpm": _gpm(client, cluster, f.ranks, f.start, f.end, f.width, f.layout),
        "hosts": _hosts(
            client,
            cluster,
            f.hosts_nodes,
            f.start,
            f.end,
            f.width,
            [a["node"] for a in alerts if a["node"]] if f.grouped else None,
        ),
        "dataloader": _dataloader(client, f.job_id, f.start, f.end, f.width),
        "datapath": _datapath(client, f.job_id, f.start, f.end, f.width),
        "collectives": _collectives(client, f.job_id, f.start, f.end, f.width),
    }


class DetailFold(PanelFold):
    """The recording fold of these panels (a part of `ui.pages.job.Panels`)."""

    def _init_details(self) -> None:
        frame = self.f
        self.cluster = frame.meta.get("cluster", "")
        self.nodes = set(frame.nodes)
        self.gpu_index = {key: i for i, key in enumerate(frame.gpu_keys)}
        self.gpus: dict[tuple[int, int], list[Any]] = {}
        self.hosts: dict[tuple[str, int], list[Any]] = {}
        self.loader: dict[int, list[Any]] = {}
        self.collectives: dict[tuple[str, int], list[Any]] = {}
        self.gpu_faults: dict[tuple[str, int], list[Any]] = {}
        self.gpm: dict[tuple[int, int], list[Mean]] = {}
        self.datapath: dict[int, list[Any]] = {}

    def _gpu(self, r: dict[str, Any]) -> None:
        f = self.f
        if r["cluster"] != self.cluster:
            return
        i = self.gpu_index.get((r["node"], r["gpu_index"]))
        if i is None:
            return
        ts = r["ts"]
        if f.width >= MINUTE_MS:
            # `gpu_minute`: the sample's minute decides, its whole seconds against the range's.
            minute = ts // MINUTE_MS * MINUTE_MS
            if not (f.start // 1000 * 1000 <= minute < f.end // 1000 * 1000):
                return
            b = minute // f.width * f.width
        else:
            if not f.start <= ts < f.end:
                return
            b = ts // f.width * f.width
        x = (b - f.start) // f.width
        cell = self.gpus.get((x, i))
        if cell is None:
            cell = self.gpus[(x, i)] = [Mean(), Mean(), Mean(), None]
        cell[0].add(r.get("gpu_util_pct"))
        cell[1].add(r.get("power_w"))
        cell[2].add(r.get("sm_clock_mhz"))
        used = r.get("mem_used_bytes")
        if used is not None and (cell[3] is None or used > cell[3]):
            cell[3] = used

    def _host(self, r: dict[str, Any]) -> None:
        if r["cluster"] != self.cluster or r["node"] not in self.nodes:
            return
        b = self._bucket(r["ts"])
        if b is None:
            return
        cell = self.hosts.get((r["node"], b))
        if cell is None:
            cell = self.hosts[(r["node"], b)] = [Mean(), Mean(), Mean(), None, Mean()]
        cell[0].add(r.get("cpu_util_pct"))
        used, total = r.get("mem_used_bytes"), r.get("mem_total_bytes")
        cell[1].add(100 * used / total if used is not None and total else None)
        cell[2].add(r.get("tcp_retrans_segs_s"))
        ib = r.get("ib_errors")
        if ib is not None and (cell[3] is None or ib > cell[3]):
            cell[3] = ib
        cell[4].add(net_gbps(r))

    def _loader(self, r: dict[str, Any]) -> None:
        b = self._bucket(r["ts"])
        if b is None:
            return
        cell = self.loader.get(b)
        if cell is None:
            cell = self.loader[b] = [Mean(), None, None, Mean(), None]
        interval = r.get("interval_s")
        frac = r["wait_s"] / interval if interval and r.get("wait_s") is not None else None
        cell[0].add(frac)
        # argMax over the table's order (job, rank, time): of equal fractions, the lowest rank's.
        if frac is not None and (
            cell[1] is None or frac > cell[1] or (frac == cell[1] and r["rank"] < cell[2])
        ):
            cell[1], cell[2] = frac, r["rank"]
        depth = r.get("queue_depth")
        cell[3].add(depth)
        if depth is not None and (cell[4] is None or depth < cell[4]):
            cell[4] = depth

    def _collective(self, r: dict[str, Any]) -> None:
        b = self._bucket(r["ts"])
        if b is None:
            return
        cell = self.collectives.get((r["op"], b))
        if cell is None:
            cell = self.collectives[(r["op"], b)] = [0.0, 0.0, 0, Mean()]
        if r.get("time_s") is not None:
            cell[0] += r["time_s"]
        if r.get("interval_s") is not None:
            cell[1] += r["interval_s"]
        cell[3].add(r.get("bus_bw_gbps"))

    def _gpu_extra(self, r: dict[str, Any]) -> None:
        # GPM means and fault samples of the job's GPUs over the raw samples in [start, end).
        f = self.f
        if r["cluster"] != self.cluster or not f.start <= r["ts"] < f.end:
            return
        i = self.gpu_index.get((r["node"], r["gpu_index"]))
        if i is None:
            return
        sm, tensor = r.get("sm_active_pct"), r.get("tensor_active_pct")
        if sm is not None or tensor is not None:
            x = (r["ts"] // f.width * f.width - f.start) // f.width
            cell = self.gpm.setdefault((x, i), [Mean(), Mean()])
            cell[0].add(sm)
            cell[1].add(tensor)
        xid, ecc = r.get("xid"), r.get("ecc_uncorrected")
        if xid is not None or (ecc is not None and ecc > 0):
            fault = self.gpu_faults.setdefault(
                (r["node"], r["gpu_index"]), [r["ts"], r["ts"], set(), None, 0]
            )
            fault[0], fault[1] = min(fault[0], r["ts"]), max(fault[1], r["ts"])
            if xid is not None:
                fault[2].add(xid)
                fault[4] += 1
            if ecc is not None and (fault[3] is None or ecc > fault[3]):
                fault[3] = ecc

    def _datapath(self, r: dict[str, Any]) -> None:
        b = self._bucket(r["ts"])
        if b is None:
            return
        cell = self.datapath.get(b)
        if cell is None:
            cell = self.datapath[b] = [[] for _ in DATAPATH_METRICS] + [None, None]
        workers, expected, read = r.get("workers"), r.get("workers_expected"), r.get("read_bytes_s")
        values = {
            "batch_prep_s": r.get("batch_prep_s"),
            "read_latency_s": r.get("read_latency_s"),
            "read_mb_s": None if read is None else read / 1000000,
            "cache_hit_ratio": r.get("cache_hit_ratio"),
            "workers_live": workers / expected if workers is not None and expected else None,
            "file_opens_s": r.get("file_opens_s"),
        }
        for i, (name, _, _, _) in enumerate(DATAPATH_METRICS):
            if values[name] is not None:
                cell[i].append((values[name], r["rank"]))
        n = len(DATAPATH_METRICS)
        for j, key in enumerate(("errors", "file_open_errors")):
            if r.get(key) is not None:
                cell[n + j] = (cell[n + j] or 0) + r[key]

    def _gpm_panel(self) -> dict[str, Any]:
        columns: list[list[Any]] = [[], [], [], []]
        for (x, i), (sm, tensor) in sorted(self.gpm.items()):
            columns[0].append(x)
            columns[1].append(i)
            columns[2].append(ch_round(sm.value(), 1))
            columns[3].append(ch_round(tensor.value(), 1))
        # ClickHouse writes no rows as `[]`.
        return {
            "columns": ["bucket index", "gpu", "sm_active", "tensor_active"],
            "cells": columns if columns[0] else [],
        }

    def _datapath_panel(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        rows = sorted(self.datapath.items())
        for i, (name, _, digits, low) in enumerate(DATAPATH_METRICS):
            median: list[list[Any]] = []
            worst: list[list[Any]] = []
            for b, cell in rows:
                values = cell[i]
                if not values:
                    continue
                ordered = sorted(v for v, _ in values)
                median.append([b, rounded(ordered[len(ordered) // 2], digits)])
                # argMin / argMax over the table's order (job, rank, time): of equal values, the lowest rank's.
                value, rank = (min if low else max)(values, key=lambda p: (p[0], p[1] if low else -p[1]))
                worst.append([b, rounded(value, digits), rank])
            out[name] = {"median": median, "worst": worst}
        n = len(DATAPATH_METRICS)
        out["errors"] = [[b, int(c[n] or 0), int(c[n + 1] or 0)] for b, c in rows if c[n] or c[n + 1]]
        return out

    def _gpus(self) -> dict[str, Any]:
        f = self.f
        if not f.gpu_keys:
            return {"source": None, "labels": [], "keys": [], "columns": [], "cells": []}
        rank_of = {(r["node"], r["gpu_index"]): r["rank"] for r in f.ranks}
        columns: list[list[Any]] = [[], [], [], [], [], []]
        for (x, i), (util, power, clock, mem) in sorted(self.gpus.items()):
            columns[0].append(x)
            columns[1].append(i)
            columns[2].append(ch_round(util.value(), 1))
            columns[3].append(ch_round(power.value(), 1))
            columns[4].append(ch_round(clock.value(), 0))
            columns[5].append(ch_round(None if mem is None else mem / GIB, 2))
        return {
            "source": "gpu_minute" if f.width >= MINUTE_MS else "gpu_samples",
            "labels": [f"{node}/gpu{gpu} r{rank_of[(node, gpu)]}" for node, gpu in f.gpu_keys],
            "keys": [[n, g] for n, g in f.gpu_keys],
            "columns": ["bucket index", "gpu", "util", "power", "sm_clock", "mem_used"],
            "cells": columns,
        }

    def _hosts(self) -> dict[str, Any]:
        if not self.f.nodes:
            return {"nodes": [], "cpu": {}, "mem_pct": {}, "retrans": {}, "ib_errors": {}, "net_gbps": {}}
        out: dict[str, Any] = {
            "nodes": sorted(self.f.nodes),
            "cpu": {},
            "mem_pct": {},
            "retrans": {},
            "ib_errors": {},
            "net_gbps": {},
        }
        for (node, b), (cpu, mem, retrans, ib, gbps) in sorted(self.hosts.items()):
            out["cpu"].setdefault(node, []).append([b, rounded(cpu.value(), 1)])
            out["mem_pct"].setdefault(node, []).append([b, rounded(mem.value(), 1)])
            out["retrans"].setdefault(node, []).append([b, rounded(retrans.value(), 1)])
            out["ib_errors"].setdefault(node, []).append([b, None if ib is None else int(ib)])
            out["net_gbps"].setdefault(node, []).append([b, rounded(gbps.value(), 3)])
        return out

    def _loader_panel(self) -> dict[str, Any]:
        rows = sorted(self.loader.items())
        return {
            "wait_frac_avg": [[b, rounded(c[0].value())] for b, c in rows],
            "wait_frac_max": [[b, rounded(c[1]), c[2]] for b, c in rows if c[1] is not None],
            "queue_depth_avg": [[b, rounded(c[3].value(), 2)] for b, c in rows],
            "queue_depth_min": [[b, rounded(c[4], 2)] for b, c in rows],
        }

    def _collectives_panel(self) -> dict[str, Any]:
        out: dict[str, dict[str, list[list[Any]]]] = {}
        for (op, b), (time_s, interval_s, _, bw) in sorted(self.collectives.items()):
            series = out.setdefault(op, {"time_frac": [], "bus_bw_gbps": []})
            series["time_frac"].append([b, rounded(time_s / interval_s) if interval_s else None])
            series["bus_bw_gbps"].append([b, rounded(bw.value(), 2)])
        return out
