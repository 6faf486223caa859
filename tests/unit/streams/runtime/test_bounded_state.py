"""Bounded state: a partition holds at most `engine.max_jobs` distinct jobs, the least recently heard
evicted and counted; a snapshot that would outgrow the changelog's limit sheds jobs instead of being
refused by Kafka (which stopped the worker, and a restart re-read the same records forever)."""

from __future__ import annotations

import dataclasses
import random
import string
from pathlib import Path

from schemas.codec import Codec
from schemas.records import Event
from schemas.topics import TRAINING_EVENTS
from streams.config import EngineConfig
from streams.runtime.changelog import SNAPSHOT_TABLE, changelog_topic
from streams.runtime.core import WorkerCore
from streams.runtime.options import WorkerOptions
from streams.stages.engine import StageEngine
from tests.unit.streams.builders import T0, gpu_sample, host_sample, job_started, step
from tests.unit.streams.runtime.fake_kafka import FakeKafka, drive

CODEC = Codec()


def _config(max_jobs: int) -> EngineConfig:
    return dataclasses.replace(EngineConfig.default(), max_jobs=max_jobs)


def test_an_engine_holds_at_most_max_jobs_and_evicts_the_least_recently_heard() -> None:
    engine = StageEngine(_config(10), stage="rank")
    for i in range(50):
        engine.process(job_started(f"job-{i}", T0 + i * 1000))
    engine.process(step("job-45", 0, 1, T0 + 60_000))  # heard again: the most recent
    for i in range(50, 55):
        engine.process(job_started(f"job-{i}", T0 + 61_000 + i))
    assert engine.jobs_held == 10 and len(engine.topology.jobs) == 10
    assert engine.stats["evicted_jobs"] == 45
    assert "job-45" in engine.topology.jobs and "job-44" not in engine.topology.jobs
    restored = StageEngine.restore(engine.snapshot(), _config(10), stage="rank")
    restored.process(job_started("job-new", T0 + 70_000))
    assert "job-45" in restored.topology.jobs and "job-46" not in restored.topology.jobs  # same order


def test_an_evicted_jobs_bindings_leave_every_index() -> None:
    engine = StageEngine(_config(1), stage="rank")
    engine.process(job_started("a", T0))
    engine.process(
        Event(
            "RankBound",
            {
                "ts": T0 + 1,
                "job_id": "a",
                "rank": 0,
                "node": "n1",
                "gpu_uuid": "g0",
                "gpu_index": 0,
                "pid": 1,
            },
        )
    )
    assert engine.topology.binding_for_gpu("n1", "g0") is not None
    engine.process(job_started("b", T0 + 2))
    topo = engine.topology
    assert (
        topo.bindings == {} and topo.binding_for_gpu("n1", "g0") is None and topo.bindings_on_node("n1") == []
    )


def _hostile_jobs(n: int) -> list[Event]:
    """Jobs under every per-record cap whose labels do not compress: ~15 KB of state each."""
    rng = random.Random(0)
    events = []
    for i in range(n):
        event = job_started(f"made-up-{i}", T0 + i)
        event.record["labels"] = {
            f"l{k}": "".join(rng.choices(string.ascii_letters, k=240)) for k in range(60)
        }
        events.append(event)
    return events


def test_a_snapshot_over_the_changelogs_limit_sheds_jobs_and_the_worker_keeps_running(tmp_path: Path) -> None:
    kafka = FakeKafka(1)
    kafka.publish(_hostile_jobs(120), CODEC)
    limit = 400_000

    def small_changelog(core: WorkerCore) -> bool:
        for task in core._all_tasks():
            task.max_snapshot_bytes = limit
        return False

    options = WorkerOptions(bootstrap="x", workdir=tmp_path)
    core, io = drive(kafka, options, stop_after=small_changelog)
    snapshots = kafka.records(changelog_topic(options.app_id, SNAPSHOT_TABLE))
    assert snapshots and max(len(r.value or b"") for r in snapshots) <= limit
    shed = sum(t.counts["shed_jobs"] for t in core._all_tasks())
    assert shed > 0
    # Every record read and committed once: no stop, no re-reading.
    assert io.committed.get(f"{TRAINING_EVENTS}:0") == len(kafka.logs[(TRAINING_EVENTS, 0)])


def test_a_job_naming_ranks_without_end_is_evicted_and_the_others_keep_theirs() -> None:
    engine = StageEngine(dataclasses.replace(EngineConfig.default(), max_ranks=100), stage="rank")
    engine.process(job_started("legit", T0, world_size=8))
    for rank in range(8):
        engine.process(step("legit", rank, 1, T0 + 1000))
    engine.process(job_started("liar", T0 + 2000))
    for n, rank in enumerate([2_000_000_000, *range(300)]):
        engine.process(step("liar", rank, 1, T0 + 3000 + n))
    assert engine.ranks_held <= 100 and engine.stats["evicted_jobs"] >= 3
    assert "legit" in engine.topology.jobs and engine._job_ranks["legit"] == set(range(8))
    restored = StageEngine.restore(engine.snapshot(), engine.config, stage="rank")
    assert restored.ranks_held == engine.ranks_held  # the count survives a restart


def test_an_engine_holds_at_most_max_nodes_and_an_evicted_nodes_alerts_resolve() -> None:
    """Node names are claims too: a flood of made-up nodes (~2.2 KB of per-node state each before the
    cap) evicts the least recently heard eighth at a time; their open alerts resolve; a node heard
    recently keeps its state."""
    config = dataclasses.replace(EngineConfig.default(), max_nodes=64)
    engine = StageEngine(config, stage="rank")
    bad = gpu_sample("node-xid", 0, T0)
    bad.record["xid"] = 79
    fired = [e.record for e in engine.process(bad) if e.type == "Alert"]
    assert [(a["rule"], a["status"]) for a in fired] == [("xid_error", "firing")]
    out: list[Event] = []
    for i in range(2_000):
        out += engine.process(gpu_sample(f"made-up-{i}", 0, T0 + 1_000 + i))
        out += engine.process(host_sample(f"made-up-{i}", T0 + 1_000 + i))
        if i % 50 == 0:
            out += engine.process(gpu_sample("busy", 0, T0 + 1_000 + i))  # heard all along
    assert len(engine._nodes_heard) <= 64 and "busy" in engine._nodes_heard
    assert engine.stats["evicted_nodes"] >= 2_000 - 64
    resolved = [e.record for e in out if e.type == "Alert" and e.record["rule"] == "xid_error"]
    assert [(a["node"], a["status"]) for a in resolved] == [("node-xid", "resolved")]
    capped = len(engine.snapshot())
    restored = StageEngine.restore(engine.snapshot(), config, stage="rank")
    assert list(restored._nodes_heard) == list(engine._nodes_heard)  # same eviction order
    # Without the cap the same flood holds every node: the snapshot is many times larger.
    free = StageEngine(dataclasses.replace(EngineConfig.default(), max_nodes=1_000_000), stage="rank")
    for i in range(2_000):
        free.process(gpu_sample(f"made-up-{i}", 0, T0 + 1_000 + i))
        free.process(host_sample(f"made-up-{i}", T0 + 1_000 + i))
    assert len(free.snapshot()) > 10 * capped
