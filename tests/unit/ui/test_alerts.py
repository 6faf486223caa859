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
    assert transitions(records) == [fired, resolved, refired]
    assert [t["ts"] for t in transitions(records, lambda ms: ms // 1000)] == [1, 2, 3]
