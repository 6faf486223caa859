"""Alert grouping and inhibition: one incident, one group; a root cause mutes the symptoms it explains.

Two steps run on every batch of Alert records the tracker emits, before routing:

- **Inhibition** (as Alertmanager's `inhibit_rules`): while a *source* alert fires, a *target*
  alert that fires and is explained by it (same values of the rule's `equal` fields; with
  `scope: node`, the target runs on the source's node: its own node, or for a job-level alert
  without a node, a rank of its job bound there; with `scope: gpu`, the target is on the source's
  GPU: its own GPU, or for a job-level alert without one, a rank of its job bound to that GPU)
  gets `inhibited_by` = the source's `alert_id`. It is still published and recorded; the
  router and forwarders may drop it, and evaluation does not count it as a page. Within a batch the
  sources fire first, so a root and its symptoms settled by the same watermark are linked; a
  symptom that fired *before* its root is not muted retroactively (it was already delivered).
- **Grouping**: every alert gets a `group_key`. An inhibited alert joins its root's group. Any
  other alert's scope is its node for node and GPU faults (an alert whose rule is the source of
  a `scope: node` or `scope: gpu` inhibit rule), else its job, else its node; the first firing alert of a scope opens
  the group `<scope>@<starts_at>` and later alerts of the scope join it until every member has
  resolved, so one incident is one group and the next incident on the same node is another.

A resolved record carries the `group_key` and `inhibited_by` of its firing. The state is plain
JSON-able dicts (it goes into engine snapshots); everything is deterministic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from streams.detectors.base import Topology

__all__ = ["AlertGrouper", "InhibitRule", "alert_field"]


def alert_field(record: dict[str, Any], name: str) -> str | None:
    """An alert field (or `labels.<name>`) as a string, None when unset."""
    if name.startswith("labels."):
        value = (record.get("labels") or {}).get(name[len("labels.") :])
    else:
        value = record.get(name)
    return None if value is None else str(value)


@dataclass(frozen=True)
class InhibitRule:
    """A firing source alert mutes target alerts that share the `equal` fields (and node, for `scope: node`)."""

    source_match: dict[str, str] = field(default_factory=dict)
    source_match_re: dict[str, re.Pattern[str]] = field(default_factory=dict)
    target_match: dict[str, str] = field(default_factory=dict)
    target_match_re: dict[str, re.Pattern[str]] = field(default_factory=dict)
    equal: tuple[str, ...] = ()
    scope: Literal["", "node", "gpu"] = ""

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
        """True when the firing `source` explains `target` under this rule."""
        if source["fingerprint"] == target["fingerprint"]:
            return False
        if not (self.is_source(source) and self.is_target(target)):
            return False
        for name in self.equal:
            if alert_field(source, name) != alert_field(target, name):
                return False
        if self.scope == "node":
            node = source.get("node")
            if not node:
                return False
            if target.get("node"):
                return bool(target["node"] == node)
            # A job-level alert (no node of its own) runs on every node its ranks are bound to.
            job = target.get("job_id")
            return bool(job) and any(b.node == node for b in topology.ranks_of(str(job)))
        if self.scope == "gpu":
            gpu = source.get("gpu_uuid")
            if not gpu:
                return False
            if target.get("gpu_uuid"):
                return bool(target["gpu_uuid"] == gpu)
            # A job-level alert (no GPU of its own) concerns every GPU its ranks are bound to.
            job = target.get("job_id")
            return bool(job) and any(b.gpu_uuid == gpu for b in topology.ranks_of(str(job)))
        return True


# Fields of a firing source kept to test later targets against it.
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
    "group_key",
)


class AlertGrouper:
    """Fills `group_key` and `inhibited_by` on Alert records, batch by batch, in place."""

    def __init__(self, rules: list[InhibitRule] | None = None, topology: Topology | None = None) -> None:
        self.rules = list(rules or [])
        self.topology = topology if topology is not None else Topology()
        self._sources: dict[str, dict[str, Any]] = {}  # fingerprint -> kept fields of a firing source
        self._alerts: dict[
            str, list[str | None]
        ] = {}  # fingerprint -> [group_key, inhibited_by] while firing
        self._groups: dict[str, list[Any]] = {}  # scope -> [group_key, open member count]

    def order(self, finding: Any) -> int:
        """Sort key of a finding in a batch: rules that can be a source (root cause) first.

        Only the rule name is probed, so every finding of one fingerprint keeps its place
        relative to the others (a stable sort never swaps a condition's start and end).
        """
        probe = {"rule": finding.rule}
        return 0 if any(r.is_source(probe) for r in self.rules) else 1

    def annotate(self, records: list[dict[str, Any]]) -> None:
        """Set `group_key` and `inhibited_by` on each record (firing and resolved) of one batch."""
        for record in records:
            if record["status"] == "firing" and any(r.is_source(record) for r in self.rules):
                self._sources[record["fingerprint"]] = {k: record.get(k) for k in _KEPT}
        for record in records:
            fp = record["fingerprint"]
            if record["status"] == "firing":
                known = self._alerts.get(fp)
                if known is None:
                    known = self._alerts[fp] = self._place(record)
                record["group_key"], record["inhibited_by"] = known
                if fp in self._sources:
                    self._sources[fp]["group_key"] = known[0]
            else:
                known = self._alerts.pop(fp, None)
                if known is not None:
                    record["group_key"], record["inhibited_by"] = known
                    self._leave(known[0])
                self._sources.pop(fp, None)

    def _place(self, record: dict[str, Any]) -> list[str | None]:
        for fp in sorted(self._sources, key=lambda f: (self._sources[f]["starts_at"], f)):
            source = self._sources[fp]
            if any(rule.explains(source, record, self.topology) for rule in self.rules):
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

    def _leave(self, group: str | None) -> None:
        for scope in sorted(self._groups):
            opened = self._groups[scope]
            if opened[0] == group:
                opened[1] -= 1
                if opened[1] <= 0:
                    del self._groups[scope]
                return

    # -- state -------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "sources": {k: self._sources[k] for k in sorted(self._sources)},
            "alerts": {k: self._alerts[k] for k in sorted(self._alerts)},
            "groups": {k: self._groups[k] for k in sorted(self._groups)},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._sources = {k: dict(v) for k, v in state.get("sources", {}).items()}
        self._alerts = {k: list(v) for k, v in state.get("alerts", {}).items()}
        self._groups = {k: list(v) for k, v in state.get("groups", {}).items()}
