"""Alert grouping and inhibition: one incident, one group; the specific cause mutes the general symptoms.

Two steps run on every batch of Alert records the tracker emits, before routing:

- **Inhibition** runs over one explicit graph of edges, *cause -> symptoms* with the scope each
  edge needs (the shipped graph is `inhibit_rules` in `routing.yaml`; docs/detectors.md draws it).
  While a cause fires, a symptom it explains gets `inhibited_by` = the cause's `alert_id`. Scopes:
  `gpu` (the symptom is on the cause's GPU: its own GPU, or for a job-level symptom without one, a
  rank of its job bound to that GPU), `node` (the same for the cause's node), `job` (the same job).
  An edge's `after_s` lets a cause explain symptoms that begin while its incident is open (its
  group has a member firing) and up to that long after the incident closed: consequences that
  arrive late (a step that spanned a stall closes after the stall; the NCCL watchdog on the other
  ranks times out ten minutes after a rank hung, and they exit). Rules may also be written in Alertmanager's
  form (`source_match`, `target_match`, `equal`), which the same code applies.
- A cause that fires *after* its symptom mutes it then: the grouper appends to the batch a copy of
  the symptom's firing record (same `alert_id` and `starts_at`, `ts` = when the cause fired) with
  `inhibited_by` and the cause's `group_key` set, so stores, pages and Alertmanager see the
  symptom fold under its cause. A cause never mutes the alert that mutes it. A later record of a
  firing alert (a refresh with its new values) carries the muting and group its firing was given.
- **Grouping**: every alert gets a `group_key`. An inhibited alert joins its root's group. Any
  other alert's scope is its node for node and GPU faults (an alert whose rule is the cause of
  a `node` or `gpu` edge), else its job, else its node; the first firing alert of a scope opens
  the group `<scope>@<starts_at>` and later alerts of the scope join it until every member has
  resolved, so one incident is one group and the next incident on the same node is another.

A muted record is still published and recorded; the router and forwarders may drop it, and
evaluation does not count it as a page. A resolved record carries the `group_key` and
`inhibited_by` of its firing. The state is plain JSON-able dicts (it goes into engine
snapshots); everything is deterministic.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from streams.detectors.base import Topology

__all__ = [
    "SCOPES",
    "SCOPE_WORDS",
    "AlertGrouper",
    "InhibitRule",
    "alert_field",
    "edge_for",
    "graph_cycle",
    "graph_levels",
    "muted_by_text",
]

Scope = Literal["", "node", "gpu", "job"]
# The scopes an edge of the graph can name: the symptom on the cause's GPU, node, or job.
SCOPES: tuple[str, ...] = ("gpu", "node", "job")


def alert_field(record: dict[str, Any], name: str) -> str | None:
    """An alert field (or `labels.<name>`) as a string, None when unset."""
    if name.startswith("labels."):
        value = (record.get("labels") or {}).get(name[len("labels.") :])
    else:
        value = record.get(name)
    return None if value is None else str(value)


def _ts(record: dict[str, Any]) -> int:
    """A record's event time (its start when it has none)."""
    return int(record.get("ts") or record.get("starts_at") or 0)


def _any_of(rules: Sequence[str]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(r) for r in rules))


