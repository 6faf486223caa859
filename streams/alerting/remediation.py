"""Remediation with safeguards: decide, per incident, whether to ask the scheduler to cancel or requeue a job.

A pure core (records, a clock and a scheduler look-up in, decisions out), fed by `ranksight
remediate` from three topics: `rs.alerts` (the incidents), `rs.training.events` (what each job
says it is doing: open checkpoints and evaluations, restore tests, verified checkpoints) and
`rs.actions` (its own earlier decisions, so a restart never acts twice). The shell executes the
actions the core decides and publishes every decision as an `ActionTaken` record.

**A record is a claim.** Who the job is, who owns it, whether it runs and whether it may be acted
on come from the scheduler (`lookup`: Slurm's squeue, the Kubernetes API in the configured
namespaces) and from this operator-owned policy, never from a record. What records say (an open
checkpoint, a job's own collective timeout or checkpoint policy) can only make remediation more
careful: a forged record can hold an action back, never cause one (docs/security.md).

An *incident* is one firing of one alert (`alert_id`: fingerprint + start); the copies routed to
several teams are the same incident. For an enabled rule the safeguards run in this order, and the
first that holds decides (a skip is recorded once per incident and reason, when the reason changes):

1. `firing_too_short`: the alert has fired continuously for less than the rule's `min_firing_s`;
2. `job_unknown`: no training event of the job was read (its open operations are unknown), or
   the scheduler lists no such job;
3. `scheduler_refused`: the job id cannot name a job of this scheduler (not a Slurm id, a
   namespace remediate may not act in) or the scheduler did not answer;
4. `identity_mismatch`: the job the scheduler answered is not the alert's job;
5. `not_opted_in`: the scheduler's job id, user, account (Slurm account, Kubernetes namespace),
   team (from the policy's `team_map` of those) or, on Kubernetes, a label on the Job object must
   be opted in; `opt_out` wins;
6. `job_not_running`: the scheduler says the job is not running, or that it started after the
   alert fired (that run did not raise it), or its training events say a new run started since;
7. `already_acted`: never twice for one incident, nor twice for one scheduler job within
   `job_cooldown_s`;
8. `within_collective_timeout` (rank_hang): the rank stopped less than the rule's collective
   timeout ago (a job's own label may make it longer, never shorter);
9. `operation_open`: a checkpoint or an evaluation is open, or a restore test runs;
10. `stale_checkpoint`: the latest verified checkpoint is older than the policy's (or the job's
    own, when stricter) maximum age: the job is requeued instead of cancelled when it is in
    `stale_checkpoint_requeue`, else nothing is done;
11. `rate_limited`: `max_actions_per_hour` actions (dry runs included) on the scheduler's cluster
    (as the scheduler names it) in the last hour;
12. otherwise the action: `dry_run` without `--execute` (or with the rule's `dry_run: true`), else
    `acted` or `failed` as the scheduler answers (a failure is retried up to 3 times, a minute apart).

The scheduler is read at most every `lookup_every_s` per job while an incident waits, and again
right before an action or dry run is decided, so every action rests on what the scheduler says now.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from schemas.errors import RanksightError
from schemas.records import Event
from streams.errors import StreamsError, refuse_unknown_keys

__all__ = [
    "REMEDIABLE_RULES",
    "Decision",
    "JobFacts",
    "Outcome",
    "RemediationError",
    "RemediationPolicy",
    "Remediator",
    "RulePolicy",
    "SchedulerView",
    "load_policy",
    "relevant_event_types",
]

REMEDIABLE_RULES: tuple[str, ...] = ("zombie_job", "rank_hang", "restart_loop")
Action = Literal["cancel", "requeue"]
DecisionKind = Literal["acted", "dry_run", "skipped", "failed"]

_HOUR_MS = 3_600_000
_MAX_ATTEMPTS = 3
_RETRY_MS = 60_000
_TOP_KEYS = (
    "rules",
    "opt_in",
    "opt_out",
    "max_actions_per_hour",
    "job_cooldown_s",
    "checkpoint_max_age_s",
    "stale_checkpoint_requeue",
    "collective_timeout_label",
    "team_map",
)
# Keys that used to take a record's word for a job's identity; refused with the reason.
_REMOVED_KEYS = {
    "scheduler_job_label": "the target comes from the scheduler, never from a JobStarted label "
    "(docs/security.md); on Slurm the ranksight job id is the Slurm job id",
}
_RULE_KEYS = ("action", "min_firing_s", "dry_run", "collective_timeout_s")


class RemediationError(StreamsError):
    """The remediation policy is malformed (the message names the key) or cannot be read."""


@dataclass(frozen=True)
class RulePolicy:
    """What to do for one rule and when."""

    action: Action
    min_firing_s: float
    dry_run: bool = False
    collective_timeout_s: float = 1800.0


class SchedulerView(Protocol):
    """One job as its scheduler reports it (producers.scheduler.actions.SchedulerJob has this shape)."""

    @property
    def job_id(self) -> str: ...  # the ranksight job id the scheduler job answers to
    @property
    def target(self) -> str: ...  # how the scheduler names it
    @property
    def state(self) -> str: ...  # a ranksight JobState symbol
    @property
    def native_state(self) -> str: ...
    @property
    def user(self) -> str | None: ...
    @property
    def account(self) -> str | None: ...
    @property
    def cluster(self) -> str: ...
    @property
    def start_ts(self) -> int | None: ...
    @property
    def labels(self) -> Mapping[str, str]: ...


# A job id -> the scheduler's job (None: it lists none); raises a RanksightError (one sentence) when
# the id cannot name a job of this scheduler or the scheduler does not answer.
Lookup = Callable[[str], SchedulerView | None]
# (user, account) -> team, from the operator's team map (the file `ranksight scheduler --teams` reads).
TeamFor = Callable[[str | None, str | None], str | None]


@dataclass(frozen=True)
class Selection:
    """Scheduler jobs, users, accounts and teams (and, for opt-in, a label on the Kubernetes Job set to "true")."""

    teams: frozenset[str] = frozenset()
    jobs: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()
    accounts: frozenset[str] = frozenset()
    label: str = ""

    def holds(self, job: SchedulerView, team: str | None) -> bool:
        """True when the scheduler's job is selected by its id, user, account, team or label."""
        if job.target in self.jobs or job.job_id in self.jobs:
            return True
        if (job.user and job.user in self.users) or (job.account and job.account in self.accounts):
            return True
        if team and team in self.teams:
            return True
        return bool(self.label) and str(job.labels.get(self.label, "")).lower() == "true"


