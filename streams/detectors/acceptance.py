"""Rule `acceptance_violation`: a metric broke a condition the job's team declared (issue 35.3).

Teams say what "good" means for their runs in a small YAML rule language (no code runs):

```yaml
detectors:
  acceptance:
    files: [acceptance/llm-pretrain.yaml]   # rule files, relative to the config file
    rules:                                  # or inline, the same entries
      - name: val-accuracy-floor            # unique; [A-Za-z0-9_.-], at most 64 characters
        metric: val/accuracy                # a ValidationResult metric (source: validation, the default)
        check: {op: ">=", value: 0.62}      # op: >= > <= < == !=
        after: {steps: 40000}               # checked from step 40k on (or tokens: N, evaluations: N)
        jobs: {team: llm-pretrain}          # which jobs: team, workload_family, model_name,
                                            #   cluster, job_id (shell-style globs); all jobs if absent
        owner: llm-pretrain                 # the team paged (default: the job's own team)
        severity: warning                   # info | warning | critical
      - name: reward-not-falling
        metric: reward_model_score
        trend: {direction: falling, evaluations: 3}  # falls at 3 evaluations in a row
      - name: loss-ceiling
        source: training                    # a field of the leader rank's StepCompleted
        metric: loss
        check: {op: "<=", value: 4.0}
        after: {tokens: 2.0e+9}
```

A `check` rule is violated by an observation (one evaluation, or one leader-rank step) that fails
its comparison or is not finite (NaN and infinity are violations, never skipped), and resolves
with the next observation that passes. A `trend` rule is violated when the metric moved in
`direction` at each of the last `evaluations` observations (or an observation is not finite),
and resolves when one does not. Everything is in event time: the same input gives the same
alerts. An observation before the `after` gate, or one that does not carry the metric, is not
judged. Rules are operator/team configuration: a record selects which of them apply only through
its job's identity fields, and a record cannot add, change or disable a rule.
"""

from __future__ import annotations

import contextlib
import fnmatch
import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import LEADER_RANK, Finding, JobInfo, PerJobDetector
from streams.detectors.catalogue import catalogued
from streams.errors import ConfigError

__all__ = ["DEFAULTS", "AcceptanceDetector", "AcceptanceRule", "parse_rules"]

DEFAULTS: dict[str, Any] = {
    "files": [],  # acceptance rule files (YAML with a `rules:` list), relative to the config file
    "rules": [],  # inline rules (the same entries as in a file)
}

# The severity and the invariant are each declared rule's own (the finding names them).
ACCEPTANCE_VIOLATION = catalogued("acceptance_violation")
RULE = ACCEPTANCE_VIOLATION.name
_POINTS = 8  # observations carried on a finding's history
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_OPS = {
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}
_SELECTORS = ("team", "workload_family", "model_name", "cluster", "job_id")
_GATES = ("steps", "tokens", "evaluations")
_TRAINING_FIELDS = (
    "loss",
    "lr",
    "grad_norm",
    "step_time_s",
    "data_wait_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "comm_s",
    "samples",
    "tokens",
)
_RULE_KEYS = {"name", "metric", "source", "check", "trend", "after", "jobs", "owner", "severity"}


@dataclass(frozen=True)
class AcceptanceRule:
    """One declared condition on one metric of the jobs it selects."""

    name: str
    metric: str
    source: str = "validation"  # validation | training
    op: str | None = None  # a check: the comparison...
    value: float | None = None  # ...against this value
    direction: str | None = None  # a trend: falling | rising...
    count: int = 0  # ...at this many observations in a row
    after: tuple[str, float] | None = None  # (steps | tokens | evaluations, threshold)
    jobs: dict[str, str] = field(default_factory=dict)
    owner: str = ""
    severity: str = "warning"

    def selects(self, job: JobInfo | None, job_id: str) -> bool:
        """Whether this rule applies to the job (every selector given must match its glob)."""
        for key, pattern in self.jobs.items():
            actual = job_id if key == "job_id" else (str(getattr(job, key, "") or "") if job else "")
            if not fnmatch.fnmatchcase(actual, pattern):
                return False
        return True

    def describe(self) -> str:
        """The invariant in words, e.g. `val/accuracy >= 0.62 from step 40000`."""
        if self.op is not None:
            text = f"{self.metric} {self.op} {self.value:g}"
        else:
            text = f"{self.metric} does not fall/rise at {self.count} evaluations in a row".replace(
                "fall/rise", "fall" if self.direction == "falling" else "rise"
            )
        if self.after is not None:
            kind, at = self.after
            text += f" from {kind[:-1]} {at:g}" if kind != "evaluations" else f" after {at:g} evaluations"
        return f"{text} (acceptance rule {self.name})"


