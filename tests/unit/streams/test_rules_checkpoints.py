"""Checkpoint integrity and retention (issue 23.6): a failed verification, and retention deleting (or about to
delete) the latest verified checkpoint while nothing newer is verified; a tight policy that keeps up is fine."""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology
from streams.detectors.checkpoint_retention import CheckpointRetentionDetector
from streams.detectors.checkpoint_verify_failed import CheckpointVerifyFailedDetector
from tests.unit.streams.builders import T0, checkpoint

JOB = "job-1"
MIN = 60_000


def ck(minute: float, phase: str, n: int, **fields: Any) -> Event:
    ev = checkpoint(JOB, T0 + int(minute * MIN), phase, ckpt=f"ck-{n}", n=n * 100)
    ev.record.update({"retention_keep": None, "deleted": [], **fields})
    return ev


def run(det: Detector, events: list[Event]) -> list[Finding]:
    out: list[Finding] = []
    for ev in events:
        out += det.observe(ev)
    return out


def saved(
    minute: float, n: int, keep: int | None, deleted: list[str], *, verified: bool = True
) -> list[Event]:
    """One checkpoint every few minutes: started, completed 30 s later (retention runs), verified 10 s after."""
    out = [ck(minute, "started", n), ck(minute + 0.5, "completed", n, retention_keep=keep, deleted=deleted)]
    if verified:
        out.append(ck(minute + 0.7, "verified", n, checksum="abc"))
    return out


def test_a_failed_verification_fires_at_once_and_a_later_verified_checkpoint_resolves_it() -> None:
    det = CheckpointVerifyFailedDetector(Topology())
    failed = ck(5.7, "verify_failed", 1, error="checksum mismatch: shard 3 of 8")
    [f] = run(det, [*saved(5, 1, None, [], verified=False), failed])
    assert (f.rule, f.key, f.active, f.severity) == ("checkpoint_verify_failed", (JOB,), True, "critical")
    assert "ck-1" in f.summary and "checksum mismatch: shard 3 of 8" in f.summary and "step 100" in f.summary
    assert f.history and f.history_metric == "failed_verifications"
    [done] = run(det, saved(10, 2, None, []))
    assert done.active is False and "ck-2" in done.summary


def test_retention_about_to_delete_then_deleting_the_latest_verified_checkpoint() -> None:
    det = CheckpointRetentionDetector(Topology())
    assert run(det, saved(5, 1, 2, [])) == []
    assert run(det, saved(10, 2, 2, [], verified=False)) == [], "its verification may still come"
    [risk] = run(det, [ck(15, "started", 3)])  # ck-2 still unverified when the next save starts
    assert risk.active and risk.severity == "warning" and "the next one to complete deletes" in risk.summary
    assert "ck-1" in risk.summary and "ck-2" in risk.summary
    [gone] = run(det, [ck(15.5, "completed", 3, retention_keep=2, deleted=["ck-1"])])
    assert (
        gone.active
        and gone.severity == "critical"
        and "deleted the latest verified checkpoint" in gone.summary
    )
    [done] = run(det, [ck(15.7, "verified", 3)])
    assert done.active is False


def test_a_tight_policy_whose_checkpoints_are_verified_in_time_and_a_normal_rotation_raise_nothing() -> None:
    tight = CheckpointRetentionDetector(Topology())
    events = saved(5, 1, 1, [])
    for n in range(2, 6):
        events += saved(5 * n, n, 1, [f"ck-{n - 1}"])
    assert run(tight, events) == []
    rotation = CheckpointRetentionDetector(Topology())
    events = saved(5, 1, 3, [])
    for n in range(2, 8):
        events += saved(5 * n, n, 3, [f"ck-{n - 3}"] if n > 3 else [])
    assert run(rotation, events) == []


def test_a_failed_verification_of_a_newer_checkpoint_puts_the_verified_one_at_risk() -> None:
    det = CheckpointRetentionDetector(Topology())
    run(det, saved(5, 1, 2, []))
    out = run(det, [*saved(10, 2, 2, [], verified=False), ck(10.7, "verify_failed", 2, error="bad")])
    assert out and out[-1].active and out[-1].severity == "warning"
