"""Where a record, a copy, a marker goes (`streams.stages.placement`): the one answer the worker and
the offline replay share."""

from __future__ import annotations

from schemas.records import Event
from schemas.topics import TRAINING_STEPS, key_for, partition_for, shard_key
from streams.stages.placement import FaultCopies, Placement, is_shared, shared_key
from streams.stages.routes import NodeRoutes


def _bind(routes: NodeRoutes, job: str, node: str, uuid: str, ts: int = 1_000) -> None:
    routes.bind(
        {"ts": ts, "job_id": job, "rank": 0, "node": node, "gpu_uuid": uuid, "gpu_index": 0, "pid": 1}
    )


def _gpu(node: str, uuid: str, ts: int, **extra: object) -> Event:
    return Event(
        "GpuSample", {"ts": ts, "node": node, "gpu_uuid": uuid, "xid": None, "ecc_uncorrected": 0, **extra}
    )


def _jobs_on_distinct_partitions(place: Placement, node: str, count: int) -> list[str]:
    """Job ids whose keys on `node` land on `count` different partitions."""
    jobs: dict[int, str] = {}
    for i in range(200):
        jobs.setdefault(place.of(shard_key(f"job-{i}", node)), f"job-{i}")
        if len(jobs) == count:
            break
    return list(jobs.values())


def test_a_ranks_record_lands_where_the_publisher_keys_it() -> None:
    place = Placement(6)
    r = {"ts": 1, "job_id": "j", "rank": 3, "node": "n7", "step": 1}
    expected = partition_for(key_for(TRAINING_STEPS, r) or b"", 6)
    assert place.source(Event("StepCompleted", r)) == [expected]


def test_unattributed_telemetry_has_no_source_partition_and_is_routed_by_the_nodes_bindings() -> None:
    place, routes = Placement(6), NodeRoutes()
    _bind(routes, "job-a", "n1", "G0")
    sample = _gpu("n1", "G0", 2_000)
    assert place.source(sample) == []
    assert place.routed(routes, sample) == {place.of(shard_key("job-a", "n1")): shard_key("job-a", "n1")}
    attributed = _gpu("n1", "G0", 2_000, job_id="job-a")
    assert place.source(attributed) == [place.of(shard_key("job-a", "n1"))]


def test_a_job_start_is_copied_to_every_other_partition_and_a_step_to_none() -> None:
    place = Placement(4)
    start = Event("JobStarted", {"ts": 1, "job_id": "j"})
    own = place.source(start)[0]
    assert own == place.job("j")
    assert sorted([own, *place.copies(start, own)]) == [0, 1, 2, 3]
    assert place.copies(Event("StepCompleted", {"ts": 1, "job_id": "j", "rank": 0}), own) == []
    assert place.others(2) == [0, 1, 3]
    assert list(place.every()) == [0, 1, 2, 3]


def test_a_gpu_fault_goes_to_the_other_jobs_of_its_node_not_to_the_partitions_that_read_it() -> None:
    place, routes = Placement(6), NodeRoutes()
    own_job, other = _jobs_on_distinct_partitions(place, "n1", 2)
    _bind(routes, own_job, "n1", "G0")
    _bind(routes, other, "n1", "G1")
    fault = _gpu("n1", "G0", 2_000, job_id=own_job, xid=79)
    shared = place.shared(routes, fault, place.source(fault))
    assert shared == {place.of(shard_key(other, "n1")): shared_key(shard_key(other, "n1"))}
    assert all(is_shared(key.encode()) for key in shared.values())
    assert not is_shared(shard_key(other, "n1").encode())
    # Where the co-located job's partition already reads the sample, no copy goes there.
    assert place.shared(routes, fault, [*place.source(fault), *shared]) == {}


def test_the_gpus_last_healthy_sample_goes_once_before_its_first_fault() -> None:
    faults: FaultCopies[str] = FaultCopies()
    healthy = {"node": "n1", "gpu_uuid": "G0", "xid": None, "ecc_uncorrected": 0}
    fault = {**healthy, "xid": 79}
    assert faults.copies(healthy, "sample-1") == []
    assert faults.copies(healthy, "sample-2") == []
    assert faults.copies(fault, "fault-1") == ["sample-2", "fault-1"]
    assert faults.copies(fault, "fault-2") == ["fault-2"]
    assert faults.copies({**healthy, "gpu_uuid": "G1", "ecc_uncorrected": 2}, "ecc") == ["ecc"]
