"""A run's progress towards its target and the time left at a step rate: the pure arithmetic.

A run's target is in steps, tokens or epochs (`JobStarted.target_*`, what the trainer was told:
max_steps, a token budget, max_epochs); the first one known is used, in that order. Progress is
the latest step (tokens: steps x the tokens one step processes, summed over ranks; epochs: the
current epoch plus the share of it done, from the length of the last full epoch). The estimated
time to completion is the remaining work at the given step rate; none when the target or the rate
is unknown, or the job has ended.

Shared by everything that shows progress: `ranksight jobs` and the job page (`sinks.progress`
works the inputs out of the stored steps) and the alerts (the engine, from the steps it reads):
it imports nothing, so detectors, sinks and the UI may all use it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RATE_WINDOW_S", "Estimate", "describe", "estimate"]

# The recent step rate is measured over a run's steps of this many seconds before its latest one:
# long enough that one evaluation or checkpoint pause slows it only as much as it slows the run.
RATE_WINDOW_S = 600.0


@dataclass(frozen=True)
class Estimate:
    """Progress towards a target and the time left at the current rate."""

    target_kind: str | None  # "steps", "tokens", "epochs" or None (no target)
    target: float | None
    done: float | None
    fraction: float | None  # done / target, 0..1
    eta_s: float | None  # seconds to completion at the current rate


def estimate(
    *,
    step: int | None,
    rate_steps_s: float | None,
    target_steps: int | None = None,
    target_tokens: int | None = None,
    target_epochs: float | None = None,
    tokens_per_step: float | None = None,
    epoch: int | None = None,
    epoch_first_step: int | None = None,
    steps_per_epoch: float | None = None,
    ended: bool = False,
) -> Estimate:
    """Progress and ETA of one job from its latest step and recent step rate (see the module doc)."""
    kind: str | None = None
    target = done = remaining_steps = None
    if target_steps and step is not None:
        kind, target, done = "steps", float(target_steps), float(step + 1)
        remaining_steps = target - done
    elif target_tokens and step is not None and tokens_per_step:
        kind, target, done = "tokens", float(target_tokens), float(step + 1) * tokens_per_step
        remaining_steps = (target - done) / tokens_per_step
    elif target_epochs and epoch is not None and step is not None and steps_per_epoch:
        into = 0.0 if epoch_first_step is None else (step - epoch_first_step + 1) / steps_per_epoch
        kind, target, done = "epochs", float(target_epochs), epoch + min(1.0, max(0.0, into))
        remaining_steps = (target - done) * steps_per_epoch
    elif target_steps or target_tokens or target_epochs:
        kind = "steps" if target_steps else "tokens" if target_tokens else "epochs"
        target = float(target_steps or target_tokens or target_epochs or 0)
    if kind is None or target is None or done is None:
        return Estimate(kind, target, None, None, None)
    fraction = min(1.0, max(0.0, done / target)) if target > 0 else None
    eta = None
    if not ended and remaining_steps is not None and rate_steps_s and rate_steps_s > 0:
        eta = max(0.0, remaining_steps) / rate_steps_s
    return Estimate(kind, target, done, fraction, eta)


def _amount(value: float, kind: str) -> str:
    if kind == "epochs":
        return f"{value:.2f}".rstrip("0").rstrip(".")
    if abs(value) >= 1e6:
        return f"{value:.3g}"
    return f"{value:,.0f}"


def _duration(seconds: float) -> str:
    s = round(seconds)
    days, s = divmod(s, 86_400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {s:02d}s"
    return f"{s}s"


def describe(target_kind: str | None, target: float | None, done: float | None, eta_s: float | None) -> str:
    """Progress in words, e.g. '1,200 of 5,000 steps (24%), about 1h 20m left at the recent step rate';
    '' without a target."""
    if not target_kind or target is None:
        return ""
    if done is None:
        return f"target {_amount(target, target_kind)} {target_kind}, progress unknown"
    share = f" ({done / target:.0%})" if target > 0 else ""
    text = f"{_amount(done, target_kind)} of {_amount(target, target_kind)} {target_kind}{share}"
    if eta_s is not None:
        text += f", about {_duration(eta_s)} left at the recent step rate"
    return text
