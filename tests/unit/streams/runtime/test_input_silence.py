"""When every input stops, the worker says so once (`input_silent`), not with a stall per job (issue 24.3).

The worker core over the in-memory Kafka, fed as a live producer would (records published at their
event time, the wall clock and the core's monotonic clock moving together), then silent for longer
than the wall-clock guard.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from producers.simulator import load_scenario, run_ends, simulate
from schemas.codec import Codec
from schemas.eventtime import event_ts
from schemas.records import Event
from schemas.topics import key_for, telemetry_copies, topic_for
from streams.errors import StreamsError
from streams.runtime.changelog import Restored
from streams.runtime.checkpoint import perform
from streams.runtime.core import WorkerCore
from streams.runtime.guard import InputSilence, WallClockGuard
from streams.runtime.options import WorkerOptions
from streams.runtime.task import decode_snapshot_meta, encode_snapshot
from tests.unit.streams.runtime.fake_kafka import Clock, Consumer, FakeIO, FakeKafka, alerts_of, restored_from

CODEC = Codec()
JOB_A, JOB_B = "sim-a-0001", "sim-b-0002"
SCENARIO = f"""
name: two_jobs
description: "Two 4-rank jobs on their own nodes."
duration: 6m
cluster: {{name: sim-x, nodes: 2, gpus_per_node: 4, gpu_class: H100-80GB}}
telemetry: {{interval: 5s}}
jobs:
  - {{id: {JOB_A}, team: llm-research, owner: carol, nodes: [node-01], model_name: llama-1b, model_version: v1, step_time: 1s}}
  - {{id: {JOB_B}, team: vision, owner: erin, nodes: [node-02], model_name: vit, model_version: v1, step_time: 1s}}
"""


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> list[Event]:
    path = tmp_path_factory.mktemp("scenario") / "two_jobs.yaml"
    path.write_text(SCENARIO)
    out = sorted(simulate(load_scenario(path), seed=0).events(), key=event_ts)
    assert {e.record.get("job_id") for e in out} >= {JOB_A, JOB_B}
    return out


class Live:
    """One worker core fed like a live cluster: `run` publishes each event when the wall clock
    reaches `at(event)` and ticks the core four times a second of its clock."""

    def __init__(self, tmp_path: Path, wall_ms: int, parts: set[int] | None = None) -> None:
        self.kafka = FakeKafka(6)
        self.io = FakeIO(self.kafka)
        self.clock = Clock()
        self.wall = wall_ms
        self.options = WorkerOptions(bootstrap="x", workdir=tmp_path)
        self.start(set(range(6)) if parts is None else parts, Restored())

    def start(self, parts: set[int], restored: Restored) -> None:
        """A worker process: its consumer from the committed offsets, its core with `restored`."""
        self.consumer = Consumer(self.kafka, self.io.committed, chunk=500)
        self.io.consumer = self.consumer
        self.core = WorkerCore(
            self.options, self.consumer.lag, monotonic=self.clock, wall_ms=lambda: self.wall
        )
        self.core.assign(parts, restored)

    def kill_and_restart(self) -> None:
        """The worker dies (no checkpoint, no goodbye) and a new one restores what it wrote."""
        self.start(set(range(6)), restored_from(self.kafka, self.options))

    def publish(self, event: Event) -> None:
        value = CODEC.encode(event)
        copies: list[tuple[str, bytes | None]] = list(telemetry_copies(event.type, event.record))
        if not copies:  # as the publisher writes it: training records keyed by job, telemetry copies
            topic = topic_for(event.type)
            copies = [(topic, key_for(topic, event.record))]
        for topic, key in copies:
            self.kafka.produce(topic, key, value, timestamp_ms=self.wall)

    def run(self, events: list[Event], until_ms: int, at: Any = event_ts) -> None:
        """Move both clocks to `until_ms` in 0.25 s steps, publishing what is due and reading it."""
        pending = sorted(events, key=at)
        i = 0
        while self.wall < until_ms:
            self.wall += 250
            self.clock.now += 0.25
            while i < len(pending) and at(pending[i]) <= self.wall:
                self.publish(pending[i])
                i += 1
            while batch := self.consumer.poll():
                perform(self.core.receive(batch), self.io)
            perform(self.core.tick(), self.io)

    def alerts(self, rule: str | None = None) -> list[dict[str, Any]]:
        return [a for a in alerts_of(self.kafka, CODEC) if rule is None or a["rule"] == rule]


def _guard_advances(live: Live) -> int:
    return sum(t.counts["guard_advances"] for t in live.core._all_tasks())


def _pairs(alerts: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Each alert's states in order: its refreshes while it fires (the same alert_id, firing again
    with the grown silence) are the state it is in, not another page."""
    out: list[tuple[str, str, str]] = []
    seen: set[tuple[str, str]] = set()
    for a in alerts:
        if (a["alert_id"], a["status"]) not in seen:
            seen.add((a["alert_id"], a["status"]))
            out.append((a["rule"], a["job_id"], a["status"]))
    return out


