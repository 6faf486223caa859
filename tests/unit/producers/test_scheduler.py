"""Scheduler sources without a scheduler: Slurm JSON parsing, the once-per-change tracker, team maps,
and the detectors raising long_pending and restart_loop from scheduler events alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from producers.publisher import MemoryPublisher
from producers.scheduler import StateTracker, TeamMap, TeamMapError, follow
from producers.scheduler.errors import SchedulerUnavailableError
from producers.scheduler.slurm import SlurmSource, observation_from_slurm, parse_slurm_json
from schemas.records import Event
from streams.offline.detection import DetectionEngine

T0 = 1_790_000_000  # seconds, as Slurm prints them
TEAMS = TeamMap(users={"alice": "vision"}, accounts={"research": "nlp"}, default="platform")


def slurm_job(job_id: int, state: str, **fields: Any) -> dict[str, Any]:
    """One job as `squeue --json` of Slurm 22.05 prints it (the fields ranksight reads)."""
    job = {
        "job_id": job_id,
        "job_state": state,
        "state_reason": "None",
        "user_name": "bob",
        "account": "",
        "partition": "gpu",
        "submit_time": T0,
        "start_time": 0,
        "end_time": 0,
        "restart_cnt": 0,
        "exit_code": 0,
    }
    job.update(fields)
    return job


class FakeSlurm:
    """A scripted `squeue`: each call returns the next snapshot (the last one repeats)."""

    def __init__(self, *snapshots: list[dict[str, Any]]) -> None:
        self.snapshots = list(snapshots)
        self.calls: list[list[str]] = []

    def __call__(self, argv: Any) -> str:
        self.calls.append(list(argv))
        if argv[0] == "sacct":
            raise SchedulerUnavailableError("Slurm accounting storage is disabled")
        jobs = self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]
        return json.dumps({"meta": {}, "errors": [], "jobs": jobs})


def run_polls(fake: FakeSlurm, polls: int, tracker: StateTracker | None = None, t0: int = T0) -> list[Event]:
    out = MemoryPublisher()
    tracker = tracker or StateTracker("slurm", TEAMS.team_for)
    clock = iter(range(t0 + 1, t0 + 1_000_000, 300))
    follow(
        SlurmSource(runner=fake),
        tracker,
        out,
        count=polls,
        clock=lambda: float(next(clock)),
        sleep=lambda _: None,
    )
    return out.events


def test_slurm_states_exit_codes_and_times_map_for_22_05_and_newer_json() -> None:
    failed = observation_from_slurm(
        slurm_job(
            7, "FAILED", state_reason="NonZeroExitCode", exit_code=3 << 8, start_time=T0 + 5, end_time=T0 + 9
        )
    )
    assert failed is not None
    assert (failed.state, failed.exit_code, failed.reason) == ("failed", 3, "NonZeroExitCode")
    assert (failed.submit_ts, failed.start_ts, failed.end_ts) == (T0 * 1000, (T0 + 5) * 1000, (T0 + 9) * 1000)
    killed = observation_from_slurm(slurm_job(8, "CANCELLED", exit_code=9))
    assert killed is not None and killed.exit_code == 128 + 9
    newer = observation_from_slurm(
        {
            "job_id": 9,
            "job_state": ["PREEMPTED"],
            "user_name": "alice",
            "submit_time": {"set": True, "infinite": False, "number": T0},
            "start_time": {"set": True, "infinite": False, "number": T0 + 1},
            "end_time": {"set": True, "infinite": False, "number": T0 + 2},
            "restart_cnt": 2,
            "exit_code": {
                "status": ["SIGNALED"],
                "return_code": {"set": True, "number": 0},
                "signal": {"id": {"set": True, "number": 15}},
            },
        }
    )
    assert newer is not None and (newer.state, newer.exit_code, newer.restart_count) == ("preempted", 143, 2)
    assert observation_from_slurm(slurm_job(10, "REQUEUED")).state == "restarting"  # type: ignore[union-attr]
    assert observation_from_slurm(slurm_job(11, "SOMETHING_NEW")) is None


def test_squeue_errors_and_garbage_are_one_sentence() -> None:
    with pytest.raises(SchedulerUnavailableError, match="did not print JSON"):
        parse_slurm_json("squeue: error: invalid option")
    with pytest.raises(SchedulerUnavailableError, match="Unable to contact slurm controller"):
        parse_slurm_json(
            json.dumps({"errors": [{"error_number": 1, "error": "Unable to contact slurm controller"}]})
        )


def test_each_state_change_is_published_once_with_owner_team_and_queue_time() -> None:
    pending = slurm_job(1, "PENDING", state_reason="Priority", user_name="alice")
    running = {
        **pending,
        "job_state": "RUNNING",
        "state_reason": "None",
        "start_time": T0 + 120,
        "end_time": T0 + 86_400,
    }
    done = {**running, "job_state": "COMPLETED", "end_time": T0 + 600}
    events = run_polls(FakeSlurm([pending], [pending], [running], [running], [done], [done]), 6)
    assert [e.record["state"] for e in events] == ["pending", "running", "completed"]
    first, start, end = (e.record for e in events)
    assert first["ts"] == T0 * 1000 and first["reason"] == "PENDING: Priority"
    assert start["ts"] - start["submit_ts"] == 120_000  # queue wait, from Slurm's own times
    assert end["ts"] == (T0 + 600) * 1000 and end["exit_code"] == 0
    assert {(r["owner"], r["team"], r["source"]) for r in (first, start, end)} == {
        ("alice", "vision", "slurm")
    }


def test_a_requeue_between_polls_is_published_as_restarting_then_the_new_state() -> None:
    running = slurm_job(2, "RUNNING", account="research", start_time=T0 + 10)
    requeued = {
        **running,
        "job_state": "PENDING",
        "state_reason": "BeginTime",
        "restart_cnt": 1,
        "submit_time": T0 + 300,
    }
    events = run_polls(FakeSlurm([running], [requeued]), 2)
    assert [(e.record["state"], e.record["restart_count"]) for e in events] == [
        ("running", 0),
        ("restarting", 1),
        ("pending", 1),
    ]
    assert events[1].record["reason"] == "requeued by slurm (restart 1)" and events[1].record["team"] == "nlp"


def test_a_restarted_command_republishes_at_most_the_current_state_and_none_with_its_state_file(
    tmp_path: Path,
) -> None:
    jobs = [slurm_job(3, "RUNNING", start_time=T0 + 5), slurm_job(4, "PENDING")]
    assert len(run_polls(FakeSlurm(jobs), 3)) == 2
    # Fresh tracker, no state file: one event per job, its current state.
    assert [e.record["state"] for e in run_polls(FakeSlurm(jobs), 1)] == ["running", "pending"]
    # With a state file the second run publishes nothing.
    state = tmp_path / "slurm.json"
    for expected in (2, 0):
        out = MemoryPublisher()
        follow(SlurmSource(runner=FakeSlurm(jobs)), StateTracker("slurm"), out, count=1, state_file=state,
               clock=lambda: float(T0 + 60), sleep=lambda _: None)  # fmt: skip
        assert len(out.events) == expected


def test_event_time_never_runs_ahead_of_the_poll_or_back_before_the_last_event() -> None:
    # A pending job's start_time is Slurm's estimate in the future; a running job's end_time its limit.
    estimate = slurm_job(5, "PENDING", start_time=T0 + 9_999_999)
    running = {**estimate, "job_state": "RUNNING", "start_time": T0 - 50, "end_time": T0 + 9_999_999}
    events = run_polls(FakeSlurm([estimate], [running]), 2, t0=T0)
    assert [e.record["state"] for e in events] == ["pending", "running"]
    assert events[1].record["ts"] >= events[0].record["ts"]


def test_filters_keep_only_the_listed_users_accounts_and_partitions() -> None:
    jobs = [
        slurm_job(1, "PENDING", user_name="alice"),
        slurm_job(2, "PENDING", account="research"),
        slurm_job(3, "PENDING", partition="cpu"),
    ]
    assert [o.job_id for o in SlurmSource(users=["alice"], runner=FakeSlurm(jobs)).poll()] == ["1"]
    assert [o.job_id for o in SlurmSource(accounts=["research"], runner=FakeSlurm(jobs)).poll()] == ["2"]
    assert [o.job_id for o in SlurmSource(partitions=["cpu"], runner=FakeSlurm(jobs)).poll()] == ["3"]


def test_purged_jobs_without_accounting_are_dropped_after_one_sacct_try() -> None:
    fake = FakeSlurm([slurm_job(6, "RUNNING", start_time=T0)], [], [])
    events = run_polls(fake, 3)
    assert [e.record["state"] for e in events] == ["running"]
    assert sum(1 for c in fake.calls if c[0] == "sacct") == 1


def test_team_map_precedence_and_bad_files(tmp_path: Path) -> None:
    assert TEAMS.team_for("alice", "research") == "vision"
    assert TEAMS.team_for("bob", "research") == "nlp"
    assert TEAMS.team_for("bob", None) == "platform"
    bad = tmp_path / "teams.yaml"
    bad.write_text("teams: {a: b}\n")
    with pytest.raises(TeamMapError, match="unknown key"):
        TeamMap.load(bad)
    with pytest.raises(TeamMapError, match="cannot read"):
        TeamMap.load(tmp_path / "missing.yaml")


def _alerts(events: list[Event], until_ms: int) -> list[dict[str, Any]]:
    engine = DetectionEngine()
    out = [a for e in events for a in engine.process(e)]
    out += engine.advance(until_ms)
    return [a.record for a in out if a.type == "Alert"]


def test_scheduler_events_alone_raise_long_pending_for_the_owning_team() -> None:
    """No training process, no telemetry: a job pending 15 min fires long_pending to its team."""
    pending = slurm_job(20, "PENDING", state_reason="Resources", account="research", cluster="gpu-east")
    events = run_polls(FakeSlurm([pending]), 1)
    assert events[0].record["cluster"] == "gpu-east"  # Slurm names its cluster in squeue's JSON
    alerts = _alerts(events, (T0 + 15 * 60) * 1000)
    fired = [a for a in alerts if a["rule"] == "long_pending" and a["status"] == "firing"]
    # long_pending is a platform alert: the platform pages, the job's team (from the team map) is informed.
    assert fired and {a["job_id"] for a in fired} == {"20"}
    assert [a["team"] for a in fired] == ["platform", "nlp"]
    # Pending before any JobStarted: the cluster comes from the scheduler's event (issue 23.7).
    assert {a["cluster"] for a in fired} == {"gpu-east"}
    # Not before the policy allows (10 min by default).
    assert not [a for a in _alerts(events, (T0 + 5 * 60) * 1000) if a["rule"] == "long_pending"]


def test_scheduler_events_alone_raise_restart_loop_after_three_requeues() -> None:
    snapshots = []
    for n in range(4):
        base = slurm_job(30, "RUNNING", restart_cnt=n, submit_time=T0 + n * 300, start_time=T0 + n * 300 + 30)
        snapshots += [
            [base],
            [{**base, "job_state": "PENDING", "restart_cnt": n + 1, "submit_time": T0 + n * 300 + 200}],
        ]
    events = run_polls(FakeSlurm(*snapshots), len(snapshots))
    assert sum(1 for e in events if e.record["state"] == "restarting") == 4
    fired = [
        a
        for a in _alerts(events, (T0 + 1300) * 1000)
        if a["rule"] == "restart_loop" and a["status"] == "firing"
    ]
    assert fired and fired[0]["job_id"] == "30" and fired[0]["team"] == "platform"
