"""The worker core with no broker: the offline alerts, the commit order, restarts, backlogs, bad input.

An in-memory Kafka (`fake_kafka`) plays the broker; the core is the one both runtimes drive.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from producers.simulator import load_scenario, simulate
from schemas.codec import Codec
from schemas.files import write_container
from schemas.records import Event
from schemas.topics import DEADLETTER, TELEMETRY_JOB, TRAINING_STEPS
from streams.offline.replay import replay_offline
from streams.runtime.core import WorkerCore
from streams.runtime.handoff import Handoff
from streams.runtime.options import BINDINGS, WorkerOptions
from tests.unit.streams.runtime.fake_kafka import FakeIO, FakeKafka, alerts_of, drive, restored_from

CODEC = Codec()


def _scenario(name: str) -> list[Event]:
    return list(simulate(load_scenario(name), seed=0).events())


def _offline(events: list[Event], tmp: Path) -> set[tuple[str, str]]:
    path = tmp / "events.avro"
    write_container(path, events)
    return {(e.record["alert_id"], e.record["status"]) for e in replay_offline([path]) if e.type == "Alert"}


def _ids(records: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(r["alert_id"], r["status"]) for r in records}


@pytest.fixture(scope="module")
def nan_loss() -> list[Event]:
    return _scenario("nan_loss")


@pytest.fixture(scope="module")
def nan_loss_offline(nan_loss: list[Event], tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    return _offline(nan_loss, tmp_path_factory.mktemp("offline"))


def test_the_core_raises_the_offline_alerts_and_commits_only_after_a_flush(
    nan_loss: list[Event], nan_loss_offline: set[tuple[str, str]], tmp_path: Path
) -> None:
    kafka = FakeKafka(6)
    kafka.publish(nan_loss, CODEC)
    core, io = drive(kafka, WorkerOptions(bootstrap="x", workdir=tmp_path))
    assert nan_loss_offline and _ids(alerts_of(kafka, CODEC)) == nan_loss_offline
    assert core.totals["training_in"] + core.totals["telemetry_in"] == len(nan_loss)
    # Every commit follows a flush with nothing sent in between (outputs and state are durable first).
    last = None
    for kind, _ in io.calls:
        if kind == "commit":
            assert last == "flush", "a commit without a flush of everything sent before it"
        if kind in ("send", "flush"):
            last = kind
    # The snapshots' offsets cover every record: the group's committed offsets reach the ends.
    for (topic, p), log in kafka.logs.items():
        if topic in (TRAINING_STEPS, TELEMETRY_JOB) and log:
            assert io.committed.get(f"{topic}:{p}") == len(log)


def _raised(core: WorkerCore) -> bool:
    """The ordered pass raised an alert (an instant rule's page may have gone out before it)."""
    return any(t.engine.stats["alerts_firing"] for t in core.tasks.values())


def test_a_restarted_core_resumes_from_its_checkpoints_and_repeats_no_alert_id(
    nan_loss: list[Event], nan_loss_offline: set[tuple[str, str]], tmp_path: Path
) -> None:
    """Stopped abruptly after its first alert (uncommitted work lost), restored from the changelogs."""
    kafka = FakeKafka(6)
    kafka.publish(nan_loss, CODEC)
    options = WorkerOptions(bootstrap="x", workdir=tmp_path, checkpoint_events=2_000)
    io = FakeIO(kafka)
    drive(kafka, options, io=io, stop_after=_raised)
    first = alerts_of(kafka, CODEC)
    assert first
    restored = restored_from(kafka, options)
    assert restored.snapshots  # something was checkpointed before the stop
    io2 = FakeIO(kafka)
    io2.committed = dict(io.committed)
    core, _ = drive(kafka, options, io=io2, restored=restored)
    tasks = [*core.tasks.values(), *core.job_tasks.values()]
    assert {t.snapshot_name for t in tasks if t.seq >= 1} >= set(restored.snapshots)  # each resumed
    records = alerts_of(kafka, CODEC)
    assert _ids(records) == nan_loss_offline
    # At-least-once: a repeat is the same alert (same id and status), never a new one.
    assert len(records) - len(first) <= 2 * len(nan_loss_offline)


@pytest.mark.parametrize("release_batch", [500, 2_000])
def test_a_restart_between_partial_releases_repeats_the_offline_alerts(
    nan_loss: list[Event], nan_loss_offline: set[tuple[str, str]], tmp_path: Path, release_batch: int
) -> None:
    """Tasks feed `release_batch` records per call, so checkpoints fall between two calls of one
    release: restored, a job stage must not follow its snapshot's markers (read past its offsets)
    past the records it reads again, nor advance past records it still holds."""
    kafka = FakeKafka(6)
    kafka.publish(nan_loss, CODEC)
    options = WorkerOptions(
        bootstrap="x", workdir=tmp_path, checkpoint_events=2_000, release_batch=release_batch
    )
    io = FakeIO(kafka)
    drive(kafka, options, io=io, stop_after=_raised)
    io2 = FakeIO(kafka)
    io2.committed = dict(io.committed)
    drive(kafka, options, io=io2, restored=restored_from(kafka, options))
    assert _ids(alerts_of(kafka, CODEC)) == nan_loss_offline


def test_a_backlog_many_times_the_cap_on_one_partition_drains_in_event_time_order(
    nan_loss: list[Event], nan_loss_offline: set[tuple[str, str]], tmp_path: Path
) -> None:
    """Issue 18.6: a job's backlog (its records spread over the partitions by node) read one
    partition at a time, as a client whose queue one partition filled delivers it; the backlog is
    ~10x a task's held cap. The partition that runs ahead is paused, never the one the others wait
    for: it drains with nothing late and the offline alerts. (A task reads 3 partitions that may
    each overshoot the pause by one fetch: 3 x (500 + 500) stays under the cap.)"""
    kafka = FakeKafka(6)
    records = kafka.publish(nan_loss, CODEC)
    options = WorkerOptions(bootstrap="x", workdir=tmp_path, align_max_buffer=4_000, align_pause_at=500)
    held: list[int] = []

    def watch(core: WorkerCore) -> bool:
        held.append(max((len(t.aligner) for t in core.tasks.values()), default=0))
        return False

    core, _ = drive(kafka, options, sticky=True, chunk=500, stop_after=watch)
    assert records > 10 * options.align_max_buffer
    assert core.totals["training_in"] + core.totals["telemetry_in"] == len(nan_loss)
    assert sum(t.engine.stats["late_dropped"] for t in core.tasks.values()) == 0
    assert max(held) < options.align_max_buffer  # backpressure, not the cap, bounded it
    assert core.totals["paused"] > 0 and not core.paused  # paused, and resumed again
    assert all(t.counts["flow_resets"] == 0 for t in core.tasks.values())
    assert _ids(alerts_of(kafka, CODEC)) == nan_loss_offline


def test_without_backpressure_a_backlog_past_the_cap_still_drains(
    nan_loss: list[Event], tmp_path: Path
) -> None:
    """Reading never stops for held records: past the cap the oldest leave (possibly late), counted."""
    kafka = FakeKafka(6)
    kafka.publish(nan_loss, CODEC)
    options = WorkerOptions(bootstrap="x", workdir=tmp_path, align_max_buffer=2_000, align_pause_at=10**9)
    core, _ = drive(kafka, options, sticky=True, chunk=500)
    assert core.totals["training_in"] + core.totals["telemetry_in"] == len(nan_loss)
    assert not core.paused


def test_bad_records_are_dead_lettered_once_by_their_topics_owner(
    nan_loss: list[Event], tmp_path: Path
) -> None:
    kafka = FakeKafka(6)
    kafka.publish(nan_loss[:2_000], CODEC)
    kafka.produce(TRAINING_STEPS, b"job", b"not avro")  # the sink's to dead-letter
    kafka.produce(TELEMETRY_JOB, b"job", b"not avro either")  # no sink reads it: the worker's
    step = next(e for e in nan_loss if e.type == "StepCompleted")
    kafka.produce(BINDINGS, b"node", CODEC.encode(step))  # valid, but no such record there
    core, _ = drive(kafka, WorkerOptions(bootstrap="x", workdir=tmp_path))
    dead = kafka.records(DEADLETTER)
    sources = sorted(kafka.headers[(r.topic, r.partition, r.offset)]["x-source-topic"].decode() for r in dead)
    assert sources == sorted([TELEMETRY_JOB, BINDINGS])  # once each; the bad step is the sink's
    assert core.totals["bad_input"] == 3


def test_a_finite_input_finishes_with_the_offline_replays_last_alerts(tmp_path: Path) -> None:
    """Issue 37.3: `xid_error` cut right after the GPU recovered. Its resolution is judged on event
    time the input never passes; the offline replay's end raises it. Once every input is read and
    quiet for `finish_idle_s`, the core releases everything and its engines reach the newest event
    time read: the same alerts, nothing held, committed offsets at the end. Without it (0) the
    resolution never comes and records stay held."""
    events = sorted(_scenario("xid_error"), key=lambda e: e.record["ts"])
    first, last = events[0].record["ts"], events[-1].record["ts"]
    cut = first + int(0.65 * (last - first))
    events = [e for e in events if e.record["ts"] <= cut]
    offline = _offline(events, tmp_path)
    kafka = FakeKafka(6)
    kafka.publish(events, CODEC)
    core, io = drive(kafka, WorkerOptions(bootstrap="x", workdir=tmp_path, finish_idle_s=3.0))
    assert _ids(alerts_of(kafka, CODEC)) == offline
    assert not any(len(t.aligner) for t in core._all_tasks()) and not len(core.side.aligner)
    newest = max(t.engine.max_ts or 0 for t in core.tasks.values())
    assert {t.engine.watermark for t in core.tasks.values() if t.engine.max_ts == newest} == {newest}
    assert all((t.engine.watermark or 0) <= newest for t in core._all_tasks())  # never past the input
    for (topic, p), log in kafka.logs.items():
        if topic in (TRAINING_STEPS, TELEMETRY_JOB) and log:
            assert io.committed.get(f"{topic}:{p}") == len(log)

    kafka = FakeKafka(6)
    kafka.publish(events, CODEC)
    drive(kafka, WorkerOptions(bootstrap="x", workdir=tmp_path, finish_idle_s=0.0))
    missing = offline - _ids(alerts_of(kafka, CODEC))
    assert [status for _, status in missing] == ["resolved"]


def test_summaries_handed_to_the_same_workers_job_stage_raise_the_alerts_decoding_them_raises(
    nan_loss: list[Event],
    nan_loss_offline: set[tuple[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 37.2: the job stage takes its own worker's summaries as the rank stage made them (not
    decoded again); every alert record is the same, field by field, as when it decodes them all."""
    kafka = FakeKafka(6)
    kafka.publish(nan_loss, CODEC)
    core, _ = drive(kafka, WorkerOptions(bootstrap="x", workdir=tmp_path))
    handed = alerts_of(kafka, CODEC)
    assert core.handoff.taken > 1_000 and len(core.handoff) == 0  # nearly every summary, none left over
    monkeypatch.setattr(Handoff, "put", lambda *args: None)  # every summary decoded from its bytes
    kafka = FakeKafka(6)
    kafka.publish(nan_loss, CODEC)
    core, _ = drive(kafka, WorkerOptions(bootstrap="x", workdir=tmp_path / "decoded"))
    assert core.handoff.taken == 0
    assert _ids(handed) == nan_loss_offline
    assert handed == alerts_of(kafka, CODEC)