@dataclass(frozen=True)
class RemediationPolicy:
    """The policy file (docs/operations.md lists every knob)."""

    rules: dict[str, RulePolicy]
    opt_in: Selection = field(default_factory=Selection)
    opt_out: Selection = field(default_factory=Selection)
    max_actions_per_hour: int = 3
    job_cooldown_s: float = 3600.0
    checkpoint_max_age_s: float | None = None
    stale_checkpoint_requeue: Selection = field(default_factory=Selection)
    collective_timeout_label: str = "ranksight.dev/collective-timeout-s"
    team_map: Path | None = None  # the operator's user/account -> team map (relative to the policy file)
    source: str = "policy"

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "policy") -> RemediationPolicy:
        """Validate a parsed policy; an error names the bad key."""
        if not isinstance(data, dict):
            raise RemediationError(f"{source}: expected a mapping with `rules` and `opt_in`")
        for key, why in _REMOVED_KEYS.items():
            if key in data:
                raise RemediationError(f"{source}: {key} is no longer read: {why}")
        refuse_unknown_keys(data, _TOP_KEYS, source, RemediationError)
        rules_data = data.get("rules")
        if not isinstance(rules_data, dict) or not rules_data:
            raise RemediationError(
                f"{source}: `rules` must enable at least one of {', '.join(REMEDIABLE_RULES)}"
            )
        rules = {name: _rule(name, spec, f"{source}: rules.{name}") for name, spec in rules_data.items()}
        per_hour = data.get("max_actions_per_hour", 3)
        if isinstance(per_hour, bool) or not isinstance(per_hour, int) or per_hour < 0:
            raise RemediationError(f"{source}: max_actions_per_hour must be a whole number >= 0")
        max_age = data.get("checkpoint_max_age_s")
        for key, value in (
            ("job_cooldown_s", data.get("job_cooldown_s", 3600)),
            ("checkpoint_max_age_s", max_age),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value < 0
            ):
                raise RemediationError(f"{source}: {key} must be a number of seconds >= 0")
        timeout_label = data.get("collective_timeout_label", "ranksight.dev/collective-timeout-s")
        if not isinstance(timeout_label, str):
            raise RemediationError(f"{source}: collective_timeout_label must be a label name")
        team_map = data.get("team_map")
        if team_map is not None and not isinstance(team_map, str):
            raise RemediationError(f"{source}: team_map must be the path of a team map YAML file")
        opt_in = _selection(data.get("opt_in"), f"{source}: opt_in", label=True)
        opt_out = _selection(data.get("opt_out"), f"{source}: opt_out")
        requeue = _selection(data.get("stale_checkpoint_requeue"), f"{source}: stale_checkpoint_requeue")
        if team_map is None and any(sel.teams for sel in (opt_in, opt_out, requeue)):
            raise RemediationError(
                f"{source}: selecting by teams needs team_map (the users/accounts -> team file of "
                "`ranksight scheduler --teams`): a job's team comes from its scheduler user and account, "
                "never from a record"
            )
        base = Path(source).parent if source != "policy" else Path(".")
        return cls(
            rules=rules,
            opt_in=opt_in,
            opt_out=opt_out,
            max_actions_per_hour=per_hour,
            job_cooldown_s=float(data.get("job_cooldown_s", 3600)),
            checkpoint_max_age_s=None if max_age is None else float(max_age),
            stale_checkpoint_requeue=requeue,
            collective_timeout_label=timeout_label,
            team_map=None if team_map is None else base / team_map,
            source=source,
        )


