"""Remediation safeguards, one test each: the core decides on records, a fake clock and a fake
scheduler (what squeue or the Kubernetes API would answer), no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from schemas.codec import Codec
from schemas.records import Event
from streams.alerting.remediation import Outcome, RemediationError, RemediationPolicy, Remediator, load_policy
from tests.unit.streams.builders import T0, job_started, job_state

MIN = 60_000
POLICY: dict[str, Any] = {
    "rules": {
        "zombie_job": {"action": "cancel", "min_firing_s": 300},
        "rank_hang": {"action": "requeue", "min_firing_s": 60, "collective_timeout_s": 600},
        "restart_loop": {"action": "cancel", "min_firing_s": 0},
    },
    "opt_in": {"users": ["alice"]},
    "max_actions_per_hour": 2,
    "job_cooldown_s": 3600,
}


@dataclass(frozen=True)
class Job:
    """A scheduler job as a look-up reports it (the shape of producers.scheduler.actions.SchedulerJob)."""

    job_id: str
    target: str
    state: str = "running"
    native_state: str = "RUNNING"
    user: str | None = "alice"
    account: str | None = "research"
    cluster: str = "slurm-a"
    start_ts: int | None = T0 - 3600_000
    labels: Mapping[str, str] = field(default_factory=dict)


class FakeScheduler:
    """Answers look-ups from a table; counts them."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job | Exception] = {}
        self.lookups: list[str] = []

    def add(self, job_id: str, **kw: Any) -> None:
        self.jobs[job_id] = Job(job_id, kw.pop("target", f"slurm-{job_id}"), **kw)

    def __call__(self, job_id: str) -> Job | None:
        self.lookups.append(job_id)
        found = self.jobs.get(job_id)
        if isinstance(found, Exception):
            raise found
        return found


def _alert(rule: str = "zombie_job", job: str = "job-1", ts: int = T0, **kw: Any) -> dict[str, Any]:
    return {
        "alert_id": f"{rule}-{job}-{ts}",
        "fingerprint": f"{rule}/{job}",
        "rule": rule,
        "category": "platform",
        "severity": "critical",
        "status": "firing",
        "ts": ts,
        "starts_at": kw.pop("starts_at", ts),
        "team": "platform",  # the routed copy: the platform is paged
        "job_id": job,
        "cluster": "c1",
        **kw,
    }


def _remediator(
    execute: bool = True, scheduler: FakeScheduler | None = None, team_for: Any = None, **policy: Any
) -> Remediator:
    if scheduler is None:
        scheduler = FakeScheduler()
        for job in ("job-1", "job-2", "job-3", "job-4"):
            scheduler.add(job)
    r = Remediator(
        RemediationPolicy.from_dict({**POLICY, **policy}),
        lookup=scheduler,
        execute=execute,
        scheduler="slurm",
        team_for=team_for,
    )
    r.observe_event(job_started("job-1", T0 - 3600_000 + 1, team="team-a", checkpoint_max_age_s=None))
    return r


def _codes(r: Remediator, now: int) -> list[tuple[str, str]]:
    return [(d.kind, d.reason_code) for d in r.decide(now)]


def test_a_zombie_past_the_minimum_is_cancelled_once_and_the_record_is_a_valid_action_taken() -> None:
    r = _remediator()
    r.observe_alert(_alert())
    (decision,) = r.decide(T0 + 5 * MIN)
    assert (decision.kind, decision.action, decision.execute) == ("acted", "cancel", True)
    record = r.record(r.settle(decision, Outcome(True, "scancel 42: ok")), T0 + 5 * MIN)
    assert record["decision"] == "acted" and record["dry_run"] is False
    assert (record["target"], record["cluster"]) == ("slurm-job-1", "slurm-a")  # the scheduler's names
    assert Codec().decode(Codec().encode(Event("ActionTaken", record))).record == record
    assert r.decide(T0 + 6 * MIN) == []  # never twice for one incident


def test_a_refresh_of_a_firing_alert_is_the_same_incident_firing_since_its_first_record() -> None:
    """A lasting alert is republished while it fires (issue 34.2): its refreshes neither restart the
    minimum firing time nor open a second incident."""
    r = _remediator()
    first = _alert()
    r.observe_alert(first)
    for i in range(1, 5):  # refreshed every minute: same alert_id, later ts, grown value
        r.observe_alert({**first, "ts": T0 + i * MIN, "observed": 60.0 * i})
    (decision,) = r.decide(T0 + 5 * MIN)
    assert decision.kind == "acted"
    assert r.decide(T0 + 6 * MIN) == []


