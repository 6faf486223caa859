"""Who owns which alerts: the ownership file (teams, their receivers, owners per category and cluster).

One YAML file names every team that receives alerts and its Alertmanager receivers, says which
team owns each alert category by default and per cluster ("the provider owns infra on cluster
X"), and which categories also *inform* the affected job's team without paging it. The router
(`streams.alerting.routing`) routes with it and `ranksight alerts am-config` renders an
Alertmanager configuration from it, so the two never disagree on a receiver name.

```yaml
teams:
  infrastructure-operations: {page: infra-pager, inform: infra-chat, escalate: infra-escalation}
  platform: {page: platform-pager, inform: platform-chat}
  llm-pretrain: {page: llm-pretrain-pager, inform: llm-pretrain-chat}
other_teams: {page: platform-pager, inform: platform-chat}  # a job team not listed above
owners: {infra: infrastructure-operations, platform: platform, model: "{job.team}", data: "{job.team}"}
clusters:
  provider-east: {infra: provider-noc}      # the provider owns infra on provider-east
layers: {storage: storage-oncall}          # alerts whose suspected layer is storage page its owner
inform_job_team: [infra, platform]         # the job's team gets these too, not paged
fallback_team: platform                    # "{job.team}" alerts that name no job team
receivers: {infra-pager: {pagerduty_configs: [...]}}   # Alertmanager integrations, verbatim
alertmanager: {...}                        # grouping, repeat intervals, escalation (see below)
```
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from streams.errors import RoutingError, refuse_unknown_keys

__all__ = [
    "CATEGORIES",
    "DEFAULT_OWNERSHIP_PATH",
    "JOB_TEAM",
    "SEVERITIES",
    "AlertmanagerPolicy",
    "Delivery",
    "Ownership",
    "TeamReceivers",
    "load_ownership",
]

DEFAULT_OWNERSHIP_PATH = Path(__file__).resolve().parent / "ownership.yaml"
JOB_TEAM = "{job.team}"
CATEGORIES: tuple[str, ...] = ("infra", "platform", "model", "data")
SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")

_TOP_KEYS = (
    "teams",
    "other_teams",
    "owners",
    "clusters",
    "layers",
    "inform_job_team",
    "fallback_team",
    "receivers",
    "alertmanager",
)
_TEAM_KEYS = ("page", "inform", "escalate")
_AM_KEYS = ("group_by", "group_wait", "group_interval", "repeat_interval", "escalation")
# Alertmanager's duration syntax (Prometheus model.Duration): 30s, 5m, 1h30m, 1d ...
_DURATION = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")
_NAME = re.compile(r"^[A-Za-z0-9_.:@/+-]+$")


@dataclass(frozen=True)
class TeamReceivers:
    """A team's Alertmanager receivers: one that pages, one for informational copies, one for escalations."""

    page: str
    inform: str
    escalate: str


@dataclass(frozen=True)
class Delivery:
    """One copy of an alert: for whom, to which receiver, whether it pages, and why (for `routing explain`)."""

    team: str
    receiver: str
    kind: Literal["page", "inform", "route"]
    why: str


@dataclass(frozen=True)
class AlertmanagerPolicy:
    """How the rendered Alertmanager configuration groups, repeats and escalates."""

    group_by: dict[str, tuple[str, ...]]
    group_wait: str = "30s"
    group_interval: str = "5m"
    repeat_interval: dict[str, str] = field(
        default_factory=lambda: {"critical": "1h", "warning": "4h", "info": "24h"}
    )
    escalate_after: str = "30m"
    escalation_receiver: str = ""


