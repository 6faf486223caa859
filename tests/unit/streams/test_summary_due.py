"""The rank summariser looks at its open buckets only once one is due (issue 37.1: its advance runs
once a second, a bucket ends every 5 s), and a restored summariser still closes the buckets it held."""

from __future__ import annotations

import json

from streams.detectors.base import Topology
from streams.stages.summary import RankSummarizer
from tests.unit.streams.builders import T0, job_started, rank_bound, step


def _fed(*ranks_and_times: tuple[int, int]) -> RankSummarizer:
    topology = Topology()
    summarizer = RankSummarizer(topology, 5_000)
    for event in (job_started("job-1", T0), rank_bound("job-1", 0, T0), rank_bound("job-1", 1, T0)):
        topology.observe(event)
    for n, (rank, ts) in enumerate(ranks_and_times):
        summarizer.observe(step("job-1", rank, n, ts))
    return summarizer


def _closed(summarizer: RankSummarizer, watermark: int) -> list[tuple[int, int]]:
    return [(s.record["rank"], s.record["bucket_start"]) for s in summarizer.advance(watermark)]


def test_a_bucket_closes_once_the_watermark_reaches_its_end_and_not_before() -> None:
    summarizer = _fed((0, T0 + 1_000), (1, T0 + 6_000))
    assert _closed(summarizer, T0 + 4_999) == []
    assert _closed(summarizer, T0 + 5_000) == [(0, T0)]
    assert _closed(summarizer, T0 + 9_999) == []
    assert _closed(summarizer, T0 + 10_000) == [(1, T0 + 5_000)]
    assert _closed(summarizer, T0 + 60_000) == []


def test_a_restored_summariser_closes_its_old_buckets_when_a_newer_one_opened_after_the_restore() -> None:
    held = _fed((0, T0 + 1_000))
    restored = RankSummarizer(Topology(), 5_000)
    restored.load_state(json.loads(json.dumps(held.state())))  # as a snapshot's JSON round trip
    restored.observe(step("job-1", 0, 7, T0 + 21_000, node="node-01"))  # a bucket ending at T0 + 25 s
    assert _closed(restored, T0 + 5_000) == [(0, T0)]
    assert _closed(restored, T0 + 25_000) == [(0, T0 + 20_000)]


def test_a_summariser_that_forgot_a_job_closes_the_other_jobs_buckets_in_time() -> None:
    summarizer = _fed((0, T0 + 1_000))
    summarizer.observe(step("job-2", 0, 1, T0 + 2_000, node="node-09"))
    summarizer.forget_job("job-1")
    assert _closed(summarizer, T0 + 5_000) == [(0, T0)]
    assert summarizer.rows == {}
