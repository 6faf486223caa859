"""The alert page's status history: one row per transition, not one per routed copy."""

from __future__ import annotations

from ui.alerts import transitions


def test_a_transition_routed_to_two_teams_is_one_row_and_a_refire_is_another() -> None:
    fired = {"ts": 1_000, "status": "firing", "summary": "rank 13 is a straggler"}
    resolved = {"ts": 2_000, "status": "resolved", "summary": "rank 13 keeps pace again"}
    refired = {"ts": 3_000, "status": "firing", "summary": "rank 13 is a straggler"}
    records = [
        {**fired, "team": "llm-pretrain"},
        {**fired, "team": "platform"},
        {**resolved, "team": "llm-pretrain"},
        {**resolved, "team": "platform"},
        {**refired, "team": "platform"},
    ]
    assert transitions(records) == [
        {**fired, "updated": 1_000},
        {**resolved, "updated": 2_000},
        {**refired, "updated": 3_000},
    ]
    assert [t["ts"] for t in transitions(records, lambda ms: ms // 1000)] == [1, 2, 3]


def test_refreshes_while_firing_are_one_row_dated_when_the_alert_began() -> None:
    """A store keeps only the newest firing record once merged; a recording keeps every refresh:
    both give one firing row dated at starts_at, saying the newest summary and when it was written."""
    first = {"ts": 10_000, "starts_at": 10_000, "status": "firing", "summary": "no progress for 61 s"}
    refresh = {"ts": 190_000, "starts_at": 10_000, "status": "firing", "summary": "no progress for 241 s"}
    resolved = {"ts": 250_000, "starts_at": 10_000, "status": "resolved", "summary": "steps again"}
    want = [
        {"ts": 10_000, "status": "firing", "summary": "no progress for 241 s", "updated": 190_000},
        {"ts": 250_000, "status": "resolved", "summary": "steps again", "updated": 250_000},
    ]
    assert transitions([first, refresh, resolved]) == want  # a recording
    assert transitions([refresh, resolved]) == want  # a merged store
