"""The data-path rules of issue 23: read latency / batch preparation, cache hits, file opens and live loader
workers judged against the run's own normal, per rank or per node, saying whether the GPUs waited."""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology
from streams.detectors.cache_hit_collapse import CacheHitCollapseDetector
from streams.detectors.data_path_slow import DataPathSlowDetector
from streams.detectors.file_open_drop import FileOpenDropDetector
from streams.detectors.loader_workers_lost import LoaderWorkersLostDetector
from tests.unit.streams.builders import T0, job_started, rank_bound, step

JOB = "job-1"


def loader(rank: int, i: int, **fields: Any) -> Event:
    """A healthy DataLoaderSample every 2 s: 4 ms reads, 0.5 s batches, 92 % cache hits, 2 opens/s, 8 workers."""
    rec = {
        "ts": T0 + i * 2000 + rank,
        "job_id": JOB,
        "run_id": f"{JOB}-run-1",
        "rank": rank,
        "interval_s": 2.0,
        "batches": 2,
        "wait_s": 0.06,
        "workers": 8,
        "workers_expected": 8,
        "batch_prep_s": 0.5,
        "read_latency_s": 0.004 * (1 + 0.05 * ((i * 7 + rank) % 3 - 1)),
        "cache_hit_ratio": 0.92,
        "file_opens_s": 2.0,
    }
    rec.update(fields)
    return Event("DataLoaderSample", rec)


