"""Values no producer can measure are made unknown before a detector sees them, and counted."""

from __future__ import annotations

import math

from schemas.records import Event
from streams.detectors.validate import MAX_DURATION_S, clean
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import T0, gpu_sample, step, training_job


def test_a_measurable_record_is_returned_unchanged() -> None:
    event = step("job-1", 0, 1, T0)
    assert clean(event) == (event, ())


def test_impossible_step_durations_become_unknown_and_the_required_one_nan() -> None:
    event = step("job-1", 0, 1, T0)
    bad = Event(
        event.type, {**event.record, "step_time_s": -1.0, "forward_s": math.inf, "comm_s": 2 * MAX_DURATION_S}
    )
    fixed, names = clean(bad)
    assert names == ("comm_s", "forward_s", "step_time_s")
    assert math.isnan(fixed.record["step_time_s"]) and fixed.record["forward_s"] is None
    assert fixed.record["comm_s"] is None and fixed.record["loss"] == 2.5


def test_utilisation_above_100_and_memory_above_the_total_become_unknown() -> None:
    event = gpu_sample("node-01", 0, T0)
    total = event.record["mem_total_bytes"]
    fixed, names = clean(
        Event(event.type, {**event.record, "gpu_util_pct": 140.0, "mem_used_bytes": 3 * total})
    )
    assert names == ("gpu_util_pct", "mem_used_bytes")
    assert fixed.record["gpu_util_pct"] is None and fixed.record["mem_used_bytes"] is None


def test_non_finite_loss_is_a_measurement_and_kept() -> None:
    fixed, names = clean(step("job-1", 0, 1, T0, loss=math.nan, grad_norm=math.inf))
    assert names == () and math.isnan(fixed.record["loss"])


def test_negative_step_times_make_no_straggler_and_are_counted() -> None:
    events = training_job(seconds=240)
    # rank 3 reports impossible negative durations for its whole life
    events = [
        Event(
            e.type,
            {**e.record, "step_time_s": -5.0, "forward_s": -2.0, "backward_s": -2.0, "optimizer_s": -1.0},
        )
        if e.type == "StepCompleted" and e.record["rank"] == 3
        else e
        for e in events
    ]
    engine = DetectionEngine()
    out = engine.run(events)
    assert not [e for e in out if e.type == "Alert" and e.record["rule"] == "straggler"]
    assert engine.stats["invalid_values"]["StepCompleted.step_time_s"] == 240