def test_dry_run_is_the_default() -> None:
    r = _remediator(execute=False)
    r.observe_alert(_alert())
    (decision,) = r.decide(T0 + 5 * MIN)
    assert (decision.kind, decision.action, decision.execute) == ("dry_run", "cancel", False)
    assert "would cancel slurm job slurm-job-1 (user alice" in decision.reason
    assert "no --execute" in decision.reason
    assert r.decide(T0 + 6 * MIN) == []


def test_a_rule_can_stay_in_dry_run_while_others_execute() -> None:
    r = _remediator(
        rules={**POLICY["rules"], "zombie_job": {"action": "cancel", "min_firing_s": 0, "dry_run": True}}
    )
    r.observe_alert(_alert())
    assert _codes(r, T0 + MIN) == [("dry_run", "dry_run")]


def test_never_before_the_alert_has_fired_for_the_minimum() -> None:
    r = _remediator()
    r.observe_alert(_alert())
    assert _codes(r, T0 + 4 * MIN) == [("skipped", "firing_too_short")]
    assert _codes(r, T0 + 4 * MIN + 30_000) == []  # the same reason is recorded once
    assert _codes(r, T0 + 5 * MIN) == [("acted", "acted")]


def test_a_resolved_alert_ends_the_incident() -> None:
    r = _remediator()
    r.observe_alert(_alert())
    r.observe_alert({**_alert(), "status": "resolved"})
    assert r.decide(T0 + 10 * MIN) == []


@pytest.mark.parametrize(
    ("opt_in", "opt_out", "expected"),
    [
        ({"users": ["alice"]}, None, "acted"),
        ({"accounts": ["research"]}, None, "acted"),
        ({"jobs": ["slurm-job-1"]}, None, "acted"),
        ({"teams": ["vision"]}, None, "acted"),  # alice's team in the operator's team map
        ({"label": "ranksight.dev/remediate"}, None, "not_opted_in"),
        ({"users": ["bob"]}, None, "not_opted_in"),
        ({"users": ["alice"]}, {"jobs": ["job-1"]}, "not_opted_in"),
        ({"users": ["alice"]}, {"accounts": ["research"]}, "not_opted_in"),
        (None, None, "not_opted_in"),
    ],
)
def test_never_for_a_job_or_team_not_opted_in(
    opt_in: dict[str, Any] | None, opt_out: dict[str, Any] | None, expected: str
) -> None:
    teams = {"alice": "vision"}
    r = _remediator(
        opt_in=opt_in, opt_out=opt_out, team_map="teams.yaml", team_for=lambda u, a: teams.get(u or "")
    )
    r.observe_alert(_alert())
    assert [code for _, code in _codes(r, T0 + 5 * MIN)] == [expected]


def test_a_label_on_the_kubernetes_job_opts_it_in_and_one_on_jobstarted_does_not() -> None:
    scheduler = FakeScheduler()
    scheduler.add("job-1", labels={"ranksight.dev/remediate": "true"})  # on the Job object
    scheduler.add("job-2")
    r = _remediator(scheduler=scheduler, opt_in={"label": "ranksight.dev/remediate"})
    forged = {"ranksight.dev/remediate": "true"}
    r.observe_event(job_started("job-2", T0 - 1000, team="team-a", labels=forged, checkpoint_max_age_s=None))
    r.observe_alert(_alert())
    r.observe_alert(_alert(job="job-2"))
    got = [(d.alert["job_id"], d.reason_code) for d in r.decide(T0 + 5 * MIN)]
    assert got == [("job-1", "acted"), ("job-2", "not_opted_in")]


def _checkpoint(phase: str, ts: int, ckpt: str = "c1") -> Event:
    return Event(
        "CheckpointEvent",
        {
            "ts": ts,
            "job_id": "job-1",
            "run_id": "job-1-run-1",
            "checkpoint_id": ckpt,
            "step": 100,
            "phase": phase,
        },
    )


def _evaluation(phase: str, ts: int) -> Event:
    return Event(
        "EvaluationEvent",
        {
            "ts": ts,
            "job_id": "job-1",
            "run_id": "job-1-run-1",
            "evaluation_id": "e1",
            "step": 100,
            "phase": phase,
        },
    )


