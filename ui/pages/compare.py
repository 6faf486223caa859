"""The compare page (`/compare`): which runs, their configuration diff, per-step series overlaid by step or tokens.

Both sources reduce a run's step rows to buckets of steps (`BucketRow`): the store with one query
(`compare`), a recording with `CompareFold` (part of the job report's second pass). This module
turns those, the runs' `JobStarted` records and their goodput into the page's JSON.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clickhouse_connect.driver.client import Client

from sinks.efficiency import run_rows
from sinks.errors import QueryError
from ui.errors import NotFoundError
from ui.pages.common import (
    PLAUSIBLE_TS,
    Mean,
    PanelFold,
    fetch_rows,
    finite,
    ms_of,
    plausible_bounds,
    rounded,
)

__all__ = [
    "CONFIG_FIELDS",
    "MAX_RUNS",
    "SEGMENTS",
    "TARGET_POINTS",
    "BucketRow",
    "CompareFold",
    "Run",
    "assemble",
    "choose_runs",
    "compare",
    "compare_of_job",
    "config_of",
    "step_bucket",
]

# At most this many runs overlaid (the newest of the family; the asked-for job's runs always).
MAX_RUNS = 8
# Points per run and series: a run of 100k steps is cut into buckets of a nice number of steps.
TARGET_POINTS = 240
SEGMENTS = ("data_wait", "forward", "backward", "optimizer", "comm", "checkpoint")
# The JobStarted fields a configuration diff shows (ids, times and owners are not configuration).
CONFIG_FIELDS = (
    "model_name",
    "model_version",
    "dataset_version",
    "workload_family",
    "gpu_class",
    "world_size",
    "nodes",
    "data_parallel",
    "tensor_parallel",
    "pipeline_parallel",
    "global_batch_size",
    "seq_len",
    "target_steps",
    "target_tokens",
    "target_epochs",
    "checkpoint_max_age_s",
    "checkpoint_timeout_s",
    "restore_test_max_age_s",
    "cluster",
    "team",
)


@dataclass
class Run:
    """One run to compare: its identity, when it started, its GPUs and its configuration."""

    job_id: str
    run_id: str
    started_ms: int
    workload_family: str = ""
    gpus: int = 0
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BucketRow:
    """A run's steps in one bucket: how many, mean step time and segments over ranks, rank 0's loss, tokens."""

    step: int  # the bucket's first step
    steps: int
    step_time_s: float | None
    segments: tuple[float | None, ...]  # in SEGMENTS order
    loss: float | None
    tokens: int


def _nice(n: float) -> int:
    if n <= 1:
        return 1
    exp = 10 ** math.floor(math.log10(n))
    for m in (1, 2, 5, 10):
        if m * exp >= n:
            return int(m * exp)
    return int(10 * exp)


def step_bucket(max_step: int, target: int = TARGET_POINTS) -> int:
    """Steps per bucket: a nice number (1, 2, 5, 10, 20, ...) giving at most about `target` buckets."""
    return _nice(max(1, max_step + 1) / max(target, 1))


def config_of(record: Mapping[str, Any]) -> dict[str, str]:
    """The configuration of a run from its JobStarted record: every CONFIG_FIELD and label, as text."""
    out: dict[str, str] = {}
    for name in CONFIG_FIELDS:
        value = record.get(name)
        if name == "nodes":
            value = len(value) if value else None
        out[name] = "" if value is None else str(value)
    for key, value in sorted((record.get("labels") or {}).items()):
        out[f"label {key}"] = str(value)
    return out


def choose_runs(
    runs: Sequence[Run], jobs: Sequence[str], run_ids: Sequence[str] = ()
) -> tuple[list[Run], str]:
    """The runs a compare page shows, and the workload family it is about ('' when it is a free choice).

    One job: its runs and the newest runs of jobs of the same workload family (`MAX_RUNS` in all).
    Several jobs, or runs by id: exactly those (any family).
    """
    if len(jobs) == 1 and not run_ids:
        own = [r for r in runs if r.job_id == jobs[0]]
        family = next((r.workload_family for r in own if r.workload_family), "")
        if not family:
            return sorted(own, key=lambda r: r.started_ms), ""
        others = sorted(
            (r for r in runs if r.workload_family == family and r.job_id != jobs[0]),
            key=lambda r: -r.started_ms,
        )
        chosen = own + others[: max(0, MAX_RUNS - len(own))]
        return sorted(chosen, key=lambda r: r.started_ms), family
    wanted = [r for r in runs if r.job_id in set(jobs) or r.run_id in set(run_ids)]
    return sorted(wanted, key=lambda r: r.started_ms)[: max(MAX_RUNS, len(jobs))], ""


def assemble(
    runs: Sequence[Run],
    rows: Mapping[tuple[str, str], Sequence[BucketRow]],
    width: int,
    goodput: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
    family: str = "",
) -> dict[str, Any]:
    """The compare page's JSON: runs with their goodput, aligned series per run, and the config diff."""
    goodput = goodput or {}
    series = []
    for run in runs:
        buckets = sorted(rows.get((run.job_id, run.run_id), ()), key=lambda r: r.step)
        tokens = 0
        cumulative = []
        for b in buckets:
            tokens += b.tokens
            cumulative.append(tokens)
        series.append(
            {
                "step": [b.step for b in buckets],
                "tokens": cumulative,
                "step_time": [rounded(b.step_time_s, 5) for b in buckets],
                "segments": {
                    name: [rounded(b.segments[i], 5) for b in buckets] for i, name in enumerate(SEGMENTS)
                },
                "loss": [rounded(b.loss, 5) for b in buckets],
                # Tokens per second per GPU: the bucket's tokens per step over its mean step time and the GPUs.
                "tokens_per_gpu_s": [
                    rounded(b.tokens / b.steps / b.step_time_s / run.gpus, 3)
                    if b.steps and b.step_time_s and run.gpus
                    else None
                    for b in buckets
                ],
            }
        )
    keys = sorted({k for r in runs for k in r.config}, key=lambda k: (k.startswith("label "), k))
    differs = [k for k in keys if len({r.config.get(k, "") for r in runs}) > 1]
    return {
        "family": family,
        "bucket_steps": width,
        "runs": [
            {
                "job_id": r.job_id,
                "run_id": r.run_id,
                "started_ms": r.started_ms,
                "workload_family": r.workload_family,
                "gpus": r.gpus,
                "config": r.config,
                "goodput_pct": rounded(goodput.get((r.job_id, r.run_id), {}).get("goodput_pct"), 2),
                "outcome": goodput.get((r.job_id, r.run_id), {}).get("outcome"),
            }
            for r in runs
        ],
        "series": series,
        "config": {"keys": keys, "differs": differs},
    }


