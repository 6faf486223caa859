"""Alertmanager-style routing: ordered routes match alert fields and labels to a team and a receiver.

```yaml
routes:
  - match: {category: infra, rule: xid_error, labels.tier: prod}
    match_re: {node: "gpu-a.*"}
    team: infra-oncall
    receiver: pagerduty-infra
    continue: false
default:
  team: "{job.team}"        # the job's own team
  fallback_team: platform   # alerts without a job team (node-only alerts)
  receiver: default
```

The first matching route decides; `continue: true` lets later routes match too (the alert is
then delivered to every matched team). `team: "{job.team}"` means the job's own team.

`ownership: ownership.yaml` (a path relative to the routing file) routes by ownership instead of
`default`: when no explicit route decides, the team that owns the alert's category (on its
cluster) gets it at its `page` receiver, and the job's team an informational copy for the
categories in `inform_job_team` (`streams.alerting.ownership`). `explain(record)` says which
route or ownership key decided each copy (`ranksight routing explain`).

`inhibit_rules` is the inhibition graph: which firing cause mutes which symptoms, each edge with
the scope it needs. The engine applies it (`streams.alerting.grouping`) and marks muted alerts
with `inhibited_by`; `ranksight alerts am-config` renders it into Alertmanager inhibit rules:

```yaml
inhibit_rules:
  - cause: ecc_uncorrectable          # one rule or a list
    mutes: [xid_error]
    scope: gpu                        # gpu | node | job: the symptom on the cause's GPU, node or job
    after_s: 0                        # the cause explains symptoms beginning this long after it resolved
    why: XID 48 is the double-bit ECC error itself
  # Alertmanager's form is accepted too:
  - source_match_re: {rule: "xid_error"}
    target_match_re: {rule: "straggler"}
    scope: gpu                        # optional here
    equal: []                         # alert fields that must be equal on both (e.g. [job_id])
```
The edges must not form a cycle (a cause muting its own cause).
A router whose `drop_inhibited` is true routes inhibited alerts nowhere (`route_all` is empty).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from streams.alerting.grouping import SCOPES, InhibitRule, alert_field, graph_cycle
from streams.alerting.ownership import JOB_TEAM, Delivery, Ownership, load_ownership
from streams.errors import RoutingError, refuse_unknown_keys

__all__ = [
    "DEFAULT_ROUTING_PATH",
    "JOB_TEAM",
    "RUNBOOK_BASE_ENV",
    "Delivery",
    "Route",
    "Router",
    "load_router",
]

DEFAULT_ROUTING_PATH = Path(__file__).resolve().parent / "routing.yaml"
# The base of alerts' runbook links, over the routing file's `runbook_base_url` (e.g. the UI's
# https://ranksight.example.com/runbooks/). Read here because every engine loads its router here.
RUNBOOK_BASE_ENV = "RANKSIGHT_RUNBOOK_BASE_URL"

# Alert fields a route may match on (plus `labels.<name>`).
_MATCHABLE = (
    "rule",
    "category",
    "severity",
    "status",
    "team",
    "job_id",
    "run_id",
    "owner",
    "cluster",
    "node",
    "rank",
    "gpu_uuid",
    "workload_family",
    "model_version",
    "dataset_version",
    "suspected_layer",
    "fingerprint",
)
_ROUTE_KEYS = {"match", "match_re", "team", "receiver", "continue"}
_DEFAULT_KEYS = {"team", "fallback_team", "receiver"}
_INHIBIT_KEYS = {"source_match", "source_match_re", "target_match", "target_match_re", "equal", "scope"}
_EDGE_KEYS = {"cause", "mutes", "scope", "after_s", "why"}
_RULE_NAME = re.compile(r"[a-z][a-z0-9_]*")
_TOP_KEYS = ("routes", "default", "inhibit_rules", "drop_inhibited", "ownership", "runbook_base_url")


@dataclass(frozen=True)
class Route:
    """One route: equality matchers, regex matchers (full match), and where matching alerts go."""

    team: str
    receiver: str
    match: dict[str, str] = field(default_factory=dict)
    match_re: dict[str, re.Pattern[str]] = field(default_factory=dict)
    cont: bool = False

    def describe(self) -> str:
        """The matchers as `field=value, field=~regex`, for explanations."""
        parts = [f"{k}={v}" for k, v in self.match.items()]
        parts += [f"{k}=~{p.pattern}" for k, p in self.match_re.items()]
        return ", ".join(parts) or "matches everything"

    def matches(self, record: dict[str, Any]) -> bool:
        """True when every matcher holds for the alert record."""
        for name, want in self.match.items():
            if alert_field(record, name) != want:
                return False
        for name, pattern in self.match_re.items():
            value = alert_field(record, name)
            if value is None or not pattern.fullmatch(value):
                return False
        return True


class Router:
    """Ordered routes, then ownership (or a default); `route_all(alert) -> [(team, receiver), ...]`."""

    def __init__(
        self,
        routes: list[Route] | None = None,
        default_team: str = JOB_TEAM,
        fallback_team: str = "platform",
        default_receiver: str = "default",
        inhibit_rules: list[InhibitRule] | None = None,
        drop_inhibited: bool = False,
        ownership: Ownership | None = None,
        runbook_base_url: str = "",
    ) -> None:
        self.routes = list(routes or [])
        self.inhibit_rules = list(inhibit_rules or [])
        self.drop_inhibited = drop_inhibited
        self.default_team = default_team
        self.fallback_team = ownership.fallback_team if ownership is not None else fallback_team
        self.default_receiver = default_receiver
        self.ownership = ownership
        # Where alerts' runbook links point ("" : the engine config's `runbook_base_url`).
        self.runbook_base_url = runbook_base_url.rstrip("/") + "/" if runbook_base_url else ""

    def _team(self, team: str, record: dict[str, Any]) -> str:
        if team == JOB_TEAM:
            return str(record.get("team") or "") or self.fallback_team
        return team

    def explain(self, record: dict[str, Any]) -> list[Delivery]:
        """Every copy of the alert, in order, with why it goes there (empty: dropped as inhibited).

        `record["team"]` is the job's team, as the alert tracker leaves it. Explicit routes are
        tried first, in order, up to the first without `continue`; when none decided, ownership
        (or, without an ownership file, `default`) adds its copies.
        """
        if self.drop_inhibited and record.get("inhibited_by"):
            return []
        out: list[Delivery] = []

        def add(delivery: Delivery) -> None:
            if all((d.team, d.receiver) != (delivery.team, delivery.receiver) for d in out):
                out.append(delivery)

        for i, route in enumerate(self.routes):
            if not route.matches(record):
                continue
            team = self._team(route.team, record)
            why = f"routes[{i}] matched ({route.describe()})"
            if route.team == JOB_TEAM:
                why += f"; team {JOB_TEAM} = {team}"
            add(Delivery(team, route.receiver, "route", why + ("; continue: true" if route.cont else "")))
            if not route.cont:
                return out
        if self.ownership is not None:
            prefix = "no explicit route decided; ownership: " if self.routes else "ownership: "
            for delivery in self.ownership.deliveries(record):
                add(Delivery(delivery.team, delivery.receiver, delivery.kind, prefix + delivery.why))
        elif not out:
            team = self._team(self.default_team, record)
            add(Delivery(team, self.default_receiver, "route", f"no route matched: default (team {team})"))
        return out

    def route_all(self, record: dict[str, Any]) -> list[tuple[str, str]]:
        """Every (team, receiver) the alert goes to (see `explain`)."""
        return [(d.team, d.receiver) for d in self.explain(record)]

    def route(self, record: dict[str, Any]) -> tuple[str, str]:
        """The first (team, receiver) for an alert record (its `team` field is the job's team)."""
        routed = self.route_all(record)
        return routed[0] if routed else ("", "")

    @classmethod
    def from_dict(
        cls, data: dict[str, Any] | None, *, source: str = "routing", base_dir: Path | None = None
    ) -> Router:
        """Validate a routing mapping; errors name the bad key. `ownership` paths are relative to `base_dir`."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise RoutingError(f"{source}: expected a mapping with `routes` and `default`")
        unknown = sorted(set(data) - set(_TOP_KEYS))
        if unknown:
            raise RoutingError(
                f"{source}: unknown top-level key {unknown[0]!r}; expected one of {', '.join(_TOP_KEYS)}"
            )
        inhibit_data = data.get("inhibit_rules") or []
        if not isinstance(inhibit_data, list):
            raise RoutingError(f"{source}: `inhibit_rules` must be a list of rules")
        inhibit = [_parse_inhibit(r, f"{source}: inhibit_rules[{i}]") for i, r in enumerate(inhibit_data)]
        cycle = graph_cycle(inhibit)
        if cycle:
            raise RoutingError(
                f"{source}: `inhibit_rules` form a cycle ({' -> '.join(cycle)}): a cause cannot mute its own cause"
            )
        drop = data.get("drop_inhibited", False)
        if not isinstance(drop, bool):
            raise RoutingError(f"{source}: `drop_inhibited` must be true or false")
        routes_data = data.get("routes") or []
        if not isinstance(routes_data, list):
            raise RoutingError(f"{source}: `routes` must be a list of routes")
        routes = [_parse_route(r, f"{source}: routes[{i}]") for i, r in enumerate(routes_data)]
        default = data.get("default") or {}
        if not isinstance(default, dict):
            raise RoutingError(f"{source}: `default` must be a mapping with team and receiver")
        refuse_unknown_keys(default, _DEFAULT_KEYS, source, RoutingError, "default")
        for key in sorted(default):
            if not isinstance(default[key], str) or not default[key]:
                raise RoutingError(f"{source}: default.{key} must be a non-empty string")
        if default.get("fallback_team") == JOB_TEAM:
            raise RoutingError(f"{source}: default.fallback_team must name a team, not {JOB_TEAM}")
        runbook_base = data.get("runbook_base_url") or ""
        if not isinstance(runbook_base, str):
            raise RoutingError(f"{source}: `runbook_base_url` must be a URL string")
        ownership = None
        if data.get("ownership"):
            if not isinstance(data["ownership"], str):
                raise RoutingError(f"{source}: `ownership` must be the path of an ownership file")
            path = Path(data["ownership"])
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            ownership = load_ownership(path)
            _check_route_receivers(routes, ownership, source)
        return cls(
            routes,
            default_team=default.get("team", JOB_TEAM),
            fallback_team=default.get("fallback_team", "platform"),
            default_receiver=default.get("receiver", "default"),
            inhibit_rules=inhibit,
            drop_inhibited=drop,
            ownership=ownership,
            runbook_base_url=runbook_base,
        )


def _check_route_receivers(routes: list[Route], ownership: Ownership, source: str) -> None:
    """With an ownership file, explicit routes name its teams and receivers (Alertmanager knows only those)."""
    known = set(ownership.all_receivers())
    for i, route in enumerate(routes):
        if route.receiver not in known:
            raise RoutingError(
                f"{source}: routes[{i}].receiver {route.receiver!r} is not a receiver of the ownership file "
                f"{ownership.source} (known: {', '.join(sorted(known))})"
            )
        if route.team != JOB_TEAM and route.team not in ownership.teams:
            raise RoutingError(
                f"{source}: routes[{i}].team {route.team!r} is not listed under `teams` in {ownership.source}"
            )


def _check_matcher_key(name: Any, where: str) -> str:
    if not isinstance(name, str):
        raise RoutingError(f"{where}: matcher keys must be strings, got {name!r}")
    if name in _MATCHABLE or (name.startswith("labels.") and len(name) > len("labels.")):
        return name
    raise RoutingError(
        f"{where}: cannot match on {name!r}; use one of {', '.join(_MATCHABLE)} or labels.<name>"
    )


def _matchers(data: Any, field: str, where: str) -> tuple[dict[str, str], dict[str, re.Pattern[str]]]:
    """The matchers `<field>` (exact values) and `<field>_re` (regular expressions) of a mapping,
    validated: a route's `match`, an inhibit rule's `source_match` and `target_match`."""
    match: dict[str, str] = {}
    raw = data.get(field) or {}
    raw_re = data.get(f"{field}_re") or {}
    if not isinstance(raw, dict) or not isinstance(raw_re, dict):
        raise RoutingError(f"{where}: `{field}` and `{field}_re` must be mappings")
    for name, value in raw.items():
        match[_check_matcher_key(name, f"{where}.{field}")] = str(value)
    match_re: dict[str, re.Pattern[str]] = {}
    for name, value in raw_re.items():
        field_name = _check_matcher_key(name, f"{where}.{field}_re")
        try:
            match_re[field_name] = re.compile(str(value))
        except re.error as exc:
            raise RoutingError(
                f"{where}.{field}_re.{field_name}: invalid regular expression {value!r} ({exc})"
            ) from None
    return match, match_re


def _rule_names(value: Any, where: str) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise RoutingError(f"{where}: expected a rule name or a list of rule names")
    for name in names:
        if not isinstance(name, str) or not _RULE_NAME.fullmatch(name):
            raise RoutingError(f"{where}: {name!r} is not a rule name (e.g. xid_error)")
    return tuple(names)


def _parse_edge(data: dict[str, Any], where: str) -> InhibitRule:
    """`{cause, mutes, scope, after_s, why}`: one edge of the inhibition graph."""
    refuse_unknown_keys(data, _EDGE_KEYS, where, RoutingError)
    causes = _rule_names(data.get("cause"), f"{where}.cause")
    symptoms = _rule_names(data.get("mutes"), f"{where}.mutes")
    if set(causes) & set(symptoms):
        raise RoutingError(f"{where}: a rule cannot mute itself ({sorted(set(causes) & set(symptoms))[0]})")
    scope = data.get("scope")
    if scope not in SCOPES:
        raise RoutingError(f"{where}: `scope` must be one of {', '.join(SCOPES)}, not {scope!r}")
    after = data.get("after_s", 0)
    if isinstance(after, bool) or not isinstance(after, int | float) or after < 0:
        raise RoutingError(f"{where}: `after_s` must be a number of seconds >= 0")
    why = data.get("why") or ""
    if not isinstance(why, str):
        raise RoutingError(f"{where}: `why` must be a sentence")
    return InhibitRule.edge(causes, symptoms, scope, after_s=float(after), why=why)


def _parse_inhibit(data: Any, where: str) -> InhibitRule:
    if not isinstance(data, dict):
        raise RoutingError(f"{where}: an inhibit rule must be a mapping")
    if "cause" in data or "mutes" in data:
        return _parse_edge(data, where)
    refuse_unknown_keys(data, _INHIBIT_KEYS, where, RoutingError)
    source_match, source_re = _matchers(data, "source_match", where)
    target_match, target_re = _matchers(data, "target_match", where)
    if not (source_match or source_re) or not (target_match or target_re):
        raise RoutingError(f"{where}: an inhibit rule needs a source and a target matcher")
    equal = data.get("equal") or []
    if not isinstance(equal, list):
        raise RoutingError(f"{where}: `equal` must be a list of alert fields")
    scope = data.get("scope") or ""
    if scope not in ("", *SCOPES):
        raise RoutingError(f"{where}: `scope` must be one of {', '.join(SCOPES)} or absent, not {scope!r}")
    node_scope: Literal["", "node", "gpu", "job"] = (
        "node" if scope == "node" else "gpu" if scope == "gpu" else "job" if scope == "job" else ""
    )
    return InhibitRule(
        source_match=source_match,
        source_match_re=source_re,
        target_match=target_match,
        target_match_re=target_re,
        equal=tuple(_check_matcher_key(e, f"{where}.equal") for e in equal),
        scope=node_scope,
    )


def _parse_route(data: Any, where: str) -> Route:
    if not isinstance(data, dict):
        raise RoutingError(f"{where}: a route must be a mapping")
    refuse_unknown_keys(data, _ROUTE_KEYS, where, RoutingError)
    for required in ("team", "receiver"):
        if not isinstance(data.get(required), str) or not data[required]:
            raise RoutingError(f"{where}: `{required}` is required (a non-empty string)")
    match, match_re = _matchers(data, "match", where)
    cont = data.get("continue", False)
    if not isinstance(cont, bool):
        raise RoutingError(f"{where}: `continue` must be true or false")
    return Route(team=data["team"], receiver=data["receiver"], match=match, match_re=match_re, cont=cont)


def load_router(path: str | Path | None = None, *, runbook_base_url: str | None = None) -> Router:
    """Router from a routing YAML file (default: the shipped `streams/alerting/routing.yaml`).

    The runbook base is `runbook_base_url` when given, else RANKSIGHT_RUNBOOK_BASE_URL when set,
    else the file's `runbook_base_url`.
    """
    from streams.config import read_yaml

    p = Path(path) if path is not None else DEFAULT_ROUTING_PATH
    router = Router.from_dict(read_yaml(p, "routing", RoutingError), source=str(p), base_dir=p.parent)
    base = runbook_base_url if runbook_base_url is not None else os.environ.get(RUNBOOK_BASE_ENV, "")
    if base:
        if "://" not in base:
            raise RoutingError(
                f"{RUNBOOK_BASE_ENV}={base!r} is not an absolute URL (e.g. https://ui.example/runbooks/)"
            )
        router.runbook_base_url = base.rstrip("/") + "/"
    return router