def _restore_test(ts: int) -> Event:
    return Event(
        "RestoreTest",
        {
            "ts": ts,
            "job_id": "job-1",
            "run_id": "job-1-run-1",
            "checkpoint_id": "c1",
            "restored_model": True,
            "restored_optimizer": True,
            "restored_scheduler": True,
            "restored_data_position": True,
            "steps_resumed": 10,
            "passed": True,
        },
    )


@pytest.mark.parametrize(
    ("opened", "closed", "needle"),
    [
        (_checkpoint("started", T0 + MIN), _checkpoint("completed", T0 + 6 * MIN), "checkpoint c1 is open"),
        (_evaluation("started", T0 + MIN), _evaluation("completed", T0 + 6 * MIN), "evaluation e1 is open"),
        (
            _checkpoint("restored", T0 + MIN),
            _restore_test(T0 + 6 * MIN),
            "a restore test of checkpoint c1 runs",
        ),
    ],
    ids=["checkpoint", "evaluation", "restore_test"],
)
def test_never_while_a_checkpoint_or_evaluation_is_open_or_a_restore_test_runs(
    opened: Event, closed: Event, needle: str
) -> None:
    r = _remediator()
    r.observe_alert(_alert())
    r.observe_event(opened)
    (decision,) = r.decide(T0 + 5 * MIN)
    assert (decision.kind, decision.reason_code) == (
        "skipped",
        "operation_open",
    ) and needle in decision.reason
    r.observe_event(closed)
    assert _codes(r, T0 + 7 * MIN) == [("acted", "acted")]


def test_a_rank_hang_is_acted_on_only_past_the_jobs_collective_timeout() -> None:
    r = _remediator()
    r.observe_alert(_alert("rank_hang", rank=3, starts_at=T0 - 2 * MIN))  # the rank stopped 2 min before
    assert _codes(r, T0 + 2 * MIN) == [("skipped", "within_collective_timeout")]  # hung 4 min < 10 min
    assert _codes(r, T0 + 8 * MIN) == [("acted", "acted")]
    # The job's own timeout (a JobStarted label) may make remediation wait longer ...
    r = _remediator()
    labels = {"ranksight.dev/collective-timeout-s": "1800"}
    r.observe_event(job_started("job-1", T0 - 1000, team="team-a", labels=labels, checkpoint_max_age_s=None))
    r.observe_alert(_alert("rank_hang", rank=3, starts_at=T0))
    assert _codes(r, T0 + 20 * MIN) == [("skipped", "within_collective_timeout")]
    assert [(d.kind, d.action) for d in r.decide(T0 + 31 * MIN)] == [("acted", "requeue")]


@pytest.mark.parametrize("claimed", ["0", "-5", "nan", "1e-9"])
def test_a_records_collective_timeout_never_makes_remediation_act_sooner(claimed: str) -> None:
    """The attack: a (forged) JobStarted sets the job's collective timeout to 0."""
    r = _remediator()
    labels = {"ranksight.dev/collective-timeout-s": claimed}
    r.observe_event(job_started("job-1", T0 - 1000, team="team-a", labels=labels, checkpoint_max_age_s=None))
    r.observe_alert(_alert("rank_hang", rank=3, starts_at=T0))
    assert _codes(r, T0 + 5 * MIN) == [("skipped", "within_collective_timeout")]  # the rule's 600 s hold


def test_at_most_n_actions_per_hour_per_cluster_as_the_scheduler_names_it() -> None:
    scheduler = FakeScheduler()
    for job in ("job-1", "job-2", "job-3"):
        scheduler.add(job)
    scheduler.add("job-4", cluster="slurm-b")
    r = _remediator(scheduler=scheduler, job_cooldown_s=0)
    for job in ("job-1", "job-2", "job-3"):
        r.observe_event(job_started(job, T0 - 1000, team="team-a", checkpoint_max_age_s=None))
        r.observe_alert(_alert(job=job))
    r.observe_event(job_started("job-4", T0 - 1000, team="team-a", checkpoint_max_age_s=None))
    r.observe_alert(_alert(job="job-4"))
    got = [(d.alert["job_id"], d.kind, d.reason_code) for d in r.decide(T0 + 5 * MIN)]
    assert got == [
        ("job-1", "acted", "acted"),
        ("job-2", "acted", "acted"),
        ("job-3", "skipped", "rate_limited"),
        ("job-4", "acted", "acted"),  # another cluster (as Slurm names it), its own budget
    ]
    assert [(d.alert["job_id"], d.kind) for d in r.decide(T0 + 66 * MIN)] == [("job-3", "acted")]


