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
