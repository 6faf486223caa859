"""Every detector's `advance` costs O(windows holding data), never O(event time elapsed).

Work is measured as Python lines executed (a trace counter), never wall time: advancing 100
years must cost about what advancing one hour costs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from schemas.records import Event
from streams.detectors import ALL_DETECTORS
from streams.detectors.imbalance import ImbalanceDetector
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import (
    T0,
    checkpoint,
    gpu_sample,
    host_sample,
    job_started,
    job_state,
    rank_bound,
    step,
    training_job,
)
from tests.unit.streams.stages import job_stage_input

HOUR = 3_600_000
CENTURY = 100 * 365 * 24 * HOUR


def _busy_state() -> DetectionEngine:
    """An engine holding open windows, an open checkpoint, restarts, a pending job and silent telemetry."""
    events: list[Event] = [*training_job(seconds=120)]
    events += [
        gpu_sample("node-01", i, T0 + s * 1000, pids=[1000 + i]) for s in range(0, 125, 5) for i in range(4)
    ]
    events += [host_sample("node-01", T0 + s * 1000) for s in range(0, 125, 10)]
    events += [checkpoint("job-1", T0 + 100_000, "started")]
    events += [job_started("job-2", T0 + 1_000, world_size=2, nodes=1)]
    events += [rank_bound("job-2", r, T0 + 1_000) for r in range(2)]
    events += [
        step("job-2", r, n, T0 + 1_000 + n * 1000, loss=float("nan")) for n in range(1, 30) for r in range(2)
    ]
    events += [job_state("job-2", T0 + 40_000 + k * 1000, "restarting", restart_count=k) for k in range(1, 5)]
    events += [job_state("job-2", T0 + 50_000, "running", restart_count=4)]
    events += [job_started("job-3", T0 + 2_000), job_state("job-3", T0 + 2_000, "pending")]
    engine = DetectionEngine()
    engine.run(sorted(events, key=lambda e: e.record["ts"]))
    engine.process(step("job-1", 0, 200, T0 + 130_000, step_time=float("inf")))  # a row still buffered
    return engine


def _lines_run(fn: Callable[[], Any]) -> tuple[int, Any]:
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Any:
        return local

    sys.settrace(global_)
    try:
        result = fn()
    finally:
        sys.settrace(None)
    return count, result


def _fresh_detector(name: str) -> tuple[DetectionEngine, Any]:
    """A detector of a busy engine that has also seen rows two days ahead (a gap in a replay)."""
    engine = DetectionEngine.restore(_busy_state().snapshot())
    # The instance of that class holding the most (each stage of each partition has one).
    det = max(
        (d for d in engine.detectors if type(d).__name__ == name),
        key=lambda d: len(getattr(d, "jobs", None) or {}),
    )
    assert engine.watermark is not None
    later = engine.watermark + 48 * HOUR
    raw = [step("job-1", 0, 300, later), gpu_sample("node-01", 0, later, pids=[1000])]
    for event in [*raw, *job_stage_input([rank_bound("job-1", 0, later - 1000), *raw])]:
        det.observe(event)
    return engine, det


@pytest.mark.parametrize("name", [cls.__name__ for cls in ALL_DETECTORS])
def test_advancing_a_century_costs_about_what_advancing_an_hour_costs(name: str) -> None:
    engine, det = _fresh_detector(name)
    assert engine.watermark is not None
    hour_work, hour_out = _lines_run(lambda: det.advance(engine.watermark + HOUR))
    engine, det = _fresh_detector(name)
    century_work, century_out = _lines_run(lambda: det.advance(engine.watermark + CENTURY))
    assert century_work <= 2 * hour_work + 2_000, (name, hour_work, century_work)
    assert len(century_out) <= len(hour_out) + 10


def test_imbalance_windows_across_a_century_are_the_windows_holding_data() -> None:
    engine, det = _fresh_detector("ImbalanceDetector")
    assert isinstance(det, ImbalanceDetector) and engine.watermark is not None
    before = det.window_iterations
    det.advance(engine.watermark + CENTURY)
    derived = det.drain_derived()
    # Rows in at most 3 windows now and 2 windows two days later per job, plus a jump over each gap.
    assert det.window_iterations - before <= 16
    assert {e.type for e in derived} <= {"RankWindowStats", "JobWindowStats"} and len(derived) <= 20


def test_a_multi_day_gap_in_a_replay_does_not_iterate_per_window() -> None:
    engine = DetectionEngine()
    engine.run(training_job(seconds=60))
    det = next(d for d in engine.detectors if isinstance(d, ImbalanceDetector) and "job-1" in d.jobs)
    before = det.window_iterations
    later = T0 + 3 * 24 * HOUR
    for n in range(60):
        for r in range(4):
            ts = later + n * 1000
            engine.process(step("job-1", r, 1000 + n, ts), received_ts=ts)
            assert engine.rejection is None
    # 3 days of 30 s hops would be 8,640 windows; the job's data fills a handful.
    assert det.window_iterations - before <= 12


def test_the_whole_engine_advances_a_century_in_bounded_work() -> None:
    engine = _busy_state()
    assert engine.watermark is not None
    work, _ = _lines_run(lambda: engine.advance(engine.watermark + CENTURY))
    assert work < 100_000