@dataclass(frozen=True)
class InhibitRule:
    """A firing cause (source) mutes the symptoms (targets) it explains.

    Written as a graph edge (`InhibitRule.edge`: cause rules, symptom rules, scope) or as an
    Alertmanager inhibit rule (source and target matchers, `equal` fields, optional scope).
    """

    source_match: dict[str, str] = field(default_factory=dict)
    source_match_re: dict[str, re.Pattern[str]] = field(default_factory=dict)
    target_match: dict[str, str] = field(default_factory=dict)
    target_match_re: dict[str, re.Pattern[str]] = field(default_factory=dict)
    equal: tuple[str, ...] = ()
    scope: Scope = ""
    # A cause resolved less than this long before a symptom began still explains it (0: only while firing).
    after_ms: int = 0
    # Set for an edge of the graph: the cause rules and the symptom rules (the matchers say the same).
    causes: tuple[str, ...] = ()
    symptoms: tuple[str, ...] = ()
    why: str = ""

    @classmethod
    def edge(
        cls,
        causes: Sequence[str],
        symptoms: Sequence[str],
        scope: Literal["gpu", "node", "job"],
        *,
        after_s: float = 0.0,
        why: str = "",
    ) -> InhibitRule:
        """The edge `causes -> symptoms` on the same GPU, node or job."""
        return cls(
            source_match_re={"rule": _any_of(causes)},
            target_match_re={"rule": _any_of(symptoms)},
            scope=scope,
            after_ms=int(after_s * 1000),
            causes=tuple(causes),
            symptoms=tuple(symptoms),
            why=why,
        )

    @staticmethod
    def _matches(record: dict[str, Any], match: dict[str, str], match_re: dict[str, re.Pattern[str]]) -> bool:
        for name, want in match.items():
            if alert_field(record, name) != want:
                return False
        for name, pattern in match_re.items():
            value = alert_field(record, name)
            if value is None or not pattern.fullmatch(value):
                return False
        return True

    def is_source(self, record: dict[str, Any]) -> bool:
        """True when the alert can inhibit under this rule."""
        return self._matches(record, self.source_match, self.source_match_re)

    def is_target(self, record: dict[str, Any]) -> bool:
        """True when the alert can be inhibited under this rule."""
        return self._matches(record, self.target_match, self.target_match_re)

    def explains(self, source: dict[str, Any], target: dict[str, Any], topology: Topology) -> bool:
        """True when `source` (firing, or resolved with `ends_at` set) explains `target` under this rule."""
        if source["fingerprint"] == target["fingerprint"]:
            return False
        if not (self.is_source(source) and self.is_target(target)):
            return False
        ended = source.get("ends_at")
        if ended is not None and (not self.after_ms or int(target["starts_at"]) > int(ended) + self.after_ms):
            return False
        for name in self.equal:
            if alert_field(source, name) != alert_field(target, name):
                return False
        if self.scope == "job":
            return bool(source.get("job_id")) and source.get("job_id") == target.get("job_id")
        if self.scope in ("node", "gpu"):
            field = "node" if self.scope == "node" else "gpu_uuid"  # the alert's and the binding's
            place = source.get(field)
            if not place:
                return False
            if target.get(field):
                return bool(target[field] == place)
            # A job-level alert (no node or GPU of its own) concerns every node and GPU its ranks
            # are bound to.
            job = target.get("job_id")
            return bool(job) and any(getattr(b, field) == place for b in topology.ranks_of(str(job)))
        return True


# How a page words an edge's scope ("straggler, muted by gpu_throttling on the same GPU").
SCOPE_WORDS: dict[str, str] = {"gpu": "on the same GPU", "node": "on the same node", "job": "in the same job"}


def edge_for(rules: Iterable[InhibitRule], cause: str, symptom: str) -> InhibitRule | None:
    """The first graph edge by which rule `cause` mutes rule `symptom`, None when there is none."""
    probe_cause, probe_symptom = {"rule": cause}, {"rule": symptom}
    for rule in rules:
        if rule.is_source(probe_cause) and rule.is_target(probe_symptom):
            return rule
    return None


def muted_by_text(rules: Iterable[InhibitRule], cause: str, symptom: str) -> str:
    """`"<symptom>, muted by <cause> on the same GPU"`: how a page folds a muted alert under its cause."""
    edge = edge_for(rules, cause, symptom)
    where = SCOPE_WORDS.get(edge.scope, "") if edge is not None else ""
    return f"{symptom}, muted by {cause}" + (f" {where}" if where else "")


def _edges(rules: Iterable[InhibitRule]) -> dict[str, set[str]]:
    """cause rule -> symptom rules, over the rules written as graph edges."""
    out: dict[str, set[str]] = {}
    for rule in rules:
        for cause in rule.causes:
            out.setdefault(cause, set()).update(rule.symptoms)
    return out


def graph_cycle(rules: Iterable[InhibitRule]) -> list[str] | None:
    """A cycle of rule names through the graph's edges (`[a, b, a]`), or None: causes must not mute each other."""
    edges = _edges(rules)
    done: set[str] = set()
    for start in sorted(edges):
        found = _cycle_from(start, [], edges, done)
        if found:
            return found
    return None


def _cycle_from(rule: str, path: list[str], edges: dict[str, set[str]], done: set[str]) -> list[str] | None:
    """A cycle reached from `rule` along `path` (depth first), or None; `done` holds rules known to
    reach none. A module function, not a closure that calls itself: that closure would be a
    reference cycle, garbage only the cyclic collector frees (see streams/gc_policy.py)."""
    if rule in path:
        return [*path[path.index(rule) :], rule]
    if rule in done:
        return None
    for nxt in sorted(edges.get(rule, ())):
        found = _cycle_from(nxt, [*path, rule], edges, done)
        if found:
            return found
    done.add(rule)
    return None


