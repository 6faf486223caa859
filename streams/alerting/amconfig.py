"""Render an Alertmanager configuration from the ownership file and the routing file's inhibit rules.

Acknowledgement, silencing and escalation stay in Alertmanager; ranksight only says who owns what.
The rendered tree (`ranksight alerts am-config --ownership FILE`):

- the root route's receiver is `other_teams.page` (a job team the file does not list);
- one route per team (`team="<name>"`, as ranksight's routing set it), whose receiver is the team's
  `page` receiver; under it, in order:
  1. informational copies (`receiver="<inform>"`, when the team's inform receiver differs from its
     page receiver): never escalated, repeated at the `info` interval;
  2. explicit routes' receivers of the routing file (`receiver="<name>"`);
  3. escalation: `severity="critical"` alerts of a category the team owns (on the clusters where it
     owns it) go, with `continue: true`, to the team's `escalate` receiver after
     `group_wait: <escalation.after>`. A page
     someone acknowledged by silencing it in Alertmanager within that time never reaches it
     (Alertmanager notifies nothing for silenced alerts), nor does one resolved by then;
  4. one route per category with its `group_by`, and under it one per severity with its
     `repeat_interval`;
- the same children at the root for teams the file does not list;
- inhibit rules from the routing file's inhibition graph, `inhibit_rules` (alert fields ->
  Alertmanager labels: `rule` is `alertname`, `labels.<x>` is `<x>`). An edge of scope `job` is
  one rule (`equal: [job]`, the target has a job); `node` becomes two rules: same `node`, or a
  job-level target (`node=""`) of the job the source names; `gpu` likewise with `gpu_uuid`. An
  edge's `after_s` (a resolved cause still explains later symptoms) has no Alertmanager form:
- the engine's own verdict travels as the `inhibited_by` label, and the first route sends every
  alert carrying it to `ranksight-muted`, a receiver that notifies nobody (the alert stays visible
  in Alertmanager, as an inhibited one does), so a symptom the engine muted never pages or escalates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from streams.alerting.alertmanager import LABEL_FIELDS
from streams.alerting.grouping import InhibitRule
from streams.alerting.ownership import CATEGORIES, JOB_TEAM, SEVERITIES, Ownership, TeamReceivers
from streams.alerting.routing import Route

__all__ = ["MUTED_RECEIVER", "RenderedConfig", "label_for_field", "matcher", "render_alertmanager_config"]

# Where alerts the engine muted (label `inhibited_by`) go: a receiver without notifiers.
MUTED_RECEIVER = "ranksight-muted"

_REGEX_SPECIAL = frozenset("\\.^$|?*+()[]{}")
_HEADER = """\
# Alertmanager configuration rendered by `ranksight alerts am-config` from {source}.
# Regenerate it after editing the ownership or routing file; check it with `amtool check-config`.
# Acknowledge a page by silencing it (amtool silence add / the Alertmanager UI): a critical page not
# silenced within {after} escalates to the team's escalation receiver. An alert ranksight muted under
# its cause (label inhibited_by) goes to {muted}, which notifies nobody.
"""


class _NoAliases(yaml.SafeDumper):
    """Writes a list shared by two rules twice instead of as a YAML anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


@dataclass(frozen=True)
class RenderedConfig:
    """The configuration (a mapping), its YAML text, and what could not be rendered."""

    config: dict[str, Any]
    text: str
    warnings: tuple[str, ...]


def label_for_field(name: str) -> str | None:
    """The Alertmanager label carrying an alert field (`rule` -> `alertname`), None if none does."""
    if name == "rule":
        return "alertname"
    if name.startswith("labels."):
        return name[len("labels.") :]
    if name in LABEL_FIELDS or name == "fingerprint":
        return name
    return None


