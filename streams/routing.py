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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streams.errors import RoutingError

__all__ = ["DEFAULT_ROUTING_PATH", "JOB_TEAM", "Route", "Router", "load_router"]

DEFAULT_ROUTING_PATH = Path(__file__).resolve().parent / "routing.yaml"
JOB_TEAM = "{job.team}"

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
    "workload_family",
    "model_version",
    "dataset_version",
    "suspected_layer",
    "fingerprint",
)
_ROUTE_KEYS = {"match", "match_re", "team", "receiver", "continue"}
_DEFAULT_KEYS = {"team", "fallback_team", "receiver"}


def _field(record: dict[str, Any], name: str) -> str | None:
    if name.startswith("labels."):
        value = (record.get("labels") or {}).get(name[len("labels.") :])
    else:
        value = record.get(name)
    return None if value is None else str(value)


@dataclass(frozen=True)
class Route:
    """One route: equality matchers, regex matchers (full match), and where matching alerts go."""

    team: str
    receiver: str
    match: dict[str, str] = field(default_factory=dict)
    match_re: dict[str, re.Pattern[str]] = field(default_factory=dict)
    cont: bool = False

    def matches(self, record: dict[str, Any]) -> bool:
        """True when every matcher holds for the alert record."""
        for name, want in self.match.items():
            if _field(record, name) != want:
                return False
        for name, pattern in self.match_re.items():
            value = _field(record, name)
            if value is None or not pattern.fullmatch(value):
                return False
        return True


class Router:
    """Ordered routes plus a default; `route(alert) -> (team, receiver)`."""

    def __init__(
        self,
        routes: list[Route] | None = None,
        default_team: str = JOB_TEAM,
        fallback_team: str = "platform",
        default_receiver: str = "default",
    ) -> None:
        self.routes = list(routes or [])
        self.default_team = default_team
        self.fallback_team = fallback_team
        self.default_receiver = default_receiver

    def _team(self, team: str, record: dict[str, Any]) -> str:
        if team == JOB_TEAM:
            return str(record.get("team") or "") or self.fallback_team
        return team

    def route_all(self, record: dict[str, Any]) -> list[tuple[str, str]]:
        """Every (team, receiver) the alert goes to: matched routes up to the first without `continue`."""
        out: list[tuple[str, str]] = []
        for route in self.routes:
            if route.matches(record):
                target = (self._team(route.team, record), route.receiver)
                if target not in out:
                    out.append(target)
                if not route.cont:
                    return out
        if not out:
            out.append((self._team(self.default_team, record), self.default_receiver))
        return out

    def route(self, record: dict[str, Any]) -> tuple[str, str]:
        """The first (team, receiver) for an alert record (its `team` field is the job's team)."""
        return self.route_all(record)[0]

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, *, source: str = "routing") -> Router:
        """Validate a routing mapping; errors name the bad key."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise RoutingError(f"{source}: expected a mapping with `routes` and `default`")
        unknown = sorted(set(data) - {"routes", "default"})
        if unknown:
            raise RoutingError(
                f"{source}: unknown top-level key {unknown[0]!r}; expected `routes` or `default`"
            )
        routes_data = data.get("routes") or []
        if not isinstance(routes_data, list):
            raise RoutingError(f"{source}: `routes` must be a list of routes")
        routes = [_parse_route(r, f"{source}: routes[{i}]") for i, r in enumerate(routes_data)]
        default = data.get("default") or {}
        if not isinstance(default, dict):
            raise RoutingError(f"{source}: `default` must be a mapping with team and receiver")
        bad = sorted(set(default) - _DEFAULT_KEYS)
        if bad:
            raise RoutingError(
                f"{source}: unknown key default.{bad[0]}; known: {', '.join(sorted(_DEFAULT_KEYS))}"
            )
        for key in sorted(default):
            if not isinstance(default[key], str) or not default[key]:
                raise RoutingError(f"{source}: default.{key} must be a non-empty string")
        if default.get("fallback_team") == JOB_TEAM:
            raise RoutingError(f"{source}: default.fallback_team must name a team, not {JOB_TEAM}")
        return cls(
            routes,
            default_team=default.get("team", JOB_TEAM),
            fallback_team=default.get("fallback_team", "platform"),
            default_receiver=default.get("receiver", "default"),
        )


def _check_matcher_key(name: Any, where: str) -> str:
    if not isinstance(name, str):
        raise RoutingError(f"{where}: matcher keys must be strings, got {name!r}")
    if name in _MATCHABLE or (name.startswith("labels.") and len(name) > len("labels.")):
        return name
    raise RoutingError(
        f"{where}: cannot match on {name!r}; use one of {', '.join(_MATCHABLE)} or labels.<name>"
    )


def _parse_route(data: Any, where: str) -> Route:
    if not isinstance(data, dict):
        raise RoutingError(f"{where}: a route must be a mapping")
    bad = sorted(set(data) - _ROUTE_KEYS)
    if bad:
        raise RoutingError(f"{where}: unknown key {bad[0]!r}; known: {', '.join(sorted(_ROUTE_KEYS))}")
    for required in ("team", "receiver"):
        if not isinstance(data.get(required), str) or not data[required]:
            raise RoutingError(f"{where}: `{required}` is required (a non-empty string)")
    match: dict[str, str] = {}
    for name, value in (data.get("match") or {}).items():
        match[_check_matcher_key(name, f"{where}.match")] = str(value)
    match_re: dict[str, re.Pattern[str]] = {}
    for name, value in (data.get("match_re") or {}).items():
        key = _check_matcher_key(name, f"{where}.match_re")
        try:
            match_re[key] = re.compile(str(value))
        except re.error as exc:
            raise RoutingError(
                f"{where}.match_re.{key}: invalid regular expression {value!r} ({exc})"
            ) from None
    cont = data.get("continue", False)
    if not isinstance(cont, bool):
        raise RoutingError(f"{where}: `continue` must be true or false")
    return Route(team=data["team"], receiver=data["receiver"], match=match, match_re=match_re, cont=cont)


def load_router(path: str | Path | None = None) -> Router:
    """Router from a routing YAML file (default: the shipped `streams/routing.yaml`)."""
    from streams.config import read_yaml

    p = Path(path) if path is not None else DEFAULT_ROUTING_PATH
    return Router.from_dict(read_yaml(p, "routing", RoutingError), source=str(p))