def _fail(where: str, what: str) -> ConfigError:
    return ConfigError(f"{where}: {what}")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        hint = ""
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                hint = f" (YAML reads {value} as text: write {float(value):.6g} or 1.0e+10 with a sign)"
        raise _fail(where, f"must be a finite number, not {value!r}{hint}")
    return float(value)


def _rule(raw: Any, where: str) -> AcceptanceRule:
    if not isinstance(raw, dict):
        raise _fail(where, "each acceptance rule must be a mapping (name, metric, check or trend, ...)")
    unknown = sorted(set(raw) - _RULE_KEYS)
    if unknown:
        raise _fail(where, f"unknown key {unknown[0]!r}; known: {', '.join(sorted(_RULE_KEYS))}")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _fail(where, "`name` must be 1-64 characters of letters, digits, '_', '.' or '-'")
    where = f"{where} ({name})"
    metric = raw.get("metric")
    if not isinstance(metric, str) or not metric or len(metric) > 200:
        raise _fail(where, "`metric` must name a metric (a non-empty string)")
    source = raw.get("source", "validation")
    if source not in ("validation", "training"):
        raise _fail(where, f"`source` must be validation or training, not {source!r}")
    if source == "training" and metric not in _TRAINING_FIELDS:
        raise _fail(
            where, f"training metric {metric!r} is not a step field; one of {', '.join(_TRAINING_FIELDS)}"
        )
    check, trend = raw.get("check"), raw.get("trend")
    if (check is None) == (trend is None):
        raise _fail(where, "give exactly one of `check: {op, value}` or `trend: {direction, evaluations}`")
    op = value = direction = None
    count = 0
    if check is not None:
        if not isinstance(check, dict) or set(check) != {"op", "value"}:
            raise _fail(where, "`check` must be {op: '>=', value: NUMBER}")
        op = check["op"]
        if op not in _OPS:
            raise _fail(where, f"check.op must be one of {' '.join(_OPS)}, not {op!r}")
        value = _number(check["value"], f"{where} check.value")
    else:
        if not isinstance(trend, dict) or set(trend) != {"direction", "evaluations"}:
            raise _fail(where, "`trend` must be {direction: falling|rising, evaluations: N}")
        direction = trend["direction"]
        if direction not in ("falling", "rising"):
            raise _fail(where, f"trend.direction must be falling or rising, not {direction!r}")
        count = trend["evaluations"]
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 100:
            raise _fail(where, "trend.evaluations must be a whole number from 1 to 100")
    after = raw.get("after")
    gate: tuple[str, float] | None = None
    if after is not None:
        if not isinstance(after, dict) or len(after) != 1 or next(iter(after)) not in _GATES:
            raise _fail(where, "`after` must be one of {steps: N}, {tokens: N}, {evaluations: N}")
        kind, at = next(iter(after.items()))
        gate = (kind, _number(at, f"{where} after.{kind}"))
    jobs = raw.get("jobs") or {}
    if not isinstance(jobs, dict) or any(
        k not in _SELECTORS or not isinstance(v, str) for k, v in jobs.items()
    ):
        raise _fail(where, f"`jobs` must map some of {', '.join(_SELECTORS)} to glob strings")
    owner = raw.get("owner", "")
    if not isinstance(owner, str) or (owner and not _NAME.match(owner)):
        raise _fail(where, "`owner` must be a team name (letters, digits, '_', '.' or '-')")
    severity = raw.get("severity", "warning")
    if severity not in ("info", "warning", "critical"):
        raise _fail(where, f"`severity` must be info, warning or critical, not {severity!r}")
    return AcceptanceRule(
        name=name,
        metric=metric,
        source=source,
        op=op,
        value=value,
        direction=direction,
        count=count,
        after=gate,
        jobs=dict(sorted(jobs.items())),
        owner=owner,
        severity=severity,
    )


