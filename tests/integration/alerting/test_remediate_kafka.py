"""`ranksight remediate` over a real broker: rebuilt from rs.alerts, rs.training.events and rs.actions, every
decision published as an ActionTaken, never twice across a restart, and a clean stop on SIGINT or
SIGTERM, also when started with SIGINT ignored."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from producers.scheduler.actions import SchedulerJob
from ranksight.signals import STOP_GRACE_S
from schemas.codec import Codec
from schemas.records import Event
from schemas.topics import ACTIONS, ALERTS, TRAINING_EVENTS, key_for
from streams.alerting.remediation import Decision, Outcome, RemediationPolicy, Remediator
from streams.alerting.remediation_loop import RemediationTopics, follow_remediation
from tests.integration.stopping import Running
from tests.unit.streams.builders import job_started

CODEC = Codec()
NOW = int(time.time() * 1000)
MIN = 60_000
POLICY = {
    "rules": {"zombie_job": {"action": "cancel", "min_firing_s": 300}},
    "opt_in": {"users": ["alice"]},
    "max_actions_per_hour": 5,
}
# What the scheduler says of each job: job-other is bob's, not opted in.
OWNERS = {"job-stuck": "alice", "job-eval": "alice", "job-other": "bob"}


def _lookup(job_id: str) -> SchedulerJob | None:
    user = OWNERS.get(job_id)
    if user is None:
        return None
    return SchedulerJob(
        job_id, f"slurm-{job_id}", "running", "RUNNING", user, "research", "c1", NOW - 90 * MIN
    )


def _alert(job: str, status: str = "firing") -> dict[str, Any]:
    return {
        "alert_id": f"zombie-{job}",
        "fingerprint": f"zombie_job/{job}",
        "rule": "zombie_job",
        "category": "platform",
        "severity": "warning",
        "status": status,
        "ts": NOW - 20 * MIN,
        "starts_at": NOW - 30 * MIN,
        "ends_at": None if status == "firing" else NOW - MIN,
        "team": "platform",
        "receiver": "platform-pager",
        "summary": f"job {job} holds its GPUs but made no progress",
        "owner": "alice",
        "job_id": job,
        "run_id": f"{job}-run-1",
        "model_version": "",
        "dataset_version": "",
        "workload_family": "",
        "cluster": "c1",
        "invariant": "",
        "suspected_layer": "platform",
        "history_metric": "",
        "history": [],
        "runbook_url": "docs/runbooks/zombie_job",
        "labels": {},
    }


def _produce(bootstrap: str, topics: dict[str, str], events: list[Event]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for event in events:
        canonical = ALERTS if event.type == "Alert" else TRAINING_EVENTS
        producer.produce(topics[canonical], key=key_for(canonical, event.record), value=CODEC.encode(event))
    assert producer.flush(30) == 0


def _actions(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = [TopicPartition(topic, p, 0) for p in meta.partitions]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=10)[1] for p in parts}
        consumer.assign(parts)
        out: list[dict[str, Any]] = []
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 60
        while len(done) < len(ends) and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.5):
                out.append(CODEC.decode(msg.value()).record)
                if msg.offset() + 1 >= ends[msg.partition()]:
                    done.add(msg.partition())
        return sorted(out, key=lambda r: (r["ts"], r["job_id"]))
    finally:
        consumer.close()


def _jobs() -> list[Event]:
    events = [
        job_started(job, NOW - 60 * MIN, team=team, checkpoint_max_age_s=None)
        for job, team in (("job-stuck", "llm"), ("job-eval", "llm"), ("job-other", "vision"))
    ]
    events.append(
        Event(
            "EvaluationEvent",
            {
                "ts": NOW - 2 * MIN,
                "job_id": "job-eval",
                "run_id": "job-eval-run-1",
                "evaluation_id": "val-7",
                "step": 7000,
                "phase": "started",
            },
        )
    )
    return events


def _run(
    bootstrap: str,
    topics: dict[str, str],
    *,
    execute: bool,
    acted: list[str],
    lookback_s: float | None = None,
) -> Any:
    def describe(decision: Decision) -> str:
        assert decision.scheduler_job is not None
        return f"scancel {decision.scheduler_job.target}"

    def act(decision: Decision) -> Outcome:
        assert decision.scheduler_job is not None
        target = decision.scheduler_job.target
        acted.append(target)
        return Outcome(True, f"{target}: cancelled", target)

    remediator = Remediator(
        RemediationPolicy.from_dict(POLICY),
        lookup=_lookup,
        execute=execute,
        scheduler="slurm",
        team_for=lambda user, account: {"alice": "llm"}.get(user or ""),
    )
    names = RemediationTopics(topics[ALERTS], topics[TRAINING_EVENTS], topics[ACTIONS])
    return follow_remediation(
        {"bootstrap.servers": bootstrap},
        names,
        remediator,
        CODEC,
        describe=describe,
        act=act,
        tick_s=0.2,
        idle_exit_s=3.0,
        lookback_s=lookback_s,
    )


def test_decisions_are_published_and_a_restart_never_acts_twice(
    kafka_bootstrap: str, topics: dict[str, str]
) -> None:
    _produce(
        kafka_bootstrap,
        topics,
        [*_jobs(), *(Event("Alert", _alert(j)) for j in ("job-stuck", "job-eval", "job-other"))],
    )
    acted: list[str] = []
    stats = _run(kafka_bootstrap, topics, execute=False, acted=acted)
    assert stats.caught_up and stats.alerts == 3
    first = _actions(kafka_bootstrap, topics[ACTIONS])
    by_job = {r["job_id"]: (r["decision"], r["reason_code"]) for r in first}
    assert by_job == {
        "job-stuck": ("dry_run", "dry_run"),
        "job-eval": ("skipped", "operation_open"),  # in a long evaluation: never
        "job-other": ("skipped", "not_opted_in"),
    }
    stuck = next(r for r in first if r["job_id"] == "job-stuck")
    assert stuck["target"] == "slurm-job-stuck" and stuck["detail"] == "scancel slurm-job-stuck"
    assert stuck["team"] == "llm" and stuck["dry_run"] is True and acted == []

    # A restart in dry run repeats nothing: the same decisions were read back from rs.actions.
    _run(kafka_bootstrap, topics, execute=False, acted=acted)
    assert _actions(kafka_bootstrap, topics[ACTIONS]) == first

    # Executing acts on what the dry run announced, once; a second executing run does nothing more.
    _run(kafka_bootstrap, topics, execute=True, acted=acted)
    _run(kafka_bootstrap, topics, execute=True, acted=acted)
    assert acted == ["slurm-job-stuck"]
    last = _actions(kafka_bootstrap, topics[ACTIONS])
    assert [(r["job_id"], r["decision"]) for r in last[len(first) :]] == [("job-stuck", "acted")]


def test_a_rebuild_from_a_lookback_reads_what_was_published_within_it(
    kafka_bootstrap: str, topics: dict[str, str]
) -> None:
    """--lookback starts each partition at the first record Kafka received within it (its record time)."""
    _produce(kafka_bootstrap, topics, [*_jobs(), Event("Alert", _alert("job-stuck"))])
    stats = _run(kafka_bootstrap, topics, execute=False, acted=[], lookback_s=3600)
    assert stats.caught_up and stats.alerts == 1 and stats.events == len(_jobs())
    assert [(r["job_id"], r["decision"]) for r in _actions(kafka_bootstrap, topics[ACTIONS])] == [
        ("job-stuck", "dry_run")
    ]


def test_a_resolved_alert_is_not_acted_on(kafka_bootstrap: str, topics: dict[str, str]) -> None:
    _produce(
        kafka_bootstrap,
        topics,
        [*_jobs(), Event("Alert", _alert("job-stuck")), Event("Alert", _alert("job-stuck", "resolved"))],
    )
    acted: list[str] = []
    _run(kafka_bootstrap, topics, execute=True, acted=acted)
    assert acted == [] and _actions(kafka_bootstrap, topics[ACTIONS]) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize("ignore_sigint", [True, False], ids=["sigint-ignored", "default"])
def test_remediate_stops_on_a_signal_within_the_budget(
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    tmp_path: Path,
    ignore_sigint: bool,
    sig: signal.Signals,
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RANKSIGHT_HOME": str(tmp_path),
        "RANKSIGHT_TOPIC_PREFIX": topic_prefix,
    }
    running = Running.start(
        ["remediate", "--policy", str(policy), "--slurm"],
        env=env,
        log=tmp_path / "out.log",
        ignore_sigint=ignore_sigint,
    )
    try:
        running.wait_for(r"^caught up: ")
        stopped = running.stop(sig)
    finally:
        running.kill()
    assert stopped.code == 128 + sig, stopped.output
    assert "no decisions; read 0 alert records" in stopped.output  # the clean path, not the hard exit
    assert stopped.seconds < STOP_GRACE_S + 3.0, f"took {stopped.seconds:.1f} s to stop"
