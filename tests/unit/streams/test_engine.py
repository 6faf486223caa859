"""The detection engine: watermark and lateness, routing, derived stats, determinism and snapshots."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.files import JsonlFormat
from schemas.records import Event
from streams.alerting.routing import Router
from streams.config import load_config
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import T0, checkpoint, gpu_sample, job_state, step, training_job

FMT = JsonlFormat()


def _lines(events: list[Event]) -> list[str]:
    return [FMT.to_line(e) for e in events]


def _engine(**engine_knobs: object) -> DetectionEngine:
    return DetectionEngine(load_config(None, {"engine": engine_knobs} if engine_knobs else None))


def _stalled_job() -> list[Event]:
    events = training_job(seconds=100)
    # telemetry keeps flowing (pids present) while the steps have stopped
    events += [
        gpu_sample("node-01", i, T0 + s * 1000, pids=[1000 + i]) for s in range(101, 400, 5) for i in range(4)
    ]
    return sorted(events, key=lambda e: e.record["ts"])


def test_a_stall_becomes_a_routed_firing_alert_with_the_job_identity() -> None:
    engine = _engine()
    out = engine.run(_stalled_job())
    stalls = [e.record for e in out if e.type == "Alert" and e.record["rule"] == "job_stall"]
    # A platform alert pages the platform team and informs the job's team (shipped ownership).
    assert [(a["status"], a["team"], a["receiver"]) for a in stalls[:2]] == [
        ("firing", "platform", "platform-pager"),
        ("firing", "team-a", "platform-chat"),  # team-a is not listed: other_teams' inform receiver
    ]
    a = stalls[1]
    assert (a["owner"], a["current_step"]) == ("alice", 100)
    assert a["last_progress_ts"] == T0 + 100_000
    # The rest are its refreshes as the stall grows (same alert, same copies), counted as one firing.
    assert {x["alert_id"] for x in stalls} == {a["alert_id"]} and {x["status"] for x in stalls} == {"firing"}
    assert engine.stats["alerts_firing"] >= 1 and engine.stats["by_rule"]["job_stall"]["firing"] == 1
    assert engine.stats["alerts_refreshed"] == (len(stalls) - 2) // 2 > 0


def test_events_older_than_the_watermark_are_dropped_and_counted() -> None:
    engine = _engine(allowed_lateness_s=5)
    engine.process(step("job-1", 0, 1, T0 + 60_000))
    engine.process(step("job-1", 0, 2, T0 + 56_000))  # within lateness: used
    engine.process(step("job-1", 0, 3, T0 + 54_999))  # beyond: dropped
    assert engine.stats["late_dropped"] == 1 and engine.stats["events"] == 2
    assert engine.watermark == T0 + 55_000


def test_the_end_of_a_job_resolves_its_alerts() -> None:
    events = [*_stalled_job(), job_state("job-1", T0 + 400000, "completed")]
    out = _engine().run(events)
    stall = [
        e.record
        for e in out
        if e.type == "Alert" and e.record["rule"] == "job_stall" and e.record["team"] == "team-a"
    ]
    assert [a["status"] for a in stall][-2:] == ["firing", "resolved"] and stall[-1][
        "ends_at"
    ] == T0 + 400_000
    assert {a["alert_id"] for a in stall} == {stall[0]["alert_id"]}


def test_finish_advances_to_the_last_event_without_inventing_resolutions() -> None:
    engine = _engine()
    for e in _stalled_job():
        engine.process(e)
    engine.finish()
    assert engine.watermark == engine.max_ts
    assert "job_stall/job-1" in engine.firing()


def test_routing_rules_choose_team_and_receiver() -> None:
    router = Router.from_dict(
        {"routes": [{"match": {"rule": "job_stall"}, "team": "sre", "receiver": "pager"}]}
    )
    engine = DetectionEngine(load_config(None), router)
    out = engine.run(_stalled_job())
    stall = next(e.record for e in out if e.type == "Alert" and e.record["rule"] == "job_stall")
    assert (stall["team"], stall["receiver"]) == ("sre", "pager")


def test_disabled_rules_never_alert() -> None:
    engine = DetectionEngine(load_config(None, {"engine": {"disabled_rules": ["job_stall"]}}))
    out = engine.run(_stalled_job())
    assert not [e for e in out if e.type == "Alert" and e.record["rule"] == "job_stall"]


def test_window_stats_are_emitted_and_marked_unhealthy_while_an_alert_fires() -> None:
    out = _engine().run(_stalled_job())
    windows = [e.record for e in out if e.type == "JobWindowStats"]
    assert windows and all(w["healthy"] for w in windows)
    assert any(e.type == "RankWindowStats" for e in out)


def test_an_open_checkpoint_is_not_a_stall_for_the_engine_either() -> None:
    events = [*_stalled_job(), checkpoint("job-1", T0 + 100500, "started")]
    out = _engine().run(sorted(events, key=lambda e: e.record["ts"]))
    assert not [e for e in out if e.type == "Alert" and e.record["rule"] == "job_stall"]


def test_snapshot_restore_continues_exactly_like_an_uninterrupted_run() -> None:
    events = _stalled_job()
    whole = _engine()
    expected = whole.run(events)
    first = _engine()
    out = [x for e in events[:700] for x in first.process(e)]
    restored = DetectionEngine.restore(first.snapshot(), load_config(None))
    assert restored.snapshot() == first.snapshot()
    out += [x for e in events[700:] for x in restored.process(e)] + restored.finish()
    assert _lines(out) == _lines(expected)
    assert restored.snapshot() == whole.snapshot()


def test_a_corrupt_snapshot_is_a_clear_error() -> None:
    import pytest

    from streams.errors import StreamsError

    with pytest.raises(StreamsError, match="corrupt"):
        DetectionEngine.restore(b"not a snapshot")


_step_event = st.tuples(
    st.integers(0, 3),  # rank
    st.integers(0, 4000),  # ms since the previous event
    st.floats(0.2, 3.0),  # compute seconds
    st.integers(-8000, 0),  # jitter (late arrivals)
    st.sampled_from(["step", "step", "step", "gpu", "ckpt_start", "ckpt_end", "val"]),
)


def _random_stream(spec: list[tuple[int, int, float, int, str]]) -> list[Event]:
    events = training_job(seconds=10)
    ts = T0 + 10_000
    n = 10
    for rank, dt, compute, jitter, kind in spec:
        ts += dt
        at = ts + jitter
        if kind == "step":
            n += 1 if rank == 0 else 0
            events.append(step("job-1", rank, n, at, compute=compute, step_time=compute + 0.2))
        elif kind == "gpu":
            events.append(gpu_sample("node-01", rank, at, util=compute * 30, pids=[1000 + rank]))
        elif kind == "ckpt_start":
            events.append(checkpoint("job-1", at, "started", ckpt=f"c{n}"))
        elif kind == "ckpt_end":
            events.append(checkpoint("job-1", at, "completed", ckpt=f"c{n}"))
        else:
            events.append(
                Event(
                    "ValidationResult",
                    {
                        "ts": at,
                        "job_id": "job-1",
                        "run_id": "r",
                        "step": n,
                        "metrics": {},
                        "duration_s": None,
                    },
                )
            )
    return events


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.lists(_step_event, min_size=20, max_size=300), split=st.floats(0.0, 1.0))
def test_random_streams_give_identical_output_twice_and_across_a_snapshot(
    spec: list[tuple[int, int, float, int, str]], split: float
) -> None:
    events = _random_stream(spec)
    a = _engine().run(events)
    b_engine = _engine()
    b = b_engine.run(events)
    assert _lines(a) == _lines(b)
    cut = int(split * len(events))
    first = _engine()
    out = [x for e in events[:cut] for x in first.process(e)]
    second = DetectionEngine.restore(first.snapshot(), load_config(None))
    out += [x for e in events[cut:] for x in second.process(e)] + second.finish()
    assert _lines(out) == _lines(a)
    assert second.snapshot() == b_engine.snapshot()


def test_a_refresh_of_a_rank_stage_symptom_the_job_stage_muted_goes_out_muted_again() -> None:
    """The job stage mutes a rank-stage alert it explains (a failed rank after its GPU's XID, from
    two rank-stage partitions); the rank stage never learns of it, so its refresh of the symptom
    comes unmuted: the job stage re-sends it muted with the refresh's values."""
    from streams.alerting.lifecycle import AlertTracker
    from streams.detectors.base import Finding, Topology
    from streams.stages.engine import StageEngine
    from tests.unit.streams.builders import job_started

    topo = Topology()
    topo.observe(job_started("job-1", T0))
    tracker = AlertTracker()
    gpu = {"job_id": "job-1", "node": "node-01", "gpu_uuid": "GPU-1", "gpu_index": 1}
    (xid,) = tracker.observe(
        Finding("xid_error", ("node-01", "GPU-1"), True, T0 + 1_000, category="infra", severity="critical",
                observed=79.0, **gpu),
        topo,
    )  # fmt: skip

    def failed(ts: int, count: float) -> list[dict[str, object]]:
        finding = Finding(
            "rank_failed", ("job-1", "1"), True, ts, category="platform", severity="critical",
            rank=1, since=T0 + 2_000, observed=count, history_metric="rank_faults",
            history=((ts, count),), **gpu,
        )  # fmt: skip
        return tracker.observe(finding, topo)

    (fired,) = failed(T0 + 2_000, 1.0)
    job = StageEngine(stage="job")
    job.process(job_started("job-1", T0))
    assert not job.process(Event("Alert", xid))  # a cause: nothing of this stage to mute yet
    muted = [e.record for e in job.process(Event("Alert", fired))]
    assert muted and {a["inhibited_by"] for a in muted} == {xid["alert_id"]}
    (refresh,) = failed(T0 + 70_000, 3.0)
    assert refresh["inhibited_by"] is None and tracker.is_refresh(refresh)
    again = [e.record for e in job.process(Event("Alert", refresh))]
    assert again and {(a["inhibited_by"], a["observed"], a["ts"]) for a in again} == {
        (xid["alert_id"], 3.0, T0 + 70_000)
    }
    assert {a["alert_id"] for a in again} == {fired["alert_id"]}
    assert [e.record for e in job.process(Event("Alert", {**refresh, "inhibited_by": xid["alert_id"]}))] == []
