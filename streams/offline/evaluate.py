"""Scenario evaluation: replay each labelled case offline and score its alerts against its labels.

Where the cases come from (the simulator's scenarios, generated cases) is the caller's: the CLI
composes them (`ranksight.evaluation`), so nothing here imports the simulator.

A label is *detected* when an alert of its rule fires for the same job (and the same rank, GPU or
node when the label names one) and the same team, between the fault's start and start +
`deadline_s` (default 120 s: two windows) plus the rule's inherent delay (a zombie is only a
zombie after its grace period; see `RULE_DELAY_PARAMS`), plus the ramp of a fault that ramps up (`detail.ramp`: due once at full strength). A firing alert that matches no label --
neither its rule nor one of the rules the label says may co-fire (`also`) -- is a false positive;
in the `healthy` and `long_checkpoint` scenarios every alert is one. An alert inhibited by a firing
root cause (`inhibited_by`) is recorded but not paged, so precision does not count it; it still
detects its label. A transient fault (label
`end` set) must see its alert resolved after the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.files import parse_ts
from schemas.records import Event
from streams.alerting.routing import Router
from streams.config import EngineConfig
from streams.engine import DetectionEngine
from streams.errors import EvaluationError

__all__ = [
    "DEFAULT_DEADLINE_S",
    "RULE_DELAY_PARAMS",
    "CaseSource",
    "EvaluationReport",
    "LabelResult",
    "ScenarioResult",
    "ScenarioRun",
    "evaluate_alerts",
    "evaluate_cases",
    "replay_case",
    "rule_delay_ms",
    "scenario_files",
]

DEFAULT_DEADLINE_S = 120.0
# Rules that by definition cannot fire before a configured delay: (detector section, knob in s).
RULE_DELAY_PARAMS: dict[str, tuple[str, str]] = {
    "zombie_job": ("progress", "zombie_grace_s"),
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
            row["max_ttd_s"] = max(ttd) if ttd else None
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
    """A detector knob from the config, else from the detector module's DEFAULTS (0 if unknown)."""
    import sys

    from streams.config import detector_section
    from streams.detectors import ALL_DETECTORS

    value = config.detectors.get(section, {}).get(knob)
    if value is None:
        for cls in ALL_DETECTORS:
            if detector_section(cls) == section:
                value = getattr(sys.modules[cls.__module__], "DEFAULTS", {}).get(knob)
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
    if alert.get("job_id"):
        return bool(alert["job_id"] == label["job_id"])
    return label.get("node") is None or alert.get("node") == label.get("node")


def evaluate_alerts(
    name: str,
    alerts: list[dict[str, Any]],
    labels: list[dict[str, Any]],
    config: EngineConfig,
    *,
    deadline_s: float = DEFAULT_DEADLINE_S,
    jobs: dict[str, dict[str, Any]] | None = None,
) -> ScenarioResult:
    """Score one scenario's alert records (Alert dicts, ms timestamps) against its labels.

    `jobs` maps job ids to their JobStarted records (for per-job delays such as checkpoint timeouts).
    """
    result = ScenarioResult(name)
    firing = [a for a in alerts if a["status"] == "firing"]
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
        deadline = start + int(deadline_s * 1000) + delay + ramp_ms
        candidates = [
            a
            for a in firing
            if a["rule"] == lr.alert and _identity_matches(a, label) and start - slack <= a["ts"] <= deadline
        ]
        good = [a for a in candidates if a["team"] == label.get("team")]
        lr.wrong_team = bool(candidates) and not good
        if not good:
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
    for a in firing:
        if a.get("inhibited_by"):
            result.inhibited += 1
            continue
        result.firing += 1
        explained = not quiet and any(_related(a, label) for label in labels)
        if explained:
            result.matched += 1
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


def _score(source: CaseSource, config: EngineConfig, router: Router, deadline_s: float) -> ScenarioResult:
    name, events, labels = source()
    run = replay_case(name, events, labels, config, router)
    result = evaluate_alerts(name, run.alerts, run.labels, config, deadline_s=deadline_s, jobs=run.jobs)
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
) -> EvaluationReport:
    """Replay and score every case. `workers` > 1 spreads the cases over processes; each case is
    scored alone and the report keeps the cases' order, so the result does not depend on it."""
    report = EvaluationReport()
    if workers <= 1:
        results: Iterable[ScenarioResult] = (_score(src, config, router, deadline_s) for src in sources)
        for result in results:
            report.scenarios.append(result)
            if on_scenario is not None:
                on_scenario(result)
        return report
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_score, src, config, router, deadline_s) for src in sources]
        for future in futures:
            result = future.result()
            report.scenarios.append(result)
            if on_scenario is not None:
                on_scenario(result)
    return report
