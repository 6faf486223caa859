"""Issue 33.3: a GPU slow from the first step under DDP, without throttle signals, is found by the
cross-rank path (its work before the first wait against its peers'), and says so; a healthy DDP
run with normal spread between its ranks stays quiet."""

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
cluster: {{name: sim-a, nodes: 2, gpus_per_node: 8, gpu_class: H100-80GB}}
jobs:
  - id: ddp-job
    team: llm-pretrain
    owner: alice
    nodes: 2
    comm_overlap: true
{extra}
"""


def _firing(tmp_path: Path, name: str, extra: str) -> tuple[list[dict[str, Any]], int]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(JOB.format(name=name, extra=extra))
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
