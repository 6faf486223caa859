"""The resource invariant beyond one GPU (issue 23.4): a job's process on a GPU outside its allocation, a rank on
a node outside the job's list, an allocated GPU idle for the whole run, and memory imbalance on by default."""

from __future__ import annotations

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology
from streams.detectors.gpu_idle_allocated import GpuIdleAllocatedDetector
from streams.detectors.gpu_outside_allocation import GpuOutsideAllocationDetector
from streams.detectors.rank_outside_nodes import RankOutsideNodesDetector
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import T0, gpu_sample, job_started, rank_bound, step

JOB = "job-1"
GIB = 2**30


def run(det: Detector, events: list[Event]) -> list[Finding]:
    out: list[Finding] = []
    for ev in events:
        det.topology.observe(ev)
        out += det.observe(ev)
    return out


def four_ranks_on_node_1() -> list[Event]:
    """A job on GPUs 0-3 of node-01 (pids 1000-1003)."""
    return [job_started(JOB, T0, world_size=4), *(rank_bound(JOB, r, T0 + 1000) for r in range(4))]


def test_a_ranks_process_on_a_gpu_outside_the_allocation_is_reported_after_two_samples() -> None:
    det = GpuOutsideAllocationDetector(Topology())
    run(det, four_ranks_on_node_1())
    stray = [
        gpu_sample("node-01", 6, T0 + 10_000 + k * 2000, util=0.0, pids=[1001], mem_used=GIB)
        for k in range(3)
    ]
    out = run(det, stray)
    [f] = out
    assert (f.rule, f.key, f.rank, f.node, f.gpu_index, f.gpu_uuid) == (
        "gpu_outside_allocation",
        (JOB, "node-01", "GPU-node-01-6"),
        1,
        "node-01",
        6,
        "GPU-node-01-6",
    )
    assert "bound to GPU 1" in f.summary and "not bound to any job" in f.summary
    assert f.history and f.history_metric == "gpu_mem_used_gib"
    [done] = run(det, [gpu_sample("node-01", 6, T0 + 20_000, util=0.0)])
    assert done.active is False


def test_the_jobs_own_gpus_and_a_strangers_process_are_not_reported() -> None:
    det = GpuOutsideAllocationDetector(Topology())
    run(det, four_ranks_on_node_1())
    own = [gpu_sample("node-01", r, T0 + 10_000 + k, pids=[1000 + r]) for k in range(3) for r in range(4)]
    stranger = [gpu_sample("node-01", 6, T0 + 20_000 + k * 2000, pids=[424242]) for k in range(3)]
    assert run(det, own + stranger) == []


def test_a_rank_on_a_node_missing_from_the_jobs_list_is_reported_once_per_node() -> None:
    det = RankOutsideNodesDetector(Topology())
    listed = job_started(JOB, T0, world_size=16, nodes=2)
    listed.record["nodes"] = ["node-01", "node-99"]
    out = run(det, [listed, *(rank_bound(JOB, r, T0 + 1000) for r in range(16))])
    active = [f for f in out if f.active]
    assert {f.key for f in active} == {(JOB, "node-02")}
    last = active[-1]
    assert last.node == "node-02" and last.rank is None and "rank(s) 8-15" in last.summary
    assert "node-01, node-99" in last.summary
    fixed = job_started(JOB, T0 + 5000, world_size=16, nodes=2, run_id=f"{JOB}-run-1")
    [done] = run(det, [fixed])
    assert done.active is False


def test_fqdn_node_lists_unknown_lists_and_a_previous_runs_bindings_are_not_reported() -> None:
    det = RankOutsideNodesDetector(Topology())
    fqdn = job_started(JOB, T0, world_size=8)
    fqdn.record["nodes"] = ["NODE-01.c1.internal"]
    assert run(det, [fqdn, *(rank_bound(JOB, r, T0 + 1000) for r in range(8))]) == []
    unknown = RankOutsideNodesDetector(Topology())
    nolist = job_started(JOB, T0, world_size=8)
    nolist.record["nodes"] = []
    assert run(unknown, [nolist, *(rank_bound(JOB, r, T0 + 1000) for r in range(8))]) == []
    # A restart on node-02: the new list names node-02 only; the old run's node-01 bindings are history.
    moved = RankOutsideNodesDetector(Topology())
    run(moved, [job_started(JOB, T0, world_size=8), *(rank_bound(JOB, r, T0 + 1000) for r in range(8))])
    again = job_started(JOB, T0 + 60_000, world_size=8, run_id=f"{JOB}-run-2")
    again.record["nodes"] = ["node-02"]
    assert [f for f in run(moved, [again]) if f.active] == []


