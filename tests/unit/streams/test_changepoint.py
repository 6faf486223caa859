"""Change detection on each rank's relative speed: mild sustained slowdowns are stragglers within a few windows."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.records import Event
from streams.detectors.changepoint import RelativeSpeedCusum
from tests.unit.streams.builders import T0, step
from tests.unit.streams.test_imbalance import _active, _job, _run

WINDOW_S = 60


def test_the_cusum_alarms_on_the_third_window_of_a_rank_at_0_8() -> None:
    cusum = RelativeSpeedCusum(skip_windows=0)
    state = cusum.new_state()
    for i in range(6):
        assert cusum.update(state, 1.0 + 0.01 * (i % 2), i) is False
    assert state["ref"] == 1.0
    verdicts = [cusum.update(state, 0.8, 10 + i) for i in range(4)]
    assert verdicts == [False, False, True, True]
    assert state["start"] == 10
    assert cusum.update(state, 0.99, 20) is False and state["s"] == 0.0


def test_warm_up_windows_teach_the_cusum_nothing() -> None:
    cusum = RelativeSpeedCusum(skip_windows=2)
    state = cusum.new_state()
    for i, x in enumerate([0.5, 0.5, 1.0, 1.0, 1.0, 0.99, 1.0, 1.0]):
        assert cusum.update(state, x, i) is False
    assert state["ref"] == 1.0


def test_a_rank_faster_than_its_peers_falling_back_to_their_pace_is_not_slow() -> None:
    cusum = RelativeSpeedCusum(skip_windows=0)
    state = cusum.new_state()
    for i in range(6):
        cusum.update(state, 1.09, i)
    assert state["ref"] == 1.0
    assert not any(cusum.update(state, 0.97, 10 + i) for i in range(50))


def test_a_rank_persistently_a_few_percent_slower_is_its_own_normal() -> None:
    cusum = RelativeSpeedCusum(skip_windows=0)
    state = cusum.new_state()
    for i in range(6):
        cusum.update(state, 0.9, i)
    assert not any(cusum.update(state, 0.88 + 0.02 * (i % 3), 10 + i) for i in range(100))


def _slow_from(factor: float, from_s: int, seconds: int) -> list[Event]:
    return _job(seconds, {"compute": 0.85 * factor}, fault_from=from_s)


def test_a_rank_1_25x_slow_is_a_straggler_within_three_windows_the_threshold_alone_never_fires() -> None:
    events = _slow_from(1.25, 300, 700)
    _, findings, _ = _run(events)
    flagged = _active(findings, "straggler")
    assert flagged and {f.rank for f in flagged} == {3}
    first = flagged[0]
    assert first.ts - (T0 + 300_000) <= 3 * WINDOW_S * 1000
    assert first.observed is not None and first.observed > 0.75  # the old threshold would not fire
    assert "change point" in first.summary
    assert T0 + 240_000 <= (first.since or 0) <= T0 + 300_000
    _, findings, _ = _run(events, {"cusum_threshold": 1e9})
    assert _active(findings, "straggler") == []


def test_a_rank_1_2x_slow_is_caught_too() -> None:
    _, findings, _ = _run(_slow_from(1.2, 300, 700))
    flagged = _active(findings, "straggler")
    assert flagged and flagged[0].rank == 3 and flagged[0].ts - (T0 + 300_000) <= 4 * WINDOW_S * 1000


def test_a_mild_straggler_resolves_when_the_rank_keeps_pace_again() -> None:
    events = _slow_from(1.25, 300, 900)
    for e in events:
        if e.type == "StepCompleted" and e.record["rank"] == 3 and e.record["ts"] >= T0 + 600_000:
            e.record.update(step("job-1", 3, e.record["step"], e.record["ts"]).record)
    _, findings, _ = _run(events)
    cleared = [f for f in findings if f.rule == "straggler" and not f.active]
    assert _active(findings, "straggler") and cleared and cleared[0].ts > T0 + 600_000


def test_noisy_healthy_jobs_raise_no_straggler() -> None:
    """Per-step jitter of +-20 %, one rank persistently 6 % slower, one 4 % faster, for 40 minutes."""
    rng = random.Random(7)
    bias = {2: 1.06, 5: 0.96}
    events = _job(2400)
    for e in events:
        if e.type == "StepCompleted":
            r = e.record
            factor = bias.get(r["rank"], 1.0) * rng.uniform(0.8, 1.2)
            for seg in ("forward_s", "backward_s", "optimizer_s"):
                r[seg] *= factor
    _, findings, _ = _run(events)
    assert [f.summary for f in findings if f.active] == []


@settings(max_examples=200, deadline=None)
@given(
    learn=st.lists(st.floats(0.5, 1.5), min_size=6, max_size=6),
    rest=st.lists(st.floats(0.0, 2.0), max_size=40),
)
def test_the_cusum_alarms_only_after_a_shortfall_beyond_its_slack_and_its_state_stays_json(
    learn: list[float], rest: list[float]
) -> None:
    cusum = RelativeSpeedCusum(skip_windows=0)
    state = cusum.new_state()
    for i, x in enumerate(learn):
        assert cusum.update(state, x, i) is False
    ref, k = state["ref"], state["k"]
    assert ref <= 1.0
    for i, x in enumerate(rest):
        alarm = cusum.update(state, x, 100 + i)
        if alarm:
            assert x < ref - k  # an alarm is never raised or kept on a window within the slack
        assert state["s"] >= 0.0
    assert json.loads(json.dumps(state)) == state
