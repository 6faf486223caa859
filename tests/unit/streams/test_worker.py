"""Worker plumbing without Kafka: event-time alignment, bad input, SIGTERM, snapshot framing, time parsing, publish pacing."""

from __future__ import annotations

import asyncio
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.errors import MetricsError
from ranksight.commands.record import parse_time
from schemas.codec import SINGLE_OBJECT_MAGIC, Codec
from schemas.errors import DecodeError
from schemas.files import write_container
from schemas.records import Event
from schemas.topics import (
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TELEMETRY_JOB,
    TELEMETRY_UNATTRIBUTED,
    TRAINING_EVENTS,
    TRAINING_STEPS,
)
from streams.aligner import Aligner
from streams.app import (
    BINDINGS,
    TELEMETRY_BY_JOB,
    WorkerOptions,
    align_ts,
    broker_credentials,
    check_record,
    reference_ms,
)
from streams.errors import StreamsError
from streams.offline.kafka_replay import KafkaReplayError, publish_file
from streams.partition import decode_snapshot, encode_snapshot, pick_latest_snapshot
from tests.unit.streams.builders import gpu_sample, host_sample, job_started, rank_bound


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


def test_a_partition_at_its_end_holds_the_others_for_its_grace_after_its_last_record() -> None:
    """Producers send each partition's batch separately: "at its end" may be a few ms early."""
    al = Aligner(idle_s=60.0, end_grace_s=0.5)
    al.expect(["steps:0", "gpu:0"], now=0.0)
    al.push("steps:0", 0, 14_000, "step at 14 s", now=0.0)
    al.push("gpu:0", 0, 9_000, "gpu at 9 s", now=0.0)

    def lag(tp: str, last: int | None) -> int:
        return 0  # both read to their end, for now

    assert [i for _, _, i in al.pop_ready(0.1, lag)] == ["gpu at 9 s"]  # the step waits for gpu:0
    al.push("gpu:0", 1, 10_000, "gpu at 10 s", now=0.2)  # ... whose next record was in flight
    assert [i for _, _, i in al.pop_ready(0.2, lag)] == ["gpu at 10 s"]
    assert [i for _, _, i in al.pop_ready(0.8, lag)] == ["step at 14 s"]  # gpu:0 quiet past its grace


def test_a_passive_partition_holds_only_for_unread_records_or_its_upstream_front() -> None:
    """Unattributed telemetry re-keyed by `route` holds a job's records back only while some of it is
    known to be coming: unread on the topic, or not yet forwarded by this worker's side path."""
    al = Aligner(idle_s=60.0, passive_topics=frozenset({"by-job"}))
    al.expect(["steps:0", "by-job:0"], now=0.0)
    backlog = {"steps:0": 0, "by-job:0": 0}

    def lag(tp: str, last: int | None) -> int:
        return backlog[tp]

    al.push("steps:0", 0, 5_000, "step", now=0.0)
    assert [i for _, _, i in al.pop_ready(0.1, lag)] == ["step"]  # idle and silent: no hold
    al.push("steps:0", 1, 9_000, "later step", now=0.2)
    al.set_upstream_front(7_000)  # the side path has forwarded everything up to 7 s only
    assert al.pop_ready(0.3, lag) == []
    al.set_upstream_front(None)
    backlog["by-job:0"] = 1  # ... and its sample is now on the topic, unread
    assert al.pop_ready(0.4, lag) == []
    al.push("by-job:0", 0, 8_000, "gpu", now=0.5)
    backlog["by-job:0"] = 0
    assert [i for _, _, i in al.pop_ready(0.6, lag)] == ["gpu", "later step"]  # in event-time order


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
    from streams.alerting.routing import load_router
    from streams.app import WorkerOptions
    from streams.config import EngineConfig
    from streams.partition import WorkerRuntime

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


def test_runtime_checkpoints_on_alerts_processing_time_and_event_count(tmp_path: Path) -> None:
    from streams.alerting.routing import load_router
    from streams.app import WorkerOptions
    from streams.config import EngineConfig
    from streams.partition import WorkerRuntime

    opts = WorkerOptions(
        bootstrap="x:1", workdir=tmp_path, checkpoint_interval_ms=10_000, checkpoint_events=3
    )
    rt = WorkerRuntime(EngineConfig.default(), load_router(), opts)
    rt.restore([])
    assert rt.engine is not None
    assert rt.checkpoint_due([Event("Alert", {})], now=0.0)
    rt.pending = [object()]
    assert not rt.checkpoint_due([], now=100.0)  # first look: remembers the time
    assert not rt.checkpoint_due([], now=109.9)
    assert rt.checkpoint_due([], now=110.0)  # 10 s of processing since
    rt.pending = []
    assert not rt.checkpoint_due([], now=500.0)  # nothing to commit: no snapshot
    rt.snapshot_value()
    rt.pending = [object(), object(), object()]
    assert rt.checkpoint_due([], now=0.0)  # checkpoint_events records


