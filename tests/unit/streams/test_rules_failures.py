"""Recorded failures get rules (issue 23.3): failed ranks with rank, node, GPU and reason; dependency timeouts;
a sustained rate of skipped steps that the non-finite rule's bursts do not explain."""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology
from streams.detectors.dependency_timeout import DependencyTimeoutDetector
from streams.detectors.rank_failed import RankFailedDetector
from streams.detectors.step_skip_rate import StepSkipRateDetector
from tests.unit.streams.builders import T0, job_started, rank_bound, step

JOB = "job-1"


def fault(
    rank: int, ts: int, kind: str, detail: str = "", exit_code: int | None = None, **extra: Any
) -> Event:
    rec = {
        "ts": ts,
        "job_id": JOB,
        "run_id": f"{JOB}-run-1",
        "rank": rank,
        "node": f"node-{rank // 8 + 1:02d}",
        "kind": kind,
        "detail": detail,
        "exit_code": exit_code,
    }
    rec.update(extra)
    return Event("RankFault", rec)


def run(det: Detector, events: list[Event]) -> list[Finding]:
    out: list[Finding] = []
    for ev in events:
        det.topology.observe(ev)
        out += det.observe(ev)
    return out


def bound(ranks: int = 16) -> Topology:
    topo = Topology()
    topo.observe(job_started(JOB, T0, world_size=ranks, nodes=ranks // 8))
    for r in range(ranks):
        topo.observe(rank_bound(JOB, r, T0 + 1000))
    return topo


def test_a_cuda_oom_names_the_rank_its_node_and_gpu_and_resolves_when_the_rank_steps_again() -> None:
    det = RankFailedDetector(bound())
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB"
    [f] = run(det, [fault(11, T0 + 60_000, "cuda_oom", f"step 812: {oom}")])
    assert (f.rule, f.key, f.active, f.rank, f.node, f.gpu_index, f.gpu_uuid) == (
        "rank_failed",
        (JOB, "11"),
        True,
        11,
        "node-02",
        3,
        "GPU-node-02-3",
    )
    assert f.category == "model" and f.severity == "critical" and f.suspected_layer == "gpu"
    assert "ran out of GPU memory" in f.summary and "Tried to allocate 4.00 GiB" in f.summary
    assert f.history and f.history_metric == "rank_faults"
    assert run(det, [step(JOB, 3, 813, T0 + 61_000)]) == [], "another rank's step does not resolve it"
    [done] = run(det, [step(JOB, 11, 813, T0 + 90_000)])
    assert done.active is False and done.key == (JOB, "11")


def test_an_exit_is_a_platform_failure_with_its_code_and_a_clean_exit_is_none() -> None:
    det = RankFailedDetector(bound())
    assert run(det, [fault(2, T0 + 5000, "exit", "worker finished", exit_code=0)]) == []
    [f] = run(det, [fault(2, T0 + 6000, "exit", "ChildFailedError: exitcode -9", exit_code=-9)])
    assert f.category == "platform" and "exited (exit code -9)" in f.summary
    assert run(det, [fault(2, T0 + 7000, "collective_timeout")]) == [], "timeouts are dependency_timeout's"


def test_a_new_run_of_the_job_resolves_the_old_runs_failures() -> None:
    det = RankFailedDetector(bound())
    run(det, [fault(5, T0 + 5000, "exception", "ValueError: bad batch")])
    restarted = job_started(JOB, T0 + 60_000, world_size=16, nodes=2, run_id=f"{JOB}-run-2")
    [done] = run(det, [restarted])
    assert done.active is False and done.rank == 5


def test_an_unbound_rank_is_placed_by_the_faults_own_node() -> None:
    det = RankFailedDetector(Topology())
    [f] = run(det, [fault(40, T0, "oom", "killed", exit_code=137, node="gpu-a-07")])
    assert f.node == "gpu-a-07" and f.gpu_uuid is None and f.suspected_layer == "host"


def test_collective_timeouts_are_one_alert_naming_the_ranks_that_did_not_time_out() -> None:
    det = DependencyTimeoutDetector(bound())
    detail = "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE)"
    out = run(det, [fault(r, T0 + 600_000 + r, "collective_timeout", detail) for r in range(16) if r != 7])
    assert {f.key for f in out} == {(JOB, "collective_timeout")}
    last = out[-1]
    assert (
        last.active and last.rank is None and last.category == "infra" and last.suspected_layer == "network"
    )
    assert "15 ranks (0-6, 8-15)" in last.summary and "rank(s) 7 did not time out" in last.summary
    assert last.observed == 15.0 and len(last.history) == 10
    [done] = run(det, [step(JOB, 0, 900, T0 + 700_000)])
    assert done.active is False


def test_a_storage_timeout_names_its_rank_with_node_and_gpu() -> None:
    det = DependencyTimeoutDetector(bound())
    [f] = run(det, [fault(2, T0 + 5000, "storage_timeout", "data loader: TimeoutError: read timed out")])
    assert (f.rank, f.node, f.gpu_index, f.category, f.suspected_layer) == (
        2,
        "node-01",
        2,
        "data",
        "storage",
    )
    assert "timed out waiting for a storage call" in f.summary


def skipped_steps(first: int, last: int, skipped: Any) -> list[Event]:
    out = []
    for n in range(first, last):
        ev = step(JOB, 0, n, T0 + n * 1000)
        ev.record["skipped"] = bool(skipped(n))
        out.append(ev)
    return out


def test_every_fifth_step_skipped_is_a_sustained_skip_rate() -> None:
    det = StepSkipRateDetector(Topology())
    assert run(det, skipped_steps(0, 100, lambda n: False)) == []
    out = run(det, skipped_steps(100, 200, lambda n: n % 5 == 0))
    fired = [f for f in out if f.active]
    assert fired and fired[0].rule == "step_skip_rate" and fired[0].key == (JOB,)
    assert fired[0].observed is not None and fired[0].observed >= 0.1
    assert fired[0].ts <= T0 + 160_000, "found within 60 steps of the start"
    back = run(det, skipped_steps(200, 320, lambda n: False))
    assert back and back[-1].active is False


def test_a_burst_of_skips_and_a_rare_skip_are_no_rate() -> None:
    burst = StepSkipRateDetector(Topology())
    assert [f for f in run(burst, skipped_steps(0, 300, lambda n: 120 <= n < 150)) if f.active] == []
    rare = StepSkipRateDetector(Topology())
    assert [f for f in run(rare, skipped_steps(0, 400, lambda n: n % 50 == 0)) if f.active] == []


def test_each_step_is_judged_once_whatever_the_number_of_ranks() -> None:
    det = StepSkipRateDetector(Topology())
    events = []
    for ev in skipped_steps(0, 200, lambda n: n % 4 == 0):
        for r in range(4):
            events.append(Event(ev.type, {**ev.record, "rank": r}))
    out = [f for f in run(det, events) if f.active]
    assert out and abs((out[0].observed or 0) - 0.25) < 0.02