def topology(ranks: int = 16) -> Topology:
    topo = Topology()
    topo.observe(job_started(JOB, T0 - 60_000, world_size=ranks, nodes=ranks // 8))
    for r in range(ranks):
        topo.observe(rank_bound(JOB, r, T0 - 50_000))
    return topo


def feed(det: Detector, events: list[Event]) -> list[Finding]:
    out: list[Finding] = []
    for ev in sorted(events, key=lambda e: e.record["ts"]):
        det.topology.observe(ev)
        out += det.observe(ev)
    return out


def steps(ranks: range, first: int, last: int, *, slow: set[int] | None = None) -> list[Event]:
    """Steps every 2 s; ranks in `slow` wait 40 % of the step for data."""
    return [
        step(JOB, r, i, T0 + i * 2000 + 500 + r, data_wait=0.4 if r in (slow or set()) else 0.03)
        for i in range(first, last)
        for r in ranks
    ]


def test_one_ranks_slow_reads_name_the_rank_its_node_and_gpu_and_that_the_gpus_waited() -> None:
    det = DataPathSlowDetector(topology())
    healthy = [loader(r, i) for i in range(20) for r in range(16)] + steps(range(16), 0, 20)
    assert feed(det, healthy) == []
    slow = [loader(r, i, read_latency_s=0.02 if r == 5 else 0.004) for i in range(20, 30) for r in range(16)]
    found = [f for f in feed(det, slow + steps(range(16), 20, 30, slow={5})) if f.active]
    assert found, "five times slower reads on rank 5 must be found"
    assert found[0].severity == "info", "its steps had not waited yet when the reads first deviated"
    f = found[-1]  # re-reported as soon as the steps' data wait grew
    assert (f.rule, f.key, f.rank, f.node, f.gpu_index, f.gpu_uuid) == (
        "data_path_slow",
        (JOB, "5"),
        5,
        "node-01",
        5,
        "GPU-node-01-5",
    )
    assert f.suspected_layer == "storage" and f.severity == "warning"
    assert "the GPUs waited" in f.summary and "5.0x" in f.summary
    assert f.observed == 0.02 and abs((f.expected or 0) - 0.004) < 0.0005
    assert f.history and f.history_metric == "read_latency_s"
    assert f.sustain_ms > 0, "a rank's own finding waits for its node's ranks"
    back = feed(det, [loader(r, i) for i in range(30, 40) for r in range(16)])
    assert [x.active for x in back if x.key == (JOB, "5")][-1] is False


def test_a_whole_node_is_one_finding_and_a_hidden_problem_is_info() -> None:
    det = DataPathSlowDetector(topology())
    feed(det, [loader(r, i) for i in range(20) for r in range(16)] + steps(range(16), 0, 20))
    slow = [loader(r, i, read_latency_s=0.03 if r >= 8 else 0.004) for i in range(20, 30) for r in range(16)]
    out = feed(det, slow + steps(range(16), 20, 30))  # the prefetch hides it: no extra data wait
    node = [f for f in out if f.key == (JOB, "node:node-02")]
    assert node and node[-1].active and node[-1].rank is None and node[-1].node == "node-02"
    assert node[-1].severity == "info" and "did not wait" in node[-1].summary
    assert "ranks 8-15" in node[-1].summary
    ranks_still_active = {f.key for f in out if f.active and f.key[1] != "node:node-02"}
    closed = {f.key for f in out if not f.active}
    assert ranks_still_active <= closed, "rank findings give way to the node's"


def test_a_blip_and_ordinary_noise_raise_nothing() -> None:
    det = DataPathSlowDetector(topology())
    events = [loader(r, i) for i in range(60) for r in range(16)]
    events[25 * 16 + 3] = loader(3, 25, read_latency_s=0.05, batch_prep_s=3.0)  # one sample
    assert [f for f in feed(det, events) if f.active] == []


def test_batch_preparation_rising_points_at_the_loader_not_storage() -> None:
    det = DataPathSlowDetector(topology())
    feed(det, [loader(r, i) for i in range(20) for r in range(16)])
    out = feed(
        det, [loader(r, i, batch_prep_s=1.6 if r == 2 else 0.5) for i in range(20, 30) for r in range(16)]
    )
    f = next(x for x in out if x.active)
    assert f.rank == 2 and f.suspected_layer == "data" and f.history_metric == "batch_prep_s"
    assert "unknown whether the GPUs waited" in f.summary, "no steps were reported"


def test_cache_hits_collapsing_on_a_node_is_one_cache_hit_collapse() -> None:
    det = CacheHitCollapseDetector(topology())
    feed(det, [loader(r, i) for i in range(20) for r in range(16)])
    out = feed(
        det, [loader(r, i, cache_hit_ratio=0.15 if r < 8 else 0.92) for i in range(20, 30) for r in range(16)]
    )
    active = {f.key for f in out if f.active and f.sustain_ms == 0}
    assert active == {(JOB, "node:node-01")}
    f = next(x for x in out if x.key == (JOB, "node:node-01"))
    assert f.suspected_layer == "storage" and "cache hits 15% of reads, normally 92%" in f.summary


def test_a_modest_cache_dip_is_no_collapse() -> None:
    det = CacheHitCollapseDetector(topology())
    feed(det, [loader(r, i) for i in range(20) for r in range(16)])
    assert [
        f for f in feed(det, [loader(0, i, cache_hit_ratio=0.8) for i in range(20, 40)]) if f.active
    ] == []


def test_file_opens_dropping_while_the_loop_wants_data_is_found_but_a_paused_loop_is_not_judged() -> None:
    det = FileOpenDropDetector(topology())
    feed(det, [loader(r, i) for i in range(20) for r in range(16)])
    paused = [loader(4, i, batches=0, file_opens_s=0.0) for i in range(20, 35)]  # an evaluation: no batches
    assert [f for f in feed(det, paused) if f.active] == []
    throttled = [loader(4, i, file_opens_s=0.2) for i in range(35, 45)]
    f = next(x for x in feed(det, throttled) if x.active)
    assert f.rank == 4 and "10% of the run's normal" in f.summary


def test_a_job_that_takes_fewer_batches_opens_fewer_files_and_that_is_no_drop() -> None:
    """Slowed by anything else (a straggler, contention), the loop takes a quarter of the batches and
    the loader opens a quarter of the files per second: the same per batch, nothing to page."""
    det = FileOpenDropDetector(topology())
    feed(det, [loader(r, i) for i in range(20) for r in range(16)])
    slowed = [loader(r, i, batches=1, file_opens_s=0.5) for i in range(20, 40) for r in range(16)]
    assert [f for f in feed(det, slowed) if f.active] == []
    # Opening fewer files per batch than normal while it takes them: the storage is the news.
    throttled = [loader(4, i, batches=1, file_opens_s=0.05) for i in range(40, 50)]
    f = next(x for x in feed(det, throttled) if x.active)
    assert f.rank == 4 and "per batch" in f.summary


def test_live_workers_below_the_configured_count_are_lost_workers_and_a_short_dip_is_not() -> None:
    det = LoaderWorkersLostDetector(topology())
    assert [f for f in feed(det, [loader(3, i) for i in range(5)]) if f.active] == []
    blip = [loader(3, 5, workers=0), loader(3, 6)]
    assert [f for f in feed(det, blip) if f.active] == []
    died = [loader(3, i, workers=3, batches=0) for i in range(7, 12)]  # all but 3 dead; even with no batch
    f = next(x for x in feed(det, died) if x.active)
    assert f.rank == 3 and "3 of 8 data-loader workers alive" in f.summary
    assert f.observed == 3.0 and f.expected == 8.0
    back = feed(det, [loader(3, i) for i in range(12, 16)])
    assert back and back[-1].active is False


def test_without_the_configured_count_the_runs_own_maximum_is_the_reference() -> None:
    det = LoaderWorkersLostDetector(topology())
    feed(det, [loader(3, i, workers_expected=None) for i in range(5)])
    out = feed(det, [loader(3, i, workers=6, workers_expected=None) for i in range(5, 10)])
    assert any(f.active and f.expected == 8.0 for f in out)


def test_a_new_run_starts_the_baseline_over_and_ends_the_old_condition() -> None:
    det = DataPathSlowDetector(topology())
    feed(det, [loader(1, i) for i in range(20)])
    assert any(f.active for f in feed(det, [loader(1, i, read_latency_s=0.04) for i in range(20, 30)]))
    after = feed(det, [loader(1, 30, run_id=f"{JOB}-run-2", read_latency_s=0.04)])
    assert after and not after[-1].active, "the restarted rank's old condition ends with its run"


def test_state_round_trips_and_the_restored_detector_goes_on_alike() -> None:
    det = DataPathSlowDetector(topology())
    feed(det, [loader(r, i) for i in range(20) for r in range(16)])
    twin = DataPathSlowDetector(det.topology)
    twin.from_bytes(det.to_bytes())
    rest = [loader(r, i, read_latency_s=0.02 if r == 5 else 0.004) for i in range(20, 30) for r in range(16)]
    assert feed(det, rest) == feed(twin, rest)
