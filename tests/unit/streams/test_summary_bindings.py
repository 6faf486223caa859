"""The rank summariser reads where ranks run from the topology's bindings, so a rank bound again on
another node moves with it (issue 31.3: one source for bindings)."""

from __future__ import annotations

from schemas.records import Event
from streams.detectors.base import Topology
from streams.stages.summary import RankSummarizer
from tests.unit.streams.builders import T0, gpu_sample, host_sample, job_started, job_state, rank_bound


def _feed(topology: Topology, summarizer: RankSummarizer, *events: Event) -> None:
    for event in events:  # as the stage engine: the topology first, then the summaries
        topology.observe(event)
        summarizer.observe(event)


def _node_rows(summarizer: RankSummarizer, upto: int) -> set[tuple[str, str]]:
    """(job, node) of the node rows (host telemetry) summarised through `upto`."""
    return {
        (s.record["job_id"], s.record["node"]) for s in summarizer.advance(upto) if s.record["rank"] is None
    }


def test_a_rank_bound_again_on_another_node_takes_its_jobs_host_telemetry_with_it() -> None:
    topology = Topology()
    summarizer = RankSummarizer(topology, 5_000)
    moved = Event("RankBound", {**rank_bound("job-1", 0, T0 + 6_000).record, "node": "node-02"})
    _feed(
        topology,
        summarizer,
        job_started("job-1", T0),
        rank_bound("job-1", 0, T0),
        host_sample("node-01", T0 + 1_000),
    )
    assert _node_rows(summarizer, T0 + 5_000) == {("job-1", "node-01")}
    _feed(topology, summarizer, moved, host_sample("node-01", T0 + 7_000), host_sample("node-02", T0 + 7_000))
    assert _node_rows(summarizer, T0 + 10_000) == {("job-1", "node-02")}


def test_a_process_is_foreign_unless_a_rank_of_the_job_is_bound_to_it_on_that_node() -> None:
    topology = Topology()
    summarizer = RankSummarizer(topology, 5_000)
    bound = rank_bound("job-1", 0, T0)  # pid 1000 on node-01, GPU 0
    _feed(topology, summarizer, job_started("job-1", T0), bound)
    sample = gpu_sample("node-01", 0, T0 + 1_000)
    own = Event("GpuSample", {**sample.record, "gpu_uuid": bound.record["gpu_uuid"], "pids": [1000]})
    stranger = Event("GpuSample", {**own.record, "ts": T0 + 6_000, "pids": [1000, 4242]})
    _feed(topology, summarizer, own, stranger)
    foreign = [
        (s.record["ts"], s.record["foreign_pid"])
        for s in summarizer.advance(T0 + 10_000)
        if s.record["rank"] == 0
    ]
    assert foreign == [(T0 + 5_000, None), (T0 + 10_000, 4242)]
    # Once the job ended, no process on its GPU is its own.
    _feed(topology, summarizer, job_state("job-1", T0 + 11_000, "completed"))
    summarizer.forget_job("job-1")
    _feed(topology, summarizer, Event("GpuSample", {**own.record, "ts": T0 + 12_000}))
    assert [s.record["foreign_pid"] for s in summarizer.advance(T0 + 15_000)] == [1000]
    assert topology.jobs_on_node("node-01") == []
