"""`ranksight scheduler --slurm` against a real single-node Slurm: states, identity, requeues, dedupe."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from producers.publisher import MemoryPublisher
from producers.scheduler import StateTracker, TeamMap, poll_once
from producers.scheduler.slurm import SlurmSource
from ranksight.cli import app
from schemas.files import iter_container
from schemas.records import Event
from streams.config import load_config
from streams.offline.detection import DetectionEngine
from tests.integration.scheduler.conftest import SlurmCluster

TEAMS = TeamMap(accounts={"research": "nlp"}, default="infra")


def _states(events: list[Event], job_id: str) -> list[str]:
    return [e.record["state"] for e in events if e.record["job_id"] == job_id]


def _poll_until(
    source: SlurmSource, tracker: StateTracker, out: MemoryPublisher, done: Callable[[], bool], what: str
) -> None:
    """Poll the real Slurm until `done()` holds (progress, not time, ends the wait)."""
    deadline = time.monotonic() + 120
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"Slurm never reached: {what}; published {[e.record for e in out.events]}")
        poll_once(source, tracker, out, int(time.time() * 1000))
        time.sleep(0.2)


@pytest.fixture
def slurm_env(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    return slurm


def test_jobs_publish_each_state_once_with_identity_exit_codes_and_queue_time(
    slurm_env: SlurmCluster,
) -> None:
    """A completed, a failed and a held job: every change once, in order, owner and team set."""
    source, tracker, out = SlurmSource(), StateTracker("slurm", TEAMS.team_for), MemoryPublisher()
    poll_once(source, tracker, out, int(time.time() * 1000))
    ok = slurm_env.sbatch("--wrap", "sleep 2")
    held = slurm_env.sbatch("--hold", "--wrap", "sleep 1")
    bad = slurm_env.sbatch("-A", "research", "--wrap", "exit 3")
    _poll_until(
        source,
        tracker,
        out,
        lambda: (
            "completed" in _states(out.events, ok)
            and "failed" in _states(out.events, bad)
            and "pending" in _states(out.events, held)
        ),
        "jobs completed, failed and held",
    )
    events = out.events
    ok_states = _states(events, ok)
    assert ok_states[-1] == "completed" and len(ok_states) == len(set(ok_states))
    assert set(ok_states) <= {"pending", "running", "completed"}
    ok_events = [e.record for e in events if e.record["job_id"] == ok]
    assert [r["ts"] for r in ok_events] == sorted(r["ts"] for r in ok_events)
    end = ok_events[-1]
    assert end["exit_code"] == 0 and end["source"] == "slurm"
    assert end["owner"] == "root" and end["team"] == "infra"
    assert end["submit_ts"] is not None and end["ts"] >= end["submit_ts"]
    failed = [e.record for e in events if e.record["job_id"] == bad][-1]
    assert failed["state"] == "failed" and failed["exit_code"] == 3 and failed["team"] == "nlp"
    assert "NonZeroExitCode" in failed["reason"]
    pending = [e.record for e in events if e.record["job_id"] == held]
    assert [r["state"] for r in pending] == ["pending"] and "JobHeldUser" in pending[0]["reason"]

    # Nothing changed: further polls publish nothing.
    before = len(out.events)
    poll_once(source, tracker, out, int(time.time() * 1000))
    poll_once(source, tracker, out, int(time.time() * 1000))
    assert len(out.events) == before

    # A restarted command (no saved state) re-publishes at most the current state of each job.
    again = MemoryPublisher()
    poll_once(source, StateTracker("slurm", TEAMS.team_for), again, int(time.time() * 1000))
    by_job = {}
    for e in again.events:
        assert e.record["job_id"] not in by_job
        by_job[e.record["job_id"]] = e.record["state"]
    assert by_job[ok] == "completed" and by_job[held] == "pending" and by_job[bad] == "failed"
    slurm_env.run("scancel", held)


def test_a_requeue_is_published_as_restarting_with_its_count_and_the_engine_sees_the_loop(
    slurm_env: SlurmCluster,
) -> None:
    """scontrol requeue -> restarting (restart 1) then pending; restart_loop fires from these alone."""
    source, tracker, out = SlurmSource(), StateTracker("slurm", TEAMS.team_for), MemoryPublisher()
    job = slurm_env.sbatch("--wrap", "sleep 60")
    _poll_until(source, tracker, out, lambda: "running" in _states(out.events, job), "the job running")
    slurm_env.run("scontrol", "requeue", job)
    _poll_until(
        source, tracker, out, lambda: "restarting" in _states(out.events, job), "the requeued job restarting"
    )
    mine = [e.record for e in out.events if e.record["job_id"] == job]
    restarting = next(r for r in mine if r["state"] == "restarting")
    assert restarting["restart_count"] == 1 and "requeued" in restarting["reason"]
    assert mine[-1]["state"] in ("pending", "restarting", "running") and mine[-1]["restart_count"] == 1
    slurm_env.run("scancel", job)

    engine = DetectionEngine(load_config(None, {"detectors": {"platform": {"restart_threshold": 1}}}))
    alerts = [a for e in out.events for a in engine.process(e)] + engine.finish()
    fired = [a.record for a in alerts if a.type == "Alert" and a.record["rule"] == "restart_loop"]
    # restart_loop is a platform alert: the platform is paged, the job's team (infra) informed.
    assert fired and {a["job_id"] for a in fired} == {job}
    assert [a["team"] for a in fired] == ["platform", "infra"]


def test_the_cli_follows_slurm_into_a_file_and_keeps_state_across_restarts(
    slurm_env: SlurmCluster, tmp_path: Path
) -> None:
    """`ranksight scheduler --slurm --count 1` twice with one state file: the second run publishes nothing new."""
    teams = tmp_path / "teams.yaml"
    teams.write_text("accounts: {research: nlp}\ndefault: infra\n")
    job = slurm_env.sbatch("--hold", "-A", "research", "--wrap", "sleep 1")
    state = tmp_path / "state.json"
    runner = CliRunner()
    first = tmp_path / "first.avro"
    args = ["scheduler", "--slurm", "--count", "1", "--teams", str(teams), "--state-file", str(state)]
    result = runner.invoke(app, [*args, "--to", f"file://{first}"])
    assert result.exit_code == 0, result.output
    records = [e.record for e in iter_container(first) if e.record["job_id"] == job]
    assert [(r["state"], r["team"]) for r in records] == [("pending", "nlp")]
    second = tmp_path / "second.avro"
    result = runner.invoke(app, [*args, "--to", f"file://{second}"])
    assert result.exit_code == 0, result.output
    assert [e for e in iter_container(second) if e.record["job_id"] == job] == []
    slurm_env.run("scancel", job)


def test_the_cli_publishes_to_the_real_broker_keyed_by_job(
    slurm_env: SlurmCluster,
    kafka_bootstrap: str,
    topics: dict[str, str],
    topic_prefix: str,
    group_id: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A held job's `pending` reaches rs.scheduler.states (the topic only the scheduler watcher may
    write), Avro-encoded, keyed by the Slurm job id like the job's training events."""
    from confluent_kafka import Consumer

    from schemas.codec import Codec
    from schemas.topics import SCHEDULER_STATES

    job = slurm_env.sbatch("--hold", "--wrap", "sleep 1")
    monkeypatch.setenv("KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("RANKSIGHT_TOPIC_PREFIX", topic_prefix)
    monkeypatch.setenv("RANKSIGHT_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(app, ["scheduler", "--slurm", "--count", "1"])
    assert result.exit_code == 0, result.output
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": group_id, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topics[SCHEDULER_STATES]])
    codec, found = Codec(), None
    deadline = time.monotonic() + 60
    try:
        while found is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            event = codec.decode(msg.value())
            if event.record["job_id"] == job:
                found = (msg.key(), event)
    finally:
        consumer.close()
    slurm_env.run("scancel", job)
    assert found is not None, "the scheduler's event never reached the broker"
    key, event = found
    assert key == job.encode() and event.type == "JobStateChanged"
    assert event.record["state"] == "pending" and event.record["source"] == "slurm"
