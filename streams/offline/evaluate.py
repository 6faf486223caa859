"""Scenario evaluation: replay each labelled case offline and score its alerts against its labels.

Where the cases come from (the simulator's scenarios, generated cases) is the caller's: the CLI
composes them (`ranksight.evaluation`), so nothing here imports the simulator.

A label is *detected* when an alert of its rule fires for the same job (and the same rank, GPU or
node when the label names one) and the same team, between the fault's start and start +
`deadline_s` (default 120 s: two windows) plus the rule's inherent delay (a zombie is only a
zombie after its grace period; see `RULE_DELAY_PARAMS`), plus the ramp of a fault that ramps up
(`detail.ramp`: due once at full strength). Its time to detect (TTD) is from the fault's start to
that alert's first firing record.

Alerts are counted once each, by `alert_id`: routing makes one record per receiver copy, a
cause that fires after its symptom re-sends the symptom's record muted, and a lasting condition is
republished while it fires (its refreshes); a label is detected by a copy's first firing record. A firing alert that matches
no label -- neither its rule nor one of the rules the label says may co-fire (`also`) -- is a false
positive; in the `healthy` and `long_checkpoint` scenarios every alert is one. An alert muted by a
root cause (`inhibited_by`) when it fired, or within `mute_grace_s` after (Alertmanager's
`group_wait`: a notification waits that long, and the mute reaches it first), is recorded but not
paged, so precision does not count it; muted later it paged, and counts. Either way it still
detects its label. A transient fault (label `end` set) must see its alert resolved after the end.

Per rule (`EvaluationReport.by_rule`): labels expecting the rule, detected, recall, TTD median and
p90 (nearest rank), and the rule's paged alerts, those matching a label, and precision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.files import parse_ts
from schemas.records import Event
from streams.alerting.routing import Router
from streams.config import EngineConfig
from streams.errors import EvaluationError
from streams.offline.detection import DetectionEngine

__all__ = [
    "DEFAULT_DEADLINE_S",
    "DEFAULT_MUTE_GRACE_S",
    "RULE_DELAY_PARAMS",
    "CaseSource",
    "EvaluationReport",
    "LabelResult",
    "ScenarioResult",
    "ScenarioRun",
    "evaluate_alerts",
    "evaluate_cases",
    "percentile",
    "replay_case",
    "rule_delay_ms",
    "scenario_files",
]

DEFAULT_DEADLINE_S = 120.0
# A symptom muted this soon after it fired never notified (Alertmanager's default group_wait).
DEFAULT_MUTE_GRACE_S = 30.0
# Rules that by definition cannot fire before a configured delay: (detector section, knob in s).
RULE_DELAY_PARAMS: dict[str, tuple[str, str]] = {
    "zombie_job": ("progress", "zombie_grace_s"),
    "startup_hang": ("progress", "startup_allow_s"),
}
_QUIET_SCENARIOS = ("healthy", "long_checkpoint")


@dataclass
class LabelResult:
    """How one label fared."""

    scenario: str
    fault: str
    alert: str | None
    job_id: str
    identity: str
    start: int
    end: int | None
    detected: bool = False
    time_to_detect_s: float | None = None
    resolved: bool | None = None  # None: not applicable (no end, or not detected)
    resolve_delay_s: float | None = None
    wrong_team: bool = False
    late_s: float | None = None  # not detected, but its alert fired this long after the fault started
    ramp_s: float = 0.0  # the fault ramps up to full strength over this long (0: a step)


@dataclass
class ScenarioResult:
    """Alerts and labels of one scenario."""

    name: str
    labels: list[LabelResult] = field(default_factory=list)
    firing: int = 0
    matched: int = 0
    false_positives: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0
    inhibited: int = 0  # firing alerts muted by a root cause (recorded, not paged: not scored)
    muted_late: int = 0  # of `firing`: alerts muted by a cause only after they had paged
    # rule -> [paged alerts, of them matching a label]
    rules: dict[str, list[int]] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by nearest rank, None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100.0 * len(ordered)) - 1)]


@dataclass
class EvaluationReport:
    """Every scenario's result plus per-fault-class aggregates."""

    scenarios: list[ScenarioResult] = field(default_factory=list)

    def labels(self) -> list[LabelResult]:
        """Every label of every scenario."""
        return [lab for s in self.scenarios for lab in s.labels]

    def by_fault(self) -> dict[str, dict[str, Any]]:
        """Per fault class: labels, detected, recall, mean/max time to detect, resolutions."""
        out: dict[str, dict[str, Any]] = {}
        for lab in self.labels():
            row = out.setdefault(
                lab.fault, {"labels": 0, "detected": 0, "ttd": [], "resolved": 0, "transient": 0}
            )
            if lab.alert is None:
                continue
            row["labels"] += 1
            if lab.detected:
                row["detected"] += 1
                row["ttd"].append(lab.time_to_detect_s)
            if lab.resolved is not None:
                row["transient"] += 1
                row["resolved"] += int(lab.resolved)
        for row in out.values():
            ttd = [t for t in row.pop("ttd") if t is not None]
            row["recall"] = row["detected"] / row["labels"] if row["labels"] else None
            row["mean_ttd_s"] = sum(ttd) / len(ttd) if ttd else None
            row["median_ttd_s"] = percentile(ttd, 50)
            row["p90_ttd_s"] = percentile(ttd, 90)
            row["max_ttd_s"] = max(ttd) if ttd else None
        return dict(sorted(out.items()))

    def by_rule(self) -> dict[str, dict[str, Any]]:
        """Per alert rule: labels expecting it, detected, recall, TTD (median, p90, max), paged alerts, precision."""
        out: dict[str, dict[str, Any]] = {}

        def row(rule: str) -> dict[str, Any]:
            return out.setdefault(
                rule, {"labels": 0, "detected": 0, "ttd": [], "ramped": [], "paged": 0, "matched": 0}
            )

        for lab in self.labels():
            if lab.alert is None:
                continue
            r = row(lab.alert)
            r["labels"] += 1
            if lab.detected:
                r["detected"] += 1
                if lab.time_to_detect_s is not None:
                    r["ttd"].append(lab.time_to_detect_s)
                    if lab.ramp_s > 0:
                        r["ramped"].append(lab.time_to_detect_s - lab.ramp_s)
        for scenario in self.scenarios:
            for rule, (paged, matched) in scenario.rules.items():
                r = row(rule)
                r["paged"] += paged
                r["matched"] += matched
        for r in out.values():
            ttd = r.pop("ttd")
            r["recall"] = r["detected"] / r["labels"] if r["labels"] else None
            r["median_ttd_s"] = percentile(ttd, 50)
            r["p90_ttd_s"] = percentile(ttd, 90)
            r["max_ttd_s"] = max(ttd) if ttd else None
            # Ramped faults: TTD above counts from the ramp's start; this is from full strength
            # (negative: paged while the fault was still growing).
            ramped = r.pop("ramped")
            r["ramped"] = len(ramped)
            r["ramped_p90_from_full_s"] = percentile(ramped, 90)
            r["precision"] = r["matched"] / r["paged"] if r["paged"] else None
        return dict(sorted(out.items()))

    @property
    def recall(self) -> float:
        """Detected labels / labels that expect an alert (1.0 when none do)."""
        expecting = [lab for lab in self.labels() if lab.alert is not None]
        return sum(lab.detected for lab in expecting) / len(expecting) if expecting else 1.0

    @property
    def precision(self) -> float:
        """Firing alerts matching a label / all firing alerts (1.0 when none fired)."""
        firing = sum(s.firing for s in self.scenarios)
        return sum(s.matched for s in self.scenarios) / firing if firing else 1.0


