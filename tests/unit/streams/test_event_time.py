"""Bounded event time: one record from a bad clock neither moves the watermark nor reaches a detector."""

from __future__ import annotations

import re
from pathlib import Path

from schemas.eventtime import MIN_EVENT_TS
from schemas.files import write_container
from schemas.records import Event
from streams.config import load_config
from streams.offline.detection import DetectionEngine
from streams.offline.replay import replay_offline
from streams.stages.engine import JUMP_RECORDS
from tests.unit.streams.builders import T0, gpu_sample, job_state, step, training_job

Y2199 = 7_226_582_400_000  # 2199-01-01T00:00:00Z
Y1970 = 86_400_000  # 1970-01-02


def _engine(**engine_knobs: object) -> DetectionEngine:
    return DetectionEngine(load_config(None, {"engine": engine_knobs} if engine_knobs else None))


def _alerts(out: list[Event], rule: str | None = None) -> list[dict[str, object]]:
    """Each alert state once: the owner's copy (ownership routing also informs the job's team)."""
    seen: set[tuple[object, object]] = set()
    alerts = []
    for e in out:
        if e.type == "Alert" and (rule is None or e.record["rule"] == rule):
            key = (e.record["alert_id"], e.record["status"])
            if key not in seen:
                seen.add(key)
                alerts.append(e.record)
    return alerts


def _with(event: Event, **fields: object) -> Event:
    return Event(event.type, {**event.record, **fields})


def _stalled_job() -> list[Event]:
    """A 4-rank job that steps for 100 s, then stalls while its GPUs keep reporting."""
    events = training_job(seconds=100)
    events += [
        gpu_sample("node-01", i, T0 + s * 1000, pids=[1000 + i]) for s in range(101, 400, 5) for i in range(4)
    ]
    return sorted(events, key=lambda e: e.record["ts"])