def _rule(name: str, spec: Any, where: str) -> RulePolicy:
    if name not in REMEDIABLE_RULES:
        raise RemediationError(f"{where}: ranksight remediates only {', '.join(REMEDIABLE_RULES)}")
    if not isinstance(spec, dict):
        raise RemediationError(f"{where}: expected {{action: cancel|requeue, min_firing_s: N}}")
    refuse_unknown_keys(spec, _RULE_KEYS, where, RemediationError)
    action = spec.get("action")
    if action not in ("cancel", "requeue"):
        raise RemediationError(f"{where}.action must be cancel or requeue, not {action!r}")
    if "min_firing_s" not in spec:
        raise RemediationError(f"{where}.min_firing_s is required (seconds the alert must fire first)")
    numbers = {}
    for key in ("min_firing_s", "collective_timeout_s"):
        value = spec.get(key, 1800.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise RemediationError(f"{where}.{key} must be a number of seconds >= 0")
        numbers[key] = float(value)
    dry = spec.get("dry_run", False)
    if not isinstance(dry, bool):
        raise RemediationError(f"{where}.dry_run must be true or false")
    return RulePolicy(action=action, dry_run=dry, **numbers)


def _selection(data: Any, where: str, *, label: bool = False) -> Selection:
    if data is None:
        return Selection()
    keys = (
        ("users", "accounts", "teams", "jobs", "label") if label else ("users", "accounts", "teams", "jobs")
    )
    if not isinstance(data, dict):
        raise RemediationError(f"{where}: expected {{{', '.join(k + ': ...' for k in keys)}}}")
    refuse_unknown_keys(data, keys, where, RemediationError)
    out: dict[str, frozenset[str]] = {}
    for key in ("users", "accounts", "teams", "jobs"):
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str | int) for v in value):
            raise RemediationError(f"{where}.{key} must be a list of names")
        out[key] = frozenset(str(v) for v in value)
    name = data.get("label", "")
    if not isinstance(name, str):
        raise RemediationError(f"{where}.label must be a label name")
    return Selection(
        teams=out["teams"], jobs=out["jobs"], users=out["users"], accounts=out["accounts"], label=name
    )


def load_policy(path: str | Path) -> RemediationPolicy:
    """Read and validate a remediation policy YAML file."""
    from streams.config import read_yaml

    p = Path(path)
    return RemediationPolicy.from_dict(read_yaml(p, "remediation policy", RemediationError), source=str(p))


# -- what each job is doing, from rs.training.events ---------------------------------------------------