def test_made_up_cluster_names_in_records_share_one_budget() -> None:
    """The attack: five jobs' records and alerts name five made-up clusters against a limit of 3."""
    scheduler = FakeScheduler()
    jobs = [f"job-{i}" for i in range(1, 6)]
    for job in jobs:
        scheduler.add(job)  # one Slurm cluster, whatever the records say
    r = _remediator(scheduler=scheduler, job_cooldown_s=0, max_actions_per_hour=3)
    for i, job in enumerate(jobs):
        forged = job_started(job, T0 - 1000, team="team-a", checkpoint_max_age_s=None)
        forged.record["cluster"] = f"made-up-{i}"
        r.observe_event(forged)
        r.observe_alert(_alert(job=job, cluster=f"made-up-{i}"))
    kinds = [d.kind for d in r.decide(T0 + 5 * MIN)]
    assert kinds.count("acted") == 3 and kinds.count("skipped") == 2


def test_the_cooldown_is_keyed_on_the_scheduler_job_not_the_records_job_id() -> None:
    """Two ranksight job ids the scheduler resolves to one job: acted on once within the cooldown."""
    scheduler = FakeScheduler()
    scheduler.add("job-1", target="4242")
    scheduler.jobs["4242"] = Job("4242", "4242")
    r = _remediator(scheduler=scheduler)
    r.observe_event(job_started("4242", T0 - 3600_000, team="team-a", checkpoint_max_age_s=None))
    r.observe_alert(_alert())
    r.observe_alert(_alert(job="4242"))
    got = [(d.alert["job_id"], d.reason_code) for d in r.decide(T0 + 5 * MIN)]
    assert got == [("4242", "acted"), ("job-1", "already_acted")]


def test_never_twice_for_one_incident_across_a_restart_and_never_twice_for_one_job_within_the_cooldown() -> (
    None
):
    first = _remediator()
    first.observe_alert(_alert())
    (decision,) = first.decide(T0 + 5 * MIN)
    record = first.record(first.settle(decision, Outcome(True, "ok")), T0 + 5 * MIN)
    restarted = _remediator()
    restarted.observe_action(record)  # read back from rs.actions at start
    restarted.observe_alert(_alert())
    assert restarted.decide(T0 + 6 * MIN) == []
    # Another rule on the same job, 10 min later: the job was acted on within the cooldown.
    restarted.observe_alert(_alert("restart_loop", ts=T0 + 10 * MIN))
    assert _codes(restarted, T0 + 10 * MIN) == [("skipped", "already_acted")]


def test_a_dry_run_does_not_stop_a_later_execute_run_from_acting() -> None:
    dry = _remediator(execute=False)
    dry.observe_alert(_alert())
    (decision,) = dry.decide(T0 + 5 * MIN)
    record = dry.record(decision, T0 + 5 * MIN)
    executing = _remediator()
    executing.observe_action(record)
    executing.observe_alert(_alert())
    assert _codes(executing, T0 + 6 * MIN) == [("acted", "acted")]


def test_a_stale_checkpoint_is_requeued_not_cancelled_only_with_explicit_opt_in() -> None:
    for opted, expected in (
        (None, ("skipped", None, "stale_checkpoint")),
        ({"users": ["alice"]}, ("acted", "requeue", "acted")),
    ):
        r = _remediator(stale_checkpoint_requeue=opted)
        r.observe_event(job_started("job-1", T0 - 7200_000, team="team-a", checkpoint_max_age_s=1800.0))
        r.observe_event(_checkpoint("verified", T0 - 3600_000))  # an hour old at T0; the policy says 30 min
        r.observe_alert(_alert())
        (decision,) = r.decide(T0 + 5 * MIN)
        assert (decision.kind, decision.action, decision.reason_code) == expected
        assert decision.checkpoint_age_s == pytest.approx(3900.0)
    # A fresh verified checkpoint: the rule's own action (cancel).
    r = _remediator()
    r.observe_event(job_started("job-1", T0 - 7200_000, team="team-a", checkpoint_max_age_s=1800.0))
    r.observe_event(_checkpoint("verified", T0))
    r.observe_alert(_alert())
    assert [(d.kind, d.action) for d in r.decide(T0 + 5 * MIN)] == [("acted", "cancel")]


