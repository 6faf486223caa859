"""The alert state machine: pending -> firing after the sustain period, one firing, resolution."""

from __future__ import annotations

from typing import Any

from schemas.codec import Codec
from schemas.records import Event
from streams.alerting.lifecycle import AlertTracker, alert_id
from streams.detectors.base import Finding, Topology
from tests.unit.streams.builders import T0, job_started, step

KEY = ("job-1", "3")


def _finding(ts: int, active: bool = True, sustain_ms: int = 30_000, **kw: Any) -> Finding:
    return Finding(
        "straggler", KEY, active, ts, job_id="job-1", rank=3, sustain_ms=sustain_ms, summary="s", **kw
    )


def _topology() -> Topology:
    topo = Topology()
    topo.observe(job_started("job-1", T0))
    return topo


def test_a_condition_fires_only_after_its_sustain_period() -> None:
    tracker, topo = AlertTracker(), _topology()
    topo.observe(step("job-1", 0, 42, T0))
    assert tracker.observe(_finding(T0), topo) == []
    assert tracker.observe(_finding(T0 + 29_999), topo) == []
    assert tracker.pending() == ["straggler/job-1/3"]
    fired = tracker.observe(_finding(T0 + 30_000), topo)
    assert [r["status"] for r in fired] == ["firing"]
    assert fired[0]["starts_at"] == T0 and fired[0]["current_step"] == 42 and fired[0]["team"] == "team-a"


def test_a_pending_condition_fires_on_a_watermark_advance_without_new_findings() -> None:
    tracker, topo = AlertTracker(), _topology()
    tracker.observe(_finding(T0), topo)
    assert tracker.advance(T0 + 10_000, topo) == []
    fired = tracker.advance(T0 + 30_000, topo)
    assert len(fired) == 1 and fired[0]["ts"] == T0 + 30_000


def test_a_firing_alert_does_not_fire_again_while_the_condition_holds() -> None:
    tracker, topo = AlertTracker(), _topology()
    out = []
    for i in range(10):
        out += tracker.observe(_finding(T0 + i * 30_000, sustain_ms=0), topo)
        out += tracker.advance(T0 + i * 30_000 + 1, topo)
    assert [r["status"] for r in out] == ["firing"]


def test_an_inactive_finding_resolves_with_ends_at_and_the_same_alert_id() -> None:
    tracker, topo = AlertTracker(), _topology()
    fired = tracker.observe(_finding(T0, sustain_ms=0), topo)
    resolved = tracker.observe(_finding(T0 + 90_000, active=False), topo)
    assert [r["status"] for r in resolved] == ["resolved"]
    assert resolved[0]["ends_at"] == T0 + 90_000
    assert resolved[0]["alert_id"] == fired[0]["alert_id"] == alert_id("straggler/job-1/3", T0)
    assert tracker.firing() == []


def test_a_condition_that_clears_while_pending_leaves_no_alert() -> None:
    tracker, topo = AlertTracker(), _topology()
    tracker.observe(_finding(T0), topo)
    assert tracker.observe(_finding(T0 + 5_000, active=False), topo) == []
    assert tracker.advance(T0 + 60_000, topo) == []


def test_a_new_episode_after_resolution_is_a_new_alert() -> None:
    tracker, topo = AlertTracker(), _topology()
    first = tracker.observe(_finding(T0, sustain_ms=0), topo)
    tracker.observe(_finding(T0 + 1000, active=False), topo)
    second = tracker.observe(_finding(T0 + 5000, sustain_ms=0), topo)
    assert first[0]["alert_id"] != second[0]["alert_id"]


def test_the_end_of_a_job_resolves_its_firing_alerts_and_drops_pending_ones() -> None:
    tracker, topo = AlertTracker(), _topology()
    tracker.observe(_finding(T0, sustain_ms=0), topo)
    tracker.observe(Finding("job_stall", ("job-1",), True, T0, job_id="job-1", sustain_ms=10**9), topo)
    out = tracker.end_job("job-1", T0 + 1000, topo)
    assert [(r["rule"], r["status"], r["ends_at"]) for r in out] == [("straggler", "resolved", T0 + 1000)]
    assert tracker.pending() == [] and tracker.firing() == []


