"""Whose job states the worker believes (issue 32.2): with `--job-states scheduler` a JobStateChanged
on rs.training.events (which any training job may write) ends nothing; the same state from
rs.scheduler.states (which only the scheduler watcher may write) does. With `any` both count."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.codec import Codec
from schemas.eventtime import event_ts
from schemas.records import Event
from schemas.topics import SCHEDULER_STATES, TRAINING_EVENTS, key_for, off_topic_reason
from streams.runtime.options import WorkerOptions
from tests.unit.streams.builders import job_state
from tests.unit.streams.runtime.fake_kafka import FakeKafka, alerts_of, drive
from tests.unit.streams.runtime.test_core import _scenario

CODEC = Codec()
JOB = "pretrain-7b-0006"  # the job_stall scenario's job: every rank stops at 7 min for 8 min


@pytest.fixture(scope="module")
def stalled() -> list[Event]:
    return _scenario("job_stall")


def _run(events: list[Event], ended_on: str | None, trust: str, tmp_path: Path) -> tuple[set[str], int]:
    """The rules that paged for the job, and how many states the worker did not believe, when a
    `completed` state for the job arrives on `ended_on` a second before the stall begins."""
    kafka = FakeKafka(6)
    kafka.publish(events, CODEC)
    if ended_on is not None:
        start = min(event_ts(e) for e in events)
        forged = job_state(JOB, start + 7 * 60_000 - 1_000, "completed")
        value = CODEC.encode(forged)
        kafka.produce(
            ended_on, key_for(ended_on, forged.record), value, timestamp_ms=event_ts(forged) + 3_600_000
        )
    core, _ = drive(kafka, WorkerOptions(bootstrap="x", workdir=tmp_path, job_states=trust))  # type: ignore[arg-type]
    rules = {a["rule"] for a in alerts_of(kafka, CODEC) if a["job_id"] == JOB and a["status"] == "firing"}
    untrusted = sum(t.counts["untrusted_states"] for t in core.tasks.values())
    return rules, untrusted


def test_a_forged_completion_on_the_training_topic_ends_nothing_when_only_the_scheduler_is_believed(
    stalled: list[Event], tmp_path: Path
) -> None:
    honest, own = _run(stalled, None, "scheduler", tmp_path / "honest")
    assert "job_stall" in honest
    # The simulated job's own states travel on the training topic too: read, not believed.
    assert own == sum(e.type == "JobStateChanged" for e in stalled) > 0
    # Believed from anyone (the default, for deployments without a scheduler watcher): the forged
    # completion silences the stall -- the attack the scheduler topic closes.
    fooled, _ = _run(stalled, TRAINING_EVENTS, "any", tmp_path / "any")
    assert "job_stall" not in fooled
    held, untrusted = _run(stalled, TRAINING_EVENTS, "scheduler", tmp_path / "scheduler")
    assert held == honest and untrusted == own + 1


def test_the_scheduler_topics_completion_ends_the_job(stalled: list[Event], tmp_path: Path) -> None:
    rules, _ = _run(stalled, SCHEDULER_STATES, "scheduler", tmp_path)
    assert "job_stall" not in rules, rules


def test_only_job_states_belong_on_the_scheduler_topic() -> None:
    assert off_topic_reason("JobStateChanged", "t1." + SCHEDULER_STATES) is None
    assert off_topic_reason("StepCompleted", SCHEDULER_STATES) == (
        "a StepCompleted record does not belong on rs.scheduler.states"
    )
    assert off_topic_reason("JobStateChanged", TRAINING_EVENTS) is None