def test_the_policy_checkpoint_age_applies_to_jobs_without_their_own() -> None:
    r = _remediator(checkpoint_max_age_s=600)
    r.observe_alert(_alert())
    assert _codes(r, T0 + 5 * MIN) == [("skipped", "stale_checkpoint")]  # no checkpoint for an hour


def test_unknown_ended_or_restarted_jobs_are_left_alone() -> None:
    r = _remediator(opt_in={"jobs": ["job-9"]})
    r.observe_alert(_alert(job="job-9"))
    assert _codes(r, T0 + 5 * MIN) == [("skipped", "job_unknown")]  # no training event of it
    r.observe_event(job_started("job-9", T0 - 1000, checkpoint_max_age_s=None))
    r.observe_alert(_alert(job="job-9", ts=T0 + MIN))
    assert ("skipped", "job_unknown") in _codes(r, T0 + 6 * MIN)  # the scheduler lists none
    for state, native in (("pending", "PENDING"), ("restarting", "REQUEUED"), ("failed", "CANCELLED")):
        scheduler = FakeScheduler()
        scheduler.add("job-1", state=state, native_state=native)
        r = _remediator(scheduler=scheduler)
        r.observe_alert(_alert())
        (decision,) = r.decide(T0 + 5 * MIN)
        assert decision.reason_code == "job_not_running" and native in decision.reason
    # A run the scheduler started after the alert fired did not raise it.
    scheduler = FakeScheduler()
    scheduler.add("job-1", start_ts=T0 + MIN)
    r = _remediator(scheduler=scheduler)
    r.observe_alert(_alert())
    assert _codes(r, T0 + 5 * MIN) == [("skipped", "job_not_running")]
    r = _remediator()
    r.observe_alert(_alert())
    r.observe_event(job_started("job-1", T0 + MIN, team="team-a", run_id="run-2", checkpoint_max_age_s=None))
    assert _codes(r, T0 + 5 * MIN) == [("skipped", "job_not_running")]


def test_a_refused_action_is_recorded_retried_a_minute_later_and_given_up_after_three() -> None:
    r = _remediator()
    r.observe_alert(_alert())
    kinds = []
    for minute in (5, 5.5, 6, 7, 8, 9):
        for decision in r.decide(T0 + int(minute * MIN)):
            kinds.append((minute, r.settle(decision, Outcome(False, "slurmctld is down")).kind))
    assert kinds == [(5, "failed"), (6, "failed"), (7, "failed")]
    # The refusals did not use the cluster's budget: another job still gets acted on.
    r.observe_event(job_started("job-2", T0 - 1000, team="team-a", checkpoint_max_age_s=None))
    r.observe_alert(_alert(job="job-2"))
    assert [(d.alert["job_id"], d.kind) for d in r.decide(T0 + 10 * MIN)] == [("job-2", "acted")]


def test_alerts_of_rules_the_policy_does_not_enable_are_not_decisions() -> None:
    r = _remediator(rules={"zombie_job": {"action": "cancel", "min_firing_s": 0}})
    r.observe_alert(_alert("restart_loop"))
    assert r.decide(T0 + 5 * MIN) == []


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"rules": {"job_stall": {"action": "cancel", "min_firing_s": 0}}}, "remediates only"),
        (
            {"rules": {"zombie_job": {"action": "kill", "min_firing_s": 0}}},
            "action must be cancel or requeue",
        ),
        ({"rules": {"zombie_job": {"action": "cancel"}}}, "min_firing_s is required"),
        ({"rules": {}}, "enable at least one"),
        ({"max_actions_per_hour": -1}, "max_actions_per_hour"),
        ({"opt_in": {"team": ["a"]}}, "unknown key 'team'"),
        ({"stale_checkpoint_requeue": {"label": "x"}}, "unknown key 'label'"),
        ({"dry_run": True}, "unknown key 'dry_run'"),
        ({"scheduler_job_label": "x"}, "no longer read: the target comes from the scheduler"),
        ({"opt_in": {"teams": ["a"]}}, "selecting by teams needs team_map"),
    ],
)
def test_a_bad_policy_is_rejected_naming_the_key(change: dict[str, Any], needle: str) -> None:
    with pytest.raises(RemediationError, match=needle):
        RemediationPolicy.from_dict({**POLICY, **change})