# --- compare ---------------------------------------------------------------------------------------


def compare(client: Client, jobs: Sequence[str], run_ids: Sequence[str] = ()) -> dict[str, Any]:
    """Runs overlaid by step or by tokens (`ui.pages.compare`): one job and its workload family, or a choice.

    Step time and its segments (mean over ranks), rank 0's loss and tokens per GPU-second per bucket
    of steps; each run's goodput from `run_efficiency`; the configuration diff from `JobStarted`.
    """

    lo, hi = plausible_bounds()
    known = [
        Run(str(job), str(run), int(started), str(family), int(gpus))
        for job, run, started, family, gpus in fetch_rows(
            client,
            f"SELECT job_id, run_id, {ms_of('min(ts)')}, argMax(workload_family, ts), argMax(world_size, ts) "
            f"FROM job_started WHERE {PLAUSIBLE_TS} GROUP BY job_id, run_id",
            lo=lo,
            hi=hi,
        )
    ]
    runs, family = choose_runs(known, jobs, run_ids)
    if not runs:
        raise NotFoundError("job", ", ".join([*jobs, *run_ids]) or "(none given)")
    keys = [(r.job_id, r.run_id) for r in runs]
    started = client.query(
        "SELECT * FROM job_started WHERE (job_id, run_id) IN {runs:Array(Tuple(String, String))} ORDER BY ts",
        parameters={"runs": keys},
    )
    records: dict[tuple[str, str], dict[str, Any]] = {}
    for row in started.result_rows:
        record = dict(zip(started.column_names, row, strict=True))
        records[(record["job_id"], record["run_id"])] = record  # ordered by time: the latest wins
    for run in runs:
        run.config = config_of(records.get((run.job_id, run.run_id), {}))
    max_step = fetch_rows(
        client,
        "SELECT max(step) FROM steps WHERE (job_id, run_id) IN {runs:Array(Tuple(String, String))}",
        runs=keys,
    )[0][0]
    width = step_bucket(int(max_step or 0))
    rows: dict[tuple[str, str], list[BucketRow]] = defaultdict(list)
    segments = ", ".join(
        f"avg({s}_s)" for s in ("data_wait", "forward", "backward", "optimizer", "comm", "checkpoint")
    )
    for r in fetch_rows(
        client,
        "SELECT job_id, run_id, intDiv(step, {width:Int64}) * {width:Int64} AS s, uniqExact(step), avg(step_time_s), "
        f"{segments}, avgIf(loss, rank = 0), sum(ifNull(tokens, 0)) FROM steps "
        "WHERE (job_id, run_id) IN {runs:Array(Tuple(String, String))} AND NOT skipped "
        "GROUP BY job_id, run_id, s ORDER BY job_id, run_id, s",
        width=width,
        runs=keys,
    ):
        rows[(r[0], r[1])].append(
            BucketRow(
                int(r[2]),
                int(r[3]),
                finite(r[4]),
                tuple(finite(v) for v in r[5:11]),
                finite(r[11]),
                int(r[12]),
            )
        )
    goodput: dict[tuple[str, str], dict[str, Any]] = {}
    for job in sorted({r.job_id for r in runs}):
        try:
            for efficiency_row in run_rows(client, job=job):
                goodput[(efficiency_row["job_id"], efficiency_row["run_id"])] = efficiency_row
        except QueryError:
            pass  # a store without the efficiency views: goodput unknown
    return assemble(runs, rows, width, goodput, family)


