"""One partition's task: snapshot framing, what a checkpoint covers, when it is due (no broker)."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from schemas.codec import Codec
from streams.alerting.routing import load_router
from streams.config import EngineConfig
from streams.errors import StreamsError
from streams.runtime.changelog import snapshot_key
from streams.runtime.checkpoint import Checkpoint
from streams.runtime.guard import WallClockGuard
from streams.runtime.intake import Intake
from streams.runtime.options import WorkerOptions
from streams.runtime.task import (
    PartitionTask,
    decode_snapshot,
    encode_snapshot,
    pick_latest_snapshot,
)


def _task(tmp_path: Path, **options: int) -> PartitionTask:
    opts = WorkerOptions(bootstrap="x:1", workdir=tmp_path, app_id="g", **options)  # type: ignore[arg-type]
    codec = Codec()
    intake = Intake(codec, 300_000, collections.defaultdict(int), collections.Counter())
    return PartitionTask(1, EngineConfig.default(), load_router(), opts, codec, intake, now=0.0)


def test_snapshot_framing_round_trips_and_newest_sequence_wins() -> None:
    a = encode_snapshot(3, {"rs.training.steps:1": 10}, b"\x00engine\nbytes")
    b = encode_snapshot(7, {"rs.training.steps:1": 42}, b"newer")
    assert decode_snapshot(a) == (3, {"rs.training.steps:1": 10}, b"\x00engine\nbytes")
    assert pick_latest_snapshot([b, a, b""]) == (7, {"rs.training.steps:1": 42}, b"newer")
    assert pick_latest_snapshot([]) is None


def test_corrupt_snapshot_header_is_a_streams_error() -> None:
    with pytest.raises(StreamsError, match="corrupt"):
        decode_snapshot(b"not json\nbody")


def test_a_snapshot_never_claims_offsets_still_held_and_restores_them(tmp_path: Path) -> None:
    task = _task(tmp_path)
    task.aligner.push("rs.training.steps:1", 7, 5000, "held", now=0.0)
    task._mark("rs.training.steps:1", 9)  # offsets 8 and 9 reached the engine, 7 is still held
    task._mark("rs.telemetry.job:1", 3)
    checkpoint = task.checkpoint(now=1.0)
    assert checkpoint.offsets == {"rs.telemetry.job:1": 4, "rs.training.steps:1": 7}
    [record] = checkpoint.changelog
    assert (record.topic, record.key, record.partition) == ("g-engine-snapshot-changelog", snapshot_key(1), 1)
    assert record.value is not None
    seq, offsets, _ = decode_snapshot(record.value)
    assert (seq, offsets) == (1, checkpoint.offsets)
    again = _task(tmp_path)
    again.restore(record.value)
    assert again.already_seen("rs.telemetry.job:1", 3)
    assert not again.already_seen("rs.telemetry.job:1", 4)
    assert not again.already_seen("rs.training.steps:1", 7)  # held at the snapshot: processed again
    assert again.seq == 1


def test_a_checkpoint_is_due_on_alerts_processing_time_and_record_count(tmp_path: Path) -> None:
    task = _task(tmp_path, checkpoint_interval_ms=10_000, checkpoint_events=3)
    assert task.checkpoint_due(True, now=0.0)
    task.uncommitted = 1
    assert not task.checkpoint_due(False, now=100.0)  # first look: remembers the time
    assert not task.checkpoint_due(False, now=109.9)
    assert task.checkpoint_due(False, now=110.0)  # 10 s of processing since
    task.uncommitted = 0
    assert not task.checkpoint_due(False, now=500.0)  # nothing to commit: no snapshot
    task.checkpoint(now=500.0)
    task.uncommitted = 3
    assert task.checkpoint_due(False, now=500.0)  # checkpoint_events records


def test_a_record_held_at_a_checkpoint_is_committed_by_the_next_one_once_released(tmp_path: Path) -> None:
    """Counting records as they leave the aligner, not as they arrive: a checkpoint taken while a
    record was held must be followed by one that covers it, even if nothing else arrives."""
    task = _task(tmp_path, align_idle_s=1)
    task.aligner.expect([], now=0.0)
    task.aligner.push("rs.training.steps:1", 0, 5_000, "held", now=0.0)
    task.last_receive = 0.0
    first = task.checkpoint(now=0.0)
    assert "rs.training.steps:1" not in first.offsets  # held: not part of the state yet
    task.aligner.pop_ready(10.0)  # released (no partition holds it back any more) ...
    task._mark("rs.training.steps:1", 0)  # ... and fed to the engine
    off = WallClockGuard(guard_s=0)
    [second] = [a for a in task.idle(20.0, 0, None, lambda tp, last: 0, off) if isinstance(a, Checkpoint)]
    assert second.offsets == {"rs.training.steps:1": 1}
