"""Evaluations are not stalls, and a stalled job that resumes raises no rank hang."""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding
from tests.unit.streams.builders import T0, collective, gpu_sample, step, training_job, validation
from tests.unit.streams.test_progress import _first, _run


def evaluation(
    job: str, ts: int, phase: str, *, eid: str = "eval-1", n: int = 100, expected_s: float | None = None
) -> Event:
    """EvaluationEvent of one phase."""
    rec: dict[str, Any] = {
        "ts": ts,
        "job_id": job,
        "run_id": f"{job}-run-1",
        "rank": None,
        "evaluation_id": eid,
        "step": n,
        "phase": phase,
        "name": "val",
        "expected_duration_s": expected_s,
        "duration_s": None,
        "batches": None,
        "error": None,
    }
    return Event("EvaluationEvent", rec)


def _steps(start_s: int, first: int, count: int, ranks: int = 4) -> list[Event]:
    return [
        step("job-1", r, first + i, T0 + (start_s + i) * 1000) for i in range(count) for r in range(ranks)
    ]


def _rules(out: list[Finding], active: bool = True) -> set[str]:
    return {f.rule for f in out if f.active is active}


# -- evaluation events ----------------------------------------------------------------------


def test_an_open_evaluation_suppresses_the_stall_for_its_whole_length() -> None:
    # A 5-minute evaluation (well past the 60 s floor) with a start event, then training resumes.
    events = [*training_job(seconds=100), evaluation("job-1", T0 + 100_500, "started", expected_s=300.0)]
    events += [evaluation("job-1", T0 + 400_000, "completed"), *_steps(401, 101, 30)]
    _, out = _run(events, until_s=430)
    assert _rules(out) == set()


def test_the_same_pause_without_an_evaluation_event_is_a_stall() -> None:
    events = [*training_job(seconds=100), *_steps(401, 101, 30)]
    _, out = _run(events, until_s=430)
    assert "job_stall" in _rules(out)


def test_an_evaluation_open_far_beyond_its_expected_duration_is_evaluation_stuck() -> None:
    events = [*training_job(seconds=100), evaluation("job-1", T0 + 100_500, "started", expected_s=60.0)]
    _, out = _run(events, until_s=219)  # eval_factor 2 x 60 s = 120 s: not yet
    assert _rules(out) == set()
    _, out = _run(events, until_s=240)
    stuck = _first(out, "evaluation_stuck")
    assert stuck is not None and stuck.since == T0 + 100_500 and stuck.expected == 120.0
    assert "job_stall" not in _rules(out) and "rank_hang" not in _rules(out)


def test_evaluation_stuck_resolves_when_the_evaluation_completes() -> None:
    events = [*training_job(seconds=100), evaluation("job-1", T0 + 100_500, "started", expected_s=60.0)]
    events += [evaluation("job-1", T0 + 260_000, "completed"), *_steps(261, 101, 10)]
    _, out = _run(events, until_s=275)
    assert _first(out, "evaluation_stuck") is not None
    cleared = _first(out, "evaluation_stuck", active=False)
    assert cleared is not None and cleared.ts == T0 + 260_000


def test_without_an_expected_duration_the_learned_evaluation_length_bounds_it() -> None:
    # The first evaluation took 100 s; the second is open for 250 s > 2 x 100 s.
    events = [*training_job(seconds=100), evaluation("job-1", T0 + 100_500, "started", eid="e1")]
    events += [evaluation("job-1", T0 + 200_500, "completed", eid="e1"), *_steps(201, 101, 50)]
    events += [evaluation("job-1", T0 + 251_000, "started", eid="e2", n=150)]
    _, out = _run(events, until_s=440)
    assert _rules(out) == set()
    _, out = _run(events, until_s=460)
    assert _rules(out) == {"evaluation_stuck"}


def test_a_step_after_a_lost_completed_event_closes_the_evaluation() -> None:
    # `completed` never arrives, but training steps on: a later stall is a stall again.
    events = [*training_job(seconds=100), evaluation("job-1", T0 + 100_500, "started", expected_s=600.0)]
    events += _steps(130, 101, 20)
    _, out = _run(events, until_s=149 + 65)
    assert "job_stall" in _rules(out)