def compare_of_job(client: Client, job_id: str) -> dict[str, Any] | None:
    """`compare` for one job (its runs and its family's), None when the store knows no run of it."""
    try:
        return compare(client, [job_id])
    except NotFoundError:
        return None


class CompareFold(PanelFold):
    """The recording fold of these panels (a part of `ui.pages.job.Panels`)."""

    def _init_compare(self, runs: list[Run] | None, width: int) -> None:
        self.compare_keys = {(r.job_id, r.run_id) for r in runs or ()}
        self.compare_width = width
        self.compare: dict[tuple[str, str, int], list[Any]] = {}

    def _compare(self, r: dict[str, Any]) -> None:
        s = r["step"] // self.compare_width * self.compare_width
        key = (r["job_id"], r.get("run_id") or "", s)
        cell = self.compare.get(key)
        if cell is None:
            cell = self.compare[key] = [set(), Mean(), [Mean() for _ in SEGMENTS], Mean(), 0]
        cell[0].add(r["step"])
        cell[1].add(r["step_time_s"])
        for mean, name in zip(cell[2], SEGMENTS, strict=True):
            mean.add(r.get(f"{name}_s"))
        if r["rank"] == 0:
            cell[3].add(r.get("loss"))
        cell[4] += r.get("tokens") or 0

    def compare_rows(self) -> dict[tuple[str, str], list[BucketRow]]:
        """The compared runs' rows per step bucket."""
        rows: dict[tuple[str, str], list[BucketRow]] = defaultdict(list)
        for (job, run, s), (steps, step_time, segments, loss, tokens) in sorted(self.compare.items()):
            rows[(job, run)].append(
                BucketRow(
                    s, len(steps), step_time.value(), tuple(m.value() for m in segments), loss.value(), tokens
                )
            )
        return rows