def test_alert_records_carry_the_job_identity_and_encode_with_the_alert_schema() -> None:
    tracker, topo = AlertTracker("https://runbooks.example/"), _topology()
    topo.observe(step("job-1", 0, 7, T0 - 1))
    topo.observe(step("job-1", 1, 7, T0))  # another rank's report of the same step is no progress
    rec = tracker.observe(_finding(T0, sustain_ms=0, history=((T0, 0.5),), suspected_layer="gpu"), topo)[0]
    assert rec["runbook_url"] == "https://runbooks.example/straggler"
    assert (rec["owner"], rec["run_id"], rec["model_version"], rec["workload_family"]) == (
        "alice",
        "job-1-run-1",
        "v1",
        "llama-pretrain",
    )
    assert rec["history"] == [{"ts": T0, "value": 0.5}] and rec["last_progress_ts"] == T0 - 1
    codec = Codec()
    assert codec.decode(codec.encode(Event("Alert", rec))).record["fingerprint"] == "straggler/job-1/3"


def test_tracker_state_round_trips() -> None:
    tracker, topo = AlertTracker(), _topology()
    tracker.observe(_finding(T0, sustain_ms=0), topo)
    tracker.observe(Finding("job_stall", ("job-1",), True, T0, job_id="job-1", sustain_ms=60_000), topo)
    clone = AlertTracker()
    clone.load_state(tracker.state())
    assert clone.state() == tracker.state()
    assert clone.advance(T0 + 60_000, topo) == tracker.advance(T0 + 60_000, topo)


def test_a_window_is_healthy_only_when_no_alert_of_the_job_fired_in_it() -> None:
    tracker, topo = AlertTracker(), _topology()
    assert tracker.job_healthy("job-1", T0)
    tracker.observe(_finding(T0, sustain_ms=0), topo)
    assert not tracker.job_healthy("job-1", T0)
    tracker.observe(_finding(T0 + 60_000, active=False), topo)
    assert not tracker.job_healthy("job-1", T0 + 30_000)
    assert tracker.job_healthy("job-1", T0 + 60_001)


# -- refreshes while firing (issue 34.2) --------------------------------------------------------------


def _stall(ts: int, silent_s: float, **kw: Any) -> Finding:
    """A job_stall finding as the progress rule reports it every second of a stall."""
    fields: dict[str, Any] = {
        "job_id": "job-1",
        "since": T0,
        "observed": silent_s,
        "expected": 60.0,
        "severity": "critical",
        "summary": f"job job-1 made no progress for {silent_s:.0f} s",
        "history_metric": "seconds_without_step",
        "history": ((T0, 0.0), (ts, silent_s)),
        **kw,
    }
    return Finding("job_stall", ("job-1",), True, ts, **fields)


def test_a_firing_stall_is_republished_as_it_grows_once_per_minute_of_event_time() -> None:
    tracker, topo = AlertTracker(), _topology()
    out = []
    for s in range(61, 400):  # a finding every second, as the stall rule reports one
        for record in tracker.observe(_stall(T0 + s * 1000, float(s)), topo):
            out.append((record, tracker.is_refresh(record)))
    records = [r for r, _ in out]
    assert [refresh for _, refresh in out] == [False, True, True, True, True, True]
    # At most one record per minute of event time since the alert's start (T0).
    assert [r["ts"] for r in records] == [T0 + s * 1000 for s in (61, 120, 180, 240, 300, 360)]
    # One alert: the same id, fingerprint and start; its value, summary and history grow with it.
    assert {(r["alert_id"], r["fingerprint"], r["starts_at"], r["status"]) for r in records} == {
        (records[0]["alert_id"], "job_stall/job-1", T0, "firing")
    }
    assert [r["observed"] for r in records] == [61.0, 120.0, 180.0, 240.0, 300.0, 360.0]
    assert records[-1]["summary"] == "job job-1 made no progress for 360 s"
    assert records[-1]["history"][-1] == {"ts": T0 + 360_000, "value": 360.0}
    # The resolution carries the last values the condition had, not the firing's.
    (resolved,) = tracker.observe(Finding("job_stall", ("job-1",), False, T0 + 400_000, job_id="job-1"), topo)
    assert (resolved["status"], resolved["observed"], resolved["alert_id"]) == (
        "resolved",
        399.0,
        records[0]["alert_id"],
    )
    assert not tracker.is_refresh(resolved)


