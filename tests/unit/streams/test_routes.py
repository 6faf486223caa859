"""Re-keying telemetry by job (NodeRoutes), the Java-compatible partitioner and the wall-clock guard."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from schemas.records import Event
from schemas.topics import murmur2, partition_for
from streams.runtime.guard import WallClockGuard
from streams.stages.routes import UNBOUND_KEY, NodeRoutes


def _bound(job: str, rank: int, node: str, uuid: str | None, ts: int) -> dict[str, object]:
    return {
        "ts": ts,
        "job_id": job,
        "rank": rank,
        "node": node,
        "gpu_uuid": uuid,
        "gpu_index": rank,
        "pid": 100 + rank,
    }


def _gpu(node: str, uuid: str, ts: int, **extra: object) -> Event:
    return Event(
        "GpuSample", {"ts": ts, "node": node, "gpu_uuid": uuid, "xid": None, "ecc_uncorrected": 0, **extra}
    )


def _host(node: str, ts: int, **extra: object) -> Event:
    return Event("HostSample", {"ts": ts, "node": node, "oom_kills": 0, **extra})


def test_partition_for_matches_the_java_client_murmur2() -> None:
    # Values of Kafka's own Utils.murmur2 test vectors, mapped to 6 partitions as the Java client does.
    java = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536}
    for key, h in java.items():
        assert partition_for(key, 6) == (h & 0x7FFFFFFF) % 6
        assert murmur2(key) == h & 0xFFFFFFFF  # Kafka's Utils.murmur2 test vectors, unsigned


@given(st.binary(max_size=64))
def test_murmur2_is_the_hash_aiokafka_and_the_java_client_compute(key: bytes) -> None:
    """A pure function of our own, checked against aiokafka's (the worker no longer imports it)."""
    from aiokafka.partitioner import murmur2 as aiokafka_murmur2

    assert murmur2(key) == aiokafka_murmur2(key)


@given(st.binary(max_size=40), st.integers(min_value=1, max_value=64))
def test_partition_for_is_always_a_valid_partition(key: bytes, n: int) -> None:
    assert 0 <= partition_for(key, n) < n


def test_gpu_sample_goes_to_the_job_bound_to_its_gpu_and_host_sample_to_every_job_on_the_node() -> None:
    routes = NodeRoutes()
    routes.bind(_bound("job-a", 0, "n1", "G0", 1_000))
    routes.bind(_bound("job-b", 0, "n1", "G1", 1_000))
    assert routes.route(_gpu("n1", "G0", 2_000)) == ["job-a/n1"]  # shard keys: job and node
    assert routes.route(_gpu("n1", "G1", 2_000)) == ["job-b/n1"]
    assert routes.route(_host("n1", 2_000)) == ["job-a/n1", "job-b/n1"]
    assert routes.jobs(_host("n1", 2_000)) == ["job-a", "job-b"]


def test_a_host_sample_goes_to_the_jobs_it_names_too_and_they_share_the_nodes_gpu_faults() -> None:
    routes = NodeRoutes()
    routes.bind(_bound("job-a", 0, "n1", "G0", 1_000))
    # The agent knows job-c runs here too (its ranks sent no RankBound).
    assert routes.jobs(_host("n1", 2_000, job_ids=["job-c"])) == ["job-a", "job-c"]
    assert routes.jobs(_host("n1", 3_000)) == ["job-a", "job-c"]  # a sample naming none keeps them
    assert routes.colocated(_gpu("n1", "G0", 3_000, xid=79)) == ["job-c/n1"]
    assert routes.with_holder(_gpu("n1", "G0", 3_000, xid=79)).record["job_id"] == "job-a"
    assert routes.end_job("job-c") == ["n1"]
    assert routes.jobs(_host("n1", 4_000)) == ["job-a"]


def test_a_newer_binding_of_a_gpu_wins_and_a_late_older_one_does_not_override_it() -> None:
    routes = NodeRoutes()
    routes.bind(_bound("job-new", 0, "n1", "G0", 5_000))
    routes.bind(_bound("job-old", 0, "n1", "G0", 1_000))  # redelivered late
    assert routes.jobs(_gpu("n1", "G0", 6_000)) == ["job-new"]


def test_ending_a_job_unbinds_its_gpus_and_leaves_other_jobs_alone() -> None:
    routes = NodeRoutes(unbound_interval_ms=0)
    routes.bind(_bound("job-a", 0, "n1", "G0", 1_000))
    routes.bind(_bound("job-b", 0, "n1", "G1", 1_000))
    assert routes.end_job("job-a") == ["n1"]
    assert routes.route(_gpu("n1", "G0", 2_000)) == [UNBOUND_KEY]
    assert routes.jobs(_gpu("n1", "G1", 2_000)) == ["job-b"]
    assert routes.jobs(_host("n1", 2_000)) == ["job-b"]
    assert routes.end_job("job-a") == []


def test_unbound_telemetry_is_thinned_per_gpu_but_xid_and_oom_always_pass() -> None:
    routes = NodeRoutes(unbound_interval_ms=10_000)
    sent = [routes.route(_gpu("n9", "G0", ts)) for ts in range(0, 30_000, 1_000)]
    assert sum(1 for s in sent if s) == 3  # one per 10 s of event time
    assert routes.route(_gpu("n9", "G0", 30_500, xid=79)) == [UNBOUND_KEY]
    assert routes.route(_gpu("n9", "G1", 30_500)) == [UNBOUND_KEY]  # another GPU has its own budget
    assert routes.route(_host("n9", 0)) == [UNBOUND_KEY]
    assert routes.route(_host("n9", 1_000)) == []
    assert routes.route(_host("n9", 2_000, oom_kills=1)) == [UNBOUND_KEY]


