"""The numerical rules: non-finite loss and gradients, divergence and gradient spikes (one class each)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology
from streams.detectors.grad_spike import GradSpikeDetector
from streams.detectors.loss_divergence import LossDivergenceDetector
from streams.detectors.nonfinite_grad import NonfiniteGradDetector
from streams.detectors.nonfinite_loss import NonfiniteLossDetector
from tests.unit.streams.builders import T0, job_started, step

JOB = "job-1"


def drive(det: Detector, events: list[Event]) -> list[Finding]:
    """Feed events as the engine does: topology first, then observe, then advance to the event time."""
    out: list[Finding] = []
    for ev in events:
        det.topology.observe(ev)
        out += det.observe(ev)
        out += det.advance(ev.record["ts"])
    return out


def losses_job(
    losses: list[float], *, ranks: int = 1, step_s: float = 1.0, grads: list[float] | None = None
) -> list[Event]:
    """A job whose step i has loss losses[i] (and grad norm grads[i]) on every rank."""
    events = [job_started(JOB, T0, world_size=ranks)]
    for i, loss in enumerate(losses):
        ts = T0 + int((i + 1) * step_s * 1000)
        g = grads[i] if grads is not None else 1.0
        events += [step(JOB, r, i + 1, ts, loss=loss, grad_norm=g) for r in range(ranks)]
    return events


def rule(findings: list[Finding], name: str) -> list[Finding]:
    return [f for f in findings if f.rule == name]


def test_nan_loss_fires_at_once_on_the_leader_rank_and_resolves_after_finite_steps() -> None:
    losses = [2.5] * 30 + [math.nan] * 5 + [2.5] * 30
    events = losses_job(losses, ranks=4)
    # Rank 2 reports a NaN a step before the others: its local loss, not the job's. The rule judges
    # the leader rank's steps (one identity per job, raised by the one rank-stage engine that reads them).
    early = next(
        e for e in events if e.type == "StepCompleted" and e.record["step"] == 30 and e.record["rank"] == 2
    )
    early.record["loss"] = math.nan
    found = rule(drive(NonfiniteLossDetector(Topology()), events), "nonfinite_loss")
    assert found[0].active and found[0].rank == 0 and found[0].key == (JOB,)
    assert found[0].ts == T0 + 31_000 and found[0].sustain_ms == 0 and found[0].category == "model"
    resolved = [f for f in found if not f.active]
    assert len(resolved) == 1
    # The last NaN is at step 35; finite values must resume for 10 steps.
    assert resolved[0].ts == T0 + 45_000


def test_infinite_grad_norm_fires_nonfinite_grad() -> None:
    grads = [1.0] * 20 + [math.inf] + [1.0] * 20
    found = rule(
        drive(NonfiniteGradDetector(Topology()), losses_job([2.5] * 41, grads=grads)), "nonfinite_grad"
    )
    assert [f.active for f in found] == [True, False]
    assert found[0].ts == T0 + 21_000


def test_a_single_skipped_overflow_step_is_not_a_finding_but_three_in_a_row_are() -> None:
    events = losses_job([2.5] * 40, grads=[1.0] * 10 + [math.inf] + [1.0] * 10 + [math.nan] * 3 + [1.0] * 16)
    for e in events:
        if e.type == "StepCompleted" and not math.isfinite(e.record["grad_norm"]):
            e.record["skipped"] = True
    found = rule(drive(NonfiniteGradDetector(Topology()), events), "nonfinite_grad")
    assert found[0].active and found[0].ts == T0 + 24_000  # the third skipped step in a row (step 24)
    assert not any(f.ts < T0 + 24_000 for f in found)


def test_rising_loss_fires_divergence_within_two_windows_and_resolves_when_back() -> None:
    # 10 flat minutes at 2.5, then +0.3 nats per minute for 4 minutes, then back to 2.5.
    flat = [2.5] * 600
    rise = [2.5 + 0.3 * i / 60 for i in range(240)]
    events = losses_job([*flat, *rise, *([2.5] * 240)])
    found = rule(drive(LossDivergenceDetector(Topology()), events), "loss_divergence")
    fired = [f for f in found if f.active]
    assert fired, "divergence did not fire"
    assert fired[0].ts - (T0 + 600_000) <= 120_000
    assert (
        fired[0].observed is not None
        and fired[0].expected is not None
        and fired[0].observed > fired[0].expected
    )
    assert fired[0].history and fired[0].category == "model"
    resolved = [f for f in found if not f.active]
    assert len(resolved) == 1 and resolved[0].ts > T0 + 840_000


def test_isolated_one_step_loss_spikes_never_fire_divergence() -> None:
    # modded-nanogpt: loss ~3.8 with single-step jumps to 5-5.6 every ~30 steps.
    losses = [3.8 - 0.0001 * i + (1.6 if i % 29 == 0 else 0.0) for i in range(3000)]
    found = drive(LossDivergenceDetector(Topology()), losses_job(losses, step_s=0.5))
    assert rule(found, "loss_divergence") == []


def test_slow_late_drift_of_two_percent_does_not_fire_divergence() -> None:
    losses = [2.834 * (1 + 0.02 * i / 6000) + 0.1 * math.sin(i * 1.7) for i in range(6000)]
    found = drive(LossDivergenceDetector(Topology()), losses_job(losses))
    assert rule(found, "loss_divergence") == []


def test_divergence_needs_rising_medians_not_a_high_plateau_after_a_fall() -> None:
    # A loss that jumps once and then falls back slowly is above the tolerance but not rising.
    losses = [2.5] * 300 + [2.6] * 60 + [2.58 - 0.0002 * i for i in range(300)]
    found = drive(LossDivergenceDetector(Topology()), losses_job(losses))
    assert rule(found, "loss_divergence") == []


def test_falling_noisy_loss_never_diverges() -> None:
    losses = [2.1 + 8.4 * (1 + i / 60) ** -0.45 + 0.05 * math.sin(i * 2.3) for i in range(3000)]
    found = drive(LossDivergenceDetector(Topology()), losses_job(losses))
    assert rule(found, "loss_divergence") == []


def test_single_extreme_gradient_norm_is_a_spike_at_once() -> None:
    grads = [1.0] * 30 + [50.0] + [1.0] * 10
    found = rule(drive(GradSpikeDetector(Topology()), losses_job([2.5] * 41, grads=grads)), "grad_spike")
    assert [f.active for f in found] == [True, False]
    assert found[0].ts == T0 + 31_000 and found[0].observed == 50.0 and found[0].expected == 1.0
    assert found[1].ts == T0 + 36_000  # five normal steps later


def test_moderate_gradient_jump_fires_only_when_sustained() -> None:
    single = [1.0] * 30 + [12.0] + [1.0] * 10
    assert (
        rule(drive(GradSpikeDetector(Topology()), losses_job([2.5] * 41, grads=single)), "grad_spike") == []
    )
    double = [1.0] * 30 + [12.0, 12.0] + [1.0] * 10
    found = rule(drive(GradSpikeDetector(Topology()), losses_job([2.5] * 42, grads=double)), "grad_spike")
    assert found[0].active and found[0].ts == T0 + 32_000


def test_grad_norm_is_counted_once_per_step_across_ranks() -> None:
    grads = [1.0] * 30 + [12.0] + [1.0] * 10
    # Eight ranks reporting the same global norm is still one high step: no spike.
    found = drive(GradSpikeDetector(Topology()), losses_job([2.5] * 41, ranks=8, grads=grads))
    assert rule(found, "grad_spike") == []


def test_no_spike_is_judged_before_enough_history() -> None:
    grads = [1.0] * 5 + [100.0] + [1.0] * 10
    found = drive(GradSpikeDetector(Topology()), losses_job([2.5] * 16, grads=grads))
    assert rule(found, "grad_spike") == []


@settings(max_examples=40, deadline=None)
@given(
    base=st.floats(min_value=0.5, max_value=10.0),
    noise=st.lists(st.floats(min_value=-0.04, max_value=0.04), min_size=200, max_size=400),
)
def test_loss_within_a_few_percent_of_a_level_never_diverges(base: float, noise: list[float]) -> None:
    losses = [base * (1 + n) for n in noise]
    found = drive(LossDivergenceDetector(Topology()), losses_job(losses))
    assert rule(found, "loss_divergence") == []


@pytest.mark.parametrize(
    "cls", [NonfiniteLossDetector, NonfiniteGradDetector, LossDivergenceDetector, GradSpikeDetector]
)
def test_forget_job_drops_its_state(cls: type[Detector]) -> None:
    det = cls(Topology())
    drive(det, losses_job([2.5] * 30))
    assert det.state()["jobs"]
    det.forget_job(JOB)
    assert det.state() == {"jobs": {}}
