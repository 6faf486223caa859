"""The job page's rank heatmap and step series: their SQL and their recording fold (`StepFold`).

Over wide ranges the heatmap reads the detectors' derived rank windows (one row per rank and
30 s), else the step rows; a job of more than `ui.rows.MAX_RANK_ROWS` ranks gets one row per node
or group of nodes.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from clickhouse_connect.driver.client import Client

from sinks.page_rollups import RANK_BLOCK, WINDOW_ROLLUP, top_rank, top_sql, top_value
from ui.pages.common import (
    DERIVED_HOP_MS,
    JOB_WHERE,
    Mean,
    PanelFold,
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
from ui.pages.compare import SEGMENTS
from ui.rows import RowLayout

__all__ = ["StepFold", "rank_heatmap", "step_rate", "step_series"]


_HEAT_COLUMNS = ["bucket index", "rank", "compute", "step", "comm", "wait"]
# The per-rank values a heatmap cell shows, from the derived windows and from the step rows.
_WINDOW_VALUES = ("compute_s", "step_time_s", "comm_s", "data_wait_s")
_STEP_VALUES = (
    "ifNull(forward_s, 0) + ifNull(backward_s, 0) + ifNull(optimizer_s, 0)",
    "step_time_s",
    "comm_s",
    "data_wait_s",
)


def rank_heatmap(
    client: Client, job_id: str, t0: int, t1: int, width: int, layout: RowLayout | None = None
) -> dict[str, Any]:
    """Per (bucket, rank): compute, step time, communication and data wait in seconds, as JSON columns.

    With a `layout` (`ui.rows`): per (bucket, row). A drill-down's rows are its ranks; a node (or
    node group) row holds the row's worst value in the bucket (its slowest window) and which rank it was.
    """
    params = {"job": job_id, "t0": t0, "t1": t1}
    if width >= DERIVED_HOP_MS:
        where = f"{JOB_WHERE} AND {between('window_start')}"
        if fetch_rows(
            client,
            f"SELECT count() FROM (SELECT 1 FROM derived_rank_windows WHERE {where} LIMIT 1)",
            **params,
        )[0][0]:
            cut = rollup_cut(t0, t1, width)
            per_row = layout.ranks_per_row if layout is not None else None
            if cut is not None and layout is not None and per_row is not None and per_row % RANK_BLOCK == 0:
                return _rollup_heatmap(client, layout, {**params, "cut": cut}, width, per_row)
            if layout is not None:
                return _rows_heatmap(
                    client, "derived_rank_windows", "window_start", _WINDOW_VALUES, layout, params, width
                )
            return {
                "source": "derived_rank_windows",
                "columns": _HEAT_COLUMNS,
                "cells": json_columns(
                    client,
                    f"SELECT intDiv({ms_of('window_start')} - {{t0:Int64}}, {{width:Int64}}) AS x, rank, "
                    f"{round_sql('avg(compute_s)')}, {round_sql('avg(step_time_s)')}, {round_sql('avg(comm_s)')}, "
                    f"{round_sql('avg(data_wait_s)')} FROM derived_rank_windows WHERE {where} "
                    "GROUP BY x, rank ORDER BY x, rank",
                    width=width,
                    **params,
                ),
            }
    if layout is not None:
        return _rows_heatmap(client, "steps", "ts", _STEP_VALUES, layout, params, width)
    return {
        "source": "steps",
        "columns": _HEAT_COLUMNS,
        "cells": json_columns(
            client,
            f"SELECT intDiv({ms_of('ts')} - {{t0:Int64}}, {{width:Int64}}) AS x, rank, "
            f"{round_sql('avg(ifNull(forward_s, 0) + ifNull(backward_s, 0) + ifNull(optimizer_s, 0))')}, "
            f"{round_sql('avg(step_time_s)')}, {round_sql('avg(comm_s)')}, {round_sql('avg(data_wait_s)')} "
            f"FROM steps WHERE {JOB_WHERE} AND {between('ts')} GROUP BY x, rank ORDER BY x, rank",
            width=width,
            **params,
        ),
    }


def _rows_heatmap(
    client: Client,
    table: str,
    time_column: str,
    values: tuple[str, ...],
    layout: RowLayout,
    params: dict[str, Any],
    width: int,
) -> dict[str, Any]:
    """`rank_heatmap` over a layout's rows: ranks of a drill-down (means), or node rows (worst and which rank)."""
    per_row = layout.ranks_per_row
    if per_row is not None:
        row, where = "intDiv(rank, {per_row:Int32})", f"{JOB_WHERE} AND {between(time_column)}"
        mapping: dict[str, Any] = {"per_row": per_row}
    else:
        row = "transform(rank, {rank_keys:Array(Int32)}, {rank_rows:Array(Int32)}, -1)"
        where = f"{JOB_WHERE} AND {between(time_column)} AND rank IN {{rank_keys:Array(Int32)}}"
        mapping = {"rank_keys": layout.rank_keys, "rank_rows": layout.rank_rows}
    head = f"SELECT intDiv({ms_of(time_column)} - {{t0:Int64}}, {{width:Int64}}) AS x, {row} AS row, "
    if layout.grouped:
        # One level: the slowest window of any of the row's ranks (a per-rank mean first would be a
        # second aggregation over ranks x buckets, millions of groups at 16k ranks). Which rank it
        # was for compute and step time, the slow views (each argMax costs as much as the max).
        # Which rank: of equal values the lowest (`sinks.page_rollups.top_sql`), as the roll-up names it.
        tops = [top_sql("max", v) for v in values[:2]]
        select = ", ".join(
            [
                *(round_sql(top_value(t)) for t in tops),
                *(round_sql(f"max({v})") for v in values[2:]),
                *(top_rank(t, "max") for t in tops),
            ]
        )
        columns = ["bucket index", "row", "compute", "step", "comm", "wait", "compute rank", "step rank"]
    else:
        select = ", ".join(round_sql(f"avg({v})") for v in values)
        columns = ["bucket index", "row", "compute", "step", "comm", "wait"]
    cells = json_columns(
        client,
        f"{head}{select} FROM {table} WHERE {where} GROUP BY x, row ORDER BY x, row",
        width=width,
        **mapping,
        **params,
    )
    return {"source": table, "columns": columns, "cells": cells, "rows": layout.as_dict()}