def test_node_state_round_trips_through_its_table_value() -> None:
    routes = NodeRoutes()
    routes.bind(_bound("job-a", 0, "n1", "G0", 1_000))
    routes.bind(_bound("job-a", 1, "n1", None, 1_000))  # a CPU rank: on the node, no GPU
    state = routes.state_of("n1")
    again = NodeRoutes()
    again.load("n1", state)
    assert again.state_of("n1") == state
    assert again.jobs(_gpu("n1", "G0", 2_000)) == ["job-a"]
    again.jobs(_host("n1", 2_000, job_ids=["job-z"]))  # the jobs the agent names are kept too
    third = NodeRoutes()
    third.load("n1", again.state_of("n1"))
    assert third.jobs(_host("n1", 3_000)) == ["job-a", "job-z"]
    again.load("n1", None)
    assert again.state_of("n1") is None


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_800_000_000_000
        self.silent_s = 0.0

    def tick(self, seconds: float) -> None:
        self.now_ms += int(seconds * 1000)
        self.silent_s += seconds


def test_guard_advances_a_live_engine_only_after_its_input_was_silent_for_guard_s() -> None:
    clock = FakeClock()
    guard = WallClockGuard(guard_s=120, live_ms=600_000, lateness_ms=5_000)
    max_ts = clock.now_ms - 1_000  # live: the last event is a second old
    clock.tick(119)
    assert guard.watermark(clock.now_ms, clock.silent_s, max_ts, max_ts - 5_000) is None
    clock.tick(1)
    assert guard.watermark(clock.now_ms, clock.silent_s, max_ts, max_ts - 5_000) == clock.now_ms - 5_000
    # Already there: nothing to gain.
    assert guard.watermark(clock.now_ms, clock.silent_s, max_ts, clock.now_ms) is None


def test_guard_never_advances_historical_event_time_or_an_empty_engine() -> None:
    clock = FakeClock()
    guard = WallClockGuard(guard_s=120, live_ms=600_000, lateness_ms=5_000)
    clock.tick(3_600)
    replay_ts = clock.now_ms - 86_400_000  # a day-old replay
    assert guard.watermark(clock.now_ms, clock.silent_s, replay_ts, replay_ts) is None
    assert guard.watermark(clock.now_ms, clock.silent_s, None, None) is None
    assert WallClockGuard(guard_s=0).watermark(clock.now_ms, 1e9, clock.now_ms, None) is None


def test_an_attributed_gpu_sample_has_its_job_key_and_a_host_sample_none() -> None:
    """A GpuSample goes to its GPU's job; a HostSample goes by node (the worker sends it to every
    job on the node, those it names included); idle GPUs to none."""
    from schemas.topics import job_keys

    assert job_keys("GpuSample", {"node": "n1", "job_id": "job-a"}) == ["job-a"]
    assert job_keys("GpuSample", {"node": "n1", "job_id": None}) == []
    assert job_keys("GpuSample", {"node": "n1"}) == []
    assert job_keys("HostSample", {"node": "n1", "job_ids": ["job-b", "job-a"]}) == []
    assert job_keys("StepCompleted", {"job_id": "job-a"}) == []


def test_the_job_keyed_telemetry_topic_carries_telemetry_only() -> None:
    """rs.telemetry.job is part of the topic contract: telemetry belongs there, training records do not."""
    from schemas.topics import TELEMETRY_JOB, key_for, off_topic_reason

    assert off_topic_reason("GpuSample", "t1." + TELEMETRY_JOB) is None
    assert off_topic_reason("HostSample", TELEMETRY_JOB) is None
    assert off_topic_reason("StepCompleted", TELEMETRY_JOB) is not None
    assert key_for(TELEMETRY_JOB, {"job_id": "job-a", "node": "n1"}) == b"job-a/n1"


def test_every_sample_has_exactly_one_kind_of_worker_copy() -> None:
    """An attributed GPU sample: one on rs.telemetry.job keyed by job and node; a host sample or an
    unattributed GPU sample: one node-keyed on rs.telemetry.unattributed."""
    from schemas.topics import TELEMETRY_JOB, TELEMETRY_UNATTRIBUTED, off_topic_reason, telemetry_copies

    assert telemetry_copies("GpuSample", {"node": "n1", "job_id": "job-a"}) == [(TELEMETRY_JOB, b"job-a/n1")]
    assert telemetry_copies("HostSample", {"node": "n1", "job_ids": ["job-b", "job-a"]}) == [
        (TELEMETRY_UNATTRIBUTED, b"n1")
    ]
    assert telemetry_copies("GpuSample", {"node": "n1", "job_id": None}) == [(TELEMETRY_UNATTRIBUTED, b"n1")]
    assert telemetry_copies("HostSample", {"node": "n2", "job_ids": []}) == [(TELEMETRY_UNATTRIBUTED, b"n2")]
    assert telemetry_copies("StepCompleted", {"job_id": "job-a", "node": "n1"}) == []
    assert off_topic_reason("HostSample", "t1." + TELEMETRY_UNATTRIBUTED) is None
    assert off_topic_reason("StepCompleted", TELEMETRY_UNATTRIBUTED) is not None