def _knob(config: EngineConfig, section: str, knob: str) -> float:
    """A detector knob from the config, else from the DEFAULTS of the section's rules (0 if unknown)."""
    from streams.config import section_defaults

    value = config.detectors.get(section, {}).get(knob)
    if value is None:
        value = (section_defaults(section) or {}).get(knob)
    return float(value or 0)


def rule_delay_ms(
    rule: str, config: EngineConfig, label: dict[str, Any] | None = None, job: dict[str, Any] | None = None
) -> int:
    """Inherent delay of a rule: how long after a fault starts the rule can fire at the earliest.

    Most rules: 0. `zombie_job`: the zombie grace period. `checkpoint_stuck`: the job's checkpoint
    timeout. `checkpoint_stale`: the job's checkpoint age policy. `long_pending`: the pending limit.
    `restart_loop`: the restarts it takes (threshold - 1) times the label's restart interval.
    """
    job = job or {}
    detail = (label or {}).get("detail") or {}
    if rule in RULE_DELAY_PARAMS:
        section, knob = RULE_DELAY_PARAMS[rule]
        return int(_knob(config, section, knob) * 1000)
    if rule == "checkpoint_stuck":
        timeout = job.get("checkpoint_timeout_s") or _knob(config, "recovery", "checkpoint_timeout_s")
        return int(float(timeout) * 1000)
    if rule == "checkpoint_stale":
        return int(float(job.get("checkpoint_max_age_s") or 0) * 1000)
    if rule == "long_pending":
        return int(_knob(config, "platform", "pending_max_s") * 1000)
    if rule == "restart_loop":
        every = float(detail.get("every_s") or detail.get("every") or 0)
        return int(max(0.0, _knob(config, "platform", "restart_threshold") - 1) * every * 1000)
    return 0