# --- bad input: every kind of bad record is one DecodeError, whichever agent reads it ------------


def _bad_values(good: bytes, other_type: bytes) -> dict[str, bytes | None]:
    codec = Codec()
    step = codec.encode(step_event(0))
    unknown_fp = SINGLE_OBJECT_MAGIC + b"\x01" * 8 + step[10:]
    return {
        "no value": None,
        "empty": b"",
        "random bytes": bytes(random.Random(7).randrange(256) for _ in range(64)),
        "truncated": good[: len(good) // 2],
        "unknown fingerprint": unknown_fp,
        "trailing junk": good + b"junk",
        "wrong type": other_type,
        "900 kB": b"\xc3\x01" + good[2:10] + b"\x00" * 900_000,
    }


def step_event(ts: int) -> Event:
    return Event("StepCompleted", {"ts": ts, "job_id": "j", "rank": 0, "step": 1, "step_time_s": 1.0})


_GOOD_AND_WRONG: dict[str, tuple[Event, Event]] = {
    # topic the agent reads -> (a record that belongs there, a valid record that does not)
    TELEMETRY_GPU: (gpu_sample("j", 0, 1_000), step_event(1_000)),
    TELEMETRY_HOST: (host_sample("n1", 1_000), gpu_sample("j", 0, 1_000)),
    TRAINING_STEPS: (step_event(1_000), gpu_sample("j", 0, 1_000)),
    TRAINING_EVENTS: (rank_bound("j", 0, 1_000), step_event(1_000)),
    BINDINGS: (rank_bound("j", 0, 1_000), job_started("j", 1_000)),
    TELEMETRY_BY_JOB: (host_sample("n1", 1_000), step_event(1_000)),
    TELEMETRY_UNATTRIBUTED: (gpu_sample("n1", 0, 1_000), step_event(1_000)),
    TELEMETRY_JOB: (host_sample("n1", 1_000), rank_bound("j", 0, 1_000)),
}


@pytest.mark.parametrize("topic", sorted(_GOOD_AND_WRONG))
def test_every_kind_of_bad_input_on_every_worker_topic_is_one_decode_error(topic: str) -> None:
    """bind, route and detect all read through `check_record`, and catch exactly DecodeError."""
    codec = Codec()
    good, wrong = _GOOD_AND_WRONG[topic]
    assert check_record(codec, codec.encode(good), topic).type == good.type
    for kind, value in _bad_values(codec.encode(good), codec.encode(wrong)).items():
        with pytest.raises(DecodeError):
            check_record(codec, value, topic)
        if kind == "wrong type":
            with pytest.raises(DecodeError, match=re.escape(f"does not belong on {topic}")):
                check_record(codec, value, topic)


def test_a_prefixed_topic_follows_the_same_contract() -> None:
    codec = Codec()
    with pytest.raises(DecodeError, match=r"does not belong on rs\.telemetry\.gpu"):
        check_record(codec, codec.encode(step_event(1)), "t1a2b.rs.telemetry.gpu")
    assert check_record(codec, codec.encode(step_event(1)), "t1a2b.rs.training.steps").type == "StepCompleted"


# --- progress: a consumed offset that holds no event still counts as read ----------------------


def test_a_rejected_last_record_does_not_hold_the_other_partitions_back() -> None:
    """The 13.3 stall: a partition's last record was rejected, so its backlog read 1 forever."""
    al = Aligner(idle_s=1.0, stall_s=1e9)
    al.expect(["a:0", "b:0"], now=0.0)
    high = {"a:0": 2, "b:0": 1}  # a:0 holds offsets 0 and 1 (1 is bad); b:0 holds offset 0

    def lag(tp: str, last: int | None) -> int:
        return high[tp] - (-1 if last is None else last) - 1

    al.push("a:0", 0, 1_000, "a1000", now=0.0)
    al.push("b:0", 0, 5_000, "b5000", now=0.0)
    assert [i for _, _, i in al.pop_ready(100.0, lag)] == ["a1000"]  # a:0 still has offset 1 to read
    assert al.stuck_for(100.0) == 0.0
    assert al.pop_ready(200.0, lag) == []
    assert al.stuck_for(200.0) == 100.0
    assert "a:0 (event time 1000, last offset 0, 1 records left" in al.blocker(200.0, lag)
    al.note("a:0", 1, None, now=200.0)  # offset 1 was rejected: read all the same
    assert [i for _, _, i in al.pop_ready(200.0, lag)] == ["b5000"]
    assert al.stuck_for(200.0) == 0.0


def test_a_record_the_engine_will_reject_for_its_time_moves_no_event_time() -> None:
    """A record from a clock in 2199 does not count for alignment and progress at all."""
    kafka_s = 1_780_000_000.0
    now = 1_780_000_001_000
    assert align_ts(1_780_000_000_000, kafka_s, 300_000, now) == 1_780_000_000_000
    assert align_ts(1_780_000_300_000, kafka_s, 300_000, now) == 1_780_000_300_000  # within the skew
    assert align_ts(7_226_582_400_000, kafka_s, 300_000, now) is None  # year 2199
    assert align_ts(1_000, kafka_s, 300_000, now) is None  # 1970: outside 2000..2200
    assert align_ts(1_700_000_000_000, kafka_s, 300_000, now) == 1_700_000_000_000  # the past stays
    # A producer's CreateTime comes from its own clock: the reader's clock caps it.
    assert align_ts(7_226_582_400_000, 7_226_582_400.0, 300_000, now) is None
    assert align_ts(1_780_000_000_000, None, 300_000, now) == 1_780_000_000_000  # no timestamp: now


def test_the_reference_time_is_the_kafka_timestamp_capped_at_the_reader_clock() -> None:
    """min(Kafka timestamp, wall clock); the wall clock when the record has no timestamp."""
    assert reference_ms(1_000, 2_000) == 1_000
    assert reference_ms(7_226_582_400_000, 2_000) == 2_000
    assert reference_ms(None, 2_000) == 2_000


# --- SIGTERM: the process ends within the grace period even while the event loop is blocked ----

_BLOCKED_LOOP = """
import asyncio, signal, sys, time
from streams.worker import install_stop_deadline

async def main():
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: print("loop got SIGTERM", flush=True))
    install_stop_deadline(1.0)
    print("busy", flush=True)
    while True:  # a computation that never yields to the loop
        sum(range(1000))

asyncio.run(main())
"""


def test_sigterm_ends_a_process_whose_event_loop_is_blocked() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKED_LOOP],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"busy\n"
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(20)
    finally:
        proc.kill()
    print(f"exited {time.monotonic() - signalled:.1f} s after SIGTERM")
    assert code == 128 + signal.SIGTERM


