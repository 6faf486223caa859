"""Worker plumbing without Kafka: event-time alignment, snapshot framing, time parsing, publish pacing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

from ranksight.commands.record import parse_time
from schemas.files import write_container
from schemas.records import Event
from streams.app import Aligner, decode_snapshot, encode_snapshot, pick_latest_snapshot
from streams.errors import StreamsError
from streams.kafka_replay import KafkaReplayError, publish_file


def test_aligner_holds_fast_partition_until_slow_one_catches_up() -> None:
    al = Aligner(idle_s=2.0)
    al.expect(["a:0", "b:0"], now=0.0)
    al.push("a:0", 0, 1000, "a1000", now=0.1)
    al.push("a:0", 1, 5000, "a5000", now=0.1)
    assert al.pop_ready(0.2) == []  # b:0 has delivered nothing yet
    al.push("b:0", 0, 2000, "b2000", now=0.3)
    assert [item for _, _, item in al.pop_ready(0.3)] == ["a1000", "b2000"]
    al.push("b:0", 1, 6000, "b6000", now=0.4)
    assert [item for _, _, item in al.pop_ready(0.4)] == ["a5000"]


def test_aligner_releases_when_the_slow_partition_is_at_its_end() -> None:
    al = Aligner(idle_s=60.0)
    al.expect(["a:0", "b:0"], now=0.0)
    al.push("a:0", 0, 1000, "x", now=0.0)
    al.push("a:0", 1, 9000, "y", now=0.0)
    al.push("b:0", 0, 500, "z", now=0.0)

    def lag(tp: str, last: int | None) -> int:
        return 0  # everything read

    assert [i for _, _, i in al.pop_ready(0.1, lag)] == ["z", "x", "y"]


def test_aligner_keeps_waiting_for_a_partition_with_backlog_despite_wall_time() -> None:
    al = Aligner(idle_s=1.0, stall_s=30.0)
    al.expect(["a:0", "b:0"], now=0.0)
    al.push("a:0", 0, 9000, "late-in-time", now=0.0)
    al.push("b:0", 0, 1000, "b1", now=0.0)
    backlog = {"a:0": 0, "b:0": 500}

    def lag(tp: str, last: int | None) -> int:
        return backlog[tp]

    assert [i for _, _, i in al.pop_ready(5.0, lag)] == ["b1"]  # 5 s > idle_s, but b:0 has records left
    assert al.pop_ready(5.0, lag) == []
    assert [i for _, _, i in al.pop_ready(31.0, lag)] == ["late-in-time"]  # b:0 stalled past stall_s


def test_aligner_idle_partition_stops_blocking_after_idle_s() -> None:
    al = Aligner(idle_s=2.0)
    al.expect(["a:0", "empty:0"], now=0.0)
    al.push("a:0", 0, 1000, "x", now=0.5)
    assert al.pop_ready(1.0) == []
    assert [i for _, _, i in al.pop_ready(2.1)] == ["x"]


def test_aligner_lowest_held_is_the_offset_a_snapshot_may_claim() -> None:
    al = Aligner(idle_s=2.0)
    al.push("a:0", 10, 3000, "x", now=0.0)
    al.push("a:0", 11, 1000, "y", now=0.0)
    al.push("b:0", 0, 2000, "z", now=0.0)
    assert al.lowest_held("a:0") == 10
    released = al.pop_ready(0.0)  # a:0 at 3000, b:0 at 2000 -> frontier 2000
    assert [i for _, _, i in released] == ["y", "z"]
    assert al.lowest_held("a:0") == 10
    assert al.lowest_held("b:0") is None


def test_aligner_bounds_its_buffer() -> None:
    al = Aligner(idle_s=100.0, max_buffer=3)
    al.expect(["a:0", "b:0"], now=0.0)
    for i in range(5):
        al.push("a:0", i, 1000 + i, i, now=0.0)
    assert [i for _, _, i in al.pop_ready(0.0)] == [0, 1]
    assert len(al) == 3


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a:0", "b:0", "c:0"]), st.integers(0, 10_000)), max_size=60))
def test_aligner_output_is_event_time_ordered_and_complete(items: list[tuple[str, int]]) -> None:
    al = Aligner(idle_s=1.0)
    out: list[int] = []
    offsets: dict[str, int] = {}
    # Each partition delivers in its own time order, like a producer publishing in event time.
    for tp, ts in sorted(items, key=lambda x: x[1]):
        offsets[tp] = offsets.get(tp, -1) + 1
        al.push(tp, offsets[tp], ts, ts, now=0.0)
        out.extend(i for _, _, i in al.pop_ready(0.0))
    out.extend(i for _, _, i in al.pop_ready(10.0))
    assert out == sorted(ts for _, ts in items)
    assert len(al) == 0


def test_snapshot_framing_round_trips_and_newest_sequence_wins() -> None:
    a = encode_snapshot(3, {"rs.training.steps:1": 10}, b"\x00engine\nbytes")
    b = encode_snapshot(7, {"rs.training.steps:1": 42}, b"newer")
    assert decode_snapshot(a) == (3, {"rs.training.steps:1": 10}, b"\x00engine\nbytes")
    assert pick_latest_snapshot([b, a, b""]) == (7, {"rs.training.steps:1": 42}, b"newer")
    assert pick_latest_snapshot([]) is None


def test_corrupt_snapshot_header_is_a_streams_error() -> None:
    with pytest.raises(StreamsError, match="corrupt"):
        decode_snapshot(b"not json\nbody")


def test_parse_time_accepts_now_relative_iso_and_ms() -> None:
    now = 1_767_225_600_000
    assert parse_time("now", now) == now
    assert parse_time("-30m", now) == now - 1_800_000
    assert parse_time("-1.5h", now) == now - 5_400_000
    assert parse_time("2026-01-01T00:00:00Z", now) == 1_767_225_600_000
    assert parse_time("1767225600123", now) == 1_767_225_600_123
    with pytest.raises(typer.BadParameter):
        parse_time("yesterday", now)


class _Pub:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def publish(self, event: Event) -> None:
        self.events.append(event)


def _step(ts: int, step: int) -> Event:
    from schemas.records import default_schemas

    # A minimal valid StepCompleted: every field at its zero/default value, then ts/job/step.
    schema = default_schemas().records["StepCompleted"].parsed
    record: dict[str, Any] = {}
    for f in schema["fields"]:
        t = f["type"]
        if "default" in f:
            record[f["name"]] = f["default"]
        elif t in ("int", "long"):
            record[f["name"]] = 0
        elif t in ("float", "double"):
            record[f["name"]] = 0.0
        elif t == "string":
            record[f["name"]] = ""
        elif t == "boolean":
            record[f["name"]] = False
        elif isinstance(t, dict) and t.get("type") in ("long", "int"):
            record[f["name"]] = 0
    record.update(ts=ts, job_id="j", step=step)
    return Event("StepCompleted", record)


def test_publish_file_paces_by_event_time(tmp_path: Path) -> None:
    path = tmp_path / "e.avro"
    write_container(path, [_step(0, 1), _step(10_000, 2), _step(20_000, 3)])
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    pub = _Pub()
    assert publish_file(path, pub, speed=10.0, sleep=sleep, clock=lambda: now[0]) == 3
    assert sleeps == pytest.approx([1.0, 1.0])  # 10 s of event time at 10x
    assert [e.record["step"] for e in pub.events] == [1, 2, 3]


def test_publish_file_speed_zero_never_sleeps_and_negative_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "e.avro"
    write_container(path, [_step(0, 1), _step(60_000, 2)])
    pub = _Pub()

    def no_sleep(s: float) -> None:
        raise AssertionError("slept")

    assert publish_file(path, pub, speed=0, sleep=no_sleep) == 2
    with pytest.raises(KafkaReplayError):
        publish_file(path, pub, speed=-1)


def test_runtime_snapshot_never_claims_offsets_still_held_and_restores_them(tmp_path: Path) -> None:
    from streams.app import WorkerOptions, WorkerRuntime
    from streams.config import EngineConfig
    from streams.routing import load_router

    rt = WorkerRuntime(
        EngineConfig.default(), load_router(), WorkerOptions(bootstrap="x:1", workdir=tmp_path)
    )
    rt.restore([])
    assert rt.engine is not None
    rt.aligner.push("rs.training.steps:1", 7, 5000, "held", now=0.0)
    rt.mark("rs.training.steps:1", 9)  # offsets 8 and 9 reached the engine, 7 is still held
    rt.mark("rs.telemetry.gpu:0", 3)
    value = rt.snapshot_value()
    seq, offsets, _ = decode_snapshot(value)
    assert (seq, offsets) == (1, {"rs.telemetry.gpu:0": 4, "rs.training.steps:1": 7})
    again = WorkerRuntime(
        EngineConfig.default(), load_router(), WorkerOptions(bootstrap="x:1", workdir=tmp_path)
    )
    again.restore([value])
    assert again.already_seen("rs.telemetry.gpu:0", 3)
    assert not again.already_seen("rs.telemetry.gpu:0", 4)
    assert not again.already_seen("rs.training.steps:1", 7)  # held at the snapshot: processed again
    assert again.seq == 1


def test_runtime_checkpoints_on_alerts_event_time_and_event_count(tmp_path: Path) -> None:
    from streams.app import WorkerOptions, WorkerRuntime
    from streams.config import EngineConfig
    from streams.routing import load_router

    opts = WorkerOptions(
        bootstrap="x:1", workdir=tmp_path, checkpoint_interval_ms=10_000, checkpoint_events=3
    )
    rt = WorkerRuntime(EngineConfig.default(), load_router(), opts)
    rt.restore([])
    assert rt.engine is not None
    assert rt.checkpoint_due([Event("Alert", {})])
    rt.engine.max_ts = 1_000
    assert not rt.checkpoint_due([])  # first look: remembers the time
    rt.engine.max_ts = 10_999
    assert not rt.checkpoint_due([])
    rt.engine.max_ts = 11_000
    assert rt.checkpoint_due([])
    rt.snapshot_value()
    rt.pending = [object(), object(), object()]
    assert rt.checkpoint_due([])