@dataclass(frozen=True)
class Ownership:
    """The parsed ownership file."""

    teams: dict[str, TeamReceivers]
    other_teams: TeamReceivers
    owners: dict[str, str]
    clusters: dict[str, dict[str, str]] = field(default_factory=dict)
    layers: dict[str, str] = field(default_factory=dict)  # suspected layer -> owning team
    inform_job_team: frozenset[str] = frozenset()
    fallback_team: str = "platform"
    receivers: dict[str, dict[str, Any]] = field(default_factory=dict)
    alertmanager: AlertmanagerPolicy = field(default_factory=lambda: AlertmanagerPolicy(group_by={}))
    source: str = "ownership"

    def receivers_of(self, team: str) -> TeamReceivers:
        """The receivers of a team; a job team not listed gets `other_teams`."""
        return self.teams.get(team) or self.other_teams

    def owner_of(self, category: str, cluster: str, layer: str = "") -> tuple[str, str]:
        """(owning team or `{job.team}`, the key of the file that decided) for an alert category.

        A cluster's own owner for the category decides first (an operating agreement with a
        provider); then a layer with an owner of its own (`layers`, e.g. storage): a slow
        filesystem is the storage team's to fix whichever category the rule files it under.
        """
        per_cluster = self.clusters.get(cluster) if cluster else None
        if per_cluster and category in per_cluster:
            return per_cluster[category], f"clusters.{cluster}.{category}"
        if layer and layer in self.layers:
            return self.layers[layer], f"layers.{layer}"
        return self.owners[category], f"owners.{category}"

    def all_receivers(self) -> list[str]:
        """Every receiver name the file uses, sorted."""
        names: set[str] = set(self.receivers)
        for spec in [*self.teams.values(), self.other_teams]:
            names.update((spec.page, spec.inform, spec.escalate))
        return sorted(n for n in names if n)

    def page_receivers(self) -> set[str]:
        """Receivers that page someone (a team's `page` and `escalate`)."""
        return {r for s in [*self.teams.values(), self.other_teams] for r in (s.page, s.escalate)}

    def deliveries(self, record: dict[str, Any]) -> list[Delivery]:
        """Where ownership sends an alert record (its `team` is the job's team): owner, then the informed job team."""
        category = str(record.get("category") or "platform")
        cluster = str(record.get("cluster") or "")
        job_team = str(record.get("team") or "")
        severity = str(record.get("severity") or "warning")
        layer = str(record.get("suspected_layer") or "")
        owner, key = self.owner_of(category, cluster, layer)
        if owner == JOB_TEAM:
            if job_team:
                team, who = job_team, f"{key} = {JOB_TEAM}: the job's team {job_team}"
            else:
                team = self.fallback_team
                who = f"{key} = {JOB_TEAM}, but the alert names no job team: fallback_team {team}"
        else:
            team, who = owner, f"{key} = {owner}"
        receivers = self.receivers_of(team)
        listed = "" if team in self.teams else " (not listed under teams: other_teams' receivers)"
        out: list[Delivery] = []
        if severity == "info":
            out.append(
                Delivery(team, receivers.inform, "inform", f"{who}{listed}; severity info never pages")
            )
        else:
            out.append(Delivery(team, receivers.page, "page", f"{who}{listed}; {severity}: pages"))
        by_layer = key.startswith("layers.")
        if job_team and job_team != team and (category in self.inform_job_team or by_layer):
            job_receivers = self.receivers_of(job_team)
            why = (
                f"{key} owns it: the job's team {job_team} is informed, not paged"
                if by_layer
                else f"inform_job_team includes {category}: the job's team {job_team} is informed, not paged"
            )
            out.append(Delivery(job_team, job_receivers.inform, "inform", why))
        return out

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "ownership") -> Ownership:
        """Validate a parsed ownership mapping; an error names the bad key."""
        if not isinstance(data, dict):
            raise RoutingError(f"{source}: expected a mapping with `teams` and `owners`")
        unknown = sorted(set(data) - set(_TOP_KEYS))
        if unknown:
            raise RoutingError(
                f"{source}: unknown key {unknown[0]!r}; expected one of {', '.join(_TOP_KEYS)}"
            )
        escalation_default = _escalation_receiver(data.get("alertmanager"), source)
        teams_data = data.get("teams")
        if not isinstance(teams_data, dict) or not teams_data:
            raise RoutingError(f"{source}: `teams` must map team names to their receivers")
        teams = {
            _name(name, f"{source}: teams"): _team(spec, f"{source}: teams.{name}", escalation_default)
            for name, spec in teams_data.items()
        }
        if "other_teams" not in data:
            raise RoutingError(f"{source}: `other_teams` (receivers of job teams not listed) is required")
        other = _team(data["other_teams"], f"{source}: other_teams", escalation_default)
        owners_data = data.get("owners")
        if not isinstance(owners_data, dict):
            raise RoutingError(
                f"{source}: `owners` must map each category ({', '.join(CATEGORIES)}) to a team"
            )
        owners = _owners(owners_data, f"{source}: owners", teams, complete=True)
        clusters_data = data.get("clusters") or {}
        if not isinstance(clusters_data, dict):
            raise RoutingError(f"{source}: `clusters` must map cluster names to {{category: team}}")
        clusters = {
            str(c): _owners(o, f"{source}: clusters.{c}", teams, complete=False)
            for c, o in clusters_data.items()
        }
        layers_data = data.get("layers") or {}
        if not isinstance(layers_data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in layers_data.items()
        ):
            raise RoutingError(f"{source}: `layers` must map suspected layers (e.g. storage) to a team")
        for layer_name, owner_team in layers_data.items():
            if owner_team not in teams:
                raise RoutingError(
                    f"{source}: layers.{layer_name} names team {owner_team!r}, which is not listed under `teams`"
                )
        inform = data.get("inform_job_team") or []
        if not isinstance(inform, list) or any(c not in CATEGORIES for c in inform):
            raise RoutingError(
                f"{source}: `inform_job_team` must be a list of categories ({', '.join(CATEGORIES)})"
            )
        fallback = data.get("fallback_team", "platform")
        if not isinstance(fallback, str) or fallback not in teams:
            raise RoutingError(
                f"{source}: `fallback_team` must name a team listed under `teams`, not {fallback!r}"
            )
        receivers_data = data.get("receivers") or {}
        if not isinstance(receivers_data, dict) or not all(
            isinstance(v, dict) for v in receivers_data.values()
        ):
            raise RoutingError(
                f"{source}: `receivers` must map receiver names to Alertmanager integrations "
                "(e.g. webhook_configs: [...])"
            )
        ownership = cls(
            teams=teams,
            other_teams=other,
            owners=owners,
            clusters=clusters,
            layers={str(k): str(v) for k, v in layers_data.items()},
            inform_job_team=frozenset(inform),
            fallback_team=fallback,
            receivers={str(k): dict(v) for k, v in receivers_data.items()},
            alertmanager=_am_policy(data.get("alertmanager") or {}, f"{source}: alertmanager"),
            source=source,
        )
        stray = sorted(set(ownership.receivers) - _used_receivers(ownership))
        if stray:
            raise RoutingError(
                f"{source}: receivers.{stray[0]} is configured but no team uses it "
                "(name it as a team's page, inform or escalate receiver)"
            )
        return ownership


