"""Issue 33.3: a GPU slow from the first step under DDP, without throttle signals, is found by the
cross-rank path (its work DDP does not overlap, or its GPU's busy time, against its peers'), and
says so, in jobs of 4 to 48 ranks; a healthy DDP run with normal spread between its ranks stays
quiet at every size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ranksight.evaluation import run_scenario
from streams.alerting.routing import load_router
from streams.config import load_config

JOB = """
name: {name}
duration: 5m
cluster: {{name: sim-a, nodes: {nodes}, gpus_per_node: {gpus}, gpu_class: H100-80GB}}
jobs:
  - id: ddp-job
    team: llm-pretrain
    owner: alice
    nodes: {nodes}
    comm_overlap: true
{extra}
"""


def _firing(
    tmp_path: Path, name: str, extra: str, nodes: int = 2, gpus: int = 8
) -> tuple[list[dict[str, Any]], int]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(JOB.format(name=name, extra=extra, nodes=nodes, gpus=gpus))
    run = run_scenario(path, 0, load_config(), load_router())
    started = int(next(iter(run.jobs.values()))["ts"])
    seen: dict[str, dict[str, Any]] = {}
    for a in run.alerts:
        if a["status"] == "firing":
            seen.setdefault(a["alert_id"], a)
    return list(seen.values()), started


@pytest.mark.parametrize("factor", [1.3, 1.2])
def test_a_gpu_slow_from_the_start_under_ddp_is_a_straggler_found_by_the_cross_rank_path(
    tmp_path: Path, factor: float
) -> None:
    alerts, started = _firing(tmp_path, "ddp_slow", f"    slow_ranks: {{5: {factor}}}")
    assert [(a["rule"], a["rank"]) for a in alerts] == [("straggler", 5)], [a["summary"] for a in alerts]
    (a,) = alerts
    assert "decided by the cross-rank path" in a["summary"] and a["suspected_layer"] == "gpu"
    # Init 30 s and 20 warm-up steps of ~1 s, then 30 s of buckets: well under two minutes from launch.
    assert a["ts"] - started < 120_000, (a["ts"] - started) / 1000


def test_a_healthy_ddp_run_with_normal_spread_between_its_ranks_raises_nothing(tmp_path: Path) -> None:
    alerts, _ = _firing(tmp_path, "ddp_healthy", "    rank_speed_spread: 0.03\n    rank_jitter: 0.02")
    assert [a["summary"] for a in alerts] == []


# (nodes, GPUs per node, the slow rank): 4, 8 and 48 ranks.
SIZES = [(1, 4, 2), (1, 8, 5), (6, 8, 29)]


@pytest.mark.parametrize(("nodes", "gpus", "rank"), SIZES, ids=["4-ranks", "8-ranks", "48-ranks"])
def test_a_1_3x_gpu_slow_from_the_start_is_found_in_jobs_of_4_8_and_48_ranks(
    tmp_path: Path, nodes: int, gpus: int, rank: int
) -> None:
    alerts, started = _firing(tmp_path, "ddp_slow", f"    slow_ranks: {{{rank}: 1.3}}", nodes, gpus)
    assert [(a["rule"], a["rank"]) for a in alerts] == [("straggler", rank)], [a["summary"] for a in alerts]
    (a,) = alerts
    assert "decided by the cross-rank path" in a["summary"] and a["suspected_layer"] == "gpu"
    assert "on its peers" in a["summary"]
    assert a["ts"] - started < 120_000, (a["ts"] - started) / 1000


@pytest.mark.parametrize(
    ("nodes", "gpus"), [(n, g) for n, g, _ in SIZES], ids=["4-ranks", "8-ranks", "48-ranks"]
)
def test_a_healthy_ddp_run_with_normal_spread_stays_quiet_at_4_8_and_48_ranks(
    tmp_path: Path, nodes: int, gpus: int
) -> None:
    extra = "    rank_speed_spread: 0.03\n    rank_jitter: 0.02"
    alerts, _ = _firing(tmp_path, "ddp_healthy", extra, nodes, gpus)
    assert [a["summary"] for a in alerts] == []


def _gpm_only_job(active_of_slow: float) -> list[Any]:
    """A 4-rank DDP job whose SDK times only whole steps (no segments, no collective) while the
    node's GPM reports SM activity: ~70 % on every GPU but rank 2's, which is `active_of_slow`."""
    import random

    from tests.unit.streams.builders import T0, gpu_sample, job_started, job_state, rank_bound, step

    rng = random.Random(7)
    events = [job_started("job-1", T0, world_size=4, nodes=1), job_state("job-1", T0, "running")]
    events += [rank_bound("job-1", r, T0, gpus_per_node=8) for r in range(4)]
    for n in range(1, 240):
        ts = T0 + n * 1000
        for r in range(4):
            ev = step("job-1", r, n, ts + rng.randint(0, 4), compute=None, data_wait=None, comm=None)
            ev.record["step_time_s"] = 1.0 + rng.gauss(0, 0.01)
            events.append(ev)
            sample = gpu_sample("node-01", r, ts + 500)
            sample.record["sm_active_pct"] = (active_of_slow if r == 2 else 70.0) + rng.gauss(0, 1.0)
            events.append(sample)
    return sorted(events, key=lambda e: e.record["ts"])


def test_a_gpu_busier_than_its_peers_by_gpm_is_a_straggler_where_no_segment_is_timed() -> None:
    """The GPU-busy signal alone: a job that times no segment leaves only its GPUs' SM activity."""
    from tests.unit.streams.test_imbalance import _active, _run

    _, findings, _ = _run(_gpm_only_job(91.0))
    found = _active(findings, "straggler")
    assert {f.rank for f in found} == {2}
    assert "GPU busy (SM active) time" in found[0].summary and found[0].suspected_layer == "gpu"
    _, quiet, _ = _run(_gpm_only_job(72.0))  # 3 % busier: normal spread
    assert _active(quiet, "straggler") == []