def training(
    det: Detector, seconds: int, *, spare_util: float = 0.0, spare_mem: int = GIB // 2
) -> list[Finding]:
    """Ranks 0-3 train on GPUs 0-3 of node-01; GPU 4 is allocated to the job (the agent says so)."""
    events = list(four_ranks_on_node_1())
    for k in range(0, seconds, 2):
        ts = T0 + 30_000 + k * 1000
        events += [step(JOB, r, k, ts) for r in range(4)]
        events += [gpu_sample("node-01", r, ts + 100, pids=[1000 + r]) for r in range(4)]
        spare = gpu_sample("node-01", 4, ts + 200, util=spare_util, mem_used=spare_mem)
        spare.record["job_id"] = JOB
        events.append(spare)
    return run(det, events)


def test_an_allocated_gpu_idle_while_the_job_trains_is_reported_after_idle_min_s() -> None:
    out = training(GpuIdleAllocatedDetector(Topology()), 150)
    [f] = out
    assert (f.rule, f.key, f.node, f.gpu_index, f.rank) == (
        "gpu_idle_allocated",
        (JOB, "node-01", "GPU-node-01-4"),
        "node-01",
        4,
        None,
    )
    assert f.ts - (f.since or 0) >= 90_000 and f.ts - T0 - 30_000 < 100_000
    assert f.history and f.history_metric == "gpu_util_pct"


def test_a_used_allocated_gpu_and_a_gpu_the_jobs_rank_strayed_onto_are_not_idle_allocations() -> None:
    assert training(GpuIdleAllocatedDetector(Topology()), 200, spare_util=40.0) == []
    assert training(GpuIdleAllocatedDetector(Topology()), 200, spare_mem=30 * GIB) == []
    det = GpuIdleAllocatedDetector(Topology())
    events = list(four_ranks_on_node_1())
    for k in range(0, 200, 2):
        ts = T0 + 30_000 + k * 1000
        events += [step(JOB, r, k, ts) for r in range(4)]
        stray = gpu_sample("node-01", 6, ts + 200, util=0.0, pids=[1001], mem_used=GIB)
        stray.record["job_id"] = JOB  # attributed by its process (Slurm's cgroup of pid 1001)
        events += [gpu_sample("node-01", r, ts + 100, pids=[1000 + r]) for r in range(4)] + [stray]
    assert run(det, events) == []


def _memory_job(leak_gib: float) -> list[Event]:
    """An 8-GPU job for 6 minutes; rank 3's GPU holds `leak_gib` more memory than its peers from minute 2."""
    events = [job_started(JOB, T0, world_size=8), *(rank_bound(JOB, r, T0 + 1000) for r in range(8))]
    for k in range(0, 360, 2):
        ts = T0 + 10_000 + k * 1000
        events += [step(JOB, r, k // 2, ts + r) for r in range(8)]
        for r in range(8):
            mem = 60 * GIB + (r * 37 % 5) * GIB // 10
            if r == 3 and k >= 120:
                mem += int(leak_gib * GIB)
            events.append(gpu_sample("node-01", r, ts + 500 + r, pids=[1000 + r], mem_used=mem))
    return events


def test_memory_imbalance_is_on_by_default_and_names_the_gpu_out_of_line() -> None:
    engine = DetectionEngine()
    alerts = [e.record for ev in _memory_job(15.0) for e in engine.process(ev) if e.type == "Alert"]
    fired = [a for a in alerts if a["rule"] == "gpu_imbalance" and a["status"] == "firing"]
    assert fired and fired[0]["rank"] == 3 and fired[0]["gpu_index"] == 3
    assert "mem_used_frac" in fired[0]["summary"]


def test_memory_within_a_few_percent_across_gpus_is_no_imbalance() -> None:
    engine = DetectionEngine()
    alerts = [e.record for ev in _memory_job(2.0) for e in engine.process(ev) if e.type == "Alert"]
    assert [a for a in alerts if a["rule"] == "gpu_imbalance"] == []