def _used_receivers(ownership: Ownership) -> set[str]:
    return {
        r for s in [*ownership.teams.values(), ownership.other_teams] for r in (s.page, s.inform, s.escalate)
    }


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise RoutingError(f"{where}: {value!r} is not a valid name (letters, digits and _.:@/+- only)")
    return value


def _escalation_receiver(am: Any, source: str) -> str:
    if not isinstance(am, dict):
        return ""
    escalation = am.get("escalation") or {}
    if not isinstance(escalation, dict):
        raise RoutingError(f"{source}: alertmanager.escalation must be a mapping with `after` and `receiver`")
    receiver = escalation.get("receiver", "")
    return _name(receiver, f"{source}: alertmanager.escalation.receiver") if receiver else ""


def _team(spec: Any, where: str, escalation_default: str) -> TeamReceivers:
    if not isinstance(spec, dict):
        raise RoutingError(
            f"{where}: expected {{page: <receiver>, inform: <receiver>, escalate: <receiver>}}"
        )
    refuse_unknown_keys(spec, _TEAM_KEYS, where, RoutingError)
    if "page" not in spec:
        raise RoutingError(f"{where}: `page` (the receiver that pages this team) is required")
    page = _name(spec["page"], f"{where}.page")
    inform = _name(spec.get("inform", page), f"{where}.inform")
    escalate = _name(spec.get("escalate") or escalation_default or page, f"{where}.escalate")
    return TeamReceivers(page=page, inform=inform, escalate=escalate)


