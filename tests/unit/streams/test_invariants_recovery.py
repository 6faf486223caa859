"""The recovery rules: failed (`checkpoint_failed`), stuck (`checkpoint_stuck`) and stale (`checkpoint_stale`) checkpoints."""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology
from streams.detectors.checkpoint_failed import CheckpointFailedDetector
from streams.detectors.checkpoint_stale import CheckpointStaleDetector
from streams.detectors.checkpoint_stuck import CheckpointStuckDetector
from tests.unit.streams.builders import T0, checkpoint, job_started, job_state
from tests.unit.streams.sections import SectionRules

JOB = "job-1"
MIN = 60_000


def drive(det: Detector, events: list[Event], until: int | None = None, every: int = 10_000) -> list[Finding]:
    """Feed events in order, advancing the watermark to each event and then in steps to `until`."""
    out: list[Finding] = []
    last = T0
    for ev in events:
        det.topology.observe(ev)
        out += det.observe(ev)
        out += det.advance(ev.record["ts"])
        last = ev.record["ts"]
    if until is not None:
        for wm in range(last + every, until + 1, every):
            out += det.advance(wm)
    return out


def rule(findings: list[Finding], name: str) -> list[Finding]:
    return [f for f in findings if f.rule == name]


def started(**policy: Any) -> Event:
    return job_started(JOB, T0, **policy)


def test_failed_checkpoint_fires_at_once_and_resolves_with_the_next_completed_one() -> None:
    events = [
        started(),
        checkpoint(JOB, T0 + 5 * MIN, "started", ckpt="c1"),
        checkpoint(JOB, T0 + 6 * MIN, "failed", ckpt="c1"),
        checkpoint(JOB, T0 + 10 * MIN, "started", ckpt="c2"),
        checkpoint(JOB, T0 + 11 * MIN, "completed", ckpt="c2"),
    ]
    events[2].record["error"] = "Disk quota exceeded"
    found = rule(drive(CheckpointFailedDetector(Topology()), events), "checkpoint_failed")
    assert [(f.active, f.ts) for f in found] == [(True, T0 + 6 * MIN), (False, T0 + 11 * MIN)]
    assert "Disk quota exceeded" in found[0].summary and found[0].key == (JOB,)
    assert found[0].category == "platform" and found[0].sustain_ms == 0


def test_checkpoint_not_completed_within_the_job_timeout_is_stuck_until_it_fails() -> None:
    events = [started(checkpoint_timeout_s=300.0), checkpoint(JOB, T0 + MIN, "started", ckpt="c1")]
    det = CheckpointStuckDetector(Topology())
    found = rule(drive(det, events, until=T0 + 7 * MIN), "checkpoint_stuck")
    assert found and found[0].active and found[0].key == (JOB, "c1")
    assert T0 + MIN + 300_000 < found[0].ts <= T0 + MIN + 310_000
    later = rule(drive(det, [checkpoint(JOB, T0 + 16 * MIN, "failed", ckpt="c1")]), "checkpoint_stuck")
    assert [f.active for f in later] == [False]


def test_checkpoint_timeout_defaults_to_thirty_minutes_without_a_job_policy() -> None:
    events = [started(checkpoint_timeout_s=None), checkpoint(JOB, T0 + MIN, "started", ckpt="c1")]
    found = rule(drive(CheckpointStuckDetector(Topology()), events, until=T0 + 40 * MIN), "checkpoint_stuck")
    assert found[0].ts > T0 + 31 * MIN


def test_a_long_checkpoint_that_completes_in_time_raises_nothing() -> None:
    events = [
        started(checkpoint_timeout_s=900.0, checkpoint_max_age_s=3600.0),
        checkpoint(JOB, T0 + MIN, "started", ckpt="c1"),
        checkpoint(JOB, T0 + 11 * MIN, "completed", ckpt="c1"),
        checkpoint(JOB, T0 + 12 * MIN, "verified", ckpt="c1"),
    ]
    assert drive(SectionRules("recovery", Topology()), events, until=T0 + 30 * MIN) == []


def test_stale_when_no_verified_checkpoint_within_the_policy_age_counted_from_job_start() -> None:
    events = [started(checkpoint_max_age_s=600.0)]
    det = CheckpointStaleDetector(Topology())
    found = rule(drive(det, events, until=T0 + 15 * MIN), "checkpoint_stale")
    assert found[0].active and T0 + 10 * MIN < found[0].ts <= T0 + 10 * MIN + 10_000
    assert found[0].expected == 600.0
    after = rule(
        drive(det, [checkpoint(JOB, T0 + 16 * MIN, "verified", ckpt="c9", n=900)]), "checkpoint_stale"
    )
    after += rule(det.advance(T0 + 16 * MIN + 10_000), "checkpoint_stale")
    assert [f.active for f in after] == [False]


def test_stale_is_measured_from_the_latest_verified_checkpoint_not_a_completed_one() -> None:
    events = [
        started(checkpoint_max_age_s=600.0),
        checkpoint(JOB, T0 + 5 * MIN, "verified", ckpt="c1"),
        checkpoint(JOB, T0 + 12 * MIN, "completed", ckpt="c2"),  # never verified
    ]
    found = rule(drive(CheckpointStaleDetector(Topology()), events, until=T0 + 20 * MIN), "checkpoint_stale")
    assert found[0].active and T0 + 15 * MIN < found[0].ts <= T0 + 15 * MIN + 10_000


def test_jobs_without_a_checkpoint_age_policy_are_never_stale() -> None:
    found = drive(
        CheckpointStaleDetector(Topology()),
        [started(checkpoint_max_age_s=None)],
        until=T0 + 600 * MIN,
        every=60_000,
    )
    assert rule(found, "checkpoint_stale") == []


def test_a_job_that_stops_running_is_no_longer_stale() -> None:
    det = CheckpointStaleDetector(Topology())
    drive(det, [started(checkpoint_max_age_s=600.0)], until=T0 + 12 * MIN)
    found = rule(drive(det, [job_state(JOB, T0 + 13 * MIN, "preempted")]), "checkpoint_stale")
    assert [f.active for f in found] == [False]


def test_rank_level_phases_of_one_checkpoint_count_once() -> None:
    events = [started(checkpoint_timeout_s=300.0)]
    for rank in range(4):
        ev = checkpoint(JOB, T0 + MIN + rank, "started", ckpt="c1")
        ev.record["rank"] = rank
        events.append(ev)
    found = rule(drive(CheckpointStuckDetector(Topology()), events, until=T0 + 7 * MIN), "checkpoint_stuck")
    assert len({f.key for f in found}) == 1
    assert found[0].since == T0 + MIN + 300_000