# -- the ValidationResult-only fallback -----------------------------------------------------


def _eval_every_50_from_step_0(second_eval_s: float) -> list[Event]:
    """Steps 0..49, an evaluation reported at step 49 (0-based loop, every 50 steps), steps 50..99,
    then the next evaluation (at step 99) lasting `second_eval_s`."""
    events = list(training_job(seconds=0))
    events += [step("job-1", r, i, T0 + (i + 1) * 1000) for i in range(50) for r in range(4)]
    events.append(validation("job-1", T0 + 80_000, 49, duration_s=40.0))
    events += [step("job-1", r, 50 + i, T0 + (81 + i) * 1000) for i in range(50) for r in range(4)]
    end = 130 + int(second_eval_s)
    events.append(validation("job-1", T0 + end * 1000, 99, duration_s=second_eval_s))
    events += [step("job-1", r, 100, T0 + (end + 1) * 1000) for r in range(4)]
    return events


def test_evaluations_every_n_steps_from_step_0_are_learned_from_one_result() -> None:
    # The one result says step 49; the period is 50. The second evaluation pauses 75 s after
    # step 99 (past the 60 s floor): within 2 x 40 s, and step 99 is an evaluation step.
    _, out = _run(_eval_every_50_from_step_0(75.0), until_s=210)
    assert _rules(out) == set()


def test_the_learned_fallback_still_catches_a_stall_at_a_step_that_is_no_evaluation_step() -> None:
    events = [
        e
        for e in _eval_every_50_from_step_0(75.0)
        if not (e.type == "StepCompleted" and e.record["step"] > 80)
    ]
    events = [e for e in events if e.type != "ValidationResult" or e.record["step"] != 99]
    _, out = _run(events, until_s=210)
    assert "job_stall" in _rules(out)


def test_the_evaluation_length_is_learned_from_the_steps_around_a_result() -> None:
    # The result carries no duration and arrives right away; the real pause is 45 s (steps
    # before and after it), so a 70 s pause at the next evaluation step is allowed (2 x 45 s).
    events = list(training_job(seconds=50))
    events.append(validation("job-1", T0 + 50_500, 50))
    events[-1].record["duration_s"] = None
    events += _steps(96, 51, 50)
    events += _steps(215, 101, 5)
    _, out = _run(events, until_s=220)
    assert _rules(out) == set()


def _first_evaluation(util: float, *, gpus: int = 4) -> list[Event]:
    """A ValidationResult-only producer: training stops at 100 s for a 150 s first evaluation
    (the result comes at its end), GPU samples every 5 s (600 W while training, 500 W at `util`
    meanwhile; idle GPUs draw 80 W), then steps resume."""
    events = [*training_job(seconds=100), validation("job-1", T0 + 250_000, 100, duration_s=150.0)]
    for s in range(5, 100, 5):
        events += [gpu_sample("node-01", i, T0 + s * 1000) for i in range(gpus)]
    for s in range(105, 250, 5):
        power = 500.0 if util > 5 else 80.0
        events += [gpu_sample("node-01", i, T0 + s * 1000, util=util, power=power) for i in range(gpus)]
    return events + _steps(251, 101, 5)


def test_a_long_first_evaluation_on_busy_gpus_is_no_stall() -> None:
    """Every rank finished the same step and every GPU keeps computing: the first-evaluation grace."""
    _, out = _run(_first_evaluation(util=92.0), until_s=256)
    assert _rules(out) == set()


def test_the_same_silence_on_idle_gpus_is_a_stall_at_the_usual_floor() -> None:
    _, out = _run(_first_evaluation(util=0.0), until_s=256)
    stall = _first(out, "job_stall")
    assert stall is not None and stall.ts <= T0 + 100_000 + 62_000


def test_the_same_silence_without_gpu_telemetry_is_a_stall() -> None:
    _, out = _run(_first_evaluation(util=92.0, gpus=0), until_s=256)
    assert "job_stall" in _rules(out)