def graph_levels(rules: Iterable[InhibitRule]) -> dict[str, int]:
    """Each rule named by the graph's edges -> its depth (causes of nothing above them: 0).

    The engine settles findings of lower levels first, so a cause and its symptoms found by the
    same event are linked when the symptom fires. Assumes no cycle (`graph_cycle`).
    """
    edges = _edges(rules)
    level: dict[str, int] = {}
    names = sorted(set(edges) | {s for targets in edges.values() for s in targets})
    # Longest path from a root; at most len(names) relaxation rounds in an acyclic graph.
    for name in names:
        level[name] = 0
    for _ in range(len(names)):
        changed = False
        for cause in sorted(edges):
            for symptom in edges[cause]:
                if level[symptom] < level[cause] + 1:
                    level[symptom] = level[cause] + 1
                    changed = True
        if not changed:
            break
    return level


# Fields of a firing cause kept to test later symptoms against it.
_KEPT = (
    "alert_id",
    "fingerprint",
    "rule",
    "category",
    "severity",
    "job_id",
    "run_id",
    "node",
    "rank",
    "gpu_uuid",
    "cluster",
    "team",
    "suspected_layer",
    "labels",
    "starts_at",
    "ts",
    "group_key",
)


class AlertGrouper:
    """Fills `group_key` and `inhibited_by` on Alert records, batch by batch, in place."""

    def __init__(self, rules: list[InhibitRule] | None = None, topology: Topology | None = None) -> None:
        self.rules = list(rules or [])
        self.topology = topology if topology is not None else Topology()
        self._levels = graph_levels(self.rules)
        self._deepest = max(self._levels.values(), default=0) + 1
        self._after_ms = max((r.after_ms for r in self.rules), default=0)
        # fingerprint -> kept fields of a cause: firing, or resolved (`ends_at`) within `after_ms`
        self._sources: dict[str, dict[str, Any]] = {}
        # fingerprint -> [group_key, inhibited_by] while firing
        self._alerts: dict[str, list[str | None]] = {}
        # fingerprint -> the firing record of an alert no cause explains yet (a cause may come later)
        self._open: dict[str, dict[str, Any]] = {}
        self._groups: dict[str, list[Any]] = {}  # scope -> [group_key, open member count]

    def order(self, finding: Any) -> int:
        """Sort key of a finding in a batch: causes before the symptoms they explain.

        The key is the rule's depth in the graph (rules written in Alertmanager's form: 0 for a
        possible source, else after every graph rule). Only the rule name is probed, so every
        finding of one fingerprint keeps its place relative to the others (a stable sort never
        swaps a condition's start and end).
        """
        level = self._levels.get(finding.rule)
        if level is not None:
            return level
        probe = {"rule": finding.rule}
        return 0 if any(r.is_source(probe) for r in self.rules) else self._deepest

    def annotate(self, records: list[dict[str, Any]]) -> None:
        """Set `group_key` and `inhibited_by` on each record (firing and resolved) of one batch.

        When a cause fires, the symptoms it explains that fired before it are muted: their updated
        firing records are appended to `records`.
        """
        fired: list[str] = []
        for record in records:
            if record["status"] == "firing" and self._is_source(record):
                fp = record["fingerprint"]
                if fp not in self._alerts:
                    fired.append(fp)
                self._sources[fp] = {k: record.get(k) for k in _KEPT}
        now = max((_ts(r) for r in records), default=None)
        for record in records:
            fp = record["fingerprint"]
            if record["status"] == "firing":
                known = self._alerts.get(fp)
                if known is None:
                    known = self._alerts[fp] = self._place(record)
                    if known[1] is None and self._is_target(record):
                        self._open[fp] = dict(record)
                record["group_key"], record["inhibited_by"] = known
                if fp in self._open:
                    # The newest record (a refresh carries new values): what a late mute re-sends.
                    self._open[fp] = {**record, "group_key": known[0], "inhibited_by": None}
                if fp in self._sources:
                    self._sources[fp]["group_key"] = known[0]
            else:
                known = self._alerts.pop(fp, None)
                self._open.pop(fp, None)
                if known is not None:
                    record["group_key"], record["inhibited_by"] = known
                    self._leave(known[0], _ts(record))
                source = self._sources.get(fp)
                if source is not None and self._after_ms and record.get("ends_at") is not None:
                    source["ends_at"] = int(record["ends_at"])  # still explains symptoms for a while
                else:
                    self._sources.pop(fp, None)
        for fp in fired:
            if fp in self._alerts:  # not resolved in the same batch
                records.extend(self._mute_earlier(self._sources[fp]))
        if now is not None:
            self._forget_ended(now)

    def _explains(self, source: dict[str, Any], target: dict[str, Any]) -> bool:
        """Whether `source` explains `target` under some rule. A cause that resolved still explains,
        under an edge with `after_s`, while its incident is open (the late consequences of one
        incident belong to it)."""
        for rule in self.rules:
            view = source
            if rule.after_ms and source.get("ends_at") is not None and self._is_open(source.get("group_key")):
                view = {**source, "ends_at": None}
            if rule.explains(view, target, self.topology):
                return True
        return False

    def _is_open(self, group: str | None) -> bool:
        return group is not None and any(opened[0] == group for opened in self._groups.values())

    def _is_source(self, record: dict[str, Any]) -> bool:
        return any(r.is_source(record) for r in self.rules)

    def _is_target(self, record: dict[str, Any]) -> bool:
        return any(r.is_target(record) for r in self.rules)

    def _mute_earlier(self, source: dict[str, Any]) -> list[dict[str, Any]]:
        """Updated firing records of the open symptoms a cause that just fired explains."""
        out = []
        muted_by = self._alerts[source["fingerprint"]][1]
        for fp in sorted(self._open, key=lambda f: (self._open[f]["starts_at"], f)):
            target = self._open[fp]
            if target["alert_id"] == muted_by:
                continue  # the alert that explains this cause is never muted by it
            if not self._explains(source, target):
                continue
            group = source["group_key"]
            known = self._alerts[fp]
            self._leave(known[0])
            self._join(group)
            known[0], known[1] = group, source["alert_id"]
            if fp in self._sources:
                self._sources[fp]["group_key"] = group
            del self._open[fp]
            out.append(
                {
                    **target,
                    "ts": max(_ts(target), _ts(source)),
                    "group_key": group,
                    "inhibited_by": source["alert_id"],
                }
            )
        return out

    def _forget_ended(self, now: int) -> None:
        for fp in [f for f, s in self._sources.items() if s.get("ends_at") is not None]:
            source = self._sources[fp]
            if now - int(source["ends_at"]) > self._after_ms and not self._is_open(source.get("group_key")):
                del self._sources[fp]

    def _place(self, record: dict[str, Any]) -> list[str | None]:
        for fp in sorted(self._sources, key=lambda f: (self._sources[f]["starts_at"], f)):
            source = self._sources[fp]
            if self._explains(source, record):
                group = source["group_key"] or f"{self._scope(source)}@{source['starts_at']}"
                self._join(group)
                return [group, source["alert_id"]]
        scope = self._scope(record)
        opened = self._groups.get(scope)
        if opened is None:
            opened = self._groups[scope] = [f"{scope}@{record['starts_at']}", 0]
        opened[1] += 1
        return [opened[0], None]

    def _scope(self, record: dict[str, Any]) -> str:
        node_fault = any(r.scope in ("node", "gpu") and r.is_source(record) for r in self.rules)
        if node_fault and record.get("node"):
            return f"node:{record['node']}"
        if record.get("job_id"):
            return f"job:{record['job_id']}"
        if record.get("node"):
            return f"node:{record['node']}"
        return f"alert:{record['fingerprint']}"

    def _join(self, group: str) -> None:
        for opened in self._groups.values():
            if opened[0] == group:
                opened[1] += 1
                return

    def _leave(self, group: str | None, ts: int | None = None) -> None:
        for scope in sorted(self._groups):
            opened = self._groups[scope]
            if opened[0] == group:
                opened[1] -= 1
                if opened[1] <= 0:
                    del self._groups[scope]
                    if ts is not None:
                        self._close(group, ts)
                return

    def _close(self, group: str | None, ts: int) -> None:
        """The incident closed at `ts`: its resolved causes explain late consequences for their
        `after_s` from now on, not from when each resolved."""
        for source in self._sources.values():
            if source.get("group_key") == group and source.get("ends_at") is not None:
                source["ends_at"] = max(int(source["ends_at"]), ts)

    # -- state -------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "sources": {k: self._sources[k] for k in sorted(self._sources)},
            "alerts": {k: self._alerts[k] for k in sorted(self._alerts)},
            "open": {k: self._open[k] for k in sorted(self._open)},
            "groups": {k: self._groups[k] for k in sorted(self._groups)},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._sources = {k: dict(v) for k, v in state.get("sources", {}).items()}
        self._alerts = {k: list(v) for k, v in state.get("alerts", {}).items()}
        self._open = {k: dict(v) for k, v in state.get("open", {}).items()}
        self._groups = {k: list(v) for k, v in state.get("groups", {}).items()}
