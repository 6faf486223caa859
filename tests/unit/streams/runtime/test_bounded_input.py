"""Bounded input: a record over a per-record cap is refused at decode and dead-lettered once by its topic's
owner with the reason; the ~19 JobStarted records of ~0.94 MB of labels each that pushed a partition
snapshot over Kafka's 16 MiB no longer reach state: the worker keeps running, nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.codec import Codec
from schemas.errors import DecodeError
from schemas.limits import DEFAULT_LIMITS, RecordTooLarge, check_record
from schemas.records import Event
from schemas.topics import DEADLETTER, TRAINING_EVENTS
from streams.runtime.changelog import SNAPSHOT_TABLE, changelog_topic
from streams.runtime.options import WorkerOptions
from tests.unit.streams.builders import job_started
from tests.unit.streams.runtime.fake_kafka import FakeKafka, alerts_of, drive
from tests.unit.streams.runtime.test_core import _ids, _scenario

CODEC = Codec()
UNCAPPED = Codec(limits=None)


def _fat_job(i: int) -> Event:
    """A JobStarted under Kafka's 1 MB with ~0.94 MB of labels (the issue's crash loop)."""
    event = job_started(f"fat-{i}")
    event.record["labels"] = {f"l{n}": "x" * 15_000 for n in range(63)}
    return event


def test_a_record_over_a_cap_is_refused_at_decode_with_the_cap_it_broke() -> None:
    fat = UNCAPPED.encode(_fat_job(0))
    assert 900_000 < len(fat) < 1_000_000
    with pytest.raises(RecordTooLarge, match=r"labels hold 945,1\d\d characters") as caught:
        CODEC.decode(fat)
    assert isinstance(caught.value, DecodeError) and caught.value.data == fat  # dead-lettered as read
    many = job_started("many")
    many.record["labels"] = {f"l{n}": "" for n in range(65)}
    with pytest.raises(RecordTooLarge, match="65 labels, more than the 64"):
        CODEC.decode(UNCAPPED.encode(many))
    wide = job_started("wide", nodes=100_000)
    with pytest.raises(RecordTooLarge, match="'nodes' lists 100,000 items"):
        CODEC.decode(UNCAPPED.encode(wide))
    long_id = job_started("j" * 20_000)
    with pytest.raises(RecordTooLarge, match="'job_id' is 20,000 characters"):
        CODEC.decode(UNCAPPED.encode(long_id))
    ok = job_started("ok", nodes=16_384)
    ok.record["labels"] = {"ranksight.dev/team": "nlp"}
    assert CODEC.decode(UNCAPPED.encode(ok)).record["labels"] == {"ranksight.dev/team": "nlp"}


def test_ranksights_own_records_are_not_capped() -> None:
    """Per-rank summaries of a 100k-rank job are long by right: only publishers' record types are checked."""
    check_record("RankSummary", {"ranks": list(range(100_000))}, 10**6, DEFAULT_LIMITS)


def test_the_fat_job_started_records_are_dead_lettered_once_and_the_worker_loses_nothing(
    tmp_path: Path,
) -> None:
    events = _scenario("nan_loss")[:20_000]  # through the NaN loss (at ~18,300) and its alert
    clean = FakeKafka(6)
    clean.publish(events, CODEC)
    drive(clean, WorkerOptions(bootstrap="x", workdir=tmp_path / "clean"))
    kafka = FakeKafka(6)
    kafka.publish(events, CODEC)
    fat = [UNCAPPED.encode(_fat_job(i)) for i in range(19)]
    for i, value in enumerate(fat):
        kafka.produce(TRAINING_EVENTS, f"fat-{i}".encode(), value)
    options = WorkerOptions(bootstrap="x", workdir=tmp_path / "hostile")
    core, _ = drive(kafka, options)
    assert core.totals["bad_input"] == 19  # refused, counted; rs.training.events is the sink's to dead-letter
    assert kafka.records(DEADLETTER) == []  # so the worker writes no second dead letter for them
    expected = _ids(alerts_of(clean, CODEC))
    assert expected and _ids(alerts_of(kafka, CODEC)) == expected  # every alert, none lost
    snapshots = kafka.records(changelog_topic(options.app_id, SNAPSHOT_TABLE))
    assert snapshots and max(len(r.value or b"") for r in snapshots) < 1_000_000


def _replay_work(nodes: int, seconds: int) -> int:
    """Python and C function calls both stages make replaying a healthy 8-rank job of `seconds`
    whose JobStarted claims `nodes` nodes (a deterministic count of work, not a timing)."""
    import sys

    from schemas.eventtime import event_ts
    from streams.offline.detection import DetectionEngine
    from tests.unit.streams.builders import T0, gpu_sample, host_sample, training_job

    events = training_job("claims", world_size=8, seconds=seconds)
    events[0] = job_started("claims", T0, world_size=8, nodes=nodes)
    for s in range(0, seconds, 5):
        events += [gpu_sample("node-01", 0, T0 + s * 1000), host_sample("node-01", T0 + s * 1000)]
    events.sort(key=event_ts)
    engine = DetectionEngine()
    calls = 0

    def count(frame: object, what: str, arg: object) -> None:
        nonlocal calls
        if what in ("call", "c_call"):
            calls += 1

    sys.setprofile(count)
    try:
        engine.run(events)
    finally:
        sys.setprofile(None)
    return calls


def test_replay_work_grows_with_records_not_with_what_one_record_claims() -> None:
    """A JobStarted listing the most nodes the caps accept costs its nodes once, however long the
    job runs: no rule walks a claimed list at every record or check (the 100k-node listing made a
    replay 14x slower when `telemetry_missing` sorted every node at each check)."""
    claim = 16_384
    short_small, short_big = _replay_work(1, 150), _replay_work(claim, 150)
    long_small, long_big = _replay_work(1, 300), _replay_work(claim, 300)
    assert 1.8 < long_small / short_small < 2.2  # the work is linear in records ...
    once = short_big - short_small
    assert once < 16 * claim  # ... a claimed node costs a few calls (10 today: six partitions) ...
    assert long_big - long_small < once + claim // 8  # ... once, not again at every window or check
