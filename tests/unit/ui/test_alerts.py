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


def test_a_refresh_at_the_resolutions_own_time_does_not_make_a_resolved_alert_firing() -> None:
    """The stall's last refresh and its resolution share one time (seen in job_stall): the alert
    is resolved, in the recording's fold as in the store's query (`_LATEST`)."""
    from ui.alerts import latest_order
    from ui.pages.recording import alert_rows

    base = {"alert_id": "a1", "rule": "job_stall", "severity": "critical", "category": "platform"}
    base |= {"team": "t", "receiver": "r", "starts_at": 1_000, "fingerprint": "job_stall/j"}
    fired = {**base, "ts": 1_000, "status": "firing", "summary": "no progress for 61 s", "ends_at": None}
    resolved = {**base, "ts": 9_000, "status": "resolved", "summary": "steps again", "ends_at": 9_000}
    refresh = {**fired, "ts": 9_000, "summary": "no progress for 481 s"}
    assert max([fired, refresh, resolved], key=latest_order) is resolved  # the engine's order
    (row,) = alert_rows({"a1": [fired, refresh, resolved]}, 0, 10_000)
    assert (row["status"], row["resolution"], row["ends_ms"]) == ("resolved", "steps again", 9_000)
    assert row["summary"] == "no progress for 481 s"
