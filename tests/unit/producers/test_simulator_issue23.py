"""What the issue-23 additions put in the simulated data: GPM activity that tells compute from a spinning
collective, the run's target and epochs, live loader workers, each data-path fault's own signature,
checkpoint retention, and the labels of the resource faults."""

from __future__ import annotations

from statistics import median
from typing import Any

from producers.simulator import load_scenario, simulate
from producers.simulator.scenario import scenario_from_mapping

MIN = 60_000


def records(sim: Any, kind: str) -> list[dict[str, Any]]:
    return [e.record for e in sim.events() if e.type == kind]


def test_gpm_tells_compute_from_ranks_spinning_in_a_hung_collective() -> None:
    sc = load_scenario("rank_hang")
    sim = simulate(sc, 0)
    (label,) = sim.labels
    hung = label["gpu_uuid"]
    start = records(sim, "JobStarted")[0]["ts"]
    hang = start + int(sc.faults[0].start * 1000)
    gpus = [g for g in records(sim, "GpuSample") if g["job_id"] and g["gpu_uuid"] != hung]
    before = [g for g in gpus if hang - 4 * MIN < g["ts"] < hang - MIN]
    during = [g for g in gpus if hang + MIN < g["ts"] < hang + 4 * MIN]
    assert before and during
    assert median(g["tensor_active_pct"] for g in before) > 40, "training is tensor work"
    assert median(g["gpu_util_pct"] for g in during) > 90, "the spinning collective keeps 'utilisation' up"
    assert median(g["sm_active_pct"] for g in during) < 25
    assert max(g["tensor_active_pct"] for g in during) == 0.0


def test_a_gpu_class_without_gpm_reports_none_and_jobs_report_their_target_and_epochs() -> None:
    sc = scenario_from_mapping(
        {
            "name": "a100",
            "duration": "4m",
            "cluster": {"name": "c", "nodes": 1, "gpus_per_node": 2, "gpu_class": "A100-80GB"},
            "jobs": [{"id": "j", "team": "t", "nodes": 1, "total_steps": 5000, "epoch_steps": 50}],
        }
    )
    sim = simulate(sc, 0)
    assert all("sm_active_pct" not in g or g["sm_active_pct"] is None for g in records(sim, "GpuSample"))
    assert records(sim, "JobStarted")[0]["target_steps"] == 5000
    steps = records(sim, "StepCompleted")
    assert {s["epoch"] for s in steps} >= {0, 1} and all(s["epoch"] == s["step"] // 50 for s in steps)
    loaders = records(sim, "DataLoaderSample")
    assert loaders and all(s["workers"] == s["workers_expected"] == 8 for s in loaders)


def _loader_medians(name: str, rank: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median loader fields of `rank` before and during the scenario's fault."""
    sc = load_scenario(name)
    sim = simulate(sc, 0)
    t0 = sc.start_ms + int(sc.faults[0].start * 1000)
    t1 = t0 + int((sc.faults[0].duration or 0) * 1000)
    mine = [s for s in records(sim, "DataLoaderSample") if s["rank"] == rank and s["batches"]]
    fields = ("read_latency_s", "cache_hit_ratio", "file_opens_s", "batch_prep_s", "workers")

    def med(rows: list[dict[str, Any]]) -> dict[str, float]:
        return {f: median(r[f] for r in rows) for f in fields}

    return med([s for s in mine if s["ts"] < t0]), med([s for s in mine if t0 + 10_000 < s["ts"] < t1])


def test_each_data_path_fault_shows_its_own_signature() -> None:
    before, during = _loader_medians("slow_reads", 5)
    assert during["read_latency_s"] > 4 * before["read_latency_s"]
    assert abs(during["cache_hit_ratio"] - before["cache_hit_ratio"]) < 0.05, "slow reads only"
    before, during = _loader_medians("cache_collapse", 8)  # node-02's first rank
    assert during["cache_hit_ratio"] < 0.25 < 0.8 < before["cache_hit_ratio"]
    assert during["read_latency_s"] < 2 * before["read_latency_s"], "a lost cache, not slow storage"
    before, during = _loader_medians("file_open_stall", 8)
    assert during["file_opens_s"] < 0.2 * before["file_opens_s"]
    before, during = _loader_medians("loader_workers_die", 3)
    assert (before["workers"], during["workers"]) == (8, 3)


def test_retention_deletes_the_oldest_checkpoints_and_reports_them() -> None:
    sim = simulate(load_scenario("checkpoint_retention_tight"), 0)
    done = [c for c in records(sim, "CheckpointEvent") if c["phase"] == "completed"]
    assert len(done) >= 3 and all(c["retention_keep"] == 1 for c in done)
    assert done[0]["deleted"] == [] and [c["deleted"] for c in done[1:]] == [
        [p["checkpoint_id"]] for p in done[:-1]
    ]


def test_resource_faults_label_what_the_rules_name() -> None:
    idle = simulate(load_scenario("gpu_allocated_idle"), 0)
    (label,) = idle.labels
    assert (label["alert"], label["node"], label["gpu_index"]) == ("gpu_idle_allocated", "node-01", 7)
    spare = [g for g in records(idle, "GpuSample") if g["node"] == "node-01" and g["gpu_index"] == 7]
    late = [g for g in spare if g["ts"] > idle.scenario.start_ms + 6 * MIN]
    assert late and all(g["job_id"] == label["job_id"] and g["gpu_util_pct"] == 0.0 for g in late)
    outside = simulate(load_scenario("gpu_outside_allocation"), 0)
    (label,) = outside.labels
    pid = label["detail"]["pid"]
    stray = [g for g in records(outside, "GpuSample") if g["gpu_index"] == 6 and pid in g["pids"]]
    assert stray and {g["node"] for g in stray} == {label["node"]}
    nodes = records(simulate(load_scenario("rank_outside_nodes"), 0), "JobStarted")
    assert any(j["nodes"] == ["node-01", "node-99"] for j in nodes)