def test_the_shipped_example_policy_loads(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[3]
    policy = load_policy(root / "examples" / "remediation.yaml")
    assert set(policy.rules) == {"zombie_job", "rank_hang", "restart_loop"}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(POLICY))
    assert load_policy(tmp_path / "p.yaml").max_actions_per_hour == 2
    with pytest.raises(RemediationError, match="does not exist"):
        load_policy(tmp_path / "none.yaml")


def test_the_rebuild_skips_training_events_it_never_reads_by_their_header() -> None:
    from streams.alerting.remediation_loop import event_filter
    from tests.unit.streams.builders import step

    codec = Codec()
    keep = event_filter(codec)
    assert keep(codec.encode(job_started("job-1", T0)))
    assert keep(codec.encode(_checkpoint("started", T0))) and keep(codec.encode(_evaluation("started", T0)))
    assert keep(codec.encode(_restore_test(T0))) and keep(codec.encode(job_state("job-1", T0, "running")))
    assert not keep(codec.encode(step("job-1", 0, 1, T0)))
    assert keep(b"\x00\x00\x00\x00\x07rest")  # registry framing: decoded, then dropped by type
    assert keep(None)  # a tombstone reaches the decoder, which reports it


# -- what a record cannot do (docs/security.md) --------------------------------------------------------


def test_the_job_the_scheduler_answers_must_be_the_alerts_job() -> None:
    scheduler = FakeScheduler()
    scheduler.jobs["job-1"] = Job("someone-else", "4243")  # e.g. a Kubernetes Job labelled otherwise
    r = _remediator(scheduler=scheduler)
    r.observe_alert(_alert())
    (decision,) = r.decide(T0 + 5 * MIN)
    assert (decision.kind, decision.reason_code) == ("skipped", "identity_mismatch")
    assert "4243" in decision.reason and r.record(decision, T0 + 5 * MIN)["target"] == ""


def test_a_job_id_the_scheduler_cannot_name_is_refused_with_its_sentence() -> None:
    from producers.scheduler.actions import SchedulerActionError

    scheduler = FakeScheduler()
    scheduler.jobs["job-1"] = SchedulerActionError("job 'kube-system/coredns' is in namespace 'kube-system'")
    r = _remediator(scheduler=scheduler)
    r.observe_alert(_alert())
    (decision,) = r.decide(T0 + 5 * MIN)
    assert (decision.kind, decision.reason_code) == ("skipped", "scheduler_refused")
    assert "kube-system" in decision.reason


def test_records_claiming_a_team_owner_labels_or_state_opt_no_job_in() -> None:
    """The attack: forged JobStarted/JobStateChanged for another job's id: opted-in team, the opt-in
    label, owner alice, state running. The scheduler says the job is bob's: nothing is done."""
    scheduler = FakeScheduler()
    scheduler.add("job-1", user="bob", account="other")
    r = _remediator(scheduler=scheduler, opt_in={"users": ["alice"], "label": "ranksight.dev/remediate"})
    r.observe_event(
        job_started(
            "job-1",
            T0 - 1000,
            team="team-a",
            labels={"ranksight.dev/remediate": "true"},
            checkpoint_max_age_s=None,
        )
    )
    r.observe_event(job_state("job-1", T0, "running"))
    r.observe_alert(_alert())
    assert _codes(r, T0 + 5 * MIN) == [("skipped", "not_opted_in")]


def test_a_records_checkpoint_policy_can_only_be_stricter_than_the_operators() -> None:
    r = _remediator(checkpoint_max_age_s=600)
    r.observe_event(job_started("job-1", T0 - 7200_000, team="team-a", checkpoint_max_age_s=1e12))
    r.observe_alert(_alert())
    assert _codes(r, T0 + 5 * MIN) == [("skipped", "stale_checkpoint")]


def test_the_scheduler_is_read_again_right_before_an_action() -> None:
    scheduler = FakeScheduler()
    scheduler.add("job-1")
    r = _remediator(scheduler=scheduler)
    r.observe_alert(_alert())
    r.observe_event(_checkpoint("started", T0))
    assert _codes(r, T0 + 5 * MIN) == [("skipped", "operation_open")]
    r.observe_event(_checkpoint("completed", T0 + 5 * MIN))
    scheduler.add("job-1", state="failed", native_state="CANCELLED")  # ended in between
    # Ten seconds later (inside the 30 s a waiting incident's read is kept), the read is renewed.
    assert _codes(r, T0 + 5 * MIN + 10_000) == [("skipped", "job_not_running")]
    assert len(scheduler.lookups) == 2