@dataclass
class JobFacts:
    """What the training events say about one job, as far as remediation needs it."""

    job_id: str
    run_id: str = ""
    team: str = ""
    cluster: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    started_ts: int | None = None  # first JobStarted of the current run
    run_started_ts: int | None = None
    state: str = ""
    state_ts: int | None = None
    checkpoint_max_age_s: float | None = None
    open_checkpoints: dict[str, int] = field(default_factory=dict)
    open_evaluations: dict[str, int] = field(default_factory=dict)
    restore_pending: dict[str, int] = field(default_factory=dict)  # checkpoint restored, no RestoreTest yet
    last_verified_ts: int | None = None

    def observe(self, event: Event) -> None:
        """Take one rs.training.events record of this job."""
        r, kind = event.record, event.type
        ts = int(r.get("ts") or 0)
        if kind == "JobStarted":
            if r.get("run_id", "") != self.run_id or self.run_started_ts is None:
                # A new run: operations of the old one can no longer be open.
                self.open_checkpoints.clear()
                self.open_evaluations.clear()
                self.run_started_ts = ts
            self.run_id = str(r.get("run_id") or "")
            self.team = str(r.get("team") or self.team)
            self.cluster = str(r.get("cluster") or self.cluster)
            self.labels = {str(k): str(v) for k, v in (r.get("labels") or {}).items()}
            self.checkpoint_max_age_s = r.get("checkpoint_max_age_s")
            self.started_ts = ts if self.started_ts is None else min(self.started_ts, ts)
            if not self.state:
                self.state, self.state_ts = "running", ts
        elif kind == "JobStateChanged":
            if self.state_ts is None or ts >= self.state_ts:
                self.state, self.state_ts = str(r.get("state") or ""), ts
            if r.get("team") and not self.team:
                self.team = str(r["team"])
        elif kind == "CheckpointEvent":
            cid, phase = str(r.get("checkpoint_id")), r.get("phase")
            if phase == "started":
                self.open_checkpoints.setdefault(cid, ts)
            elif phase in ("completed", "failed"):
                self.open_checkpoints.pop(cid, None)
            elif phase == "verified":
                self.open_checkpoints.pop(cid, None)
                self.last_verified_ts = max(self.last_verified_ts or 0, ts)
            elif phase == "restored":
                self.restore_pending.setdefault(cid, ts)
        elif kind == "EvaluationEvent":
            eid, phase = str(r.get("evaluation_id")), r.get("phase")
            if phase == "started":
                self.open_evaluations.setdefault(eid, ts)
            else:
                self.open_evaluations.pop(eid, None)
        elif kind == "RestoreTest":
            # The SDK names the test after the restored step; any result ends the job's restore test.
            self.restore_pending.clear()

    def open_operation(self) -> str | None:
        """A sentence naming the open checkpoint, evaluation or restore test; None when none is."""
        if self.open_checkpoints:
            cid, since = min(self.open_checkpoints.items(), key=lambda kv: kv[1])
            return f"checkpoint {cid} is open (started at {_iso(since)})"
        if self.open_evaluations:
            eid, since = min(self.open_evaluations.items(), key=lambda kv: kv[1])
            return f"evaluation {eid} is open (started at {_iso(since)})"
        if self.restore_pending:
            cid, since = min(self.restore_pending.items(), key=lambda kv: kv[1])
            return f"a restore test of checkpoint {cid} runs (restored at {_iso(since)}, no result yet)"
        return None

    def checkpoint_age_s(self, now_ms: int) -> float | None:
        """Seconds since the latest verified checkpoint (since the job started when none was verified)."""
        reference = self.last_verified_ts if self.last_verified_ts is not None else self.started_ts
        return None if reference is None else max(0.0, (now_ms - reference) / 1000.0)