def _rollup_heatmap(
    client: Client, layout: RowLayout, params: dict[str, Any], width: int, per_row: int
) -> dict[str, Any]:
    """`_rows_heatmap` of a grouped layout over the derived windows, from `rank_window_minute`: the same
    slowest values and ranks, from blocks of `RANK_BLOCK` ranks per minute instead of every window."""
    rows = rollup_source(WINDOW_ROLLUP, "window_start")
    select = ", ".join(
        [
            round_sql(top_value("max(compute_top)")),
            round_sql(top_value("max(step_top)")),
            round_sql("max(comm_max)"),
            round_sql("max(wait_max)"),
            top_rank("max(compute_top)", "max"),
            top_rank("max(step_top)", "max"),
        ]
    )
    cells = json_columns(
        client,
        "SELECT intDiv(toInt64(toUnixTimestamp(minute)) * 1000 - {t0:Int64}, {width:Int64}) AS x, "
        f"intDiv(rank_block, {{blocks:Int32}}) AS row, {select} FROM ({rows}) GROUP BY x, row ORDER BY x, row",
        width=width,
        blocks=per_row // RANK_BLOCK,
        **params,
    )
    columns = ["bucket index", "row", "compute", "step", "comm", "wait", "compute rank", "step rank"]
    return {"source": "derived_rank_windows", "columns": columns, "cells": cells, "rows": layout.as_dict()}


