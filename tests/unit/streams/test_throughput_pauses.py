"""A step that carries a checkpoint (or an evaluation) is attributed to it, never read as a throughput drop."""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, Topology
from streams.detectors.throughput import ThroughputDetector
from tests.unit.streams.builders import T0, checkpoint, job_started, validation

WINDOW = 60_000


def _window(end: int, step_s: float, steps: int) -> list[Event]:
    """A window's rank rows and its job row: 8 ranks alike (an even window)."""
    rows: list[Event] = []
    for r in range(8):
        rec: dict[str, Any] = {
            "job_id": "job-1",
            "window_start": end - WINDOW,
            "window_end": end,
            "rank": r,
            "node": "node-01",
            "step_time_s": step_s,
            "compute_s": 3.4,
            "data_wait_s": 0.1,
            "comm_s": 0.5,
            "steps": steps,
            "straggler_score": 1.0,
        }
        rows.append(Event("RankWindowStats", rec))
    job = {"job_id": "job-1", "window_start": end - WINDOW, "window_end": end, "step_time_s": step_s}
    job["tokens_per_s_per_gpu"] = 1000.0 * 4.0 / step_s
    return [*rows, Event("JobWindowStats", job)]


def _run(pauses: list[Event]) -> list[Finding]:
    """Ten 4 s windows, then two windows whose mean step is 14 s: four steps, one of which carried a
    40 s checkpoint write (or an evaluation) that `pauses` may announce."""
    det = ThroughputDetector(Topology())
    events = [job_started("job-1", T0)]
    for i in range(1, 11):
        events += _window(T0 + i * WINDOW, 4.0, 15)
    events += pauses
    events += _window(T0 + 11 * WINDOW, 14.0, 4) + _window(T0 + 12 * WINDOW, 14.0, 4)
    events += _window(T0 + 13 * WINDOW, 4.0, 15)
    out: list[Finding] = []
    for ev in sorted(events, key=lambda e: e.record.get("ts", e.record.get("window_end", 0))):
        out += det.observe(ev)
    return [f for f in out if f.active]


def test_windows_slow_only_by_the_checkpoint_their_steps_carried_are_no_drop() -> None:
    ckpts = []
    for i, at in enumerate((T0 + 10 * WINDOW + 10_000, T0 + 11 * WINDOW + 10_000)):
        ckpts += [
            checkpoint("job-1", at, "started", ckpt=f"c{i}"),
            checkpoint("job-1", at + 40_000, "completed", ckpt=f"c{i}"),
        ]
    assert _run(ckpts) == []


def test_an_evaluation_reported_only_by_its_result_is_attributed_too() -> None:
    evals = [validation("job-1", T0 + 10 * WINDOW + 50_000, 100, duration_s=40.0)]
    evals += [validation("job-1", T0 + 11 * WINDOW + 50_000, 200, duration_s=40.0)]
    assert _run(evals) == []


def test_the_same_windows_without_a_pause_to_explain_them_are_a_drop() -> None:
    (drop,) = _run([])
    assert drop.rule == "throughput_drop" and "3.50x" in drop.summary


def test_a_short_checkpoint_does_not_excuse_a_real_slowdown() -> None:
    """A 2 s checkpoint in the window explains 0.5 s of a 10 s excess per step: still a drop."""
    short = [
        checkpoint("job-1", T0 + 10 * WINDOW + 10_000, "started"),
        checkpoint("job-1", T0 + 10 * WINDOW + 12_000, "completed"),
    ]
    assert [f.rule for f in _run(short)] == ["throughput_drop"]