def test_all_input_silent_on_live_data_raises_input_silent_once_and_no_stall_then_resolves(
    events: list[Event], tmp_path: Path
) -> None:
    """Everything stops at 4 min (a Kafka outage: the producers spool). 130 s later: one
    input_silent page to the platform, no job_stall; the spooled records arrive, it resolves, and
    since no engine's time moved on while it was silent, none of them is late."""
    start = event_ts(events[0])
    cut = start + 240_000
    before = [e for e in events if event_ts(e) <= cut]
    after = [e for e in events if event_ts(e) > cut]
    live = Live(tmp_path, start)
    live.run(before, cut)
    assert live.alerts() == []  # a healthy pair of jobs
    live.run([], cut + 130_000)  # nothing for 130 s (the guard: 120 s)
    (silent,) = live.alerts("input_silent")
    assert (silent["status"], silent["category"], silent["severity"]) == ("firing", "platform", "critical")
    assert (silent["team"], silent["receiver"]) == ("platform", "platform-pager")
    assert silent["fingerprint"] == "input_silent/ranksight-detect" and silent["job_id"] == ""
    assert silent["summary"].startswith("no records from any producer since ")
    assert "every job's stall, hang and missing-telemetry rules are on hold" in silent["summary"]
    assert silent["runbook_url"].endswith("input_silent")
    assert abs(silent["starts_at"] - cut) <= 1_000  # since the last record
    # No job_stall, no evaluation_stuck, nothing else:
    assert [a for a in live.alerts() if a["rule"] != "input_silent"] == []
    guarded = _guard_advances(live)  # a task silent while others flowed (as before)
    # Nothing stays held: every stage moved to the last event time read, no further.
    newest = max(t.engine.max_ts or 0 for t in live.core.tasks.values())
    assert not any(len(t.aligner) for t in live.core._all_tasks())
    assert newest in {t.engine.watermark for t in live.core.tasks.values()}
    assert all((t.engine.watermark or 0) <= newest for t in live.core.job_tasks.values())
    live.run([], cut + 400_000)  # a long outage: still one page, and still no stall
    assert _pairs(live.alerts()) == [("input_silent", "", "firing")]
    # ...whose record grows with the silence: refreshed at most once a minute, the same alert.
    updates = live.alerts("input_silent")
    assert len(updates) > 1 and {a["alert_id"] for a in updates} == {silent["alert_id"]}
    assert all(b["ts"] - a["ts"] >= 60_000 for a, b in itertools.pairwise(updates))
    assert updates[-1]["observed"] > silent["observed"] + 200
    assert _guard_advances(live) == guarded  # the guard held
    # The outage ends: the spool drains (records of the last minutes, published now), then live again.
    back = live.wall
    live.run(after, back + 60_000, at=lambda e: back + (event_ts(e) - cut) // 100)
    assert _pairs(live.alerts()) == [("input_silent", "", "firing"), ("input_silent", "", "resolved")]
    resolved = live.alerts("input_silent")[-1]
    assert resolved["alert_id"] == silent["alert_id"] and resolved["summary"].startswith("records flow again")
    assert sum(t.engine.stats["late_dropped"] for t in live.core._all_tasks()) == 0
    assert live.core.totals["input_silent"] == 1


def test_a_worker_restarted_while_input_silent_fires_holds_it_and_resolves_it_when_records_flow(
    events: list[Event], tmp_path: Path
) -> None:
    """The worker dies while input_silent fires and a new one starts, still in the silence: the new
    one knows the alert fires (from the checkpoint written when it fired), so it holds the guard (no
    stall for every job) and resolves that alert when records come, instead of leaving it firing."""
    start = event_ts(events[0])
    cut = start + 240_000
    live = Live(tmp_path, start)
    live.run([e for e in events if event_ts(e) <= cut], cut)
    live.run([], cut + 130_000)
    (silent,) = live.alerts("input_silent")
    live.kill_and_restart()
    assert live.core.silence.holding
    live.run([], live.wall + 300_000)  # still silent: nothing new, and no stall
    assert _pairs(live.alerts()) == [("input_silent", "", "firing")]
    back = live.wall
    live.run(
        [e for e in events if event_ts(e) > cut],
        back + 60_000,
        at=lambda e: back + (event_ts(e) - cut) // 100,
    )
    assert _pairs(live.alerts()) == [("input_silent", "", "firing"), ("input_silent", "", "resolved")]
    assert live.alerts("input_silent")[-1]["alert_id"] == silent["alert_id"]
    # Once resolved, that is what a further restart knows too: it does not resolve it again.
    live.kill_and_restart()
    assert not live.core.silence.holding


def test_one_job_silent_while_the_other_flows_pages_its_job_stall_and_no_input_silent(
    events: list[Event], tmp_path: Path
) -> None:
    """Job A (its steps and its node's telemetry) stops at 3 min, job B goes on: A's job_stall fires as
    before, B stays quiet, and nothing says that all input stopped."""
    start = event_ts(events[0])
    cut = start + 180_000
    kept = [e for e in events if event_ts(e) <= cut or not _of_job_a(e)]
    live = Live(tmp_path, start)
    live.run(kept, event_ts(events[-1]))
    stalls = [a for a in live.alerts("job_stall") if a["status"] == "firing"]
    assert stalls and {a["job_id"] for a in stalls} == {JOB_A}
    assert live.alerts("input_silent") == []
    assert not [a for a in live.alerts() if a["job_id"] == JOB_B]


def _of_job_a(event: Event) -> bool:
    r = event.record
    return r.get("job_id") == JOB_A or r.get("node") == "node-01"


def test_historical_data_never_raises_input_silent(events: list[Event], tmp_path: Path) -> None:
    """A replay of yesterday's records that then goes quiet: the wall clock says nothing about its
    event time, so no input_silent (and, as before, no guard advance)."""
    start = event_ts(events[0])
    day = 86_400_000
    live = Live(tmp_path, start + day)
    live.run(events, start + day + 20_000, at=lambda e: start + day + (event_ts(e) - start) // 100)
    live.run([], live.wall + 400_000)
    assert live.alerts("input_silent") == []
    assert _guard_advances(live) == 0


def test_a_finished_simulate_to_kafka_run_ends_its_jobs_and_then_says_once_that_input_stopped(
    events: list[Event], tmp_path: Path
) -> None:
    """What `ranksight simulate --to-kafka` publishes (the scenario, then an end for each job still
    running): the worker ends both jobs in both stages, and the silence after it is one
    input_silent, never a stall."""
    ends = run_ends(events)
    assert {e.record["job_id"] for e in ends} == {JOB_A, JOB_B}
    live = Live(tmp_path, event_ts(events[0]))
    live.run([*events, *ends], event_ts(ends[0]) + 400_000)
    assert _pairs(live.alerts()) == [("input_silent", "", "firing")]
    for task in live.core._all_tasks():
        jobs = task.engine.topology.jobs
        assert all(jobs[j].state == "completed" for j in (JOB_A, JOB_B) if j in jobs), task.snapshot_name
    job_stage = {j for t in live.core.job_tasks.values() for j in t.engine.topology.jobs}
    assert job_stage == {JOB_A, JOB_B}  # the job stage saw each end (the rank stages passed it on)


def test_another_workers_rank_stage_moving_on_is_input_too(events: list[Event], tmp_path: Path) -> None:
    """Two workers in a group: this one (partition 2, where both jobs' records land) hears nothing
    more, but the other's rank stage of partition 4 still sends markers that move on: no
    input_silent. Once those stop too, it fires."""
    start = event_ts(events[0])
    cut = start + 180_000
    live = Live(tmp_path, start, parts={2})
    live.run([e for e in events if event_ts(e) <= cut], cut)
    assert live.core.tasks.keys() == {2} and live.core.tasks[2].engine.max_ts
    for _ in range(40):  # 200 s of the other worker's markers, one per 5 s bucket
        live.run([], live.wall + 5_000)
        marker = Event("StageProgress", {"ts": live.wall - 10_000, "source": 4, "idle": False})
        live.kafka.produce("rs.internal.summaries", None, CODEC.encode(marker), partition=2)
    assert live.alerts("input_silent") == []
    live.run([], live.wall + 130_000)
    assert _pairs(live.alerts("input_silent")) == [("input_silent", "", "firing")]


def test_input_silence_is_pure_and_fires_once_per_silence() -> None:
    guard = WallClockGuard(guard_s=120, live_ms=600_000)
    silence = InputSilence(guard, "g", "docs/runbooks/")
    t0 = 1_800_000_000_000
    assert silence.check(t0 + 100_000, 100.0, t0, t0 - 1_000) == []  # not yet
    (fired,) = silence.check(t0 + 121_000, 121.0, t0, t0 - 1_000)
    assert fired["status"] == "firing" and fired["starts_at"] == t0 and silence.holding
    assert silence.check(t0 + 150_000, 150.0, t0, t0 - 1_000) == []  # once (no refresh within 60 s)
    # The silence grew: the same alert, refreshed with it (not another page).
    (grown,) = silence.check(t0 + 300_000, 300.0, t0, t0 - 1_000)
    assert (grown["status"], grown["alert_id"], grown["observed"]) == ("firing", fired["alert_id"], 300.0)
    assert "(300 s)" in grown["summary"] and silence.tracker.is_refresh(grown)
    assert silence.check(t0 + 330_000, 330.0, t0, t0 - 1_000) == []
    (done,) = silence.check(t0 + 331_000, 0.5, t0 + 330_500, t0 + 330_000)
    assert done["status"] == "resolved" and done["alert_id"] == fired["alert_id"] and not silence.holding
    # Historical (newest event an hour before the last record), the guard off, no input yet: never.
    assert silence.check(t0 + 999_000, 500.0, t0, t0 - 3_600_000) == []
    assert InputSilence(WallClockGuard(guard_s=0), "g", "").check(t0, 1e9, t0, t0) == []
    assert silence.check(t0, None, None, None) == []


def test_a_worker_that_takes_over_a_firing_workers_partitions_resolves_both_alerts() -> None:
    """Two workers of a group each fire their own input_silent (their own last record, their own
    id); one dies and the other takes its partitions: its checkpoints carry both, and a record
    resolves both, each once."""
    guard = WallClockGuard(guard_s=120, live_ms=600_000)
    t0 = 1_800_000_000_000
    a, b = InputSilence(guard, "g", "docs/runbooks/"), InputSilence(guard, "g", "docs/runbooks/")
    (fired_a,) = a.check(t0 + 121_000, 121.0, t0, t0 - 1_000)
    (fired_b,) = b.check(t0 + 125_000, 122.0, t0 + 3_000, t0 - 1_000)
    assert fired_a["alert_id"] != fired_b["alert_id"]
    b.adopt(a.state())
    b.adopt(a.state())  # every partition of the dead worker carries it: kept once
    restarted = InputSilence(guard, "g", "docs/runbooks/")
    restarted.adopt(b.state())  # and b restarts in turn, from its own checkpoints
    done = restarted.check(t0 + 300_000, 0.5, t0 + 299_500, t0 + 299_000)
    assert sorted((d["status"], d["alert_id"]) for d in done) == sorted(
        [("resolved", fired_a["alert_id"]), ("resolved", fired_b["alert_id"])]
    )
    assert restarted.state() is None and not restarted.holding
    # A worker restarted with the guard off still resolves what it restored, at its first record.
    off = InputSilence(WallClockGuard(guard_s=0), "g", "docs/runbooks/")
    off.adopt(a.state())
    (resolved,) = off.check(t0 + 400_000, 0.2, t0 + 399_800, t0 + 399_000)
    assert (resolved["status"], resolved["alert_id"]) == ("resolved", fired_a["alert_id"])


def test_the_firing_alert_travels_in_the_snapshot_header_and_a_corrupt_one_is_refused() -> None:
    silence = InputSilence(WallClockGuard(guard_s=120, live_ms=600_000), "g", "docs/runbooks/")
    t0 = 1_800_000_000_000
    silence.check(t0 + 121_000, 121.0, t0, t0 - 1_000)
    value = encode_snapshot(4, {"rs.training.steps:1": 9}, b"engine", silence=silence.state())
    meta, body = decode_snapshot_meta(value)
    assert (meta["silence"], body) == (silence.state(), b"engine")
    assert decode_snapshot_meta(encode_snapshot(4, {}, b"engine"))[0]["silence"] is None  # older snapshots
    with pytest.raises(StreamsError, match="header is corrupt"):
        decode_snapshot_meta(encode_snapshot(4, {}, b"engine", silence={"since": "soon"}))