def _identity_matches(alert: dict[str, Any], label: dict[str, Any]) -> bool:
    if alert.get("job_id") != label["job_id"]:
        return False
    if label.get("rank") is not None:
        return bool(alert.get("rank") == label["rank"])
    if label.get("gpu_uuid") is not None:
        return bool(alert.get("gpu_uuid") == label["gpu_uuid"])
    if label.get("node") is not None:
        return bool(alert.get("node") == label["node"])
    return True


def _related(alert: dict[str, Any], label: dict[str, Any]) -> bool:
    """An alert explained by a label: its rule or a co-firing rule, same job (or same node)."""
    rules = {label.get("alert"), *(label.get("also") or ())} - {None}
    if alert["rule"] not in rules:
        return False
    if alert.get("job_id") and alert["job_id"] != label["job_id"]:
        # A node's fault pages every job on the node through its co-firing node rules (a degraded
        # port, a host): another job's copy on the same node is explained too.
        return (
            alert["rule"] in (label.get("also") or ())
            and label.get("node") is not None
            and alert.get("node") == label["node"]
        )
    if alert.get("job_id"):
        return True
    return label.get("node") is None or alert.get("node") == label.get("node")


def _alert_key(record: dict[str, Any]) -> str:
    """One alert's identity across its copies and updates (records without an id: fingerprint and start)."""
    if record.get("alert_id"):
        return str(record["alert_id"])
    return f"{record['fingerprint']}@{record.get('starts_at', '')}"


def _unique_firing(
    firing: list[dict[str, Any]], mute_grace_ms: int
) -> list[tuple[dict[str, Any], bool, bool]]:
    """Each firing alert once: (its first firing record, muted in time, muted only later), in firing order."""
    by_alert: dict[str, list[dict[str, Any]]] = {}
    for record in firing:
        by_alert.setdefault(_alert_key(record), []).append(record)
    out = []
    for records in by_alert.values():
        first = min(records, key=lambda a: a["ts"])
        muted = [a["ts"] for a in records if a.get("inhibited_by")]
        in_time = bool(muted) and min(muted) - first["ts"] <= mute_grace_ms
        out.append((first, in_time, bool(muted) and not in_time))
    return sorted(out, key=lambda x: (x[0]["ts"], _alert_key(x[0])))


def evaluate_alerts(
    name: str,
    alerts: list[dict[str, Any]],
    labels: list[dict[str, Any]],
    config: EngineConfig,
    *,
    deadline_s: float = DEFAULT_DEADLINE_S,
    jobs: dict[str, dict[str, Any]] | None = None,
    mute_grace_s: float = DEFAULT_MUTE_GRACE_S,
) -> ScenarioResult:
    """Score one scenario's alert records (Alert dicts, ms timestamps) against its labels.

    `jobs` maps job ids to their JobStarted records (for per-job delays such as checkpoint timeouts).
    """
    result = ScenarioResult(name)
    firing = [a for a in alerts if a["status"] == "firing"]
    # What each routed copy said when it fired: a later record of it (a refresh while it fires, a
    # re-send muted by a cause) updates that alert and detects nothing by itself.
    fired: dict[tuple[str, str, str], dict[str, Any]] = {}
    for a in firing:
        copy = (_alert_key(a), str(a.get("team") or ""), str(a.get("receiver") or ""))
        if copy not in fired or a["ts"] < fired[copy]["ts"]:
            fired[copy] = a
    resolved = [a for a in alerts if a["status"] == "resolved"]
    quiet = name in _QUIET_SCENARIOS
    for label in labels:
        start = parse_ts(label["start"])
        end = parse_ts(label["end"]) if label.get("end") else None
        ident = next(
            (f"{k}={label[k]}" for k in ("rank", "gpu_uuid", "node") if label.get(k) is not None), "job"
        )
        lr = LabelResult(name, label["fault"], label.get("alert"), label["job_id"], ident, start, end)
        result.labels.append(lr)
        if lr.alert is None:
            continue
        slack = config.allowed_lateness_ms
        delay = rule_delay_ms(lr.alert, config, label, (jobs or {}).get(label["job_id"]))
        # A fault that ramps up (severity rising over `ramp` seconds) is due once it is at full strength.
        ramp_ms = int(float((label.get("detail") or {}).get("ramp") or 0) * 1000)
        lr.ramp_s = ramp_ms / 1000.0
        deadline = start + int(deadline_s * 1000) + delay + ramp_ms
        candidates = [
            a
            for a in fired.values()
            if a["rule"] == lr.alert and _identity_matches(a, label) and start - slack <= a["ts"] <= deadline
        ]
        good = [a for a in candidates if a["team"] == label.get("team")]
        lr.wrong_team = bool(candidates) and not good
        if not good:
            later = [
                a["ts"]
                for a in fired.values()
                if a["rule"] == lr.alert and _identity_matches(a, label) and a["ts"] > deadline
            ]
            lr.late_s = (min(later) - start) / 1000.0 if later else None
            continue
        first = min(good, key=lambda a: a["ts"])
        lr.detected = True
        lr.time_to_detect_s = max(0, first["ts"] - start) / 1000.0
        if end is not None:
            fps = {a["fingerprint"] for a in good}
            after = [
                a
                for a in resolved
                if a["fingerprint"] in fps and a["ends_at"] is not None and a["ts"] >= end - slack
            ]
            lr.resolved = bool(after)
            if after:
                lr.resolve_delay_s = (min(a["ts"] for a in after) - end) / 1000.0
    for a, muted, muted_late in _unique_firing(firing, int(mute_grace_s * 1000)):
        if muted:
            result.inhibited += 1
            continue
        result.firing += 1
        result.muted_late += int(muted_late)
        counts = result.rules.setdefault(a["rule"], [0, 0])
        counts[0] += 1
        explained = not quiet and any(_related(a, label) for label in labels)
        if explained:
            result.matched += 1
            counts[1] += 1
        else:
            result.false_positives.append(a)
    return result


