"""A job's condition now (ui.facts.job_condition): a state that stops the job wins over its averages."""

from __future__ import annotations

from ui.facts import job_condition, without_eta

MIN = 60_000


def _progress(state: str = "running", last: int = 10 * MIN, rate: float | None = 1.0) -> dict:
    return {"state": state, "last_step_ms": last, "rate_steps_s": rate, "eta_s": 3600.0, "finish_ms": 1}


def test_a_firing_stall_or_hang_says_since_the_last_step_and_drops_the_eta() -> None:
    stall = {"status": "firing", "rule": "job_stall", "starts_ms": 11 * MIN}
    c = job_condition(_progress(), [stall], now_ms=11 * MIN)
    assert c == {"kind": "stalled", "state": "running", "since_ms": 10 * MIN, "rule": "job_stall"}
    assert without_eta(_progress(), c)["eta_s"] is None
    hang = {"status": "firing", "rule": "rank_hang", "starts_ms": 11 * MIN}
    assert job_condition(_progress(), [hang], 11 * MIN)["kind"] == "hung"
    resolved = {**stall, "status": "resolved"}
    assert job_condition(_progress(), [resolved], 10 * MIN + 5_000)["kind"] == "running"


def test_an_overdue_heartbeat_is_told_before_any_rule_fires() -> None:
    assert job_condition(_progress(), [], now_ms=10 * MIN + 119_000)["kind"] == "running"
    assert job_condition(_progress(), [], now_ms=10 * MIN + 121_000)["kind"] == "overdue"
    # A slow job (one step per 30 s) is overdue after ten of its intervals, not two minutes.
    assert job_condition(_progress(rate=1 / 30), [], now_ms=10 * MIN + 200_000)["kind"] == "running"
    assert job_condition(_progress(rate=1 / 30), [], now_ms=10 * MIN + 301_000)["kind"] == "overdue"


def test_a_finished_job_is_finished_whatever_fires_or_lags() -> None:
    stall = {"status": "firing", "rule": "job_stall", "starts_ms": 11 * MIN}
    c = job_condition(_progress(state="completed"), [stall], now_ms=100 * MIN)
    assert c["kind"] == "finished" and c["state"] == "completed"
    assert without_eta(_progress(state="completed"), c)["eta_s"] == 3600.0  # its panel's own answer stands
