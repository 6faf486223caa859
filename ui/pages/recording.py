"""Pass 1 of a report made from a recording (no store): which jobs, runs, alerts and actions it holds.

`ranksight report recording.avro` reads the recording (its events, and the alerts and derived
windows the CLI layer's replay raised on them: `ui/` runs no detector) twice. `Scan` is the first
pass: per job, its `JobStarted` records, rank bindings, alerts, states and the minutes with steps
(the page's time range); per run, its last step (the compare page's buckets). The second pass is
each page's fold, next to that page's SQL (`ui.pages.job.Panels` and the folds it is made of).
Memory is bounded by the page, not by the recording.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from schemas.records import Event
from ui.alerts import copies_of, fold_muted, latest_order
from ui.pages.common import ACTION_COLUMNS, MINUTE_MS, plausible_bounds, rounded
from ui.pages.compare import Run

__all__ = ["EventSource", "Scan", "ScannedJob", "alert_rows", "scan"]
# A replayable stream of events: called once per pass.
EventSource = Callable[[], Iterable[Event]]

# JobStarted fields the page shows that a record may leave null: targets and the checkpoint policy.
_OPTIONAL_STARTED = ("target_steps", "target_tokens", "target_epochs", "checkpoint_max_age_s")


# --- pass 1: what the recording holds ---------------------------------------------------------------


@dataclass
class ScannedJob:
    started: dict[str, dict[str, Any]] = field(default_factory=dict)  # run -> latest JobStarted
    started_min: int | None = None
    meta_latest: dict[str, Any] | None = None
    minutes: tuple[int, int] | None = None  # first and last minute with a (plausible) step
    steps: tuple[int, int] | None = None  # first and last (plausible) step time
    state: tuple[int, str] | None = None  # (ts, state) of the latest state change, any time
    state_max: int | None = None  # latest plausible state change
    alert_max: int | None = None
    ranks: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # rank -> (ts, binding)
    alerts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # JobStarted fields that may be null: the latest non-null value of each (ClickHouse's argMax skips nulls).
    optional: dict[str, tuple[int, Any]] = field(default_factory=dict)
    latest_step: tuple[int, str] | None = None  # (ts, run) of the latest plausible step


@dataclass
class Scan:
    """Pass 1 over a recording: every job's identity, span, states, bindings and alerts; every run's last step."""

    lo: int
    hi: int
    jobs: dict[str, ScannedJob] = field(default_factory=lambda: defaultdict(ScannedJob))
    runs: dict[tuple[str, str], Run] = field(default_factory=dict)
    last_step: dict[tuple[str, str], int] = field(default_factory=dict)
    newest_minute: int | None = None
    events: int = 0
    # Alerts that name no job (a node's), by alert_id: the causes that may mute a job's alerts.
    unjobbed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    actions: list[dict[str, Any]] = field(default_factory=list)  # remediation decisions (few)

    def feed(self, event: Event) -> None:
        """Take one event into account."""
        self.events += 1
        kind, r = event.type, event.record
        if kind == "StepCompleted":
            ts = r["ts"]
            key = (r["job_id"], r.get("run_id") or "")
            if r["step"] > self.last_step.get(key, -1):
                self.last_step[key] = r["step"]
            if not self.lo <= ts <= self.hi:
                return
            job = self.jobs[r["job_id"]]
            minute = ts // MINUTE_MS * MINUTE_MS
            job.minutes = (
                (minute, minute)
                if job.minutes is None
                else (min(job.minutes[0], minute), max(job.minutes[1], minute))
            )
            job.steps = (ts, ts) if job.steps is None else (min(job.steps[0], ts), max(job.steps[1], ts))
            if job.latest_step is None or ts > job.latest_step[0]:
                job.latest_step = (ts, r.get("run_id") or "")
            if self.newest_minute is None or minute > self.newest_minute:
                self.newest_minute = minute
        elif kind == "JobStarted":
            if not self.lo <= r["ts"] <= self.hi:
                return
            job = self.jobs[r["job_id"]]
            run = r.get("run_id") or ""
            if run not in job.started or r["ts"] >= job.started[run]["ts"]:
                job.started[run] = r
            if job.meta_latest is None or r["ts"] >= job.meta_latest["ts"]:
                job.meta_latest = r
            for name in _OPTIONAL_STARTED:
                if r.get(name) is not None and (name not in job.optional or r["ts"] >= job.optional[name][0]):
                    job.optional[name] = (r["ts"], r[name])
            job.started_min = r["ts"] if job.started_min is None else min(job.started_min, r["ts"])
            known = self.runs.get((r["job_id"], run))
            first = r["ts"] if known is None else min(known.started_ms, r["ts"])
            self.runs[(r["job_id"], run)] = Run(
                r["job_id"], run, first, r.get("workload_family") or "", int(r.get("world_size") or 0)
            )
        elif kind == "JobStateChanged":
            job = self.jobs[r["job_id"]]
            if job.state is None or r["ts"] >= job.state[0]:
                job.state = (r["ts"], r["state"])
            if self.lo <= r["ts"] <= self.hi:
                job.state_max = r["ts"] if job.state_max is None else max(job.state_max, r["ts"])
        elif kind == "RankBound":
            job = self.jobs[r["job_id"]]
            seen = job.ranks.get(r["rank"])
            if seen is None or r["ts"] >= seen[0]:
                job.ranks[r["rank"]] = (r["ts"], r)
        elif kind == "ActionTaken":
            self.actions.append(r)
        elif kind == "Alert":
            if not r.get("job_id"):
                self.unjobbed.setdefault(r["alert_id"], []).append(r)
                return
            job = self.jobs[r["job_id"]]
            job.alerts.setdefault(r["alert_id"], []).append(r)
            if self.lo <= r["ts"] <= self.hi:
                job.alert_max = r["ts"] if job.alert_max is None else max(job.alert_max, r["ts"])

    def alert_records(self, alert_id: str) -> list[dict[str, Any]]:
        """An alert's records as the store keeps them, in time order: the newest per routed copy
        and status (`alerts` is a ReplacingMergeTree(ts) on team, fingerprint, alert_id, status)."""
        for job in self.jobs.values():
            if alert_id in job.alerts:
                return _as_merged(job.alerts[alert_id])
        return _as_merged(self.unjobbed.get(alert_id, []))

    def all_alerts(self) -> dict[str, list[dict[str, Any]]]:
        """Every alert's records by alert_id, job or not."""
        out = dict(self.unjobbed)
        for job in self.jobs.values():
            out.update(job.alerts)
        return out

    def fold(self, alerts: list[dict[str, Any]], kinds: dict[str, str] | None = None) -> None:
        """`ui.alerts.fold_muted` as the store's pages do it: causes outside `alerts` are looked up."""
        known = {a["alert_id"] for a in alerts}
        missing = {a["inhibited_by"] for a in alerts if a["inhibited_by"] and a["inhibited_by"] not in known}
        everything = self.all_alerts()
        others = alert_rows({i: everything[i] for i in missing if i in everything}, self.lo, self.hi, kinds)
        fold_muted(alerts, {a["alert_id"]: a for a in others})

    def actions_of(self, key: str, value: str) -> list[dict[str, Any]]:
        """`ui.pages.common._actions`: the remediation decisions whose `key` is `value`, oldest first."""
        out = []
        for r in sorted(
            (a for a in self.actions if a.get(key) == value), key=lambda a: (a["ts"], a["action_id"])
        ):
            action = {k: r.get(k) for k in ACTION_COLUMNS}
            action["ts"] = int(r["ts"])
            action["firing_since"] = r.get("firing_since")
            action["dry_run"] = bool(action["dry_run"])
            action["checkpoint_age_s"] = rounded(action["checkpoint_age_s"], 1)
            out.append(action)
        return out