def test_without_gpu_power_from_training_to_compare_nothing_excuses_the_silence() -> None:
    events = [
        e for e in _first_evaluation(util=92.0) if e.type != "GpuSample" or e.record["ts"] > T0 + 100_000
    ]
    _, out = _run(events, until_s=256)
    assert "job_stall" in _rules(out)


def test_the_first_evaluation_grace_can_be_turned_off() -> None:
    _, out = _run(_first_evaluation(util=92.0), until_s=256, params={"eval_first_grace_s": 0.0})
    assert "job_stall" in _rules(out)


def test_the_first_evaluation_grace_is_bounded() -> None:
    """A job that never reports back after its 'evaluation' is stalled once the grace is spent."""
    events = [e for e in _first_evaluation(util=92.0) if e.record["ts"] < T0 + 250_000]
    for s in range(250, 800, 5):
        events += [gpu_sample("node-01", i, T0 + s * 1000, util=92.0) for i in range(4)]
    _, out = _run(events, until_s=760)
    stall = _first(out, "job_stall")
    assert stall is not None and T0 + 100_000 + 600_000 <= stall.ts <= T0 + 100_000 + 602_000


def test_gpus_spinning_at_full_activity_but_a_fraction_of_their_training_power_are_no_evaluation() -> None:
    """A hung collective: NCCL kernels keep every GPU 100% active, drawing far less than training did."""
    events = [e for e in _first_evaluation(util=100.0) if e.type != "GpuSample"]
    for s in range(5, 250, 5):
        training = s <= 100
        events += [
            gpu_sample(
                "node-01",
                i,
                T0 + s * 1000,
                util=95.0 if training else 100.0,
                power=600.0 if training else 250.0,
            )
            for i in range(4)
        ]
    _, out = _run(events, until_s=256)
    stall = _first(out, "job_stall")
    assert stall is not None and stall.ts <= T0 + 100_000 + 62_000


def test_peers_blocked_in_a_collective_are_no_evaluation() -> None:
    events = _first_evaluation(util=100.0)
    for s in range(110, 250, 10):
        events += [collective("job-1", r, T0 + s * 1000, 1.0) for r in range(4)]
    _, out = _run(events, until_s=256)
    assert "job_stall" in _rules(out)


# -- recovery -------------------------------------------------------------------------------


def _stall_then_resume(first_back: int) -> list[Event]:
    """A 4-rank job stalls at 100 s with every GPU idle; at 250 s GPU `first_back` comes back a
    few samples before the others, then every rank steps again at 262 s."""
    events = training_job(seconds=100)
    for s in range(105, 270, 5):
        for i in range(4):
            busy = s >= 250 and (i == first_back or s >= 260)
            events.append(gpu_sample("node-01", i, T0 + s * 1000, util=95.0 if busy else 0.0))
    events += _steps(262, 101, 5)
    return events


def test_a_stalled_job_that_resumes_raises_no_rank_hang() -> None:
    _, out = _run(_stall_then_resume(first_back=2), until_s=266)
    assert _first(out, "job_stall") is not None
    assert _first(out, "rank_hang") is None


def test_a_rank_whose_gpu_is_out_of_line_for_the_whole_stall_is_named_as_hung() -> None:
    # Twin: GPU 2 idle from the start of the stall while its peers spin in the collective.
    events = training_job(seconds=100)
    for s in range(105, 200, 5):
        events += [gpu_sample("node-01", i, T0 + s * 1000, util=0.0 if i == 2 else 100.0) for i in range(4)]
    _, out = _run(events, until_s=199)
    hang = _first(out, "rank_hang")
    assert hang is not None and hang.rank == 2


def test_the_first_rank_to_leave_the_collective_as_a_stalled_job_resumes_is_not_hung() -> None:
    events = training_job(seconds=100)
    for s in range(110, 250, 10):
        events += [collective("job-1", r, T0 + s * 1000, 1.0) for r in range(4)]
    events += [collective("job-1", r, T0 + 250_000, 0.0 if r == 2 else 1.0) for r in range(4)]
    events += _steps(256, 101, 5)
    _, out = _run(events, until_s=258)
    assert _first(out, "job_stall") is not None and _first(out, "rank_hang") is None
