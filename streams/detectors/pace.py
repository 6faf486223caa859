"""A job's recent pace from the steps the engine reads: what an alert's progress and ETA need.

The Topology keeps one `JobPace` per job, fed by every StepCompleted (the rank stage; the job
stage reads the leader rank's) and every RankSummary (the job stage): the latest step of the
current run and when it came, one point per `SAMPLE_MS` of the run's last `RATE_WINDOW_S` (the
step rate over that window, as `ranksight jobs` measures it from the stored steps), the tokens one
rank processes per step (smoothed) and the current epoch with the length of the last full one.
`estimate` turns them, with the job's target (JobStarted.target_*), into `schemas.progress`'s
Estimate: the same arithmetic as the job page. Pure and event-time only: a replay gives the same.
"""

from __future__ import annotations

from typing import Any

from schemas.progress import RATE_WINDOW_S, Estimate, estimate

__all__ = ["SAMPLE_MS", "JobPace"]

SAMPLE_MS = 10_000  # one rate point per this much event time: at most 61 points per job
_WINDOW_MS = int(RATE_WINDOW_S * 1000)
_TOKENS_ALPHA = 0.05  # smoothing of the tokens one rank processes per step


class JobPace:
    """One job's latest step, recent step rate, tokens per rank-step and epochs (one run)."""

    __slots__ = ("epoch", "epoch_first", "epoch_len", "points", "run_id", "step", "tokens", "ts")

    def __init__(self, run_id: str = "") -> None:
        self.run_id = run_id
        self.step: int | None = None  # latest step of the run
        self.ts: int | None = None  # when it was first reported (event time, ms)
        self.points: list[list[int]] = []  # [ts, step]: the rate's window, one per SAMPLE_MS
        self.tokens: float | None = None  # tokens one rank processes per step
        self.epoch: int | None = None  # current epoch
        self.epoch_first: int | None = None  # first step seen of the current epoch
        self.epoch_len: int | None = None  # steps of the last full epoch

    def step_done(self, step: int, ts: int) -> None:
        """A rank finished `step` at `ts`: the first report of a newer step moves the pace on."""
        if self.step is not None and step <= self.step:
            return
        self.step, self.ts = step, ts
        points = self.points
        cut = ts - _WINDOW_MS
        while points and points[0][0] < cut:
            points.pop(0)
        if not points or ts - points[-1][0] >= SAMPLE_MS:
            points.append([ts, step])

    def tokens_done(self, tokens: float) -> None:
        """Tokens one rank processed in one step (smoothed over the recent steps)."""
        if self.tokens is None:
            self.tokens = float(tokens)
        else:
            self.tokens += _TOKENS_ALPHA * (tokens - self.tokens)

    def epoch_at(self, epoch: int, step: int) -> None:
        """A step of `epoch`: a new epoch closes the previous one (its length in steps)."""
        if self.epoch is None or epoch > self.epoch:
            if self.epoch is not None and self.epoch_first is not None and epoch == self.epoch + 1:
                self.epoch_len = step - self.epoch_first
            self.epoch, self.epoch_first = epoch, step
        elif epoch == self.epoch and self.epoch_first is not None and step < self.epoch_first:
            self.epoch_first = step

    def rate(self) -> float | None:
        """Steps per second over the run's last RATE_WINDOW_S of steps; None before two points."""
        if not self.points or self.step is None or self.ts is None:
            return None
        first_ts, first_step = self.points[0]
        span_s = (self.ts - first_ts) / 1000
        if span_s <= 0 or self.step <= first_step:
            return None
        return (self.step - first_step) / span_s

    def ended(self) -> None:
        """The job ended: its rate no longer matters (bounded state), its progress stays."""
        self.points = []

    def estimate(
        self,
        *,
        target_steps: int | None,
        target_tokens: int | None,
        target_epochs: float | None,
        ranks: int,
        ended: bool,
    ) -> Estimate:
        """Progress towards the target and the ETA at the recent rate (`schemas.progress.estimate`)."""
        return estimate(
            step=self.step,
            rate_steps_s=self.rate(),
            target_steps=target_steps,
            target_tokens=target_tokens,
            target_epochs=target_epochs,
            tokens_per_step=self.tokens * ranks if self.tokens and ranks > 0 else None,
            epoch=self.epoch,
            epoch_first_step=self.epoch_first,
            steps_per_epoch=float(self.epoch_len) if self.epoch_len else None,
            ended=ended,
        )

    def state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> JobPace:
        """Rebuild from `state()`."""
        pace = cls()
        for name in cls.__slots__:
            if name in state:
                setattr(pace, name, state[name])
        pace.points = [list(p) for p in pace.points]
        return pace
