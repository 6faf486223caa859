"""A job's pace (issue 23.1): progress towards its target and the ETA at its recent step rate, as alerts carry it."""

from __future__ import annotations

import pytest

from schemas.codec import Codec
from schemas.records import Event
from streams.alerting.lifecycle import AlertTracker
from streams.detectors.base import Finding, Topology
from streams.detectors.pace import JobPace
from tests.unit.streams.builders import T0, job_started, job_state, step


def _stepping(topo: Topology, steps: int, *, every_ms: int = 2_000, ranks: int = 4, first: int = 0) -> None:
    for n in range(first, first + steps):
        for rank in range(ranks):
            topo.observe(step("job-1", rank, n, T0 + n * every_ms + rank, tokens=1000))


def test_progress_and_eta_follow_the_steps_at_the_recent_rate() -> None:
    topo = Topology()
    topo.observe(job_started("job-1", T0, target_steps=1000))
    _stepping(topo, 100)  # one step every 2 s
    est = topo.progress("job-1")
    assert est is not None and (est.target_kind, est.target, est.done) == ("steps", 1000.0, 100.0)
    assert est.eta_s == pytest.approx(900 * 2.0, rel=0.01)


def test_the_rate_is_the_last_ten_minutes_of_steps_not_the_whole_run() -> None:
    topo = Topology()
    topo.observe(job_started("job-1", T0, target_steps=10_000))
    _stepping(topo, 600, every_ms=1_000, ranks=1)  # 10 min at 1 step/s ...
    _stepping(topo, 300, every_ms=4_000, ranks=1, first=600)  # ... then 20 min at 0.25 step/s
    pace = topo.pace["job-1"]
    assert pace.rate() == pytest.approx(0.25, rel=0.02)
    assert len(pace.points) <= 61  # one point per 10 s of the window


def test_tokens_and_epoch_targets_use_tokens_per_step_over_ranks_and_the_last_full_epoch() -> None:
    topo = Topology()
    topo.observe(job_started("job-1", T0, world_size=4, target_tokens=4_000_000))
    _stepping(topo, 100)  # 1000 tokens per rank-step, 4 ranks: 4000 per step
    est = topo.progress("job-1")
    assert est is not None and est.target_kind == "tokens" and est.done == pytest.approx(400_000.0)
    assert est.eta_s == pytest.approx((4_000_000 - 400_000) / 4000 * 2.0, rel=0.01)
    pace = JobPace()
    for n in range(0, 75):
        pace.step_done(n, T0 + n * 1000)
        pace.epoch_at(n // 30, n)
    est = pace.estimate(target_steps=None, target_tokens=None, target_epochs=4, ranks=1, ended=False)
    assert est.target_kind == "epochs" and est.done == pytest.approx(2.5)  # epoch 2, 15 of 30 steps
    assert est.eta_s == pytest.approx(1.5 * 30, rel=0.01)


def test_no_target_no_eta_and_an_ended_job_has_progress_but_no_eta() -> None:
    topo = Topology()
    topo.observe(job_started("job-1", T0))
    _stepping(topo, 20)
    est = topo.progress("job-1")
    assert est is not None and (est.target_kind, est.eta_s) == (None, None)
    topo.observe(job_started("job-2", T0, target_steps=100))
    for n in range(50):
        topo.observe(step("job-2", 0, n, T0 + n * 1000))
    topo.observe(job_state("job-2", T0 + 60_000, "completed"))
    est = topo.progress("job-2")
    assert est is not None and est.done == 50.0 and est.eta_s is None
    assert topo.pace["job-2"].points == []  # bounded: an ended job keeps no rate points


def test_a_new_run_starts_its_own_pace() -> None:
    topo = Topology()
    topo.observe(job_started("job-1", T0, target_steps=1000))
    _stepping(topo, 100)
    topo.observe(job_started("job-1", T0 + 400_000, run_id="job-1-run-2", target_steps=1000))
    assert "job-1" not in topo.pace
    topo.observe(step("job-1", 0, 60, T0 + 410_000, run_id="job-1-run-2"))
    pace = topo.pace["job-1"]
    assert (pace.run_id, pace.step, pace.rate()) == ("job-1-run-2", 60, None)


def test_the_pace_survives_a_topology_snapshot_and_old_snapshots_load_without_it() -> None:
    topo = Topology()
    topo.observe(job_started("job-1", T0, target_steps=1000))
    _stepping(topo, 100)
    clone = Topology.from_state(topo.state())
    assert clone.progress("job-1") == topo.progress("job-1")
    old = topo.state()
    del old["pace"]
    for job in old["jobs"].values():
        for name in ("target_steps", "target_tokens", "target_epochs"):
            del job[name]
    restored = Topology.from_state(old)
    est = restored.progress("job-1")
    assert est is not None and est.target_kind is None and restored.pace == {}


def test_rank_summaries_move_the_pace_in_the_job_stage() -> None:
    topo = Topology()
    topo.observe(job_started("job-1", T0, world_size=2, target_steps=1000))
    for b in range(20):
        for rank in range(2):
            topo.observe(
                Event(
                    "RankSummary",
                    {
                        "ts": T0 + (b + 1) * 5_000,
                        "job_id": "job-1",
                        "run_id": "job-1-run-1",
                        "rank": rank,
                        "steps": 5,
                        "last_step": 5 * b + 4,
                        "last_step_ts": T0 + (b + 1) * 5_000 - 100,
                        "tokens": 5_000,
                    },
                )
            )
    est = topo.progress("job-1")
    assert est is not None and est.done == 100.0 and est.eta_s == pytest.approx(900.0, rel=0.01)


def test_every_job_alert_carries_target_done_and_eta_and_encodes() -> None:
    topo = Topology()
    topo.observe(job_started("job-1", T0, target_steps=1000))
    _stepping(topo, 100)
    tracker = AlertTracker()
    finding = Finding("straggler", ("job-1", "3"), True, T0 + 200_000, job_id="job-1", rank=3, summary="s")
    (alert,) = tracker.observe(finding, topo)
    assert (alert["target_kind"], alert["target"], alert["target_done"]) == ("steps", 1000.0, 100.0)
    assert alert["eta_s"] == pytest.approx(1800.0, rel=0.01)
    Codec().encode(Event("Alert", alert))
    node_only = Finding("telemetry_missing", ("node-01",), True, T0 + 200_000, node="node-01", summary="s")
    (alert,) = tracker.observe(node_only, topo)
    assert (alert["target_kind"], alert["target"], alert["target_done"], alert["eta_s"]) == (None,) * 4
