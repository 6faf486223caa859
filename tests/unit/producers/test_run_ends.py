"""`ranksight simulate --to-kafka` ends the jobs its scenario left running (issue 24.3)."""

from __future__ import annotations

from producers.simulator import load_scenario, run_ends, simulate
from schemas.codec import Codec
from schemas.eventtime import event_ts


def test_only_the_jobs_still_running_get_an_end_just_after_the_last_event() -> None:
    """throughput_regression runs four jobs in a row; the first three complete, the last runs to the
    scenario's end: it alone is ended, 1 ms after the last event, with its run and team."""
    sc = load_scenario("throughput_regression").with_overrides(duration=17 * 60)
    events = list(simulate(sc, seed=0).events())
    ended = {
        e.record["job_id"] for e in events if e.type == "JobStateChanged" and e.record["state"] == "completed"
    }
    assert ended == {"finetune-7b-0101", "finetune-7b-0102", "finetune-7b-0103"}
    (end,) = run_ends(events)
    started = next(
        e.record for e in events if e.type == "JobStarted" and e.record["job_id"] == "finetune-7b-0104"
    )
    assert end.type == "JobStateChanged" and end.record["job_id"] == "finetune-7b-0104"
    assert end.record["state"] == "completed" and end.record["reason"] == "simulation ended"
    assert end.record["ts"] == max(event_ts(e) for e in events) + 1
    assert (end.record["run_id"], end.record["team"]) == (started["run_id"], started["team"])
    Codec().decode(Codec().encode(end))  # a valid record of the schema
    assert run_ends([*events, end]) == []  # ended once


def test_a_job_that_failed_is_not_ended_again_and_no_events_need_no_end() -> None:
    events = list(simulate(load_scenario("healthy").with_overrides(duration=60), seed=0).events())
    (end,) = run_ends(events)
    failed = end.record | {"state": "failed"}
    from schemas.records import Event

    assert run_ends([*events, Event("JobStateChanged", failed)]) == []
    assert run_ends([]) == []
