"""The simulator's data-path and validation faults put their signal in the records, and their twins do not."""

from __future__ import annotations

import itertools
from typing import Any

from producers.simulator import load_scenario, simulate
from schemas.files import parse_ts


def _run(name: str) -> tuple[list[Any], list[dict[str, Any]], int]:
    sc = load_scenario(name)
    sim = simulate(sc, 0)
    return [e for e in sim.events()], sim.labels, sc.start_ms


def _steps(events: list[Any], rank: int) -> list[dict[str, Any]]:
    return [e.record for e in events if e.type == "StepCompleted" and e.record["rank"] == rank]


def test_repeated_batches_cycle_one_rank_through_a_few_fingerprints_and_leave_the_others_alone() -> None:
    events, (label,), _t0 = _run("repeated_batches")
    start, end = parse_ts(label["start"]), parse_ts(label["end"])
    stuck = {s["batch_fingerprint"] for s in _steps(events, 3) if start + 2000 <= s["ts"] < end - 2000}
    assert len(stuck) == 4
    before = [s["batch_fingerprint"] for s in _steps(events, 3) if s["ts"] < start]
    assert len(set(before)) == len(before), "a healthy loader hands out a new batch every step"
    others = [s["batch_fingerprint"] for s in _steps(events, 2)]
    assert len(set(others)) == len(others)
    assert label["alert"] == "repeated_data" and label["rank"] == 3


def test_epoch_replay_repeats_each_batch_once_per_epoch() -> None:
    events, (label,), _ = _run("epoch_replay")
    start = parse_ts(label["start"])
    fps = [s["batch_fingerprint"] for s in _steps(events, 0) if s["ts"] >= start]
    assert len(fps) > 200 and all(fps[i] == fps[i + 200] for i in range(len(fps) - 200))
    assert len(set(fps[:200])) == 200 and label["alert"] is None


def test_data_errors_are_reported_by_one_rank_for_the_fault_window_only() -> None:
    events, (label,), _ = _run("data_errors")
    samples = [e.record for e in events if e.type == "DataLoaderSample"]
    erring = [s for s in samples if s["errors"]]
    assert erring and {s["rank"] for s in erring} == {5}
    assert all(s["file_open_errors"] == 3 for s in erring)
    assert parse_ts(label["start"]) <= erring[0]["ts"] and erring[-1]["ts"] < parse_ts(label["end"])
    _, (twin,), _ = _run("data_errors_transient")
    assert twin["alert"] is None


def test_validation_missing_stops_results_while_steps_go_on_and_late_only_shifts_one() -> None:
    events, (label,), _ = _run("validation_missing")
    start = parse_ts(label["start"])
    results = [e.record for e in events if e.type == "ValidationResult"]
    assert results and all(r["ts"] < start + 5000 for r in results)
    assert any(s["ts"] > start + 300_000 for s in _steps(events, 0))
    events, (late,), _ = _run("validation_late")
    steps = [e.record["step"] for e in events if e.type == "ValidationResult"]
    gaps = {b - a for a, b in itertools.pairwise(steps)}
    assert gaps == {20, 26, 14} and late["detail"]["delayed_steps"] == 6


def test_validation_divergence_raises_val_loss_while_the_twin_only_adds_noise() -> None:
    def val_trend(name: str) -> list[float]:
        events, (label,), _ = _run(name)
        start = parse_ts(label["start"])
        return [
            e.record["metrics"]["val_loss"]
            for e in events
            if e.type == "ValidationResult" and e.record["ts"] > start
        ]

    diverging, noisy = val_trend("validation_divergence"), val_trend("validation_noise")
    assert diverging[-1] > 1.5 * diverging[0]
    assert noisy[-1] < noisy[0]


def test_loader_samples_carry_prep_time_reads_and_cache_hits_and_a_slow_loader_shows_in_them() -> None:
    sc = load_scenario("slow_data_worker")
    sim = simulate(sc, 0)
    (label,) = sim.labels
    start, end = parse_ts(label["start"]), parse_ts(label["end"])
    samples = [
        e.record
        for e in sim.events()
        if e.type == "DataLoaderSample" and e.record["rank"] == 11 and e.record["batches"]
    ]
    before = [s for s in samples if s["ts"] < start]
    during = [s for s in samples if start + 10_000 <= s["ts"] < end]
    for s in before:
        assert s["batch_prep_s"] > 0 and s["read_bytes_s"] > 0 and s["file_opens_s"] > 0
        assert 0 < s["cache_hit_ratio"] <= 1 and s["errors"] == 0
    mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    assert mean(during, "read_latency_s") > 2 * mean(before, "read_latency_s")
    assert mean(during, "cache_hit_ratio") < mean(before, "cache_hit_ratio")
