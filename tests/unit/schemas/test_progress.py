"""A run's progress towards a target in steps, tokens or epochs, and the ETA at a rate (`ranksight jobs`, the job page, alerts)."""

from __future__ import annotations

import pytest

from schemas.progress import describe, estimate


def test_steps_target_progress_and_eta_at_the_recent_rate() -> None:
    est = estimate(step=99, rate_steps_s=2.0, target_steps=1000)
    assert (est.target_kind, est.target, est.done) == ("steps", 1000.0, 100.0)
    assert est.fraction == pytest.approx(0.1) and est.eta_s == pytest.approx(450.0)


def test_tokens_target_counts_steps_times_tokens_per_step() -> None:
    est = estimate(step=9, rate_steps_s=0.5, target_tokens=1_000_000, tokens_per_step=20_000.0)
    assert est.target_kind == "tokens" and est.done == 200_000.0
    assert est.eta_s == pytest.approx(40 / 0.5)  # 800k tokens left = 40 steps


def test_epochs_target_uses_the_share_of_the_current_epoch_and_the_last_full_epochs_length() -> None:
    est = estimate(
        step=74, rate_steps_s=1.0, target_epochs=4, epoch=2, epoch_first_step=60, steps_per_epoch=30.0
    )
    assert est.target_kind == "epochs" and est.done == pytest.approx(2.5)
    assert est.eta_s == pytest.approx(45.0)


def test_steps_win_over_tokens_and_epochs_when_several_are_known() -> None:
    est = estimate(step=0, rate_steps_s=1.0, target_steps=10, target_tokens=10**9, tokens_per_step=1.0)
    assert est.target_kind == "steps"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"step": 50, "rate_steps_s": 1.0},  # no target: no progress, no ETA
        {"step": 50, "rate_steps_s": None, "target_steps": 100},  # no rate yet
        {"step": 50, "rate_steps_s": 1.0, "target_steps": 100, "ended": True},  # the job is over
        {"step": 50, "rate_steps_s": 1.0, "target_epochs": 3.0},  # epochs, but the epoch length is unknown
    ],
)
def test_no_eta_without_a_target_a_rate_or_a_running_job(kwargs: dict) -> None:
    assert estimate(**kwargs).eta_s is None


def test_progress_past_the_target_is_done_with_no_time_left() -> None:
    est = estimate(step=1500, rate_steps_s=1.0, target_steps=1000)
    assert est.fraction == 1.0 and est.eta_s == 0.0


def test_progress_in_words_names_the_share_done_and_the_time_left() -> None:
    est = estimate(step=1199, rate_steps_s=0.5, target_steps=5000)
    assert describe(est.target_kind, est.target, est.done, est.eta_s) == (
        "1,200 of 5,000 steps (24%), about 2h 06m left at the recent step rate"
    )
    assert describe("tokens", 1e10, 4.1e9, None) == "4.1e+09 of 1e+10 tokens (41%)"
    assert (
        describe("epochs", 3.0, 1.5, 59.6)
        == "1.5 of 3 epochs (50%), about 1m 00s left at the recent step rate"
    )
    assert describe(None, None, None, None) == ""
    assert describe("steps", 100.0, None, None) == "target 100 steps, progress unknown"


def test_sinks_progress_uses_the_shared_arithmetic() -> None:
    """One estimate for `ranksight jobs`, the UI and the alerts: sinks re-exports it, no copy."""
    import schemas.progress
    import sinks.progress

    assert sinks.progress.estimate is schemas.progress.estimate
    assert sinks.progress.DEFAULT_WINDOW_S == schemas.progress.RATE_WINDOW_S
