"""SDK clocks and the plain API: CUDA-event segments resolved off the training thread (with a fake
event class), step_begin/step_end, evaluations, the stuck-step heartbeat, the owner warning and the
node-local binding file."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from producers.publisher import MemoryPublisher
from producers.training import Reporter
from producers.training.timing import CudaTimer, HostTimer, choose_timer
from schemas.records import Event


class FakeGpu:
    """A GPU stream: events are recorded in order and reach the GPU only when the test says so."""

    def __init__(self) -> None:
        self.queued: list[FakeEvent] = []
        self.clock_ms = 0.0
        self.synchronized = 0
        self.created = 0
        self.lock = threading.Lock()

    def run(self, *durations_ms: float) -> None:
        """The GPU reaches the next queued events, each `duration` ms after the previous one."""
        with self.lock:
            for d in durations_ms:
                event = self.queued.pop(0)
                self.clock_ms += d
                event.at_ms = self.clock_ms


class FakeEvent:
    """Same surface as torch.cuda.Event: record / query / synchronize / elapsed_time (ms)."""

    gpu: FakeGpu

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at_ms: float | None = None
        type(self).gpu.created += 1

    def record(self, stream: Any = None) -> None:
        self.at_ms = None
        with self.gpu.lock:
            self.gpu.queued.append(self)

    def query(self) -> bool:
        return self.at_ms is not None

    def synchronize(self) -> None:
        self.gpu.synchronized += 1
        while self.at_ms is None:
            self.gpu.run(0.0)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at_ms is not None and end.at_ms is not None, "elapsed_time on an unfinished event"
        return end.at_ms - self.at_ms


def _wait(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def _cuda_reporter(gpu: FakeGpu, publisher: MemoryPublisher, **kw: Any) -> Reporter:
    event_class = type("BoundFakeEvent", (FakeEvent,), {"gpu": gpu})
    return Reporter(
        "job-c", 0, node="n1", publisher=publisher, bind=False, env={}, timing=CudaTimer(event_class), **kw
    )


def test_cuda_segments_are_gpu_times_published_only_once_the_events_completed() -> None:
    gpu, publisher = FakeGpu(), MemoryPublisher()
    reporter = _cuda_reporter(gpu, publisher)
    with reporter.step(1) as s:
        with s.segment("forward"):
            pass
        with s.segment("backward"):
            pass
        s.record(loss=0.5)
    # step begin, forward begin/end, backward begin/end, step end: queued, nothing reached yet
    assert len(gpu.queued) == 6
    time.sleep(0.1)  # several polls of the reporter's thread: nothing may be published yet
    assert [e for e in publisher.events if e.type == "StepCompleted"] == []
    assert reporter.stats["pending"] == 1
    gpu.run(1.0, 0.5, 7.27, 0.0, 10.58, 0.25)
    _wait(lambda: any(e.type == "StepCompleted" for e in publisher.events))
    [step] = [e.record for e in publisher.events if e.type == "StepCompleted"]
    assert step["forward_s"] == pytest.approx(0.00727)
    assert step["backward_s"] == pytest.approx(0.01058)
    assert step["step_time_s"] == pytest.approx(0.0186)  # 0.5 + 7.27 + 0 + 10.58 + 0.25
    assert gpu.synchronized == 0, "the training thread never waits for the GPU"
    assert reporter.timer_clock == "cuda"
    reporter.close()


def test_cuda_steps_keep_their_order_and_events_are_reused() -> None:
    gpu, publisher = FakeGpu(), MemoryPublisher()
    reporter = _cuda_reporter(gpu, publisher)
    for n in range(3):
        with reporter.step(n) as s, s.segment("forward"):
            pass
        gpu.run(*([1.0] * 4))
    _wait(lambda: sum(e.type == "StepCompleted" for e in publisher.events) == 3)
    assert [e.record["step"] for e in publisher.events] == [0, 1, 2]
    for n in range(3, 6):
        with reporter.step(n) as s, s.segment("forward"):
            pass
        gpu.run(*([1.0] * 4))
    reporter.flush(5)
    assert gpu.created < 6 * 4, "completed events go back to a pool"
    reporter.close()


def test_close_waits_for_the_last_steps_gpu_work() -> None:
    gpu, publisher = FakeGpu(), MemoryPublisher()
    reporter = _cuda_reporter(gpu, publisher)
    with reporter.step(9) as s, s.segment("optimizer"):
        pass
    reporter.close()
    assert [e.record["step"] for e in publisher.events if e.type == "StepCompleted"] == [9]
    assert gpu.synchronized >= 1


def test_auto_timing_is_host_without_torch_and_rejects_unknown_modes() -> None:
    assert isinstance(choose_timer("auto", env={}), (HostTimer, CudaTimer))
    assert isinstance(choose_timer("host", env={}), HostTimer)
    with pytest.raises(ValueError, match="unknown timing"):
        choose_timer("wall", env={})  # type: ignore[arg-type]


class FakeClock:
    """Monotonic and wall clocks that move only when told."""

    def __init__(self) -> None:
        self.ns = 1_700_000_000_000_000_000

    def wall(self) -> int:
        return self.ns

    def mono(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


def test_plain_api_reports_the_same_step_as_the_with_blocks() -> None:
    clock, publisher = FakeClock(), MemoryPublisher()
    reporter = Reporter(
        "job-p", 0, node="n", publisher=publisher, bind=False, env={}, mono_ns=clock.mono, wall_ns=clock.wall
    )
    reporter.step_begin(4)
    reporter.segment_begin("data_wait")
    clock.advance(0.01)
    reporter.segment_begin("forward")  # ends data_wait
    clock.advance(0.02)
    reporter.segment_end()
    reporter.segment_begin("backward")
    clock.advance(0.03)
    reporter.step_end(loss=1.5, samples=8)  # ends backward too
    assert reporter.current_step is None
    reporter.flush(5)
    [step] = [e.record for e in publisher.events if e.type == "StepCompleted"]
    assert (step["step"], step["loss"], step["samples"]) == (4, 1.5, 8)
    assert step["data_wait_s"] == pytest.approx(0.01)
    assert step["forward_s"] == pytest.approx(0.02)
    assert step["backward_s"] == pytest.approx(0.03)
    assert step["step_time_s"] == pytest.approx(0.06)
    reporter.close()


def test_evaluation_sends_started_then_completed_or_failed() -> None:
    clock, publisher = FakeClock(), MemoryPublisher()
    reporter = Reporter(
        "job-e", 0, node="n", publisher=publisher, bind=False, env={}, mono_ns=clock.mono, wall_ns=clock.wall
    )
    with reporter.evaluation(100, "val", expected_duration_s=30.0) as ev:
        clock.advance(12.5)
        ev.batches = 40
    with pytest.raises(RuntimeError), reporter.evaluation(200, "val"):
        raise RuntimeError("eval crashed")
    reporter.flush(5)
    evals = [e.record for e in publisher.events if e.type == "EvaluationEvent"]
    assert [(r["step"], r["phase"]) for r in evals] == [
        (100, "started"),
        (100, "completed"),
        (200, "started"),
        (200, "failed"),
    ]
    assert evals[0]["evaluation_id"] == evals[1]["evaluation_id"] != evals[2]["evaluation_id"]
    assert evals[0]["expected_duration_s"] == 30.0
    assert evals[1]["duration_s"] == pytest.approx(12.5) and evals[1]["batches"] == 40
    assert "eval crashed" in evals[3]["error"]
    reporter.close()


def test_a_job_without_team_or_owner_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    publisher = MemoryPublisher()
    reporter = Reporter("job-w", 0, node="n", publisher=publisher, bind=False, env={})
    with caplog.at_level(logging.WARNING):
        reporter.job_started(model_name="m")
        reporter.job_started(model_name="m")
    warnings = [r for r in caplog.records if "platform" in r.getMessage()]
    assert len(warnings) == 1 and "owner and team" in warnings[0].getMessage()
    reporter.close()
    slurm = Reporter(
        "job-s",
        0,
        node="n",
        publisher=(p2 := MemoryPublisher()),
        bind=False,
        env={"SLURM_JOB_USER": "ada", "SLURM_JOB_ACCOUNT": "vision"},
    )
    slurm.job_started()
    slurm.close()
    [started] = [e.record for e in p2.events if e.type == "JobStarted"]
    assert (started["owner"], started["team"]) == ("ada", "vision")


def test_a_step_stuck_in_comm_sends_heartbeats_naming_its_blocked_share() -> None:
    clock, publisher = FakeClock(), MemoryPublisher()
    reporter = Reporter(
        "job-h",
        1,
        world_size=2,
        node="n",
        publisher=publisher,
        bind=False,
        env={},
        heartbeat_s=10,
        mono_ns=clock.mono,
        wall_ns=clock.wall,
    )
    step = reporter.step_begin(7)
    step.segment_begin("comm")
    clock.advance(5)
    time.sleep(0.1)
    assert reporter.stats["heartbeats"] == 0, "not stuck yet"
    clock.advance(6)
    _wait(lambda: reporter.stats["heartbeats"] >= 1)
    clock.advance(10)
    _wait(lambda: reporter.stats["heartbeats"] >= 2)
    reporter.step_end()
    reporter.flush(5)
    beats = [e.record for e in publisher.events if e.type == "CollectiveSample"]
    assert len(beats) == 2
    assert all(b["time_s"] / b["interval_s"] == pytest.approx(1.0) for b in beats)
    assert beats[1]["interval_s"] == pytest.approx(10)
    reporter.close()


def test_the_sdk_leaves_a_binding_for_the_agent_and_removes_it_at_close(tmp_path: Path) -> None:
    from producers.agent import FakeNvml

    nvml = FakeNvml(gpus=2)
    reporter = Reporter(
        "job-b",
        1,
        local_rank=1,
        node="n",
        publisher=MemoryPublisher(),
        env={},
        nvml=nvml,
        runtime_dir=tmp_path / "bindings",
    )
    reporter.flush(5)
    [path] = list((tmp_path / "bindings").glob("*.json"))
    data = json.loads(path.read_text())
    assert (data["job_id"], data["rank"], data["gpu_uuid"]) == ("job-b", 1, nvml.devices[1].uuid)
    reporter.close()
    assert not path.exists()


def _example_run(*, hang_rank: int, heartbeat_s: float) -> list[Event]:
    """What examples/train_ddp.py emits (4 ranks, 100 ms steps) when one rank hangs 90 s in forward."""
    clock = FakeClock()
    publishers = [MemoryPublisher() for _ in range(4)]
    ranks = [
        Reporter(
            "example-hang",
            r,
            world_size=4,
            node="n",
            publisher=publishers[r],
            bind=False,
            env={},
            heartbeat_s=heartbeat_s,
            mono_ns=clock.mono,
            wall_ns=clock.wall,
        )
        for r in range(4)
    ]
    ranks[0].job_started(owner="o", team="t")
    ranks[0].state("running")

    def step(n: int) -> None:
        for r in ranks:
            with r.step(n) as s:
                for seg in ("data_wait", "forward", "backward", "comm", "optimizer"):
                    with s.segment(seg):
                        pass
                s.record(loss=1.0)
        clock.advance(0.1)

    for n in range(40):
        step(n)
    # Step 40: the hung rank sleeps in forward, the others block in the all-reduce.
    open_steps = [r.step_begin(40) for r in ranks]
    for r, s in enumerate(open_steps):
        s.segment_begin("forward" if r == hang_rank else "comm")
    for i in range(1, 19):
        clock.advance(5)
        if heartbeat_s and i % 2 == 0:  # a beat is due every 10 s: wait until each rank's thread sent it
            _wait(lambda k=i // 2: all(r.stats["heartbeats"] >= k for r in ranks))
    for r in ranks:
        r.step_end(loss=1.0)
    clock.advance(0.1)
    for n in range(41, 80):
        step(n)
    ranks[0].state("completed")
    for r in ranks:
        r.close()
    events = [e for p in publishers for e in p.events]
    return sorted(events, key=lambda e: e.record["ts"])


def _alerts(events: list[Event]) -> list[dict[str, Any]]:
    from streams.offline.detection import DetectionEngine

    engine = DetectionEngine()
    out = [a for e in events for a in engine.process(e)]
    out += engine.finish()
    return [a.record for a in out if a.type == "Alert" and a.record["status"] == "firing"]


def test_the_examples_hang_raises_job_stall_and_names_the_hung_rank_in_replay() -> None:
    alerts = _alerts(_example_run(hang_rank=2, heartbeat_s=10))
    rules = {(a["rule"], a.get("rank")) for a in alerts}
    assert ("rank_hang", 2) in rules, rules
    assert any(rule == "job_stall" for rule, _ in rules), rules


def test_without_heartbeats_a_hang_of_every_rank_shows_only_when_records_resume_in_replay() -> None:
    """While every rank is stuck nothing moves event time: no rank can be named as the hung one.
    When the steps resume, the job stage's time passes the silence before the summary of the new
    steps reaches it (one bucket later), so the replay still shows the ~90 s stall, after the fact."""
    alerts = _alerts(_example_run(hang_rank=2, heartbeat_s=0))
    assert not [a for a in alerts if a["rule"] == "rank_hang"]
    stalls = [a for a in alerts if a["rule"] == "job_stall"]
    assert stalls and all(a["observed"] >= 60 for a in stalls)
