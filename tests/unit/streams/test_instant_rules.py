"""Instant rules page as their record is read (issue 37.4): the rank stage's look ahead sends the
alert the ordered pass later raises, and the ordered pass does not send it again."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from schemas.codec import Codec
from schemas.records import Event
from schemas.topics import ALERTS, TRAINING_STEPS
from streams.alerting.routing import load_router
from streams.config import EngineConfig
from streams.runtime.checkpoint import Send
from streams.runtime.intake import Intake, Record
from streams.runtime.options import WorkerOptions
from streams.runtime.task import PartitionTask
from streams.stages.engine import StageEngine
from tests.unit.streams.builders import T0, gpu_sample, job_started, job_state, rank_bound, step

JOB = "job-1"


def _engine() -> StageEngine:
    return StageEngine(EngineConfig.default(), load_router(), "rank")


def _start(engine: StageEngine) -> list[Event]:
    out = engine.process(job_started(JOB, T0, world_size=2), received_ts=T0)
    for rank in range(2):
        out += engine.process(rank_bound(JOB, rank, T0 + 10), received_ts=T0 + 10)
    for n in range(5):
        for rank in range(2):
            ts = T0 + 1_000 * (n + 1) + rank
            out += engine.process(step(JOB, rank, n, ts), received_ts=ts)
    return out


def _fault(rank: int, ts: int) -> Event:
    return Event(
        "RankFault",
        {"ts": ts, "job_id": JOB, "run_id": f"{JOB}-run-1", "rank": rank, "node": "node-01", "kind": "exit",
         "detail": "killed", "exit_code": 137},
    )  # fmt: skip


def _alerts(events: list[Event], rule: str) -> list[dict[str, Any]]:
    return [e.record for e in events if e.type == "Alert" and e.record["rule"] == rule]


def test_a_nan_loss_pages_on_arrival_and_the_ordered_pass_does_not_page_it_again() -> None:
    ahead, ordered = _engine(), _engine()
    _start(ahead)
    _start(ordered)
    nan = step(JOB, 0, 5, T0 + 6_000, loss=float("nan"))
    early = ahead.instant(nan, received_ts=T0 + 6_000)
    assert [a["rule"] for a in _alerts(early, "nonfinite_loss")] == ["nonfinite_loss"]
    assert ahead.firing() == []  # a look ahead: the engine's own state is unchanged
    late = ahead.process(nan, received_ts=T0 + 6_000)
    truth = ordered.process(nan, received_ts=T0 + 6_000)
    assert _alerts(late, "nonfinite_loss") == []  # already paged
    [paged] = _alerts(early, "nonfinite_loss")
    [raised] = _alerts(truth, "nonfinite_loss")
    assert (paged["alert_id"], paged["status"], paged["team"]) == (
        raised["alert_id"],
        "firing",
        raised["team"],
    )
    assert ahead.firing() == ordered.firing()
    assert ahead.stats["instant_confirmed"] == 1
    # The next NaN of the same job is no new page, ahead or in order.
    again = step(JOB, 0, 6, T0 + 7_000, loss=float("nan"))
    assert ahead.instant(again, received_ts=T0 + 7_000) == []


def test_an_xid_pages_on_arrival_with_the_ordered_alert_id() -> None:
    ahead, ordered = _engine(), _engine()
    _start(ahead)
    _start(ordered)
    ts = T0 + 6_500
    xid = Event("GpuSample", {**gpu_sample("node-01", 1, ts).record, "job_id": JOB, "xid": 79})
    paged = _alerts(ahead.instant(xid, received_ts=ts), "xid_error")
    assert _alerts(ahead.process(xid, received_ts=ts), "xid_error") == []
    raised = _alerts(ordered.process(xid, received_ts=ts), "xid_error")

    def pages(alerts: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
        return {(a["alert_id"], a["rank"], a["severity"], a["team"], a["receiver"]) for a in alerts}

    assert pages(paged) == pages(raised)  # every receiver it routes to, paged once
    assert {a["rank"] for a in paged} == {1}


def test_an_ordinary_record_is_not_looked_at_and_a_late_one_is_not_paged() -> None:
    engine = _engine()
    _start(engine)
    assert engine.instant(step(JOB, 0, 5, T0 + 6_000), received_ts=T0 + 6_000) == []
    assert engine.instant(step(JOB, 1, 5, T0 + 6_000, loss=float("nan")), received_ts=T0 + 6_000) == []
    late = _fault(1, T0 - 60_000)
    assert engine.instant(late, received_ts=T0 + 6_000) == []  # older than the watermark


def test_a_page_the_ordered_pass_never_raises_is_withdrawn_once_event_time_passes_it() -> None:
    engine = _engine()
    _start(engine)
    fault = _fault(1, T0 + 6_000)
    paged = _alerts(engine.instant(fault, received_ts=T0 + 6_000), "rank_failed")
    assert paged
    # In event time the job had completed just before the fault: the ordered pass raises nothing
    # (after `failed` it would: a cause within the late-cause grace still pages).
    engine.process(job_state(JOB, T0 + 5_990, "completed"), received_ts=T0 + 5_990)
    assert _alerts(engine.process(fault, received_ts=T0 + 6_000), "rank_failed") == []
    out = engine.advance(T0 + 8_000)
    withdrawn = _alerts(out, "rank_failed")
    assert {(a["alert_id"], a["receiver"], a["status"]) for a in withdrawn} == {
        (a["alert_id"], a["receiver"], "resolved") for a in paged
    }
    assert engine.stats["instant_withdrawn"] == len(paged)


def test_what_was_paged_ahead_survives_a_snapshot() -> None:
    engine = _engine()
    _start(engine)
    nan = step(JOB, 0, 5, T0 + 6_000, loss=float("nan"))
    assert _alerts(engine.instant(nan, received_ts=T0 + 6_000), "nonfinite_loss")
    restored = StageEngine.restore(engine.snapshot(), EngineConfig.default(), load_router(), "rank")
    assert restored.instant(nan, received_ts=T0 + 6_000) == []  # read again after a restart: paged already
    assert _alerts(restored.process(nan, received_ts=T0 + 6_000), "nonfinite_loss") == []


def test_the_rank_stage_task_sends_the_page_when_it_reads_the_record_still_held_for_alignment(
    tmp_path: Path,
) -> None:
    opts = WorkerOptions(bootstrap="x:1", workdir=tmp_path, app_id="g")
    codec = Codec()
    intake = Intake(codec, 300_000, collections.defaultdict(int), collections.Counter())
    task = PartitionTask(1, EngineConfig.default(), load_router(), opts, codec, intake, now=0.0)
    _start(task.engine)
    nan = step(JOB, 0, 5, T0 + 6_000, loss=float("nan"))
    rec = Record(TRAINING_STEPS, 1, 0, JOB.encode(), codec.encode(nan), T0 + 6_000)
    event, sent = task.receive(rec, now=1.0)
    assert event is not None and len(task.aligner) == 1  # held: the other inputs have said nothing yet
    alerts = [codec.decode(s.value or b"").record for s in sent if isinstance(s, Send) and s.topic == ALERTS]
    assert {a["rule"] for a in alerts} == {"nonfinite_loss"}


def test_a_page_raised_in_order_with_another_mute_is_sent_again_and_never_withdrawn() -> None:
    engine = _engine()
    _start(engine)
    nan = step(JOB, 0, 5, T0 + 6_000, loss=float("nan"))
    [paged] = _alerts(engine.instant(nan, received_ts=T0 + 6_000), "nonfinite_loss")
    # As if the look ahead had seen a cause muting it that the ordered pass does not see.
    [(key, entry)] = list(engine._early.items())
    engine._early = {(key[0], key[1], "some-cause", *key[3:]): entry}
    [raised] = _alerts(engine.process(nan, received_ts=T0 + 6_000), "nonfinite_loss")
    assert (raised["alert_id"], raised["status"], raised["inhibited_by"]) == (
        paged["alert_id"],
        "firing",
        None,
    )
    assert _alerts(engine.advance(T0 + 20_000), "nonfinite_loss") == []  # still firing: nothing withdrawn
    assert engine.stats.get("instant_withdrawn", 0) == 0


def test_a_backlog_read_ahead_of_its_turn_and_a_job_not_started_yet_wait_for_the_ordered_pass() -> None:
    engine = _engine()
    _start(engine)
    far = step(JOB, 0, 60, T0 + 60_000, loss=float("nan"))  # a minute past what the engine took
    assert engine.instant(far, received_ts=T0 + 60_000) == []
    other = StageEngine(EngineConfig.default(), load_router(), "rank")
    other.process(step("job-2", 1, 0, T0 + 1_000), received_ts=T0 + 1_000)  # its JobStarted not taken yet
    nan = step("job-2", 0, 1, T0 + 2_000, loss=float("nan"))
    assert (
        other.instant(nan, received_ts=T0 + 2_000) == []
    )  # its team is not known: not paged to the platform
    assert _alerts(other.process(nan, received_ts=T0 + 2_000), "nonfinite_loss")  # raised in order


def test_a_cause_just_after_a_failed_state_is_paged_ahead_and_kept_by_the_ordered_pass() -> None:
    """The late-cause grace (a killed rank's fault after a peer's error failed the job) holds for
    the instant path and the ordered pass alike: paged once, never withdrawn."""
    engine = _engine()
    _start(engine)
    fault = _fault(1, T0 + 6_000)
    paged = _alerts(engine.instant(fault, received_ts=T0 + 6_000), "rank_failed")
    assert paged
    engine.process(job_state(JOB, T0 + 5_990, "failed"), received_ts=T0 + 5_990)
    assert _alerts(engine.process(fault, received_ts=T0 + 6_000), "rank_failed") == []  # sent already
    engine.advance(T0 + 8_000)
    assert engine.stats.get("instant_withdrawn", 0) == 0
