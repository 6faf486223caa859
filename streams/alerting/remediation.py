"""Remediation with safeguards: decide, per incident, whether to ask the scheduler to cancel or requeue a job.

A pure core (records and a clock in, decisions out), fed by `ranksight remediate` from three
topics: `rs.alerts` (the incidents), `rs.training.events` (what each job is doing: open
checkpoints and evaluations, restore tests, verified checkpoints, its state and team) and
`rs.actions` (its own earlier decisions, so a restart never acts twice). The shell executes the
actions the core decides and publishes every decision as an `ActionTaken` record.

An *incident* is one firing of one alert (`alert_id`: fingerprint + start); the copies routed to
several teams are the same incident. For an enabled rule the safeguards run in this order, and the
first that holds decides (a skip is recorded once per incident and reason, when the reason changes):

1. `already_acted`: never twice for one incident, nor twice for one job within `job_cooldown_s`;
2. `not_opted_in`: the job, its team, or its `opt_in.label` must be opted in; `opt_out` wins;
3. `job_unknown`: no JobStarted or scheduler JobStateChanged of the job was read: its open
   operations are unknown, so nothing is done;
4. `job_not_running`: the job's latest state is not `running`, or a new run started after the alert;
5. `firing_too_short`: the alert has fired continuously for less than the rule's `min_firing_s`;
6. `within_collective_timeout` (rank_hang): the rank stopped less than the job's collective
   timeout ago (NCCL may still abort it);
7. `operation_open`: a checkpoint or an evaluation is open, or a restore test runs (a checkpoint
   was restored and its RestoreTest has not arrived);
8. `stale_checkpoint`: the latest verified checkpoint is older than the job's policy: the job is
   requeued instead of cancelled when its job or team is in `stale_checkpoint_requeue`, else
   nothing is done;
9. `rate_limited`: `max_actions_per_hour` actions (dry runs included) on the job's cluster in the
   last hour;
10. otherwise the action: `dry_run` without `--execute` (or with the rule's `dry_run: true`), else
    `acted` or `failed` as the scheduler answers (a failure is retried up to 3 times, a minute apart).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from schemas.records import Event
from streams.errors import StreamsError

__all__ = [
    "REMEDIABLE_RULES",
    "Decision",
    "JobFacts",
    "Outcome",
    "RemediationError",
    "RemediationPolicy",
    "Remediator",
    "RulePolicy",
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
    "scheduler_job_label",
)
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


@dataclass(frozen=True)
class Selection:
    """Jobs and teams (and, for opt-in, a JobStarted label set to "true")."""

    teams: frozenset[str] = frozenset()
    jobs: frozenset[str] = frozenset()
    label: str = ""

    def holds(self, job_id: str, team: str, labels: dict[str, str]) -> bool:
        """True when the job is selected by id, team or label."""
        if job_id in self.jobs or (team and team in self.teams):
            return True
        return bool(self.label) and str(labels.get(self.label, "")).lower() == "true"


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
    scheduler_job_label: str = "ranksight.dev/scheduler-job-id"
    source: str = "policy"

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "policy") -> RemediationPolicy:
        """Validate a parsed policy; an error names the bad key."""
        if not isinstance(data, dict):
            raise RemediationError(f"{source}: expected a mapping with `rules` and `opt_in`")
        bad = sorted(set(data) - set(_TOP_KEYS))
        if bad:
            raise RemediationError(f"{source}: unknown key {bad[0]!r}; known: {', '.join(_TOP_KEYS)}")
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
        labels = {}
        for key in ("collective_timeout_label", "scheduler_job_label"):
            value = data.get(key, cls.__dataclass_fields__[key].default)
            if not isinstance(value, str):
                raise RemediationError(f"{source}: {key} must be a label name")
            labels[key] = value
        return cls(
            rules=rules,
            opt_in=_selection(data.get("opt_in"), f"{source}: opt_in", label=True),
            opt_out=_selection(data.get("opt_out"), f"{source}: opt_out"),
            max_actions_per_hour=per_hour,
            job_cooldown_s=float(data.get("job_cooldown_s", 3600)),
            checkpoint_max_age_s=None if max_age is None else float(max_age),
            stale_checkpoint_requeue=_selection(
                data.get("stale_checkpoint_requeue"), f"{source}: stale_checkpoint_requeue"
            ),
            source=source,
            **labels,
        )


def _rule(name: str, spec: Any, where: str) -> RulePolicy:
    if name not in REMEDIABLE_RULES:
        raise RemediationError(f"{where}: ranksight remediates only {', '.join(REMEDIABLE_RULES)}")
    if not isinstance(spec, dict):
        raise RemediationError(f"{where}: expected {{action: cancel|requeue, min_firing_s: N}}")
    bad = sorted(set(spec) - set(_RULE_KEYS))
    if bad:
        raise RemediationError(f"{where}: unknown key {bad[0]!r}; known: {', '.join(_RULE_KEYS)}")
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
    keys = ("teams", "jobs", "label") if label else ("teams", "jobs")
    if not isinstance(data, dict):
        raise RemediationError(f"{where}: expected {{{', '.join(k + ': ...' for k in keys)}}}")
    bad = sorted(set(data) - set(keys))
    if bad:
        raise RemediationError(f"{where}: unknown key {bad[0]!r}; known: {', '.join(keys)}")
    out: dict[str, frozenset[str]] = {}
    for key in ("teams", "jobs"):
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str | int) for v in value):
            raise RemediationError(f"{where}.{key} must be a list of names")
        out[key] = frozenset(str(v) for v in value)
    name = data.get("label", "")
    if not isinstance(name, str):
        raise RemediationError(f"{where}.label must be a label name")
    return Selection(teams=out["teams"], jobs=out["jobs"], label=name)


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


class Remediator:
    """Incidents, job facts and past decisions in; `decide(now_ms)` out. No I/O."""

    def __init__(self, policy: RemediationPolicy, *, execute: bool = False, scheduler: str = "") -> None:
        self.policy = policy
        self.execute = execute
        self.scheduler = scheduler
        self.jobs: dict[str, JobFacts] = {}
        self._incidents: dict[str, _Incident] = {}
        # (time ms, alert_id) of every action taken (or dry-run, in dry-run mode): per job for the
        # cooldown, per cluster for the hourly budget. An action the scheduler refused is taken back.
        self._by_job: dict[str, list[tuple[int, str]]] = {}
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
        dry run only announced."""
        alert_id = str(record.get("alert_id") or "")
        self._codes[alert_id] = str(record.get("reason_code") or "")
        counts = record.get("decision") == "acted" or (
            record.get("decision") == "dry_run" and not self.execute
        )
        if counts:
            mark = (int(record["ts"]), alert_id)
            self._done.add(alert_id)
            self._by_job.setdefault(str(record.get("job_id") or ""), []).append(mark)
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
            if decision is None:
                continue
            alert_id = str(incident.alert["alert_id"])
            if decision.kind == "skipped" and self._codes.get(alert_id) == decision.reason_code:
                continue  # recorded already: a skip is written when its reason changes
            if decision.kind in ("acted", "dry_run"):
                incident.attempts += 1
                incident.last_attempt = now_ms
                mark = (now_ms, alert_id)
                self._done.add(alert_id)
                self._by_job.setdefault(str(incident.alert["job_id"]), []).append(mark)
                self._by_cluster.setdefault(self._cluster(incident.alert, decision.job), []).append(mark)
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
        for marks in (*self._by_job.values(), *self._by_cluster.values()):
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
        )

    @staticmethod
    def _cluster(alert: dict[str, Any], job: JobFacts | None) -> str:
        return str(alert.get("cluster") or (job.cluster if job else "") or "")

    def _skip(self, incident: _Incident, job: JobFacts | None, code: str, reason: str) -> Decision:
        return Decision(incident.alert, None, "skipped", code, reason, job)

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
        last = max((t for t, _ in self._by_job.get(job_id, [])), default=None)
        cooldown_ms = int(self.policy.job_cooldown_s * 1000)
        if last is not None and now_ms - last < cooldown_ms:
            return self._skip(
                incident,
                job,
                "already_acted",
                f"job {job_id} was acted on at {_iso(last)}, within job_cooldown_s "
                f"({self.policy.job_cooldown_s:g} s): never twice for one job",
            )
        team = job.team if job and job.team else str(alert.get("team") or "")
        labels = job.labels if job else {}
        if self.policy.opt_out.holds(job_id, team, labels) or not self.policy.opt_in.holds(
            job_id, team, labels
        ):
            return self._skip(
                incident,
                job,
                "not_opted_in",
                f"job {job_id} (team {team or '-'}) is not opted in to remediation",
            )
        if job is None or job.state_ts is None:
            return self._skip(
                incident,
                job,
                "job_unknown",
                f"no JobStarted or scheduler state of job {job_id} was read from the training events: "
                "its open checkpoints and evaluations are unknown",
            )
        if job.state != "running":
            return self._skip(incident, job, "job_not_running", f"job {job_id} is {job.state}, not running")
        if job.run_started_ts is not None and job.run_started_ts > incident.firing_since:
            return self._skip(
                incident, job, "job_not_running", f"job {job_id} started a new run after the alert fired"
            )
        fired_s = (now_ms - incident.firing_since) / 1000.0
        if fired_s < rule_policy.min_firing_s:
            eligible = incident.firing_since + int(rule_policy.min_firing_s * 1000)
            return self._skip(
                incident,
                job,
                "firing_too_short",
                f"{rule} has fired for {max(fired_s, 0):.0f} s; the policy waits {rule_policy.min_firing_s:g} s "
                f"(until {_iso(eligible)})",
            )
        if rule == "rank_hang":
            timeout_s = _collective_timeout(job, self.policy, rule_policy)
            hung_s = (now_ms - int(alert.get("starts_at") or incident.firing_since)) / 1000.0
            if hung_s < timeout_s:
                return self._skip(
                    incident,
                    job,
                    "within_collective_timeout",
                    f"rank {alert.get('rank')} stopped {hung_s:.0f} s ago, within the job's collective timeout "
                    f"({timeout_s:g} s): the collective may still time out by itself",
                )
        operation = job.open_operation()
        if operation is not None:
            return self._skip(incident, job, "operation_open", f"{operation}: never while it runs")
        action: Action = rule_policy.action
        age = job.checkpoint_age_s(now_ms)
        max_age = (
            job.checkpoint_max_age_s
            if job.checkpoint_max_age_s is not None
            else self.policy.checkpoint_max_age_s
        )
        stale_note = ""
        if max_age is not None and age is not None and age > max_age:
            if not self.policy.stale_checkpoint_requeue.holds(job_id, team, labels):
                return Decision(
                    alert,
                    None,
                    "skipped",
                    "stale_checkpoint",
                    f"the latest verified checkpoint of job {job_id} is {age:.0f} s old, older than its policy "
                    f"({max_age:g} s): cancelling would lose that work; requeue needs opt-in "
                    "(stale_checkpoint_requeue)",
                    job,
                    age,
                )
            action = "requeue"
            stale_note = f"; requeued, not cancelled: its latest verified checkpoint is {age:.0f} s old (policy {max_age:g} s)"
        cluster = self._cluster(alert, job)
        recent = [m for m in self._by_cluster.get(cluster, []) if now_ms - m[0] < _HOUR_MS]
        self._by_cluster[cluster] = recent
        if len(recent) >= self.policy.max_actions_per_hour:
            return Decision(
                alert,
                None,
                "skipped",
                "rate_limited",
                f"{len(recent)} actions on cluster {cluster or '-'} in the last hour: max_actions_per_hour is "
                f"{self.policy.max_actions_per_hour}",
                job,
                age,
            )
        what = f"{action} job {job_id}: {rule} has fired for {fired_s:.0f} s{stale_note}"
        if not self.execute or rule_policy.dry_run:
            why = "dry run (no --execute)" if not self.execute else f"dry run (rules.{rule}.dry_run)"
            return Decision(alert, action, "dry_run", "dry_run", f"would {what}; {why}", job, age)
        return Decision(alert, action, "acted", "acted", what, job, age)

    # -- records ---------------------------------------------------------------------------------
    def record(
        self, decision: Decision, now_ms: int, *, target: str = "", detail: str | None = None
    ) -> dict[str, Any]:
        """The ActionTaken record of a decision."""
        alert, job = decision.alert, decision.job
        alert_id = str(alert["alert_id"])
        action_id = hashlib.sha256(
            f"{alert_id}|{decision.kind}|{decision.reason_code}|{now_ms}".encode()
        ).hexdigest()[:24]
        return {
            "ts": now_ms,
            "action_id": action_id,
            "alert_id": alert_id,
            "fingerprint": str(alert.get("fingerprint") or ""),
            "rule": str(alert["rule"]),
            "job_id": str(alert["job_id"]),
            "run_id": job.run_id if job else str(alert.get("run_id") or ""),
            "team": (job.team if job and job.team else str(alert.get("team") or "")),
            "cluster": self._cluster(alert, job),
            "scheduler": self.scheduler,
            "target": target,
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
        """Drop facts of jobs that ended and have no open incident (a long-running remediator stays small)."""
        open_jobs = {str(i.alert["job_id"]) for i in self._incidents.values()}
        for job_id in [j for j, f in self.jobs.items() if f.state in ("completed", "failed")]:
            if job_id not in open_jobs:
                del self.jobs[job_id]


def _collective_timeout(job: JobFacts, policy: RemediationPolicy, rule: RulePolicy) -> float:
    """The job's collective timeout: its `collective_timeout_label` label, else the rule's default."""
    raw = job.labels.get(policy.collective_timeout_label)
    try:
        return float(raw) if raw is not None else rule.collective_timeout_s
    except ValueError:
        return rule.collective_timeout_s


def relevant_event_types() -> Iterable[str]:
    """The rs.training.events record types remediation reads (the shell may skip decoding others)."""
    return sorted(_RELEVANT)
