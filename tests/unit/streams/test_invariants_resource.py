"""ResourceDetector: a job's GPUs run only the job's processes."""

from __future__ import annotations

from schemas.records import Event
from streams.detectors.base import Finding, Topology
from streams.detectors.resource import ResourceDetector
from tests.unit.streams.builders import T0, gpu_sample, job_started, rank_bound

JOB = "job-1"


def drive(det: ResourceDetector, events: list[Event]) -> list[Finding]:
    out: list[Finding] = []
    for ev in events:
        det.topology.observe(ev)
        out += det.observe(ev)
        out += det.advance(ev.record["ts"])
    return out


def bound_job() -> list[Event]:
    # Ranks 0-3 on node-01 GPUs 0-3, pids 1000-1003.
    return [job_started(JOB, T0), *(rank_bound(JOB, r, T0) for r in range(4))]


def samples(pids_per_sample: list[list[int]], gpu: int = 1) -> list[Event]:
    return [gpu_sample("node-01", gpu, T0 + 10_000 * (i + 1), pids=p) for i, p in enumerate(pids_per_sample)]


def test_a_foreign_pid_on_a_bound_gpu_fires_after_two_samples_and_resolves_when_gone() -> None:
    events = bound_job() + samples([[1001], [1001, 4242], [1001, 4242], [1001, 4242], [1001]])
    found = drive(ResourceDetector(Topology()), events)
    assert [(f.active, f.ts) for f in found] == [
        (True, T0 + 30_000),
        (True, T0 + 40_000),
        (False, T0 + 50_000),
    ]
    f = found[0]
    assert f.rule == "foreign_process" and f.key == ("node-01", "GPU-node-01-1")
    assert f.job_id == JOB and f.rank == 1 and f.gpu_index == 1 and f.node == "node-01"
    assert "4242" in f.summary and f.since == T0 + 20_000 and f.category == "infra"


def test_a_single_sample_with_a_new_pid_is_not_reported() -> None:
    events = bound_job() + samples([[1001], [1001, 4242], [1001], [1001]])
    assert drive(ResourceDetector(Topology()), events) == []


def test_pids_of_other_ranks_of_the_same_job_are_not_foreign() -> None:
    events = bound_job() + samples([[1001, 1000, 1003]] * 5)
    assert drive(ResourceDetector(Topology()), events) == []


def test_gpus_bound_to_no_job_are_not_checked() -> None:
    events = bound_job() + samples([[7777]] * 5, gpu=6)
    assert drive(ResourceDetector(Topology()), events) == []


def test_a_restarted_rank_with_its_new_binding_is_not_foreign() -> None:
    restarted = rank_bound(JOB, 1, T0 + 15_000)
    restarted.record["pid"] = 5555
    events = [*bound_job(), *samples([[1001]]), restarted, *samples([[5555]] * 4)[1:]]
    assert drive(ResourceDetector(Topology()), events) == []