def scan(events: Iterable[Event]) -> Scan:
    """Pass 1 over events."""
    lo, hi = plausible_bounds()
    result = Scan(lo, hi)
    for event in events:
        result.feed(event)
    return result


def alert_rows(
    records: dict[str, list[dict[str, Any]]], lo: int, hi: int, kinds: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    # `ui.pages.common._alerts`: one row per alert from its plausible records.
    out = []
    for alert_id, all_records in records.items():
        kept = [a for a in all_records if lo <= a["ts"] <= hi and lo <= a["starts_at"] <= hi]
        if not kept:
            continue
        first = kept[0]
        latest = max(kept, key=latest_order)
        firing = [a for a in kept if a["status"] == "firing"]
        ends = latest.get("ends_at")
        out.append(
            {
                "alert_id": alert_id,
                "status": latest["status"],
                "rule": first["rule"],
                "severity": first["severity"],
                "category": first["category"],
                "team": first["team"],
                "receiver": first["receiver"],
                "summary": max(firing, key=lambda a: a["ts"])["summary"] if firing else latest["summary"],
                "resolution": latest["summary"] if latest["status"] == "resolved" else "",
                "job_id": first.get("job_id"),
                "run_id": first.get("run_id"),
                "cluster": first.get("cluster"),
                "node": first.get("node"),
                "rank": first.get("rank"),
                "gpu_index": first.get("gpu_index"),
                "gpu_uuid": first.get("gpu_uuid"),
                "starts_ms": min(a["starts_at"] for a in kept),
                "ends_ms": ends,
                "updated_ms": latest["ts"],
                "suspected_layer": first.get("suspected_layer"),
                "runbook_url": first.get("runbook_url"),
                "fingerprint": first.get("fingerprint"),
                "inhibited_by": latest.get("inhibited_by") or "",
                "copies": copies_of([(a["team"], a["receiver"]) for a in kept], kinds),
            }
        )
    return sorted(out, key=lambda a: a["starts_ms"])


def _as_merged(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What `SELECT ... FROM alerts FINAL` returns of these records: per (team, fingerprint,
    status), the one with the greatest ts, the later one on a tie."""
    kept: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in records:
        key = (r.get("team"), r.get("fingerprint"), r.get("status"))
        if key not in kept or r["ts"] >= kept[key]["ts"]:
            kept[key] = r
    return sorted(kept.values(), key=latest_order)