_SEGMENTS = ("data_wait_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "checkpoint_s")


def step_series(
    client: Client, job_id: str, t0: int, t1: int, width: int, from_windows: bool
) -> dict[str, Any]:
    """Step segments, step time and rate, loss, lr and grad norm per bucket.

    Over wide ranges the segments come from the derived rank windows already read for the heatmap
    (compute = forward + backward + optimizer; no extra scan of the step rows); zoomed in, from the
    step rows with the forward / backward / optimizer / checkpoint split. Model metrics come from rank 0
    (the primary key answers it directly).
    """
    params = {"job": job_id, "t0": t0, "t1": t1, "width": width}
    progress = fetch_rows(
        client,
        f"SELECT {bucket_sql(ms_of('ts'))} AS b, {round_sql('avg(loss)', 5)}, {round_sql('avg(lr)', 9)}, "
        f"{round_sql('avg(grad_norm)')}, max(step), countIf(skipped), {round_sql('avg(step_time_s)')} FROM steps "
        f"WHERE {JOB_WHERE} AND rank = 0 AND {between('ts')} GROUP BY b ORDER BY b",
        **params,
    )
    cut = rollup_cut(t0, t1, width)
    if from_windows and cut is not None:
        # The mean over ranks per bucket from `rank_window_minute`'s sums and counts (avg's own arithmetic).
        rows = fetch_rows(
            client,
            "SELECT intDiv(toInt64(toUnixTimestamp(minute)) * 1000, {width:Int64}) * {width:Int64} AS b, "
            + ", ".join(round_sql(f"sum({v}_sum) / sum({v}_n)") for v in ("wait", "compute", "comm", "other"))
            + f" FROM ({rollup_source(WINDOW_ROLLUP, 'window_start')}) GROUP BY b ORDER BY b",
            cut=cut,
            **params,
        )
    elif from_windows:
        rows = fetch_rows(
            client,
            f"SELECT {bucket_sql(ms_of('window_start'))} AS b, {round_sql('avg(data_wait_s)')}, {round_sql('avg(compute_s)')}, "
            f"{round_sql('avg(comm_s)')}, {round_sql('avg(greatest(0, step_time_s - compute_s - comm_s - data_wait_s))')} "
            f"FROM derived_rank_windows WHERE {JOB_WHERE} AND {between('window_start')} "
            "GROUP BY b ORDER BY b",
            **params,
        )
    if from_windows:
        names = ("data_wait", "compute", "comm", "other")
        segments = {name: [[r[0], r[i + 1]] for r in rows] for i, name in enumerate(names)}
        source = "derived_rank_windows"
    else:
        rows = fetch_rows(
            client,
            f"SELECT {bucket_sql(ms_of('ts'))} AS b, "
            + ", ".join(round_sql(f"avg({s})") for s in _SEGMENTS)
            + f" FROM steps WHERE {JOB_WHERE} AND {between('ts')} GROUP BY b ORDER BY b",
            **params,
        )
        segments = {s.removesuffix("_s"): [[r[0], r[i + 1]] for r in rows] for i, s in enumerate(_SEGMENTS)}
        source = "steps"
    return {
        "segments": segments,
        "segments_source": source,
        "step_time": [[r[0], r[6]] for r in progress],
        "step_rate": step_rate([(int(r[0]), int(r[4])) for r in progress], t0, t1, width),
        "loss": [[r[0], r[1]] for r in progress],
        "lr": [[r[0], r[2]] for r in progress],
        "grad_norm": [[r[0], r[3]] for r in progress],
        "skipped": [[r[0], r[5]] for r in progress if r[5]],
    }


def step_rate(last_steps: list[tuple[int, int]], t0: int, t1: int, width: int) -> list[list[Any]]:
    """Steps per second per bucket from (bucket start, last step in it); 0 where the job stalled.

    A bucket with steps reads the steps since the previous such bucket over the time between them.
    An empty bucket reads 0 once the last step is longer ago than twice the bucket and three of the
    job's usual step periods (a line drawn from neighbour to neighbour would show a stalled job still
    stepping); an empty bucket inside a normal step period (1 s buckets, 1.5 s steps) has no point.
    """
    if not last_steps:
        return []
    periods = sorted((b[0] - a[0]) / (b[1] - a[1]) for a, b in pairwise(last_steps) if b[1] > a[1])
    period = periods[len(periods) // 2] if periods else width
    quiet = max(2 * width, 3 * period)
    by_bucket = dict(last_steps)
    out: list[list[Any]] = []
    previous: tuple[int, int] | None = None
    bucket = last_steps[0][0]
    while bucket < t1:
        last = by_bucket.get(bucket)
        if last is not None:
            if previous is not None:
                out.append([bucket, rounded((last - previous[1]) / ((bucket - previous[0]) / 1000), 3)])
            previous = (bucket, last)
        elif previous is not None and bucket - previous[0] > quiet:
            out.append([bucket, 0.0])
        bucket += width
    return out


class StepFold(PanelFold):
    """The recording fold of these panels (a part of `ui.pages.job.Panels`)."""

    def _init_steps(self) -> None:
        # (bucket index, rank) -> compute, step, comm, wait means; from the derived windows and from steps.
        self.windows: dict[tuple[int, int], list[Mean]] = {}
        self.rank_steps: dict[tuple[int, int], list[Mean]] = {}
        self.window_segments: dict[int, list[Mean]] = {}
        self.step_segments: dict[int, list[Mean]] = {}
        # rank 0 per bucket: loss, lr, grad norm, step time means; max step; skipped count
        self.progress: dict[int, list[Any]] = {}

    def _step(self, r: dict[str, Any]) -> None:
        f = self.f
        ts = r["ts"]
        if not f.start <= ts < f.end:
            return
        x = (ts - f.start) // f.width
        cell = self.rank_steps.get((x, r["rank"]))
        if cell is None:
            cell = self.rank_steps[(x, r["rank"])] = [Mean() for _ in range(4)]
        compute = (r.get("forward_s") or 0.0) + (r.get("backward_s") or 0.0) + (r.get("optimizer_s") or 0.0)
        cell[0].add(compute)
        cell[1].add(r["step_time_s"])
        cell[2].add(r.get("comm_s"))
        cell[3].add(r.get("data_wait_s"))
        b = ts // f.width * f.width
        segments = self.step_segments.get(b)
        if segments is None:
            segments = self.step_segments[b] = [Mean() for _ in SEGMENTS]
        for mean, name in zip(segments, SEGMENTS, strict=True):
            mean.add(r.get(f"{name}_s"))
        if r["rank"] == 0:
            p = self.progress.get(b)
            if p is None:
                p = self.progress[b] = [Mean(), Mean(), Mean(), Mean(), r["step"], 0]
            p[0].add(r.get("loss"))
            p[1].add(r.get("lr"))
            p[2].add(r.get("grad_norm"))
            p[3].add(r["step_time_s"])
            p[4] = max(p[4], r["step"])
            p[5] += 1 if r.get("skipped") else 0

    def _window(self, r: dict[str, Any]) -> None:
        f = self.f
        ts = r["window_start"]
        if not f.start <= ts < f.end:
            return
        x = (ts - f.start) // f.width
        cell = self.windows.get((x, r["rank"]))
        if cell is None:
            cell = self.windows[(x, r["rank"])] = [Mean() for _ in range(4)]
        cell[0].add(r.get("compute_s"))
        cell[1].add(r.get("step_time_s"))
        cell[2].add(r.get("comm_s"))
        cell[3].add(r.get("data_wait_s"))
        b = ts // f.width * f.width
        segments = self.window_segments.get(b)
        if segments is None:
            segments = self.window_segments[b] = [Mean() for _ in range(4)]
        wait, compute, comm, step = (
            r.get("data_wait_s"),
            r.get("compute_s"),
            r.get("comm_s"),
            r.get("step_time_s"),
        )
        segments[0].add(wait)
        segments[1].add(compute)
        segments[2].add(comm)
        if wait is not None and compute is not None and comm is not None and step is not None:
            segments[3].add(max(0.0, step - compute - comm - wait))

    def _heatmap(self) -> dict[str, Any]:
        derived = self.f.width >= DERIVED_HOP_MS and bool(self.windows)
        cells = self.windows if derived else self.rank_steps
        columns: list[list[Any]] = [[], [], [], [], [], []]
        for (x, rank), means in sorted(cells.items()):
            columns[0].append(x)
            columns[1].append(rank)
            for i, mean in enumerate(means):
                columns[2 + i].append(ch_round(mean.value()))
        return {
            "source": "derived_rank_windows" if derived else "steps",
            "columns": ["bucket index", "rank", "compute", "step", "comm", "wait"],
            "cells": columns,
        }

    def _steps(self, from_windows: bool) -> dict[str, Any]:
        f = self.f
        progress = sorted(self.progress.items())
        if from_windows:
            names = ("data_wait", "compute", "comm", "other")
            rows = sorted(self.window_segments.items())
            segments = {n: [[b, ch_round(m[i].value())] for b, m in rows] for i, n in enumerate(names)}
        else:
            rows = sorted(self.step_segments.items())
            segments = {n: [[b, ch_round(m[i].value())] for b, m in rows] for i, n in enumerate(SEGMENTS)}
        return {
            "segments": segments,
            "segments_source": "derived_rank_windows" if from_windows else "steps",
            "step_time": [[b, ch_round(p[3].value())] for b, p in progress],
            "step_rate": step_rate([(b, p[4]) for b, p in progress], f.start, f.end, f.width),
            "loss": [[b, ch_round(p[0].value(), 5)] for b, p in progress],
            "lr": [[b, ch_round(p[1].value(), 9)] for b, p in progress],
            "grad_norm": [[b, ch_round(p[2].value())] for b, p in progress],
            "skipped": [[b, p[5]] for b, p in progress if p[5]],
        }