# --- the agents themselves: bad input never raises out of bind, route or detect -----------------


@dataclass
class _Message:
    topic: str
    partition: int
    offset: int
    timestamp: float | None = 1_780_000_000.0


@dataclass
class _FaustEvent:
    message: _Message
    key: bytes | None
    value: bytes | None


class _Stream:
    """The slice of a Faust stream the agents use: `noack().events()` and `ack`."""

    def __init__(self, events: list[_FaustEvent]) -> None:
        self._events = events
        self.acked: list[_FaustEvent] = []

    def noack(self) -> _Stream:
        return self

    async def events(self) -> Any:
        for event in self._events:
            yield event

    async def ack(self, event: _FaustEvent) -> bool:
        self.acked.append(event)
        return True


# Agent -> the raw topics it reads whose dead letters the sink owns, so no broker is needed. `route`
# reads only topics the worker dead-letters itself (through Kafka: test_worker_bad_input.py).
_AGENT_TOPICS = {
    "detect": [TRAINING_STEPS, TRAINING_EVENTS],
}


def test_bad_input_on_each_topic_never_raises_out_of_an_agent_and_counts_as_read(tmp_path: Path) -> None:
    """Every kind of bad record through the real `detect` agent function."""
    from streams.app import WorkerOptions, build_app

    app = build_app(WorkerOptions(bootstrap="127.0.0.1:1", workdir=tmp_path, store="memory://"))
    agents = {name.rpartition(".")[2]: agent for name, agent in app.agents.items()}
    codec = Codec()
    offsets: dict[tuple[str, int], int] = {}

    async def run() -> None:
        for name, agent_topics in _AGENT_TOPICS.items():
            for topic in agent_topics:
                good, wrong = _GOOD_AND_WRONG[topic]
                values = _bad_values(codec.encode(good), codec.encode(wrong))
                partition = 1
                events = []
                for value in values.values():
                    offset = offsets[(topic, partition)] = offsets.get((topic, partition), -1) + 1
                    events.append(_FaustEvent(_Message(topic, partition, offset), b"key", value))
                await agents[name].fun(_Stream(events))  # returns once the stream ends; raises on a bug

    asyncio.run(run())
    # detect took note of every bad offset: its partitions' backlogs are not stuck behind them.
    runtime = app.ranksight_runtimes[1]  # type: ignore[attr-defined]
    described = runtime.aligner.describe(0.0)
    for topic in _AGENT_TOPICS["detect"]:
        assert described[f"{topic}:1"][1] == offsets[(topic, 1)]
    assert runtime.counts["rejected"] == 2 * len(_bad_values(b"x" * 20, b"y"))