def test_a_refresh_waits_until_something_a_reader_sees_has_moved() -> None:
    tracker, topo = AlertTracker(), _topology()
    history = ((T0, 0.5),)
    assert len(tracker.observe(_finding(T0, sustain_ms=0, observed=2.0, history=history), topo)) == 1
    # The same value (within 10 %), the same layer, no newer history: nothing new to say, however long.
    assert tracker.observe(_finding(T0 + 600_000, sustain_ms=0, observed=2.1, history=history), topo) == []
    # A move of 10 % or more is news, but not sooner than a minute after the last record.
    (moved,) = tracker.observe(_finding(T0 + 660_000, sustain_ms=0, observed=2.3, history=history), topo)
    assert moved["observed"] == 2.3
    assert tracker.observe(_finding(T0 + 700_000, sustain_ms=0, observed=9.0, history=history), topo) == []
    # A new suspected layer or a newer history point is news too.
    (layer,) = tracker.observe(
        _finding(T0 + 720_000, sustain_ms=0, observed=9.0, history=history, suspected_layer="gpu"), topo
    )
    assert layer["suspected_layer"] == "gpu"
    later = ((T0, 0.5), (T0 + 790_000, 0.4))
    (grown,) = tracker.observe(
        _finding(T0 + 790_000, sustain_ms=0, observed=9.0, history=later, suspected_layer="gpu"), topo
    )
    assert grown["history"][-1] == {"ts": T0 + 790_000, "value": 0.4}


def test_a_refresh_keeps_the_firings_labels_and_route() -> None:
    """Severity, category and team are what Alertmanager and the router know the alert by: a
    refresh that changed them would page again, or someone else."""
    tracker, topo = AlertTracker(), _topology()
    (fired,) = tracker.observe(_stall(T0 + 61_000, 61.0), topo)
    (update,) = tracker.observe(
        _stall(T0 + 200_000, 200.0, severity="warning", category="infra", team="storage"), topo
    )
    assert (update["severity"], update["category"], update["team"]) == (
        fired["severity"],
        fired["category"],
        fired["team"],
    )
    assert update["observed"] == 200.0


def test_refreshes_are_off_with_a_zero_interval() -> None:
    tracker, topo = AlertTracker(refresh_every_ms=0), _topology()
    out = [r for s in range(61, 400) for r in tracker.observe(_stall(T0 + s * 1000, float(s)), topo)]
    assert [r["observed"] for r in out] == [61.0]


def test_the_refresh_pace_survives_a_snapshot_and_an_older_snapshot_without_it() -> None:
    tracker, topo = AlertTracker(), _topology()
    tracker.observe(_stall(T0 + 61_000, 61.0), topo)
    clone = AlertTracker()
    clone.load_state(tracker.state())
    assert clone.state() == tracker.state()
    later = [_stall(T0 + s * 1000, float(s)) for s in range(62, 200)]
    assert [r for f in later for r in clone.observe(f, topo)] == [
        r for f in later for r in tracker.observe(f, topo)
    ]
    # A snapshot written before refreshes: its firing counts as published when its sustain ended.
    old = tracker.state()
    for entry in old["entries"].values():
        del entry["sent"]
    legacy = AlertTracker()
    legacy.load_state(old)
    (update,) = legacy.observe(_stall(T0 + 260_000, 260.0), topo)
    assert legacy.is_refresh(update) and update["observed"] == 260.0
