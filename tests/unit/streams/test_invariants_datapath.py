"""The data-path rules `repeated_data` (a loader cycling through the same batches) and `data_errors` (loader errors that persist)."""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology, dumps_state
from streams.detectors.data_errors import DataErrorsDetector
from streams.detectors.repeated_data import RepeatedDataDetector
from tests.unit.streams.builders import T0
from tests.unit.streams.sections import SectionRules

JOB = "job-1"


def step_fp(step: int, fp: str | None, *, rank: int = 0, run: str = "r1") -> Event:
    return Event(
        "StepCompleted",
        {
            "ts": T0 + step * 1000, "job_id": JOB, "run_id": run, "rank": rank, "step": step,
            "step_time_s": 1.0, "skipped": False, "batch_fingerprint": fp,
        },
    )  # fmt: skip


def loader(i: int, errors: int = 0, *, opens: int = 0, rank: int = 0) -> Event:
    return Event(
        "DataLoaderSample",
        {
            "ts": T0 + i * 10_000, "job_id": JOB, "run_id": "r1", "rank": rank, "interval_s": 10.0,
            "batches": 10, "wait_s": 0.1, "errors": errors, "file_open_errors": opens,
        },
    )  # fmt: skip


def run(det: Detector, events: list[Event]) -> list[Finding]:
    out: list[Finding] = []
    for ev in events:
        out += det.observe(ev)
    return out


def test_a_loader_stuck_on_four_batches_is_repeated_data_and_resolves_when_batches_vary_again() -> None:
    det = RepeatedDataDetector(Topology(), {"window_steps": 16})
    healthy = [step_fp(s, f"b{s}") for s in range(20)]
    stuck = [step_fp(s, f"b{s % 4}") for s in range(20, 40)]
    assert run(det, healthy) == []
    fired = run(det, stuck)
    assert fired and fired[0].rule == "repeated_data" and fired[0].active
    assert fired[0].key == (JOB, "0") and fired[0].category == "data"
    assert "distinct batches" in fired[0].summary
    recovered = run(det, [step_fp(s, f"c{s}") for s in range(40, 60)])
    assert [(f.rule, f.active) for f in recovered] == [("repeated_data", False)]


def test_an_epoch_without_shuffle_longer_than_the_window_never_fires() -> None:
    """Batches that come back once per 20-step epoch are not repetition (the window is 16)."""
    det = RepeatedDataDetector(Topology(), {"window_steps": 16})
    assert run(det, [step_fp(s, f"b{s % 20}") for s in range(200)]) == []


def test_a_restart_replaying_data_starts_a_fresh_window() -> None:
    det = RepeatedDataDetector(Topology(), {"window_steps": 16})
    first = [step_fp(s, f"b{s}") for s in range(10)]
    # Resumed from step 0's checkpoint: the same batches again, under a new run id.
    replay = [step_fp(s, f"b{s}", run="r2") for s in range(10)] + [
        step_fp(s, f"b{s}", run="r2") for s in range(10, 30)
    ]
    assert run(det, first + replay) == []


def test_steps_without_fingerprints_are_ignored() -> None:
    det = RepeatedDataDetector(Topology(), {"window_steps": 4})
    assert run(det, [step_fp(s, None) for s in range(20)]) == []


def test_sustained_loader_errors_fire_after_three_samples_and_resolve_after_two_clean_ones() -> None:
    det = DataErrorsDetector(Topology())
    assert run(det, [loader(0, 2), loader(1, 1)]) == []
    fired = run(det, [loader(2, 0, opens=3)])
    assert len(fired) == 1 and fired[0].rule == "data_errors" and fired[0].active
    assert "3 failed file opens" in fired[0].summary and fired[0].rank == 0
    assert run(det, [loader(3, 0)]) == []
    assert [(f.rule, f.active) for f in run(det, [loader(4, 0)])] == [("data_errors", False)]


def test_a_transient_error_burst_does_not_fire() -> None:
    det = DataErrorsDetector(Topology())
    events = [loader(i, 5 if i in (3, 4, 9) else 0) for i in range(20)]
    assert run(det, events) == []


def test_state_round_trips_and_replays_identically() -> None:
    events: list[Any] = [step_fp(s, f"b{s % 3}") for s in range(80)] + [loader(i, 1) for i in range(5)]
    a = SectionRules("datapath", Topology())
    whole = run(a, events)
    b = SectionRules("datapath", Topology())
    first = run(b, events[:50])
    c = SectionRules("datapath", Topology())
    c.load_state(b.state())
    assert first + run(c, events[50:]) == whole
    assert dumps_state(a.state()) == dumps_state(c.state())