def test_a_producer_that_acknowledges_nothing_stops_the_worker_loudly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stuck producer used to hold every agent silently; now the worker logs why and stops itself."""
    import streams.app as worker_app

    killed: list[int] = []

    async def run() -> None:
        released = asyncio.Event()

        class _StuckProducer:
            async def flush(self) -> None:
                await released.wait()  # acknowledges nothing until the worker gives up

        def fake_kill(pid: int, sig: int) -> None:
            killed.append(sig)
            released.set()  # the stop ends the wait (in the worker: the process ends)

        monkeypatch.setattr(worker_app.os, "kill", fake_kill)
        monkeypatch.setattr(worker_app, "_DELIVERY_TIMEOUT_S", 0.05)
        app = type("App", (), {"producer": _StuckProducer()})()
        await worker_app._delivered(app, [], "the snapshot of partition 3")

    asyncio.run(run())
    assert killed == [signal.SIGTERM]
    assert "has not acknowledged the snapshot of partition 3" in caplog.text


# --- Kafka security: the worker honours the settings every other command uses -------------------
def test_worker_credentials_follow_the_kafka_security_settings(tmp_path: Path) -> None:
    """PLAINTEXT: none; SSL: a verifying context; SASL_SSL + SCRAM: user, mechanism and TLS."""
    import faust

    plain = WorkerOptions(bootstrap="b:9092", workdir=tmp_path)
    assert broker_credentials(plain) is None
    ssl_only = broker_credentials(
        WorkerOptions(bootstrap="b:9093", workdir=tmp_path, security_protocol="SSL")
    )
    assert isinstance(ssl_only, faust.SSLCredentials)
    sasl = WorkerOptions(
        bootstrap="b:9094",
        workdir=tmp_path,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="detector",
        sasl_password="s3cret",
    )
    creds = broker_credentials(sasl)
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value) == ("detector", "s3cret", "SCRAM-SHA-512")
    assert creds.ssl_context is not None and creds.protocol.value == "SASL_SSL"
    assert "s3cret" not in repr(sasl)  # options end up in logs


# --- /metrics -------------------------------------------------------------------------------------
def test_worker_metrics_are_served_as_published_and_a_busy_port_is_one_sentence() -> None:
    """A scrape sees the last published snapshot; a port in use fails with a MetricsError."""
    import socket
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from infra.metrics import MetricsServer
    from streams.runtime.health import worker_metrics

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = MetricsServer(port, addr="127.0.0.1")
    server.publish(
        worker_metrics(
            consumed={"rs.training.steps": 7},
            produced={"rs.alerts": 2},
            totals={"bad_input": 1},
            dead_letters={"clock_ahead": 1},
            lag={"rs.training.steps": 3},
            watermark_delay_s=4.5,
            firing_by_rule={"xid_error": 2},
        )
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("ranksight_worker_events_in_total", (("topic", "rs.training.steps"),))] == 7
    assert samples[("ranksight_worker_dead_letters_total", (("reason", "clock_ahead"),))] == 1
    assert samples[("ranksight_worker_consumer_lag", (("topic", "rs.training.steps"),))] == 3
    assert samples[("ranksight_worker_alerts_firing", (("rule", "xid_error"),))] == 2
    assert samples[("ranksight_worker_watermark_delay_seconds", ())] == 4.5
    with pytest.raises(MetricsError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
        MetricsServer(port, addr="127.0.0.1")