def matcher(label: str, value: str, *, regex: bool = False, negate: bool = False) -> str:
    """One Alertmanager matcher (`label="value"`, `=~`, `!=`, `!~`), with the value escaped."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    op = ("!~" if negate else "=~") if regex else ("!=" if negate else "=")
    return f'{label}{op}"{escaped}"'


def _severity_routes(ownership: Ownership) -> list[dict[str, Any]]:
    return [
        {"matchers": [matcher("severity", s)], "repeat_interval": ownership.alertmanager.repeat_interval[s]}
        for s in SEVERITIES
    ]


def _literal(text: str) -> str:
    """`text` as a regular expression matching itself (RE2 and Python agree on these escapes)."""
    return "".join(f"\\{ch}" if ch in _REGEX_SPECIAL else ch for ch in text)


def _escalation_scopes(ownership: Ownership, team: str | None) -> list[list[str]]:
    """Matchers of the (category, cluster) pairs `team` owns, one list per category it can own.

    `team` None stands for a job team the file does not list. Informational copies of a category
    only ever reach a team that does not own it there, so these matchers escalate pages alone.
    """
    wanted = {JOB_TEAM} if team is None else {team, JOB_TEAM}
    scopes = []
    for category in CATEGORIES:
        overrides = {c: o[category] for c, o in sorted(ownership.clusters.items()) if category in o}
        mine = [c for c, owner in overrides.items() if owner in wanted]
        others = [c for c, owner in overrides.items() if owner not in wanted]
        where = [matcher("category", category)]
        if ownership.owners[category] in wanted:
            if others:
                where.append(
                    matcher("cluster", "|".join(_literal(c) for c in others), regex=True, negate=True)
                )
        elif mine:
            where.append(matcher("cluster", "|".join(_literal(c) for c in mine), regex=True))
        else:
            continue
        scopes.append(where)
    # A team that owns a layer (`layers`, e.g. storage) is paged for alerts of categories it does
    # not own otherwise (a storage-layer `data` alert): those pages escalate too. Alertmanager sees
    # no layer label, so the scope is the category: under the team's own route only its pages
    # (informational copies are routed before the escalation) reach it.
    if team is not None and team in ownership.layers.values():
        covered = {next(m for m in scope if m.startswith("category")) for scope in scopes}
        for category in CATEGORIES:
            by_category = matcher("category", category)
            if by_category not in covered:
                scopes.append([by_category])
    return scopes


def _children(
    ownership: Ownership, receivers: TeamReceivers, owned: Sequence[list[str]], extra_receivers: Iterable[str]
) -> list[dict[str, Any]]:
    am = ownership.alertmanager
    routes: list[dict[str, Any]] = []
    if receivers.inform != receivers.page:
        routes.append(
            {
                "matchers": [matcher("receiver", receivers.inform)],
                "receiver": receivers.inform,
                "repeat_interval": am.repeat_interval["info"],
            }
        )
    for name in sorted(set(extra_receivers) - {receivers.page, receivers.inform}):
        routes.append(
            {"matchers": [matcher("receiver", name)], "receiver": name, "routes": _severity_routes(ownership)}
        )
    for scope in owned:
        routes.append(
            {
                "matchers": [matcher("severity", "critical"), *scope],
                "receiver": receivers.escalate,
                "group_wait": am.escalate_after,
                "repeat_interval": am.repeat_interval["critical"],
                "continue": True,
            }
        )
    for category in CATEGORIES:
        route: dict[str, Any] = {"matchers": [matcher("category", category)]}
        if category in am.group_by:
            route["group_by"] = list(am.group_by[category])
        route["routes"] = _severity_routes(ownership)
        routes.append(route)
    return routes


def _inhibit_rules(rules: Sequence[InhibitRule], warnings: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, rule in enumerate(rules):
        where = f"inhibit_rules[{i}]"
        converted: dict[str, list[str]] = {}
        missing: list[str] = []
        for side, match, match_re in (
            ("source", rule.source_match, rule.source_match_re),
            ("target", rule.target_match, rule.target_match_re),
        ):
            matchers = []
            for name, value in match.items():
                label = label_for_field(name)
                if label is None:
                    missing.append(name)
                else:
                    matchers.append(matcher(label, value))
            for name, pattern in match_re.items():
                label = label_for_field(name)
                if label is None:
                    missing.append(name)
                else:
                    matchers.append(matcher(label, pattern.pattern, regex=True))
            converted[side] = matchers
        equal = []
        for name in rule.equal:
            label = label_for_field(name)
            if label is None or label == "team":
                missing.append(name)  # `team` is the routed team in Alertmanager, not the job's
            else:
                equal.append(label)
        if missing:
            warnings.append(
                f"{where} left out: Alertmanager sees no label for {', '.join(sorted(set(missing)))}"
            )
            continue
        base = {"source_matchers": converted["source"], "target_matchers": converted["target"]}
        if rule.scope == "job":
            # `equal` holds when both lack the label: the target must name a job.
            with_job = [*converted["target"], matcher("job", ".+", regex=True)]
            out.append({**base, "target_matchers": with_job, "equal": sorted({*equal, "job"})})
        elif rule.scope:
            scope_label = "node" if rule.scope == "node" else "gpu_uuid"
            own = [*converted["target"], matcher(scope_label, ".+", regex=True)]
            out.append({**base, "target_matchers": own, "equal": [*equal, scope_label]})
            job_level = [*converted["target"], matcher(scope_label, "")]
            out.append({**base, "target_matchers": job_level, "equal": sorted({*equal, "job"})})
        else:
            out.append({**base, "equal": equal})
    return out


def render_alertmanager_config(
    ownership: Ownership,
    inhibit_rules: Sequence[InhibitRule] = (),
    routes: Sequence[Route] = (),
    *,
    resolve_timeout: str = "5m",
    source: str | None = None,
) -> RenderedConfig:
    """The Alertmanager configuration for `ownership`, with the routing file's inhibit rules and routes.

    `source` names the ownership file in the header comment (default: the path it was read from).
    """
    am = ownership.alertmanager
    warnings: list[str] = []
    extra: dict[str, set[str]] = {}
    for route in routes:
        teams = [*ownership.teams, ""] if route.team == JOB_TEAM else [route.team]
        for team in teams:
            extra.setdefault(team, set()).add(route.receiver)
    team_routes = []
    for team, receivers in ownership.teams.items():
        team_routes.append(
            {
                "matchers": [matcher("team", team)],
                "receiver": receivers.page,
                "routes": _children(
                    ownership, receivers, _escalation_scopes(ownership, team), extra.get(team, ())
                ),
            }
        )
    others = _children(
        ownership, ownership.other_teams, _escalation_scopes(ownership, None), extra.get("", ())
    )
    config: dict[str, Any] = {
        "global": {"resolve_timeout": resolve_timeout},
        "route": {
            "receiver": ownership.other_teams.page,
            "group_by": ["team", "alertname", "job"],
            "group_wait": am.group_wait,
            "group_interval": am.group_interval,
            "repeat_interval": am.repeat_interval["warning"],
            "routes": [
                {"matchers": [matcher("inhibited_by", ".+", regex=True)], "receiver": MUTED_RECEIVER},
                *team_routes,
                *others,
            ],
        },
        "inhibit_rules": _inhibit_rules(inhibit_rules, warnings),
        "receivers": [
            *({"name": name, **ownership.receivers.get(name, {})} for name in ownership.all_receivers()),
            {"name": MUTED_RECEIVER},
        ],
    }
    body = yaml.dump(config, Dumper=_NoAliases, sort_keys=False, default_flow_style=False, width=120)
    text = (
        _HEADER.format(source=source or ownership.source, after=am.escalate_after, muted=MUTED_RECEIVER)
        + body
    )
    return RenderedConfig(config=config, text=text, warnings=tuple(warnings))
