"""ValidationDetector: validation moving against training, and a validation that stops coming."""

from __future__ import annotations

from schemas.records import Event
from streams.detectors.base import Finding, Topology
from streams.detectors.validation import ValidationDetector
from tests.unit.streams.builders import T0

JOB = "job-1"


def step(s: int, loss: float, *, rank: int = 0) -> Event:
    return Event(
        "StepCompleted",
        {"ts": T0 + s * 1000, "job_id": JOB, "run_id": "r1", "rank": rank, "step": s, "loss": loss,
         "step_time_s": 1.0, "skipped": False},
    )  # fmt: skip


def val(s: int, v: float, metric: str = "val_loss") -> Event:
    return Event(
        "ValidationResult",
        {"ts": T0 + s * 1000 + 500, "job_id": JOB, "run_id": "r1", "step": s, "metrics": {metric: v}},
    )


def train(det: ValidationDetector, evals: list[float], *, start: int = 0, every: int = 100,
          train_loss=lambda s: 3.0 * (1 + s / 100) ** -0.5, metric: str = "val_loss") -> list[Finding]:  # fmt: skip
    out: list[Finding] = []
    s = start
    for v in evals:
        for _ in range(every):
            s += 1
            out += det.observe(step(s, train_loss(s)))
        out += det.observe(val(s, v, metric))
    return out


def test_validation_rising_while_training_falls_fires_after_three_evaluations_and_resolves() -> None:
    det = ValidationDetector(Topology())
    found = train(det, [2.5, 2.3, 2.2, 2.3, 2.4])
    assert found == [], "two rising evaluations are not yet sustained"
    fired = train(det, [2.5], start=500)
    assert len(fired) == 1 and fired[0].rule == "validation_divergence" and fired[0].active
    assert "rose from 2.2 to 2.5 over 3 evaluations" in fired[0].summary
    assert fired[0].category == "model"
    assert train(det, [2.45], start=600) == [], "one calm evaluation is noise: still diverging"
    still = train(det, [2.6], start=700)
    assert [(f.rule, f.active) for f in still] == [("validation_divergence", True)]
    healed = train(det, [2.55, 2.5], start=800)
    assert [(f.rule, f.active) for f in healed] == [("validation_divergence", False)]


def test_validation_noise_within_the_tolerance_and_joint_rises_do_not_fire() -> None:
    det = ValidationDetector(Topology())
    # +0.5% per evaluation: within the 1% noise.
    assert train(det, [2.0 * 1.005**k for k in range(10)]) == []
    det = ValidationDetector(Topology())
    # Both losses rise together (a bad learning rate, not overfitting): another rule's business.
    assert train(det, [2.0 + 0.1 * k for k in range(10)], train_loss=lambda s: 1.0 + s / 100) == []


def test_eval_loss_is_read_when_val_loss_is_absent() -> None:
    det = ValidationDetector(Topology())
    fired = train(det, [2.0, 2.1, 2.2, 2.3], metric="eval_loss")
    assert [f.rule for f in fired] == ["validation_divergence"]


def test_a_validation_that_stops_at_its_usual_period_is_missing_until_the_next_one() -> None:
    det = ValidationDetector(Topology())
    assert train(det, [2.0, 2.0, 2.0]) == []
    out: list[Finding] = []
    for s in range(301, 460):
        out += det.observe(step(s, 1.0))
    assert [(f.rule, f.active) for f in out] == [("validation_missing", True)]
    assert out[0].ts == T0 + 451 * 1000, "fires once training is 1.5 periods past the last validation"
    assert "without a validation since step 300" in out[0].summary
    back = det.observe(val(459, 2.0))
    assert [(f.rule, f.active) for f in back] == [("validation_missing", False)]


def _missing(det: ValidationDetector, steps: range) -> list[Finding]:
    return [f for s in steps for f in det.observe(step(s, 1.0)) if f.rule == "validation_missing"]


def test_evaluations_that_stop_after_the_second_one_are_missing() -> None:
    """Steps 1..200, evaluations at 100 and 200 (every 100 steps), then none."""
    det = ValidationDetector(Topology())
    assert train(det, [2.0, 2.0]) == []
    out = _missing(det, range(201, 600))
    assert [(f.active, f.ts) for f in out] == [(True, T0 + 351 * 1000)], "1.5 periods past step 200"
    assert out[0].expected == 100.0
    assert [f.active for f in det.observe(val(360, 2.0))] == [False]


def test_evaluations_that_stop_after_the_first_one_are_missing() -> None:
    """A run seen from its first step evaluates at step 100: the period is the 100 steps before it."""
    det = ValidationDetector(Topology())
    assert train(det, [2.0]) == []
    out = _missing(det, range(101, 600))
    assert [(f.active, f.ts) for f in out] == [(True, T0 + 251 * 1000)]
    # Loops counting from 0 evaluate after 100 steps at step 99: the same period.
    zero = ValidationDetector(Topology())
    for s in range(0, 100):
        zero.observe(step(s, 1.0))
    zero.observe(val(99, 2.0))
    assert [f.ts for f in _missing(zero, range(100, 600))] == [T0 + 250 * 1000]


def test_runs_that_evaluate_on_schedule_never_miss() -> None:
    for every in (20, 37, 100, 150):
        det = ValidationDetector(Topology())
        assert train(det, [2.0] * 12, every=every) == [], every
    # One evaluation runs 0.3 periods late (within the 1.5-period tolerance), from the second one on.
    for late_after in (1, 2, 5):
        det = ValidationDetector(Topology())
        out, s = [], 0
        for k in range(1, 10):
            due = 100 * k + (30 if k == late_after + 1 else 0)
            while s < due:
                s += 1
                out += det.observe(step(s, 1.0))
            out += det.observe(val(s, 2.0))
        assert out == [], late_after
    # Evaluating at step 0 too (before training) adds no false period.
    det = ValidationDetector(Topology())
    det.observe(step(0, 1.0))
    det.observe(val(0, 2.0))
    assert train(det, [2.0] * 4, start=0) == []


def test_no_period_is_assumed_from_evaluations_off_the_every_n_steps_grid() -> None:
    """A job first seen mid-run (step 5001) with two evaluations 200 steps apart at 5100 and 5300:
    5100 is no multiple of 200, so the interval is not yet a period; a third evaluation makes one."""
    det = ValidationDetector(Topology())
    train(det, [2.0], start=5000)  # steps 5001..5100, evaluation at 5100
    assert _missing(det, range(5101, 5300)) == []
    det.observe(val(5299, 2.0))
    assert _missing(det, range(5300, 7000)) == []
    # One evaluation of a run the detector did not see begin teaches nothing either.
    mid = ValidationDetector(Topology())
    train(mid, [2.0], start=4900)
    assert _missing(mid, range(5001, 9000)) == []
    # Nor one at step 0 (an evaluation before training is no period).
    zero = ValidationDetector(Topology())
    zero.observe(step(0, 1.0))
    zero.observe(val(0, 2.0))
    assert _missing(zero, range(1, 3000)) == []


def test_other_ranks_do_not_move_progress_or_training_loss() -> None:
    det = ValidationDetector(Topology())
    train(det, [2.0, 2.0, 2.0])
    assert all(det.observe(step(s, 1.0, rank=1)) == [] for s in range(301, 1000))