def scenario_files(directory: Path) -> list[Path]:
    """Scenario YAML files of a directory, sorted by name."""
    if not directory.is_dir():
        raise EvaluationError(f"scenario directory {directory} does not exist")
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))
    if not files:
        raise EvaluationError(f"no scenario YAML files in {directory}")
    return files


@dataclass
class ScenarioRun:
    """One simulated and replayed scenario."""

    name: str
    output: list[Event]
    labels: list[dict[str, Any]]
    jobs: dict[str, dict[str, Any]]
    events: int

    @property
    def alerts(self) -> list[dict[str, Any]]:
        """Alert records of the replay, in output order."""
        return [e.record for e in self.output if e.type == "Alert"]


# Where a case's events come from (a simulated scenario, a generated case, a recording): called
# where the case is scored, so with `workers` > 1 it must pickle (a module-level class or function).
CaseSource = Callable[[], tuple[str, Iterable[Event], list[dict[str, Any]]]]


def replay_case(
    name: str, events: Iterable[Event], labels: list[dict[str, Any]], config: EngineConfig, router: Router
) -> ScenarioRun:
    """Replay one case's events through a fresh engine (in order), keeping what scoring needs."""
    engine = DetectionEngine(config, router)
    out: list[Event] = []
    jobs: dict[str, dict[str, Any]] = {}
    n = 0
    for event in events:
        n += 1
        if event.type == "JobStarted":
            jobs.setdefault(event.record["job_id"], event.record)
        out.extend(engine.process(event))
    out.extend(engine.finish())
    return ScenarioRun(name, out, list(labels), jobs, n)


def _worker_signals() -> None:
    """A pool worker leaves stopping to its parent: a Ctrl-C to the process group is the parent's
    to act on, and the parent's SIGTERM (Pool.terminate) ends the worker quietly, not through the
    stop handlers it inherited by fork."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _score(
    source: CaseSource, config: EngineConfig, router: Router, deadline_s: float, mute_grace_s: float
) -> ScenarioResult:
    name, events, labels = source()
    run = replay_case(name, events, labels, config, router)
    result = evaluate_alerts(
        name, run.alerts, run.labels, config, deadline_s=deadline_s, jobs=run.jobs, mute_grace_s=mute_grace_s
    )
    result.events = run.events
    return result


def evaluate_cases(
    sources: Sequence[CaseSource],
    config: EngineConfig,
    router: Router,
    *,
    deadline_s: float = DEFAULT_DEADLINE_S,
    workers: int = 1,
    on_scenario: Callable[[ScenarioResult], None] | None = None,
    mute_grace_s: float = DEFAULT_MUTE_GRACE_S,
) -> EvaluationReport:
    """Replay and score every case. `workers` > 1 spreads the cases over processes; each case is
    scored alone and the report keeps the cases' order, so the result does not depend on it."""
    report = EvaluationReport()
    if workers <= 1:
        results: Iterable[ScenarioResult] = (
            _score(src, config, router, deadline_s, mute_grace_s) for src in sources
        )
        for result in results:
            report.scenarios.append(result)
            if on_scenario is not None:
                on_scenario(result)
        return report
    import multiprocessing
    from functools import partial

    score = partial(_score, config=config, router=router, deadline_s=deadline_s, mute_grace_s=mute_grace_s)
    # A Pool, not a ProcessPoolExecutor: leaving it terminates the workers, so an interrupted run
    # (SIGINT, SIGTERM) stops at once instead of waiting for the cases in flight (a 1,000-rank one
    # takes a minute). imap keeps the cases' order.
    with multiprocessing.Pool(workers, initializer=_worker_signals) as pool:
        for result in pool.imap(score, sources):
            report.scenarios.append(result)
            if on_scenario is not None:
                on_scenario(result)
    return report
