"""Comparing runs: which runs, their configuration diff, and per-step series overlaid by step or by tokens.

Pure assembly shared by the store (`ui.queries.compare`) and the reports made from recordings
(`ui.digest`): both reduce a run's step rows to buckets of steps (`BucketRow`), and this module
turns those, the runs' `JobStarted` records and their goodput into the page's JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CONFIG_FIELDS",
    "MAX_RUNS",
    "SEGMENTS",
    "TARGET_POINTS",
    "BucketRow",
    "Run",
    "assemble",
    "choose_runs",
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


def _num(value: float | None, digits: int = 5) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


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
                "step_time": [_num(b.step_time_s) for b in buckets],
                "segments": {name: [_num(b.segments[i]) for b in buckets] for i, name in enumerate(SEGMENTS)},
                "loss": [_num(b.loss) for b in buckets],
                # Tokens per second per GPU: the bucket's tokens per step over its mean step time and the GPUs.
                "tokens_per_gpu_s": [
                    _num(b.tokens / b.steps / b.step_time_s / run.gpus, 3)
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
                "goodput_pct": _num(goodput.get((r.job_id, r.run_id), {}).get("goodput_pct"), 2),
                "outcome": goodput.get((r.job_id, r.run_id), {}).get("outcome"),
            }
            for r in runs
        ],
        "series": series,
        "config": {"keys": keys, "differs": differs},
    }
