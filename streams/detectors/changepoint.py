"""Change detection on a rank's relative speed: a one-sided CUSUM against the rank's own normal.

A threshold on the straggler score (job median busy time / rank busy time) only catches a rank
once it is clearly slow (below 0.75: 1.33x). A GPU that degrades slowly runs 1.2-1.3x slow for
minutes first. Minder and Greyhound catch those with change detection on per-rank speed; this is
the classic tabular CUSUM (Page, 1954) on the per-window score:

    S_t = max(0, S_{t-1} + (ref - x_t - k))        alarm when S_t >= h

`ref` is the rank's own normal score, the median of its first `learn_windows` scored windows
after `skip_windows` of warm-up,
capped at 1 (the job median: a rank faster than its peers that falls back to their pace is not
slow), so a rank that is persistently a few percent slower than its peers (a slower PCIe slot,
an older card) is its own reference and never accumulates. `k` (slack) is the drift tolerated
forever and `h` the evidence needed: with k = 0.08 and h = 0.25 a rank at 0.8 (1.25x slow)
alarms on its third window, while per-window jitter and the slow +-10% wander of real jobs
(Alibaba PAI traces) stay below the slack. Both
are widened to `sigma_slack x sigma` and `sigma_threshold x sigma` when the rank's learned scores
are noisier than that (robust sigma, MAD-based), so noisy healthy jobs stay quiet.

Before an alarm a good window only lowers the sum (one lucky window does not hide a slow rank);
in alarm, the alarm clears once `clear_after` windows in a row (default 1) are back within `k` of
`ref` (the sum is reset). `max_step` (default: none) caps what one update adds to the sum, so an
alarm needs at least `h / (max_step)` updates however far one outlier falls: fed per 5 s summary
bucket rather than per 60 s window, a single odd bucket (a step that spanned an evaluation, a
bucket boundary that split a step) never alarms alone. The state is one small JSON-able dict per
rank; everything is pure arithmetic, deterministic under replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streams.detectors.stats import MAD_TO_SIGMA, mad, median

__all__ = ["RelativeSpeedCusum"]


@dataclass(frozen=True)
class RelativeSpeedCusum:
    """The CUSUM rule with its parameters; per-rank state lives in plain dicts (`new_state`)."""

    skip_windows: int = 2
    learn_windows: int = 6
    slack: float = 0.08
    threshold: float = 0.25
    sigma_slack: float = 1.5
    sigma_threshold: float = 6.0
    max_step: float | None = None  # most one update adds to the sum (None: no cap)
    clear_after: int = 1  # updates in a row within the slack that clear an alarm

    @staticmethod
    def new_state() -> dict[str, Any]:
        """State of a rank seen for the first time (learning its normal)."""
        return {
            "skip": 0,
            "learn": [],
            "ref": None,
            "k": None,
            "h": None,
            "s": 0.0,
            "start": None,
            "alarm": False,
        }

    def update(self, state: dict[str, Any], score: float, end: int) -> bool:
        """Take one window's score (window ending at `end`); True while the rank is in alarm."""
        if state["ref"] is None:
            if state.get("skip", 0) < self.skip_windows:
                state["skip"] = state.get("skip", 0) + 1  # warm-up windows teach nothing
                return False
            state["learn"] = [*state["learn"], round(score, 6)]
            if len(state["learn"]) >= self.learn_windows:
                ref = median(state["learn"])
                spread = mad(state["learn"], ref)
                assert ref is not None and spread is not None
                sigma = MAD_TO_SIGMA * spread
                state.update(
                    ref=min(ref, 1.0),
                    k=max(self.slack, self.sigma_slack * sigma),
                    h=max(self.threshold, self.sigma_threshold * sigma),
                    learn=[],
                )
            return False
        ref, k, h = state["ref"], state["k"], state["h"]
        step = ref - score - k
        if self.max_step is not None:
            step = min(step, self.max_step)
        if state["alarm"]:
            if score >= ref - k:
                state["ok"] = state.get("ok", 0) + 1
                if state["ok"] >= self.clear_after:
                    # Back within the tolerated drift: the alarm and its evidence are gone.
                    state.update(s=0.0, start=None, alarm=False, ok=0)
                    return False
                return True
            state["ok"] = 0
            state["s"] = round(min(2 * h, state["s"] + step), 6)
            return True
        if state["s"] == 0.0:
            state["start"] = end
        state["s"] = round(max(0.0, state["s"] + step), 6)
        if state["s"] == 0.0:
            state["start"] = None
        elif state["s"] >= h:
            state["alarm"] = True
        return bool(state["alarm"])

    def describe(self, state: dict[str, Any]) -> str:
        """One clause for an alert: the rank's normal score and how much evidence accumulated."""
        return f"change point: its normal score is {state['ref']:.2f}, cumulative shortfall {state['s']:.2f} >= {state['h']:.2f}"