def _key(alerts: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return [(a["rule"], a["fingerprint"], a["status"], a["starts_at"], a["ends_at"]) for a in alerts]


def test_a_record_far_ahead_of_its_kafka_timestamp_is_rejected_and_leaves_the_watermark() -> None:
    engine = _engine()
    engine.process(step("job-1", 0, 1, T0), received_ts=T0)
    wm = engine.watermark
    out = engine.process(step("job-1", 0, 2, Y2199), received_ts=T0 + 1_000)
    assert out == [] and engine.rejection == "clock_ahead"
    assert engine.watermark == wm and engine.max_ts == T0
    assert engine.stats["rejected"] == {"clock_ahead": 1} and engine.stats["events"] == 1
    engine.process(step("job-1", 0, 3, T0 + 2_000), received_ts=T0 + 2_000)
    assert engine.rejection is None and engine.stats["late_dropped"] == 0


def test_a_record_within_the_skew_of_its_kafka_timestamp_is_accepted() -> None:
    engine = _engine(max_clock_skew_s=300)
    engine.process(step("job-1", 0, 1, T0 + 299_000), received_ts=T0)
    assert engine.rejection is None and engine.max_ts == T0 + 299_000
    engine.process(step("job-1", 0, 2, T0 + 2_000 + 301_000), received_ts=T0 + 2_000)
    assert engine.rejection == "clock_ahead"


def test_records_before_2000_are_rejected_even_before_any_time_is_known() -> None:
    engine = _engine()
    for ts in (Y1970, 0, -5, 1_780_000_020):  # 1970, zero, negative, seconds sent as milliseconds
        engine.process(step("job-1", 0, 1, ts))
        assert engine.rejection == "out_of_range"
    assert engine.max_ts is None and engine.watermark is None
    assert engine.stats["rejected"] == {"out_of_range": 4}


def test_a_kafka_timestamp_of_minus_one_means_unknown_not_1970() -> None:
    engine = _engine()
    engine.process(step("job-1", 0, 1, T0), received_ts=-1)
    assert engine.rejection is None and engine.max_ts == T0


def test_offline_one_far_future_record_changes_no_alert() -> None:
    events = _stalled_job()
    clean = _alerts(_engine().run(events))
    bad = _with(events[len(events) // 2], ts=Y2199)
    dirty_engine = _engine()
    dirty = _alerts(dirty_engine.run([*events[: len(events) // 2], bad, *events[len(events) // 2 :]]))
    assert _key([a for a in dirty if a["rule"] != "clock_skew"]) == _key(clean)
    assert dirty_engine.stats["late_dropped"] == 0 and dirty_engine.stats["rejected"] == {"clock_ahead": 1}


def test_clock_skew_names_the_node_fires_while_skewed_records_arrive_and_resolves_after() -> None:
    engine = _engine()
    out: list[Event] = []
    for s in range(0, 900, 5):
        ts = T0 + s * 1000
        out += engine.process(gpu_sample("node-01", 0, ts), received_ts=ts)
        if s < 300:  # node-02's clock is a day ahead for its first five minutes
            out += engine.process(gpu_sample("node-02", 0, ts + 86_400_000), received_ts=ts)
        else:
            out += engine.process(gpu_sample("node-02", 0, ts), received_ts=ts)
    skew = _alerts(out, "clock_skew")
    assert [a["status"] for a in skew] == ["firing", "resolved"]
    firing, resolved = skew
    assert firing["node"] == "node-02" and firing["category"] == "infra"
    assert "node node-02" in str(firing["summary"]) and "24.0 h ahead" in str(firing["summary"])
    assert firing["observed"] == 86_400.0
    # resolved once 5 quiet minutes passed after the last skewed record (at 295 s)
    assert T0 + 295_000 + 300_000 <= int(resolved["ts"]) <= T0 + 295_000 + 310_000  # type: ignore[call-overload]
    assert int(firing["starts_at"]) < T0 + 10_000  # type: ignore[call-overload]


def test_clock_skew_of_a_rank_names_its_job_and_node() -> None:
    engine = _engine()
    out = engine.run([*training_job(seconds=30), _with(step("job-1", 2, 99, T0), ts=Y2199)])
    (firing,) = _alerts(out, "clock_skew")
    assert (firing["node"], firing["job_id"], firing["rank"], firing["team"]) == (
        "node-01",
        "job-1",
        2,
        "infrastructure-operations",  # infra: its owner pages...
    )
    copies = [e.record["team"] for e in out if e.type == "Alert" and e.record["rule"] == "clock_skew"]
    assert copies == ["infrastructure-operations", "team-a"]  # ...and the job's team is informed
    assert "2199-01-01T00:00:00Z" in str(firing["summary"])


def test_offline_a_jump_agreed_by_several_sources_is_a_gap_not_a_bad_clock() -> None:
    engine = _engine(clock_jump_sources=3)
    day = 86_400_000
    for n in range(1, 4):
        engine.process(gpu_sample(f"node-0{n}", 0, T0))
    verdicts = []
    for n in range(1, 5):
        engine.process(gpu_sample(f"node-0{n}", 0, T0 + 2 * day + n))
        verdicts.append(engine.rejection)
    assert verdicts == ["clock_ahead", "clock_ahead", None, None]
    assert engine.max_ts == T0 + 2 * day + 4 and engine.stats["time_jumps"] == 1
    assert _alerts(engine.advance(T0 + 2 * day + 100_000), "clock_skew") == []


def test_offline_one_source_far_ahead_never_moves_event_time_while_others_speak() -> None:
    engine = _engine(clock_jump_sources=3)
    for i in range(200):
        engine.process(gpu_sample("node-01", 0, T0 + i * 1000))
        engine.process(gpu_sample("node-02", i % 8, Y2199 + i))
        assert engine.rejection == "clock_ahead"
    assert engine.max_ts == T0 + 199_000


def test_offline_a_gap_in_a_single_source_stream_is_confirmed_by_many_records() -> None:
    engine = _engine()
    engine.process(gpu_sample("node-01", 0, T0))
    later = T0 + 86_400_000
    verdicts = []
    for i in range(JUMP_RECORDS + 1):
        engine.process(gpu_sample("node-01", i % 8, later + i))
        verdicts.append(engine.rejection)
    assert verdicts == ["clock_ahead"] * (JUMP_RECORDS - 1) + [None, None]


def test_no_absurd_stall_and_no_window_at_time_zero_after_records_from_1970_and_2199() -> None:
    """Issue 13.4 and 13.7: neither a 2199 nor a 1970 record produces impossible alerts or windows."""
    events = _stalled_job()
    mid = len(events) // 2
    poisoned = [
        _with(events[0], ts=Y1970),
        *events[:mid],
        _with(events[mid], ts=Y2199),
        _with(step("job-1", 0, 1, 0), ts=0),
        *events[mid:],
        job_state("job-1", T0 + 400_000, "completed"),
    ]
    out = _engine().run(poisoned)
    windows = [e.record for e in out if e.type in ("RankWindowStats", "JobWindowStats")]
    assert windows and min(int(w["window_start"]) for w in windows) >= T0 - 60_000
    span_s = 400
    for a in _alerts(out):
        assert T0 - 5_000 <= int(a["starts_at"]) <= T0 + span_s * 1000  # watermark: T0 - lateness
        for seconds in re.findall(r"(\d+) s\b", str(a["summary"])):
            assert int(seconds) <= span_s, a["summary"]
    assert [a["status"] for a in _alerts(out, "job_stall")] == ["firing", "resolved"]


def test_replay_keeps_a_file_with_one_spike_in_order_and_rejects_the_spike(tmp_path: Path) -> None:
    events = _stalled_job()
    mid = len(events) // 2
    other = [gpu_sample("node-09", 0, T0 + s * 1000) for s in range(0, 400, 5)]
    a, b = tmp_path / "a.avro", tmp_path / "b.avro"
    write_container(a, [*events[:mid], _with(events[mid], ts=Y2199), *events[mid:]])
    write_container(b, other)
    engine = DetectionEngine()
    out = list(replay_offline([a, b], engine=engine))
    assert engine.stats["late_dropped"] == 0 and engine.stats["rejected"] == {"clock_ahead": 1}
    clean = _alerts(_engine().run(sorted([*events, *other], key=lambda e: e.record["ts"])))
    assert _key([x for x in _alerts(out) if x["rule"] != "clock_skew"]) == _key(clean)


def test_replay_rejects_a_first_record_far_ahead_of_the_rest_of_its_file(tmp_path: Path) -> None:
    events = _stalled_job()
    path = tmp_path / "a.avro"
    write_container(path, [_with(events[0], ts=Y2199), *events])
    engine = DetectionEngine()
    list(replay_offline([path], engine=engine))
    assert engine.stats["rejected"] == {"clock_ahead": 1} and engine.stats["late_dropped"] == 0
    assert engine.max_ts is not None and engine.max_ts < T0 + 3_600_000


def test_the_time_guard_survives_a_snapshot() -> None:
    engine = _engine(clock_jump_sources=2)
    engine.process(gpu_sample("node-01", 0, T0))
    engine.process(gpu_sample("node-02", 0, Y2199))
    restored = DetectionEngine.restore(engine.snapshot(), engine.config)
    restored.process(gpu_sample("node-03", 0, Y2199 + 1))
    assert restored.rejection is None and restored.stats["time_jumps"] == 1
    assert restored.stats["rejected"] == {"clock_ahead": 1}


def test_the_skew_knob_is_validated() -> None:
    import pytest

    from streams.errors import ConfigError

    for bad in ({"max_clock_skew_s": 0}, {"max_clock_skew_s": "soon"}, {"clock_jump_sources": 0}):
        with pytest.raises(ConfigError, match="engine"):
            load_config(None, {"engine": bad})
    assert load_config(None, {"engine": {"max_clock_skew_s": 60}}).max_clock_skew_ms == 60_000
    assert MIN_EVENT_TS == 946_684_800_000