def _owners(data: Any, where: str, teams: dict[str, TeamReceivers], *, complete: bool) -> dict[str, str]:
    if not isinstance(data, dict):
        raise RoutingError(f"{where}: expected {{category: team}}")
    out: dict[str, str] = {}
    for category, team in data.items():
        if category not in CATEGORIES:
            raise RoutingError(f"{where}: unknown category {category!r}; known: {', '.join(CATEGORIES)}")
        if team != JOB_TEAM and team not in teams:
            raise RoutingError(
                f"{where}.{category}: team {team!r} is not listed under `teams` (or use {JOB_TEAM!r})"
            )
        out[category] = str(team)
    missing = [c for c in CATEGORIES if c not in out]
    if complete and missing:
        raise RoutingError(f"{where}: no owner for category {missing[0]!r}; every category needs one")
    return out


def _duration(value: Any, where: str) -> str:
    text = str(value)
    if not text or not _DURATION.match(text) or text == "0s":
        raise RoutingError(f"{where}: {value!r} is not an Alertmanager duration such as 30s, 5m or 4h")
    return text


def _am_policy(data: Any, where: str) -> AlertmanagerPolicy:
    if not isinstance(data, dict):
        raise RoutingError(f"{where}: expected a mapping")
    refuse_unknown_keys(data, _AM_KEYS, where, RoutingError)
    group_by_data = data.get("group_by") or {}
    if not isinstance(group_by_data, dict):
        raise RoutingError(f"{where}.group_by: expected {{category: [label, ...]}}")
    group_by: dict[str, tuple[str, ...]] = {}
    for category, labels in group_by_data.items():
        if category not in CATEGORIES:
            raise RoutingError(f"{where}.group_by: unknown category {category!r}")
        if not isinstance(labels, list) or not all(isinstance(x, str) and x for x in labels):
            raise RoutingError(f"{where}.group_by.{category}: expected a list of label names")
        group_by[category] = tuple(labels)
    repeat = data.get("repeat_interval") or {}
    if not isinstance(repeat, dict) or any(s not in SEVERITIES for s in repeat):
        raise RoutingError(
            f"{where}.repeat_interval: expected {{severity: duration}} for {', '.join(SEVERITIES)}"
        )
    repeats = {"critical": "1h", "warning": "4h", "info": "24h"}
    repeats.update({s: _duration(v, f"{where}.repeat_interval.{s}") for s, v in repeat.items()})
    escalation = data.get("escalation") or {}
    refuse_unknown_keys(escalation, ("after", "receiver"), f"{where}.escalation", RoutingError)
    return AlertmanagerPolicy(
        group_by=group_by,
        group_wait=_duration(data.get("group_wait", "30s"), f"{where}.group_wait"),
        group_interval=_duration(data.get("group_interval", "5m"), f"{where}.group_interval"),
        repeat_interval=repeats,
        escalate_after=_duration(escalation.get("after", "30m"), f"{where}.escalation.after"),
        escalation_receiver=str(escalation.get("receiver") or ""),
    )


def load_ownership(path: str | Path | None = None) -> Ownership:
    """The ownership file at `path` (default: the shipped `streams/alerting/ownership.yaml`)."""
    from streams.config import read_yaml

    p = Path(path) if path is not None else DEFAULT_OWNERSHIP_PATH
    return Ownership.from_dict(read_yaml(p, "ownership", RoutingError), source=str(p))