def parse_rules(raw: Any, where: str = "acceptance") -> tuple[AcceptanceRule, ...]:
    """Validate a list of rule mappings; any mistake is one `ConfigError` naming the rule and key."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _fail(where, "`rules` must be a list of acceptance rules")
    rules = tuple(_rule(entry, f"{where} rule {i + 1}") for i, entry in enumerate(raw))
    seen: set[str] = set()
    for rule in rules:
        if rule.name in seen:
            raise _fail(where, f"two acceptance rules are named {rule.name!r}; names must be unique")
        seen.add(rule.name)
    return rules


def _finite(value: Any) -> float | None:
    """A number as float (NaN and infinity kept: they are violations); None when not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class AcceptanceDetector(PerJobDetector, rule=ACCEPTANCE_VIOLATION, section="acceptance"):
    """The teams' declared acceptance rules, judged on validation results and leader-rank steps."""

    stage: ClassVar[str] = "job"  # validation results are job records; the leader's steps reach it

    @classmethod
    def check_params(cls, params: dict[str, Any], source: str) -> None:
        """Refuse a bad rule when the configuration is loaded, not when the first record comes."""
        parse_rules(params.get("rules"), f"{source}: detectors.acceptance")

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        # `files` are read by the config loader (streams.config), which inlines their rules here.
        self._rules = parse_rules(p["rules"], "detectors.acceptance")
        self._validation = tuple(r for r in self._rules if r.source == "validation")
        self._training = tuple(r for r in self._rules if r.source == "training")

    def new_job_state(self) -> dict[str, Any]:
        """Evaluations seen, and per rule: recent observations and the open violation."""
        return {"evaluations": 0, "rules": {}}

    def observe(self, event: Event) -> list[Finding]:
        """Judge each rule that selects the job on the observation this record carries."""
        if not self._rules:
            return []
        r = event.record
        if event.type == "ValidationResult" and self._validation:
            job = self._job(r["job_id"])
            job["evaluations"] += 1
            metrics = r.get("metrics") or {}
            return self._judge(r, job, self._validation, lambda rule: metrics.get(rule.metric))
        if event.type == "StepCompleted" and self._training and r.get("rank") == LEADER_RANK:
            return self._judge(r, self._job(r["job_id"]), self._training, lambda rule: r.get(rule.metric))
        return []

    def _judge(
        self, r: dict[str, Any], job: dict[str, Any], rules: tuple[AcceptanceRule, ...], value_of: Any
    ) -> list[Finding]:
        job_id = r["job_id"]
        info = self.topology.jobs.get(job_id)
        out: list[Finding] = []
        for rule in rules:
            value = _finite(value_of(rule))
            if value is None or not rule.selects(info, job_id) or not self._gate_open(rule, r, job):
                continue
            state = job["rules"].setdefault(rule.name, {"points": [], "open": None})
            points: list[list[Any]] = state["points"]
            points.append([int(r["ts"]), value])
            del points[: max(0, len(points) - max(_POINTS, rule.count + 1))]
            violated = self._violated(rule, points)
            if violated and state["open"] is None:
                state["open"] = {"since": int(r["ts"])}
                out.append(self._finding(rule, job_id, r, state, True, value))
            elif not violated and state["open"] is not None:
                out.append(self._finding(rule, job_id, r, state, False, value))
                state["open"] = None
        return out

    def _gate_open(self, rule: AcceptanceRule, r: dict[str, Any], job: dict[str, Any]) -> bool:
        if rule.after is None:
            return True
        kind, at = rule.after
        if kind == "evaluations":
            return job["evaluations"] > at
        step = r.get("step")
        if step is None:
            return False
        if kind == "steps":
            return float(step) >= at
        # Tokens so far: steps times the tokens one rank processes per step times the ranks.
        pace = self.topology.pace.get(r["job_id"])
        info = self.topology.jobs.get(r["job_id"])
        ranks = info.world_size if info is not None else 0
        if pace is None or not pace.tokens or ranks <= 0:
            return False
        return (float(step) + 1) * pace.tokens * ranks >= at

    @staticmethod
    def _violated(rule: AcceptanceRule, points: list[list[Any]]) -> bool:
        latest = points[-1][1]
        if not math.isfinite(latest):
            return True
        if rule.op is not None:
            return not _OPS[rule.op](latest, rule.value)
        recent = [v for _, v in points[-(rule.count + 1) :]]
        if len(recent) < rule.count + 1:
            return False
        pairs = itertools.pairwise(recent)
        if rule.direction == "falling":
            return all(b < a for a, b in pairs)
        return all(b > a for a, b in pairs)

    def _finding(
        self,
        rule: AcceptanceRule,
        job_id: str,
        r: dict[str, Any],
        state: dict[str, Any],
        active: bool,
        value: float,
    ) -> Finding:
        where = f"at step {r['step']}" if r.get("step") is not None else ""
        shown = f"{value:.6g}" if math.isfinite(value) else str(value)
        summary = (
            f"{rule.metric} of job {job_id} is {shown} {where}: breaks {rule.describe()}"
            if active
            else f"{rule.metric} of job {job_id} is {shown} {where}: meets {rule.describe()} again"
        )
        history = tuple((int(t), float(v)) for t, v in state["points"][-_POINTS:] if math.isfinite(v))
        return ACCEPTANCE_VIOLATION.finding(
            (job_id, rule.name),
            active,
            int(r["ts"]),
            severity=rule.severity,
            job_id=job_id,
            since=int((state["open"] or {}).get("since", r["ts"])),
            invariant=rule.describe(),
            observed=value if math.isfinite(value) else None,
            expected=rule.value,
            summary=" ".join(summary.split()),
            history_metric=rule.metric,
            history=history,
            sustain_ms=0,
            team=rule.owner,
        )
