"""The alert state machine: detector conditions -> pending -> firing -> resolved `Alert` records.

One entry per fingerprint (rule + identity). An active condition opens a *pending* entry; it
turns *firing* once it has stayed active for the finding's `sustain_ms` of event time (checked
on every finding and on every watermark advance); `active=False` or the end of the job resolves
it (`ends_at` set). A firing fingerprint never fires again until it has resolved, and pending
entries that clear before their sustain period vanish without a trace.

A condition that lasts is *refreshed* while it fires: a stall's "no progress for 61 s" would
otherwise stand through a six-minute stall. When an active finding of a firing entry comes in a
later period of `refresh_every_ms` of event time (counted from the alert's start: at most one
record per period, and the periods are the same whichever engine saw the finding, offline replay
or the worker, whose job stage hears its findings a few seconds apart) than the last record
published for it, and what a reader sees moved -- its observed value by at least `refresh_min_change` of the last one published, its
expected value likewise, its suspected layer, or the end of its history -- the tracker publishes
the alert again: the same `alert_id`, fingerprint and `starts_at`, status firing, `ts` the
finding's, with the new observed value, summary and history. Severity, category and team stay
the firing's (Alertmanager's labels and the routing: a refresh is never a new page nor a new
receiver). A refresh is an update of an alert already published: every reader keys alerts by
`alert_id` (`is_refresh` tells the engine's counters). Deterministic in event time.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace
from typing import Any

from streams.alerting.measures import measures_of
from streams.detectors.base import Finding, JobInfo, Topology

__all__ = ["DEFAULT_REFRESH_MIN_CHANGE", "DEFAULT_REFRESH_MS", "AlertTracker", "alert_id"]

# A firing alert is published again at most once per this much event time (0: never)...
DEFAULT_REFRESH_MS = 60_000
# ...and only when its observed (or expected) value moved by at least this share of the last one sent.
DEFAULT_REFRESH_MIN_CHANGE = 0.1


def alert_id(fingerprint: str, starts_at: int) -> str:
    """Deterministic id of one firing: a hash of the fingerprint and its start time."""
    return hashlib.sha256(f"{fingerprint}@{starts_at}".encode()).hexdigest()[:24]


def _finding_to_dict(finding: Finding) -> dict[str, Any]:
    d = asdict(finding)
    d["key"] = list(finding.key)
    d["history"] = [[t, v] for t, v in finding.history]
    return d


def _finding_from_dict(d: dict[str, Any]) -> Finding:
    d = dict(d)
    d["key"] = tuple(d["key"])
    d["history"] = tuple((int(t), float(v)) for t, v in d["history"])
    return Finding(**d)


class AlertTracker:
    """Per-fingerprint state machine; returns Alert records (dicts, schema `Alert`) to publish.

    Records leave with `team` set to the job's own team (empty for node-only alerts) and
    `receiver` empty: the engine routes them and fills both.
    """

    def __init__(
        self,
        runbook_base_url: str = "https://ranksight.dev/runbooks/",
        *,
        refresh_every_ms: int = DEFAULT_REFRESH_MS,
        refresh_min_change: float = DEFAULT_REFRESH_MIN_CHANGE,
    ) -> None:
        self.runbook_base_url = runbook_base_url if runbook_base_url.endswith("/") else runbook_base_url + "/"
        self.refresh_every_ms = refresh_every_ms
        self.refresh_min_change = refresh_min_change
        # fingerprint -> {"status", "pending_since", "starts_at", "finding", and once firing "sent":
        # what the last record published said (see `_sent`)}
        self._entries: dict[str, dict[str, Any]] = {}
        # job -> event time the last firing alert of the job resolved (healthy-window test)
        self._job_last_resolved: dict[str, int] = {}

    # -- transitions -------------------------------------------------------------------
    def observe(self, finding: Finding, topology: Topology) -> list[dict[str, Any]]:
        """Apply one finding; return the Alert records it causes (zero or one)."""
        fp = finding.fingerprint
        entry = self._entries.get(fp)
        if not finding.active:
            if entry is None:
                return []
            del self._entries[fp]
            if entry["status"] != "firing":
                return []
            last = _finding_from_dict(entry["finding"])
            if finding.summary:
                # The resolving finding says what changed; identity and values stay the firing's.
                last = replace(last, summary=finding.summary)
            ends_at = max(finding.ts, entry["starts_at"])
            if finding.job_id or last.job_id:
                job = finding.job_id or last.job_id
                self._job_last_resolved[job] = max(self._job_last_resolved.get(job, 0), ends_at)
            return [self._record(last, entry, "resolved", finding.ts, ends_at, topology)]
        if entry is None:
            entry = {
                "status": "pending",
                "pending_since": finding.ts,
                "starts_at": finding.since if finding.since is not None else finding.ts,
                "finding": _finding_to_dict(finding),
            }
            self._entries[fp] = entry
        else:
            entry["finding"] = _finding_to_dict(finding)
        if entry["status"] == "pending" and finding.ts - entry["pending_since"] >= finding.sustain_ms:
            entry["status"] = "firing"
            entry["sent"] = _sent(finding, finding.ts, fired=True)
            return [self._record(finding, entry, "firing", finding.ts, None, topology)]
        if entry["status"] == "firing" and self._refresh_due(entry, finding):
            sent = entry["sent"]
            # The firing's labels and route: an update of the alert, never another page.
            update = replace(finding, severity=sent["severity"], category=sent["category"], team=sent["team"])
            entry["sent"] = {**sent, **_sent(finding, finding.ts)}
            return [self._record(update, entry, "firing", finding.ts, None, topology)]
        return []

    def _refresh_due(self, entry: dict[str, Any], finding: Finding) -> bool:
        """Whether an active finding of a firing alert is worth publishing again: it is in a later
        `refresh_every_ms` period (counted from the alert's start) than the last record, and
        something a reader sees has moved."""
        every, start, sent = self.refresh_every_ms, int(entry["starts_at"]), entry["sent"]
        if every <= 0 or (finding.ts - start) // every <= (int(sent["ts"]) - start) // every:
            return False
        if finding.suspected_layer != sent["layer"] or _history_end(finding) > sent["end"]:
            return True
        return _moved(sent["observed"], finding.observed, self.refresh_min_change) or _moved(
            sent["expected"], finding.expected, self.refresh_min_change
        )

    def is_refresh(self, record: dict[str, Any]) -> bool:
        """Whether a record this tracker just returned updates an alert it had already published
        (a refresh: counted once, as the firing it updates)."""
        entry = self._entries.get(str(record.get("fingerprint")))
        if record.get("status") != "firing" or entry is None or "sent" not in entry:
            return False
        return int(record["ts"]) > int(entry["sent"]["fired"])

    def advance(self, watermark: int, topology: Topology) -> list[dict[str, Any]]:
        """Fire pending entries whose condition has now been active for its sustain period."""
        out = []
        for fp in sorted(self._entries):
            entry = self._entries[fp]
            if entry["status"] != "pending":
                continue
            finding = _finding_from_dict(entry["finding"])
            if watermark - entry["pending_since"] >= finding.sustain_ms:
                entry["status"] = "firing"
                entry["sent"] = _sent(finding, watermark, fired=True)
                out.append(self._record(finding, entry, "firing", watermark, None, topology))
        return out

    def end_nodes(self, nodes: frozenset[str], ts: int, topology: Topology) -> list[dict[str, Any]]:
        """These nodes' state was evicted: resolve their firing alerts and drop their pending ones."""
        return self._end(lambda f: f.get("node") in nodes, ts, topology)

    def end_job(self, job_id: str, ts: int, topology: Topology) -> list[dict[str, Any]]:
        """The job ended: resolve its firing alerts (ends_at = `ts`) and drop its pending ones."""
        out = self._end(lambda f: f["job_id"] == job_id, ts, topology)
        for record in out:
            self._job_last_resolved[job_id] = max(self._job_last_resolved.get(job_id, 0), record["ends_at"])
        return out

    def _end(
        self, whose: Callable[[dict[str, Any]], bool], ts: int, topology: Topology
    ) -> list[dict[str, Any]]:
        """Resolve the firing alerts whose finding `whose` selects (ends_at = `ts`, never before
        their start) and drop the pending ones."""
        out = []
        for fp in sorted(self._entries):
            entry = self._entries[fp]
            if not whose(entry["finding"]):
                continue
            del self._entries[fp]
            if entry["status"] == "firing":
                finding = _finding_from_dict(entry["finding"])
                out.append(
                    self._record(finding, entry, "resolved", ts, max(ts, entry["starts_at"]), topology)
                )
        return out

    # -- queries -----------------------------------------------------------------------
    def firing(self) -> list[str]:
        """Fingerprints currently firing, sorted."""
        return sorted(fp for fp, e in self._entries.items() if e["status"] == "firing")

    def is_firing(self, fingerprint: str) -> bool:
        """Whether an alert of this fingerprint fires now."""
        entry = self._entries.get(fingerprint)
        return entry is not None and entry["status"] == "firing"

    def lookahead(self, fingerprints: Iterable[str]) -> AlertTracker:
        """A tracker with copies of these fingerprints' entries only: to judge a record ahead of its
        turn without changing this one (`StageEngine.instant`)."""
        other = AlertTracker(self.runbook_base_url)
        other._entries = {fp: copy.deepcopy(self._entries[fp]) for fp in fingerprints if fp in self._entries}
        return other

    def pending(self) -> list[str]:
        """Fingerprints currently pending, sorted."""
        return sorted(fp for fp, e in self._entries.items() if e["status"] == "pending")

    def job_healthy(self, job_id: str, window_start: int) -> bool:
        """True when no alert of the job is firing now nor resolved after `window_start`."""
        if any(e["status"] == "firing" and e["finding"]["job_id"] == job_id for e in self._entries.values()):
            return False
        return self._job_last_resolved.get(job_id, -1) < window_start

    def forget_job(self, job_id: str) -> None:
        """Drop bookkeeping of an ended job."""
        self._job_last_resolved.pop(job_id, None)

    # -- records -----------------------------------------------------------------------
    def _record(
        self,
        finding: Finding,
        entry: dict[str, Any],
        status: str,
        ts: int,
        ends_at: int | None,
        topology: Topology,
    ) -> dict[str, Any]:
        job: JobInfo | None = topology.jobs.get(finding.job_id) if finding.job_id else None
        # The job's step and when it was first reported: the topology's pace of its current run,
        # the one tracker of a job's progress (the job page and the ETA read the same).
        prog = topology.pace.get(finding.job_id) if finding.job_id else None
        # The job's target and the time left at its recent step rate (`schemas.progress`, the
        # arithmetic of the job page): none for node-only alerts or a job without a target.
        est = topology.progress(finding.job_id) if finding.job_id else None
        labels: dict[str, str] = dict(sorted(job.labels.items())) if job else {}
        observed, expected, history_unit = measures_of(finding.rule, finding.history_metric)
        return {
            "alert_id": alert_id(finding.fingerprint, entry["starts_at"]),
            "fingerprint": finding.fingerprint,
            "rule": finding.rule,
            "category": finding.category,
            "severity": finding.severity,
            "status": status,
            "ts": ts,
            "starts_at": entry["starts_at"],
            "ends_at": ends_at,
            "team": finding.team or (job.team if job else ""),
            "receiver": "",
            "summary": finding.summary or f"{finding.rule} on {finding.fingerprint}",
            "owner": job.owner if job else "",
            "job_id": finding.job_id,
            "run_id": job.run_id if job else "",
            "model_version": job.model_version if job else "",
            "dataset_version": job.dataset_version if job else "",
            "workload_family": job.workload_family if job else "",
            # The job's cluster; for a node-only alert (an XID on an idle GPU) the one its agent named.
            "cluster": (job.cluster if job else "") or topology.node_cluster.get(finding.node or "", ""),
            "node": finding.node,
            "rank": finding.rank,
            "gpu_uuid": finding.gpu_uuid,
            "gpu_index": finding.gpu_index,
            "current_step": prog.step if prog else None,
            "last_progress_ts": prog.ts if prog else None,
            "target_kind": est.target_kind if est else None,
            "target": est.target if est else None,
            "target_done": est.done if est else None,
            "eta_s": est.eta_s if est else None,
            "invariant": finding.invariant,
            "observed": finding.observed,
            "expected": finding.expected,
            "observed_what": observed.what,
            "observed_unit": observed.unit,
            "expected_what": expected.what if finding.expected is not None else None,
            "expected_unit": expected.unit if finding.expected is not None else None,
            "history_unit": history_unit if finding.history_metric else None,
            "baseline": finding.baseline,
            "baseline_runs": finding.baseline_runs,
            "suspected_layer": finding.suspected_layer or "unknown",
            "history_metric": finding.history_metric,
            "history": [{"ts": int(t), "value": float(v)} for t, v in finding.history],
            "runbook_url": f"{self.runbook_base_url}{finding.rule}",
            "labels": labels,
            "group_key": None,
            "inhibited_by": None,
            # Where the job runs, for whoever acts on the page (issue 35.5).
            "image": job.image if job else "",
            "workspace": job.workspace if job else "",
        }

    # -- state -------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "entries": {fp: self._entries[fp] for fp in sorted(self._entries)},
            "job_last_resolved": dict(sorted(self._job_last_resolved.items())),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self._entries = {fp: dict(e) for fp, e in state.get("entries", {}).items()}
        for entry in self._entries.values():
            if entry["status"] == "firing" and "sent" not in entry:
                # A snapshot from before refreshes: the firing as its last publication (when its
                # sustain period ended, the earliest it can have fired).
                finding = _finding_from_dict(entry["finding"])
                entry["sent"] = _sent(finding, int(entry["pending_since"]) + finding.sustain_ms, fired=True)
        self._job_last_resolved = {k: int(v) for k, v in state.get("job_last_resolved", {}).items()}


def _history_end(finding: Finding) -> int:
    """The time of a finding's newest history point (-1 without history)."""
    return max((int(t) for t, _ in finding.history), default=-1)


def _sent(finding: Finding, ts: int, *, fired: bool = False) -> dict[str, Any]:
    """What a published record of `finding` says (JSON-able: it goes into snapshots); `fired`:
    the firing itself, whose time and labels every refresh keeps."""
    sent: dict[str, Any] = {
        "ts": ts,
        "observed": finding.observed,
        "expected": finding.expected,
        "layer": finding.suspected_layer,
        "end": _history_end(finding),
    }
    if fired:
        sent.update(fired=ts, severity=finding.severity, category=finding.category, team=finding.team)
    return sent


def _moved(before: float | None, after: float | None, min_change: float) -> bool:
    """Whether a value moved by at least `min_change` of its size (unknown <-> known, a non-finite
    value changing, or any move from 0 counts)."""
    if before is None or after is None:
        return (before is None) != (after is None)
    if not (math.isfinite(before) and math.isfinite(after)):
        return not (before == after or (math.isnan(before) and math.isnan(after)))
    return abs(after - before) >= min_change * max(abs(before), 1e-9)