_RELEVANT = frozenset({"JobStarted", "JobStateChanged", "CheckpointEvent", "EvaluationEvent", "RestoreTest"})


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- decisions -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What the core decided for one incident; `execute` says the shell must ask the scheduler now."""

    alert: dict[str, Any]
    action: Action | None
    kind: DecisionKind
    reason_code: str
    reason: str
    job: JobFacts | None
    checkpoint_age_s: float | None = None
    scheduler_job: SchedulerView | None = None  # what the scheduler said; the target of an action

    @property
    def execute(self) -> bool:
        """True when the shell must call the scheduler (the outcome is reported with `Remediator.settle`)."""
        return self.kind == "acted"


@dataclass(frozen=True)
class Outcome:
    """What the scheduler answered to an executed decision."""

    ok: bool
    detail: str
    target: str = ""


@dataclass
class _Incident:
    alert: dict[str, Any]
    firing_since: int
    last_code: str = ""
    acted: bool = False
    attempts: int = 0
    last_attempt: int | None = None


@dataclass(frozen=True)
class _Read:
    """One look-up of a job at the scheduler: its answer, or the sentence it failed with."""

    at_ms: int
    job: SchedulerView | None
    error: str | None = None


class Remediator:
    """Incidents, job facts and past decisions in, the scheduler's word on each job through `lookup`;
    `decide(now_ms)` out. No I/O of its own."""

    def __init__(
        self,
        policy: RemediationPolicy,
        *,
        lookup: Lookup,
        execute: bool = False,
        scheduler: str = "",
        team_for: TeamFor | None = None,
        lookup_every_s: float = 30.0,
    ) -> None:
        self.policy = policy
        self.execute = execute
        self.scheduler = scheduler
        self.jobs: dict[str, JobFacts] = {}
        self._lookup = lookup
        self._team_for = team_for
        self._lookup_every_ms = int(lookup_every_s * 1000)
        self._reads: dict[str, _Read] = {}
        self._incidents: dict[str, _Incident] = {}
        # (time ms, alert_id) of every action taken (or dry-run, in dry-run mode), keyed on the
        # scheduler's identities: per scheduler job (its target) for the cooldown, per cluster as the
        # scheduler names it for the hourly budget. An action the scheduler refused is taken back.
        self._by_target: dict[str, list[tuple[int, str]]] = {}
        self._by_cluster: dict[str, list[tuple[int, str]]] = {}
        self._done: set[str] = set()  # alert_ids acted on (restored from rs.actions too)
        self._codes: dict[str, str] = {}  # alert_id -> last recorded reason code

    # -- input -----------------------------------------------------------------------------------
    def observe_event(self, event: Event) -> None:
        """Take one rs.training.events record (other types are ignored)."""
        if event.type not in _RELEVANT:
            return
        job_id = str(event.record.get("job_id") or "")
        if not job_id:
            return
        self.jobs.setdefault(job_id, JobFacts(job_id)).observe(event)

    def observe_alert(self, record: dict[str, Any]) -> None:
        """Take one rs.alerts record: a firing opens an incident of an enabled rule, a resolution closes it."""
        if record.get("rule") not in self.policy.rules or not record.get("job_id"):
            return
        alert_id = str(record["alert_id"])
        if record.get("status") == "resolved":
            self._incidents.pop(alert_id, None)
            return
        if alert_id not in self._incidents:
            self._incidents[alert_id] = _Incident(alert=record, firing_since=int(record["ts"]))

    def observe_action(self, record: dict[str, Any]) -> None:
        """Take one earlier ActionTaken (read back from rs.actions at start): acted incidents stay acted.

        A dry run counts only for a dry-running remediator: switching to --execute acts on what a
        dry run only announced. Its `target` and `cluster` are the scheduler's, as recorded."""
        alert_id = str(record.get("alert_id") or "")
        self._codes[alert_id] = str(record.get("reason_code") or "")
        counts = record.get("decision") == "acted" or (
            record.get("decision") == "dry_run" and not self.execute
        )
        if counts:
            mark = (int(record["ts"]), alert_id)
            self._done.add(alert_id)
            self._by_target.setdefault(str(record.get("target") or record.get("job_id") or ""), []).append(
                mark
            )
            self._by_cluster.setdefault(str(record.get("cluster") or ""), []).append(mark)

    # -- decisions -------------------------------------------------------------------------------
    def open_incidents(self) -> list[dict[str, Any]]:
        """The firing alerts of enabled rules, oldest first."""
        return [
            i.alert
            for i in sorted(self._incidents.values(), key=lambda i: (i.firing_since, i.alert["alert_id"]))
        ]

    def decide(self, now_ms: int) -> list[Decision]:
        """Decisions to record now: new or changed skips, dry runs, and actions to execute."""
        out: list[Decision] = []
        for incident in sorted(self._incidents.values(), key=lambda i: (i.firing_since, i.alert["alert_id"])):
            decision = self._decide(incident, now_ms)
            if decision is not None and decision.kind in ("acted", "dry_run"):
                job_id = str(incident.alert["job_id"])
                read = self._reads.get(job_id)
                if read is None or read.at_ms != now_ms:
                    # Before acting (or announcing it), the scheduler is asked again, now.
                    self._reads.pop(job_id, None)
                    decision = self._decide(incident, now_ms)
            if decision is None:
                continue
            alert_id = str(incident.alert["alert_id"])
            if decision.kind == "skipped" and self._codes.get(alert_id) == decision.reason_code:
                continue  # recorded already: a skip is written when its reason changes
            if decision.kind in ("acted", "dry_run"):
                assert decision.scheduler_job is not None
                incident.attempts += 1
                incident.last_attempt = now_ms
                mark = (now_ms, alert_id)
                self._done.add(alert_id)
                self._by_target.setdefault(decision.scheduler_job.target, []).append(mark)
                self._by_cluster.setdefault(decision.scheduler_job.cluster, []).append(mark)
            self._codes[alert_id] = decision.reason_code
            out.append(decision)
        return out

    def settle(self, decision: Decision, outcome: Outcome) -> Decision:
        """The scheduler's answer to an executed decision: the decision to record (acted or failed)."""
        if outcome.ok:
            return decision
        # A refused action does not use up the incident, the job's cooldown or the cluster's budget.
        alert_id = str(decision.alert["alert_id"])
        self._done.discard(alert_id)
        for marks in (*self._by_target.values(), *self._by_cluster.values()):
            marks[:] = [m for m in marks if m[1] != alert_id]
        incident = self._incidents.get(alert_id)
        tries = incident.attempts if incident else _MAX_ATTEMPTS
        self._codes[alert_id] = "scheduler_error"
        return Decision(
            decision.alert,
            decision.action,
            "failed",
            "scheduler_error",
            f"the action could not be done (attempt {tries} of {_MAX_ATTEMPTS}): {outcome.detail}",
            decision.job,
            decision.checkpoint_age_s,
            decision.scheduler_job,
        )

    def _read(self, job_id: str, now_ms: int) -> _Read:
        """The scheduler's job, read at most every `lookup_every_s` while an incident waits."""
        read = self._reads.get(job_id)
        if read is None or now_ms - read.at_ms >= self._lookup_every_ms or now_ms < read.at_ms:
            try:
                read = _Read(now_ms, self._lookup(job_id))
            except RanksightError as exc:
                read = _Read(now_ms, None, str(exc))
            self._reads[job_id] = read
        return read

    def _team(self, job: SchedulerView) -> str | None:
        return self._team_for(job.user, job.account) if self._team_for is not None else None

    def _decide(self, incident: _Incident, now_ms: int) -> Decision | None:
        alert = incident.alert
        alert_id, rule = str(alert["alert_id"]), str(alert["rule"])
        job_id = str(alert["job_id"])
        rule_policy = self.policy.rules[rule]
        job = self.jobs.get(job_id)
        if alert_id in self._done:
            return None  # acted (or dry-ran) on this incident: never twice
        if incident.attempts >= _MAX_ATTEMPTS:
            return None  # the scheduler failed every attempt: the failures are recorded
        if incident.last_attempt is not None and now_ms - incident.last_attempt < _RETRY_MS:
            return None

        def skip(
            code: str, reason: str, sched: SchedulerView | None = None, age: float | None = None
        ) -> Decision:
            return Decision(alert, None, "skipped", code, reason, job, age, sched)

        fired_s = (now_ms - incident.firing_since) / 1000.0
        if fired_s < rule_policy.min_firing_s:
            eligible = incident.firing_since + int(rule_policy.min_firing_s * 1000)
            return skip(
                "firing_too_short",
                f"{rule} has fired for {max(fired_s, 0):.0f} s; the policy waits {rule_policy.min_firing_s:g} s "
                f"(until {_iso(eligible)})",
            )
        if job is None:
            return skip(
                "job_unknown",
                f"no training event of job {job_id} was read: its open checkpoints and evaluations are unknown",
            )
        # -- the scheduler's word: who the job is, who owns it, whether it runs -------------------------
        said = self._scheduler_says(incident, job, now_ms)
        if isinstance(said, Decision):
            return said
        sched, team, owner = said
        last = max((t for t, _ in self._by_target.get(sched.target, [])), default=None)
        cooldown_ms = int(self.policy.job_cooldown_s * 1000)
        if last is not None and now_ms - last < cooldown_ms:
            return skip(
                "already_acted",
                f"job {sched.target} was acted on at {_iso(last)}, within job_cooldown_s "
                f"({self.policy.job_cooldown_s:g} s): never twice for one job",
                sched,
            )
        if rule == "rank_hang":
            timeout_s = _collective_timeout(job, self.policy, rule_policy)
            hung_s = (now_ms - int(alert.get("starts_at") or incident.firing_since)) / 1000.0
            if hung_s < timeout_s:
                return skip(
                    "within_collective_timeout",
                    f"rank {alert.get('rank')} stopped {hung_s:.0f} s ago, within the job's collective timeout "
                    f"({timeout_s:g} s): the collective may still time out by itself",
                    sched,
                )
        operation = job.open_operation()
        if operation is not None:
            return skip("operation_open", f"{operation}: never while it runs", sched)
        action: Action = rule_policy.action
        age = job.checkpoint_age_s(now_ms)
        # The job's own policy may only be stricter than the operator's.
        limits = [
            float(v)
            for v in (job.checkpoint_max_age_s, self.policy.checkpoint_max_age_s)
            if isinstance(v, int | float) and math.isfinite(v)
        ]
        max_age = min(limits) if limits else None
        stale_note = ""
        if max_age is not None and age is not None and age > max_age:
            if not self.policy.stale_checkpoint_requeue.holds(sched, team):
                return skip(
                    "stale_checkpoint",
                    f"the latest verified checkpoint of job {job_id} is {age:.0f} s old, older than its policy "
                    f"({max_age:g} s): cancelling would lose that work; requeue needs opt-in "
                    "(stale_checkpoint_requeue)",
                    sched,
                    age,
                )
            action = "requeue"
            stale_note = f"; requeued, not cancelled: its latest verified checkpoint is {age:.0f} s old (policy {max_age:g} s)"
        cluster = sched.cluster
        recent = [m for m in self._by_cluster.get(cluster, []) if now_ms - m[0] < _HOUR_MS]
        self._by_cluster[cluster] = recent
        if len(recent) >= self.policy.max_actions_per_hour:
            return skip(
                "rate_limited",
                f"{len(recent)} actions on {self.scheduler or 'scheduler'} cluster {cluster or '-'} in the last hour: "
                f"max_actions_per_hour is {self.policy.max_actions_per_hour}",
                sched,
                age,
            )
        what = f"{action} {self.scheduler or 'scheduler'} job {sched.target} ({owner}): {rule} has fired for {fired_s:.0f} s{stale_note}"
        if not self.execute or rule_policy.dry_run:
            why = "dry run (no --execute)" if not self.execute else f"dry run (rules.{rule}.dry_run)"
            return Decision(alert, action, "dry_run", "dry_run", f"would {what}; {why}", job, age, sched)
        return Decision(alert, action, "acted", "acted", what, job, age, sched)

    def _scheduler_says(
        self, incident: _Incident, job: JobFacts, now_ms: int
    ) -> Decision | tuple[SchedulerView, str | None, str]:
        """The scheduler's view of the alert's job, its team and owner; or the skip that says why not.

        Acted on only when the scheduler names this very job, it is opted in, runs, and its run
        started before the alert fired.
        """
        alert = incident.alert
        job_id = str(alert["job_id"])

        def skip(code: str, reason: str, sched: SchedulerView | None = None) -> Decision:
            return Decision(alert, None, "skipped", code, reason, job, None, sched)

        read = self._read(job_id, now_ms)
        if read.error is not None:
            return skip(
                "scheduler_refused",
                f"{self.scheduler or 'the scheduler'} cannot name job {job_id!r}: {read.error}",
            )
        sched = read.job
        if sched is None:
            return skip("job_unknown", f"{self.scheduler or 'the scheduler'} lists no job {job_id!r}")
        if sched.job_id != job_id:
            return skip(
                "identity_mismatch",
                f"{self.scheduler or 'the scheduler'} job {sched.target} answers to job {sched.job_id!r}, "
                f"not {job_id!r}: never acted on",
                sched,
            )
        team = self._team(sched)
        owner = f"user {sched.user or '-'}, account {sched.account or '-'}" + (
            f", team {team}" if team else ""
        )
        if self.policy.opt_out.holds(sched, team) or not self.policy.opt_in.holds(sched, team):
            return skip(
                "not_opted_in",
                f"{self.scheduler or 'scheduler'} job {sched.target} ({owner}) is not opted in to remediation",
                sched,
            )
        if sched.state != "running":
            return skip(
                "job_not_running",
                f"{self.scheduler or 'the scheduler'} says job {sched.target} is {sched.native_state or sched.state}, "
                "not running",
                sched,
            )
        if sched.start_ts is not None and sched.start_ts > incident.firing_since:
            return skip(
                "job_not_running",
                f"job {sched.target} started at {_iso(sched.start_ts)}, after the alert fired: this run did not "
                "raise it",
                sched,
            )
        if job.run_started_ts is not None and job.run_started_ts > incident.firing_since:
            return skip("job_not_running", f"job {job_id} started a new run after the alert fired", sched)
        return sched, team, owner

    # -- records ---------------------------------------------------------------------------------
    def record(self, decision: Decision, now_ms: int, *, detail: str | None = None) -> dict[str, Any]:
        """The ActionTaken record of a decision (its target, team and cluster as the scheduler names them)."""
        alert, job, sched = decision.alert, decision.job, decision.scheduler_job
        alert_id = str(alert["alert_id"])
        action_id = hashlib.sha256(
            f"{alert_id}|{decision.kind}|{decision.reason_code}|{now_ms}".encode()
        ).hexdigest()[:24]
        team = (self._team(sched) if sched is not None else None) or str(alert.get("team") or "")
        return {
            "ts": now_ms,
            "action_id": action_id,
            "alert_id": alert_id,
            "fingerprint": str(alert.get("fingerprint") or ""),
            "rule": str(alert["rule"]),
            "job_id": str(alert["job_id"]),
            "run_id": job.run_id if job and job.run_id else str(alert.get("run_id") or ""),
            "team": team,
            "cluster": sched.cluster if sched is not None else "",
            "scheduler": self.scheduler,
            "target": sched.target if sched is not None and decision.kind != "skipped" else "",
            "action": decision.action or "none",
            "decision": decision.kind,
            "reason_code": decision.reason_code,
            "reason": decision.reason,
            "dry_run": not self.execute,
            "severity": str(alert.get("severity") or ""),
            "firing_since": int(alert["ts"]),
            "checkpoint_age_s": decision.checkpoint_age_s,
            "detail": detail,
        }

    def forget_ended_jobs(self) -> None:
        """Drop facts and reads of jobs that ended and have no open incident (a long-running remediator stays small).

        A record saying a job ended can only make remediation forget what the job said: with no
        facts it is `job_unknown`, never acted on."""
        open_jobs = {str(i.alert["job_id"]) for i in self._incidents.values()}
        for job_id in [j for j, f in self.jobs.items() if f.state in ("completed", "failed")]:
            if job_id not in open_jobs:
                del self.jobs[job_id]
        for job_id in [j for j in self._reads if j not in open_jobs]:
            del self._reads[job_id]


def _collective_timeout(job: JobFacts, policy: RemediationPolicy, rule: RulePolicy) -> float:
    """The rule's collective timeout, or the job's own label when that is longer (a record may only wait more)."""
    raw = job.labels.get(policy.collective_timeout_label)
    try:
        own = float(raw) if raw is not None else 0.0
    except ValueError:
        own = 0.0
    if not math.isfinite(own):
        own = 0.0 if math.isnan(own) else own
    return max(rule.collective_timeout_s, own)


def relevant_event_types() -> Iterable[str]:
    """The rs.training.events record types remediation reads (the shell may skip decoding others)."""
    return sorted(_RELEVANT)
