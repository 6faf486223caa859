"""The readiness rules: failed restore tests alert at once; the newest restore-tested checkpoint stays young."""

from __future__ import annotations

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import T0, job_started, job_state
from tests.unit.streams.sections import SectionRules

JOB = "job-1"
HOUR = 3_600_000


def restore(ts: int, cid: str, *, passed: bool, **extra: object) -> Event:
    record = {
        "ts": ts, "job_id": JOB, "run_id": "r1", "checkpoint_id": cid, "step": 100,
        "restored_model": True, "restored_optimizer": passed, "restored_scheduler": True,
        "restored_data_position": True, "steps_resumed": 10 if passed else 0, "passed": passed,
        "error": None if passed else "KeyError: 'optimizer'", **extra,
    }  # fmt: skip
    return Event("RestoreTest", record)


def written(ts: int, cid: str) -> Event:
    return Event(
        "CheckpointEvent",
        {"ts": ts, "job_id": JOB, "run_id": "r1", "checkpoint_id": cid, "step": 100, "phase": "completed"},
    )


def drive(
    det: Detector, events: list[Event], until: int | None = None, every: int = 600_000
) -> list[Finding]:
    out: list[Finding] = []
    last = T0
    for ev in events:
        det.topology.observe(ev)
        out += det.observe(ev)
        out += det.advance(ev.record["ts"])
        last = ev.record["ts"]
    for wm in range(last + every, (until or last) + 1, every):
        out += det.advance(wm)
    return out


def test_a_failed_restore_test_fires_at_once_naming_what_failed_and_resolves_with_a_passing_one() -> None:
    det = SectionRules("readiness", Topology())
    found = drive(
        det, [job_started(JOB, T0), written(T0 + 1000, "c1"), restore(T0 + 60_000, "c1", passed=False)]
    )
    fired = [f for f in found if f.rule == "restore_test_failed"]
    assert (
        len(fired) == 1 and fired[0].active and fired[0].ts == T0 + 60_000 and fired[0].severity == "critical"
    )
    assert "not restored: optimizer" in fired[0].summary and "KeyError" in fired[0].summary
    later = drive(det, [restore(T0 + 120_000, "c2", passed=True)])
    assert [(f.rule, f.active) for f in later] == [("restore_test_failed", False)]


def test_stale_when_the_newest_restore_tested_checkpoint_is_older_than_the_job_policy() -> None:
    det = SectionRules("readiness", Topology())
    events = [job_started(JOB, T0, restore_test_max_age_s=4 * 3600.0), written(T0 + HOUR, "c1"),
              restore(T0 + 2 * HOUR, "c1", passed=True)]  # fmt: skip
    found = [f for f in drive(det, events, until=T0 + 6 * HOUR) if f.rule == "restore_test_stale"]
    # The checkpoint was written at 1 h, so it is 4 h old at 5 h (not at 6 h after the test).
    assert found and found[0].active and found[0].since == T0 + 5 * HOUR
    assert T0 + 5 * HOUR < found[0].ts <= T0 + 5 * HOUR + 600_000
    fresh = drive(det, [written(T0 + 6 * HOUR + 1, "c2"), restore(T0 + 6 * HOUR + 2, "c2", passed=True)])
    assert [(f.rule, f.active) for f in fresh] == [("restore_test_stale", False)]


def test_without_a_policy_the_default_applies_from_the_job_start_and_only_while_it_runs() -> None:
    det = SectionRules("readiness", Topology(), {"restore_test_max_age_s": 2 * 3600.0})
    found = drive(det, [job_started(JOB, T0)], until=T0 + 3 * HOUR)
    assert [f.active for f in found if f.rule == "restore_test_stale"][:1] == [True]
    ended = drive(det, [job_state(JOB, T0 + 3 * HOUR + 1, "preempted")])
    assert [(f.rule, f.active) for f in ended] == [("restore_test_stale", False)]


def test_a_passing_restore_test_never_alerts_and_state_round_trips() -> None:
    det = SectionRules("readiness", Topology())
    found = drive(
        det,
        [job_started(JOB, T0), written(T0 + 1000, "c1"), restore(T0 + 5000, "c1", passed=True)],
        until=T0 + 24 * HOUR,
    )
    assert found == []
    again = SectionRules("readiness", det.topology)
    again.from_bytes(det.to_bytes())
    assert again.to_bytes() == det.to_bytes()


def test_the_engine_routes_a_failed_restore_test_to_the_owning_team() -> None:
    engine = DetectionEngine()
    alerts = [
        a
        for e in [job_started(JOB, T0, team="vision"), restore(T0 + 1000, "c1", passed=False)]
        for a in engine.process(e)
    ]
    alerts += engine.finish()
    fired = [a.record for a in alerts if a.type == "Alert" and a.record["rule"] == "restore_test_failed"]
    # restore_test_failed is a platform alert: the platform team is paged, the job's team informed.
    assert [(a["status"], a["team"], a["receiver"]) for a in fired] == [
        ("firing", "platform", "platform-pager"),
        ("firing", "vision", "multimodal-chat"),
    ]


def test_a_change_of_code_runtime_config_or_format_since_the_passing_test_makes_it_due() -> None:
    """Issue 35.4: a restore proven for other code or another checkpoint format proves nothing now."""
    det = SectionRules("readiness", Topology())
    tested = {
        "code_version": "abc123",
        "runtime_version": "torch 2.4",
        "config_hash": "cfg1",
        "checkpoint_format": "dcp-1",
    }
    events = [
        job_started(JOB, T0, **tested),
        written(T0 + 1000, "c1"),
        restore(T0 + 5000, "c1", passed=True, **tested),
    ]
    assert [f for f in drive(det, events, until=T0 + HOUR) if f.rule == "restore_test_stale"] == []
    # The job restarts with new code and a new checkpoint format: due at once, naming both changes.
    upgraded = {**tested, "code_version": "def456", "checkpoint_format": "dcp-2"}
    found = drive(det, [job_started(JOB, T0 + HOUR + 1, **upgraded)])
    [due] = [f for f in found if f.rule == "restore_test_stale"]
    assert due.active and "code version 'abc123' -> 'def456'" in due.summary
    assert "checkpoint format 'dcp-1' -> 'dcp-2'" in due.summary and "configuration" not in due.summary
    # A passing test restored with what the job runs now resolves it.
    fixed = drive(
        det, [written(T0 + HOUR + 2000, "c2"), restore(T0 + HOUR + 3000, "c2", passed=True, **upgraded)]
    )
    assert [(f.rule, f.active) for f in fixed] == [("restore_test_stale", False)]


def test_a_field_the_test_did_not_record_is_not_a_change() -> None:
    """A restore test run without --code-version compares nothing on that field (no page per job)."""
    det = SectionRules("readiness", Topology())
    events = [
        job_started(JOB, T0, code_version="abc123", config_hash="cfg1"),
        written(T0 + 1000, "c1"),
        restore(T0 + 5000, "c1", passed=True, config_hash="cfg1"),
    ]
    assert [f for f in drive(det, events, until=T0 + HOUR) if f.rule == "restore_test_stale"] == []
