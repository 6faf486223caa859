"""The pages of a report computed from a stream of events, in bounded memory, without a store.

`ranksight report recording.avro` used to write the whole recording into a temporary chDB store
and query it (21 s and 687 MB for a 20-minute 16-rank job; chDB alone is ~300 MB resident). Here
the recording (its events, and the alerts and derived windows the CLI layer's replay raised on
them: `ui/` runs no detector) is read twice and folded into per-panel aggregates:

1. `Scan`: per job, its `JobStarted` records, rank bindings, alerts, states and the minutes with
   steps (the page's time range); per run, its last step (the compare page's buckets).
2. `Panels`: for the chosen job and range, each panel's per-bucket sums and counts, the same
   arithmetic as `ui.queries` (avg skips nulls, buckets `intDiv(t, width) * width`), plus the
   compare page's per-step-bucket rows and the efficiency panel (`ui.efficiency`).

Memory is bounded by the page (buckets x ranks, buckets x GPUs, steps of the compared runs), not
by the recording. The output has the shape `ui.queries.job_page` / `alert_page` / `compare`
answer, so the same page script renders it; a test compares both on one recording.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from schemas.records import Event
from sinks.ddl import table_specs
from sinks.efficiency import PriceList
from sinks.rows import row_converter
from ui.alerts import copies_of, fold_muted, routed_copies, transitions, units_of
from ui.compare import SEGMENTS, BucketRow, Run, assemble, choose_runs, config_of, step_bucket
from ui.errors import NotFoundError, UiError
from ui.facts import PROGRESS_WINDOW_S, checkpoint_facts, job_condition, progress_panel, without_eta
from ui.queries import (
    _ALERT_MARGIN_MS,
    _DERIVED_HOP_MS,
    _MINUTE_MS,
    ACTION_COLUMNS,
    DATAPATH_METRICS,
    MAX_FAULTS,
    TARGET_BUCKETS,
    TERMINAL_STATES,
    _num,
    bucket_ms,
    plausible_bounds,
    step_rate,
)

__all__ = ["EventSource", "alert_report", "job_report"]

# JobStarted fields the page shows that a record may leave null: targets and the checkpoint policy.
_OPTIONAL_STARTED = ("target_steps", "target_tokens", "target_epochs", "checkpoint_max_age_s")
# What a derived rank window contributes to the page (kept from pass 1 when the detectors run once).
_WINDOW_FIELDS = ("job_id", "window_start", "rank", "compute_s", "step_time_s", "comm_s", "data_wait_s")
# A replayable stream of events: called once per pass.
EventSource = Callable[[], Iterable[Event]]
_GIB = 1073741824


def _ch(value: float | None, digits: int = 4) -> float | None:
    """Rounded as ClickHouse's `round(x, N)` rounds a float (scale, round half to even, unscale), so a
    report from a recording shows the digits the served page shows."""
    if value is None or not math.isfinite(value):
        return None
    scale = 10.0**digits
    return round(value * scale) / scale


class _Mean:
    """Sum and count of the non-null values seen (ClickHouse's avg skips nulls; no rows: null)."""

    __slots__ = ("n", "total")

    def __init__(self) -> None:
        self.total = 0.0
        self.n = 0

    def add(self, value: float | None) -> None:
        if value is not None:
            self.total += value
            self.n += 1

    def value(self) -> float | None:
        return self.total / self.n if self.n else None


# --- pass 1: what the recording holds ---------------------------------------------------------------


@dataclass
class _Job:
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
    jobs: dict[str, _Job] = field(default_factory=lambda: defaultdict(_Job))
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
            minute = ts // _MINUTE_MS * _MINUTE_MS
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
        """`ui.alerts.fold_muted` as `ui.queries` does it: causes outside `alerts` are looked up."""
        known = {a["alert_id"] for a in alerts}
        missing = {a["inhibited_by"] for a in alerts if a["inhibited_by"] and a["inhibited_by"] not in known}
        everything = self.all_alerts()
        others = _alert_rows({i: everything[i] for i in missing if i in everything}, self.lo, self.hi, kinds)
        fold_muted(alerts, {a["alert_id"]: a for a in others})

    def actions_of(self, key: str, value: str) -> list[dict[str, Any]]:
        """`ui.queries._actions`: the remediation decisions whose `key` is `value`, oldest first."""
        out = []
        for r in sorted(
            (a for a in self.actions if a.get(key) == value), key=lambda a: (a["ts"], a["action_id"])
        ):
            action = {k: r.get(k) for k in ACTION_COLUMNS}
            action["ts"] = int(r["ts"])
            action["firing_since"] = r.get("firing_since")
            action["dry_run"] = bool(action["dry_run"])
            action["checkpoint_age_s"] = _num(action["checkpoint_age_s"], 1)
            out.append(action)
        return out


def scan(events: Iterable[Event]) -> Scan:
    """Pass 1 over events."""
    lo, hi = plausible_bounds()
    result = Scan(lo, hi)
    for event in events:
        result.feed(event)
    return result


def _alert_rows(
    records: dict[str, list[dict[str, Any]]], lo: int, hi: int, kinds: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    # `ui.queries._alerts`: one row per alert from its plausible records.
    out = []
    for alert_id, all_records in records.items():
        kept = [a for a in all_records if lo <= a["ts"] <= hi and lo <= a["starts_at"] <= hi]
        if not kept:
            continue
        first = kept[0]
        latest = max(kept, key=lambda a: a["ts"])
        firing = [a for a in kept if a["status"] == "firing"]
        ends = max(kept, key=lambda a: a["ts"]).get("ends_at")
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


# --- the page's frame: range, identity, GPUs -------------------------------------------------------


@dataclass(frozen=True)
class _Frame:
    job_id: str
    start: int
    end: int
    width: int
    span: tuple[int, int]
    meta: dict[str, Any]
    ranks: list[dict[str, Any]]
    nodes: list[str]
    gpu_keys: list[tuple[str, int]]
    alerts: list[dict[str, Any]]
    actions: list[dict[str, Any]]
    latest_step: tuple[int, str] | None = None  # (ts, run) of the job's latest plausible step
    state: str | None = None  # its latest state, any time
    lo: int = 0
    hi: int = 0


def _meta(job_id: str, job: _Job) -> dict[str, Any]:
    r = job.meta_latest
    if r is None:
        return {"job_id": job_id, "team": "", "owner": "", "cluster": "", "nodes": [], "world_size": 0}
    return {
        "job_id": job_id,
        "run_id": r.get("run_id") or "",
        "team": r["team"],
        "owner": r["owner"],
        "cluster": r["cluster"],
        "model": f"{r.get('model_name') or ''} {r.get('model_version') or ''}".strip(),
        "dataset_version": r.get("dataset_version") or "",
        "world_size": int(r["world_size"]),
        "nodes": list(r.get("nodes") or []),
        "gpu_class": r.get("gpu_class") or "",
        "workload_family": r.get("workload_family") or "",
        "target_steps": job.optional.get("target_steps", (0, None))[1],
        "target_tokens": job.optional.get("target_tokens", (0, None))[1],
        "target_epochs": _num(job.optional.get("target_epochs", (0, None))[1], 6),
        "checkpoint_max_age_s": _num(job.optional.get("checkpoint_max_age_s", (0, None))[1], 6),
        "started_ms": int(job.started_min or r["ts"]),
    }


def _frame(
    found: Scan, job_id: str, t0: int | None, t1: int | None, target: int, kinds: dict[str, str] | None = None
) -> _Frame:
    job = found.jobs.get(job_id)
    if job is None:
        raise NotFoundError("job", job_id)
    meta = _meta(job_id, job)
    span = (job.minutes[0], job.minutes[1] + _MINUTE_MS) if job.minutes else None
    alerts = _alert_rows(job.alerts, found.lo, found.hi, kinds)
    found.fold(alerts, kinds)
    if span is None and not meta.get("started_ms") and not alerts:
        raise NotFoundError("job", job_id)
    if span is None:
        first = meta.get("started_ms") or min(a["starts_ms"] for a in alerts)
        span = (first, first + _MINUTE_MS)
    # `ui.queries._quiet_until`: a job that is not over runs to the newest step of the recording.
    ends = [v + 1 for v in (job.state_max, job.alert_max) if v and v >= found.lo]
    if (job.state is None or job.state[1] not in TERMINAL_STATES) and found.newest_minute is not None:
        ends.append(found.newest_minute + _MINUTE_MS)
    if ends and max(ends) > span[1]:
        span = (span[0], max(ends))
    start = int(t0) if t0 is not None else span[0]
    end = int(t1) if t1 is not None else span[1]
    start, end = min(max(start, found.lo), found.hi), min(max(end, found.lo), found.hi + _MINUTE_MS)
    if end <= start:
        end = start + _MINUTE_MS
    width = bucket_ms(end - start, target)
    start = start // width * width
    ranks = [
        {"rank": rank, "node": b["node"], "gpu_index": b.get("gpu_index"), "gpu_uuid": b.get("gpu_uuid")}
        for rank, (_, b) in sorted(job.ranks.items())
    ]
    nodes = meta.get("nodes") or sorted({r["node"] for r in ranks})
    keys = sorted({(r["node"], int(r["gpu_index"])) for r in ranks if r["gpu_index"] is not None})
    return _Frame(
        job_id,
        start,
        end,
        width,
        span,
        meta,
        ranks,
        list(nodes),
        keys,
        alerts,
        found.actions_of("job_id", job_id),
        job.latest_step,
        job.state[1] if job.state else None,
        found.lo,
        found.hi,
    )


# --- pass 2: the panels ----------------------------------------------------------------------------


class Panels:
    """Pass 2 for one job and range: every panel's aggregates, folded event by event."""

    def __init__(self, frame: _Frame, compare_runs: list[Run] | None = None, compare_width: int = 1) -> None:
        self.f = frame
        self.cluster = frame.meta.get("cluster", "")
        self.nodes = set(frame.nodes)
        self.gpu_index = {key: i for i, key in enumerate(frame.gpu_keys)}
        # (bucket index, rank) -> compute, step, comm, wait means; from the derived windows and from steps.
        self.windows: dict[tuple[int, int], list[_Mean]] = {}
        self.rank_steps: dict[tuple[int, int], list[_Mean]] = {}
        self.window_segments: dict[int, list[_Mean]] = {}
        self.step_segments: dict[int, list[_Mean]] = {}
        # rank 0 per bucket: loss, lr, grad norm, step time means; max step; skipped count
        self.progress: dict[int, list[Any]] = {}
        self.validation: dict[str, list[list[Any]]] = defaultdict(list)
        self.gpus: dict[tuple[int, int], list[Any]] = {}
        self.hosts: dict[tuple[str, int], list[Any]] = {}
        self.loader: dict[int, list[Any]] = {}
        self.collectives: dict[tuple[str, int], list[Any]] = {}
        self.phases: dict[str, dict[str, dict[str, Any]]] = {"checkpoints": {}, "evaluations": {}}
        self.states: list[dict[str, Any]] = []
        # Progress: the latest run's steps of the window before its last step; epoch lengths.
        self.window: dict[str, Any] | None = None
        self.epochs: dict[int, list[int]] = {}
        self.checkpoint_records: list[dict[str, Any]] = []
        self.rank_faults: list[dict[str, Any]] = []
        self.gpu_faults: dict[tuple[str, int], list[Any]] = {}
        self.gpm: dict[tuple[int, int], list[_Mean]] = {}
        self.datapath: dict[int, list[Any]] = {}
        self.compare_keys = {(r.job_id, r.run_id) for r in compare_runs or ()}
        self.compare_width = compare_width
        self.compare: dict[tuple[str, str, int], list[Any]] = {}

    def _bucket(self, ts: int) -> int | None:
        f = self.f
        return ts // f.width * f.width if f.start <= ts < f.end else None

    def feed(self, event: Event) -> None:
        """Fold one event into the panels it belongs to."""
        kind, r = event.type, event.record
        if kind == "StepCompleted":
            if (r["job_id"], r.get("run_id") or "") in self.compare_keys and not r.get("skipped"):
                self._compare(r)
            if r["job_id"] == self.f.job_id:
                self._step(r)
                self._progress(r)
        elif kind == "GpuSample":
            self._gpu(r)
            self._gpu_extra(r)
        elif kind == "HostSample":
            self._host(r)
        elif r.get("job_id") != self.f.job_id:
            return
        elif kind == "RankWindowStats":
            self._window(r)
        elif kind == "DataLoaderSample":
            self._loader(r)
            self._datapath(r)
        elif kind == "RankFault":
            if self.f.start <= r["ts"] < self.f.end:
                self.rank_faults.append(
                    {
                        "ts": r["ts"],
                        "rank": r["rank"],
                        "node": r.get("node"),
                        "kind": r["kind"],
                        "detail": r.get("detail"),
                        "exit_code": r.get("exit_code"),
                    }
                )
        elif kind == "CollectiveSample":
            self._collective(r)
        elif kind == "ValidationResult":
            if self.f.start <= r["ts"] < self.f.end:
                for name, value in (r.get("metrics") or {}).items():
                    self.validation[name].append([r["ts"], _num(value, 5), r["step"]])
        elif kind in ("CheckpointEvent", "EvaluationEvent"):
            self._phase(kind, r)
            if kind == "CheckpointEvent" and self.f.lo <= r["ts"] <= self.f.hi:
                self.checkpoint_records.append(r)
        elif kind == "JobStateChanged" and self.f.start - 24 * 3600_000 <= r["ts"] < self.f.end:
            self.states.append(
                {
                    "ts": r["ts"],
                    "state": r["state"],
                    "reason": r.get("reason"),
                    "exit_code": r.get("exit_code"),
                    "restart_count": int(r.get("restart_count") or 0),
                }
            )

    def _step(self, r: dict[str, Any]) -> None:
        f = self.f
        ts = r["ts"]
        if not f.start <= ts < f.end:
            return
        x = (ts - f.start) // f.width
        cell = self.rank_steps.get((x, r["rank"]))
        if cell is None:
            cell = self.rank_steps[(x, r["rank"])] = [_Mean() for _ in range(4)]
        compute = (r.get("forward_s") or 0.0) + (r.get("backward_s") or 0.0) + (r.get("optimizer_s") or 0.0)
        cell[0].add(compute)
        cell[1].add(r["step_time_s"])
        cell[2].add(r.get("comm_s"))
        cell[3].add(r.get("data_wait_s"))
        b = ts // f.width * f.width
        segments = self.step_segments.get(b)
        if segments is None:
            segments = self.step_segments[b] = [_Mean() for _ in SEGMENTS]
        for mean, name in zip(segments, SEGMENTS, strict=True):
            mean.add(r.get(f"{name}_s"))
        if r["rank"] == 0:
            p = self.progress.get(b)
            if p is None:
                p = self.progress[b] = [_Mean(), _Mean(), _Mean(), _Mean(), r["step"], 0]
            p[0].add(r.get("loss"))
            p[1].add(r.get("lr"))
            p[2].add(r.get("grad_norm"))
            p[3].add(r["step_time_s"])
            p[4] = max(p[4], r["step"])
            p[5] += 1 if r.get("skipped") else 0

    def _window(self, r: dict[str, Any]) -> None:
        f = self.f
        ts = r["window_start"]
        if not f.start <= ts < f.end:
            return
        x = (ts - f.start) // f.width
        cell = self.windows.get((x, r["rank"]))
        if cell is None:
            cell = self.windows[(x, r["rank"])] = [_Mean() for _ in range(4)]
        cell[0].add(r.get("compute_s"))
        cell[1].add(r.get("step_time_s"))
        cell[2].add(r.get("comm_s"))
        cell[3].add(r.get("data_wait_s"))
        b = ts // f.width * f.width
        segments = self.window_segments.get(b)
        if segments is None:
            segments = self.window_segments[b] = [_Mean() for _ in range(4)]
        wait, compute, comm, step = (
            r.get("data_wait_s"),
            r.get("compute_s"),
            r.get("comm_s"),
            r.get("step_time_s"),
        )
        segments[0].add(wait)
        segments[1].add(compute)
        segments[2].add(comm)
        if wait is not None and compute is not None and comm is not None and step is not None:
            segments[3].add(max(0.0, step - compute - comm - wait))

    def _gpu(self, r: dict[str, Any]) -> None:
        f = self.f
        if r["cluster"] != self.cluster:
            return
        i = self.gpu_index.get((r["node"], r["gpu_index"]))
        if i is None:
            return
        ts = r["ts"]
        if f.width >= _MINUTE_MS:
            # `gpu_minute`: the sample's minute decides, its whole seconds against the range's.
            minute = ts // _MINUTE_MS * _MINUTE_MS
            if not (f.start // 1000 * 1000 <= minute < f.end // 1000 * 1000):
                return
            b = minute // f.width * f.width
        else:
            if not f.start <= ts < f.end:
                return
            b = ts // f.width * f.width
        x = (b - f.start) // f.width
        cell = self.gpus.get((x, i))
        if cell is None:
            cell = self.gpus[(x, i)] = [_Mean(), _Mean(), _Mean(), None]
        cell[0].add(r.get("gpu_util_pct"))
        cell[1].add(r.get("power_w"))
        cell[2].add(r.get("sm_clock_mhz"))
        used = r.get("mem_used_bytes")
        if used is not None and (cell[3] is None or used > cell[3]):
            cell[3] = used

    def _host(self, r: dict[str, Any]) -> None:
        if r["cluster"] != self.cluster or r["node"] not in self.nodes:
            return
        b = self._bucket(r["ts"])
        if b is None:
            return
        cell = self.hosts.get((r["node"], b))
        if cell is None:
            cell = self.hosts[(r["node"], b)] = [_Mean(), _Mean(), _Mean(), None]
        cell[0].add(r.get("cpu_util_pct"))
        used, total = r.get("mem_used_bytes"), r.get("mem_total_bytes")
        cell[1].add(100 * used / total if used is not None and total else None)
        cell[2].add(r.get("tcp_retrans_segs_s"))
        ib = r.get("ib_errors")
        if ib is not None and (cell[3] is None or ib > cell[3]):
            cell[3] = ib

    def _loader(self, r: dict[str, Any]) -> None:
        b = self._bucket(r["ts"])
        if b is None:
            return
        cell = self.loader.get(b)
        if cell is None:
            cell = self.loader[b] = [_Mean(), None, None, _Mean(), None]
        interval = r.get("interval_s")
        frac = r["wait_s"] / interval if interval and r.get("wait_s") is not None else None
        cell[0].add(frac)
        # argMax over the table's order (job, rank, time): of equal fractions, the lowest rank's.
        if frac is not None and (
            cell[1] is None or frac > cell[1] or (frac == cell[1] and r["rank"] < cell[2])
        ):
            cell[1], cell[2] = frac, r["rank"]
        depth = r.get("queue_depth")
        cell[3].add(depth)
        if depth is not None and (cell[4] is None or depth < cell[4]):
            cell[4] = depth

    def _collective(self, r: dict[str, Any]) -> None:
        b = self._bucket(r["ts"])
        if b is None:
            return
        cell = self.collectives.get((r["op"], b))
        if cell is None:
            cell = self.collectives[(r["op"], b)] = [0.0, 0.0, 0, _Mean()]
        if r.get("time_s") is not None:
            cell[0] += r["time_s"]
        if r.get("interval_s") is not None:
            cell[1] += r["interval_s"]
        cell[3].add(r.get("bus_bw_gbps"))

    def _phase(self, kind: str, r: dict[str, Any]) -> None:
        f = self.f
        if not f.start - 3600_000 <= r["ts"] < f.end:
            return
        table = "checkpoints" if kind == "CheckpointEvent" else "evaluations"
        key = r["checkpoint_id"] if table == "checkpoints" else r["evaluation_id"]
        p = self.phases[table].get(key)
        ts, phase = r["ts"], r["phase"]
        if p is None:
            p = self.phases[table][key] = {
                "step": r["step"], "started": None, "ended": None, "first": ts, "last": (ts, phase),
                "phases": set(), "label": r.get("name" if table == "evaluations" else "uri"), "error": r.get("error"),
            }  # fmt: skip
        p["step"] = min(p["step"], r["step"])
        p["first"] = min(p["first"], ts)
        if ts >= p["last"][0]:
            p["last"] = (ts, phase)
        p["phases"].add(phase)
        # ClickHouse's any() skips nulls: the first label and error that are set.
        label = r.get("name" if table == "evaluations" else "uri")
        if p["label"] is None and label is not None:
            p["label"] = label
        if p["error"] is None and r.get("error") is not None:
            p["error"] = r.get("error")
        if phase == "started":
            p["started"] = ts if p["started"] is None else min(p["started"], ts)
        if phase in ("completed", "failed"):
            p["ended"] = ts if p["ended"] is None else max(p["ended"], ts)

    def _compare(self, r: dict[str, Any]) -> None:
        s = r["step"] // self.compare_width * self.compare_width
        key = (r["job_id"], r.get("run_id") or "", s)
        cell = self.compare.get(key)
        if cell is None:
            cell = self.compare[key] = [set(), _Mean(), [_Mean() for _ in SEGMENTS], _Mean(), 0]
        cell[0].add(r["step"])
        cell[1].add(r["step_time_s"])
        for mean, name in zip(cell[2], SEGMENTS, strict=True):
            mean.add(r.get(f"{name}_s"))
        if r["rank"] == 0:
            cell[3].add(r.get("loss"))
        cell[4] += r.get("tokens") or 0

    def _progress(self, r: dict[str, Any]) -> None:
        # `ui.queries._progress`: the latest run's plausible steps in the window before its last step.
        f = self.f
        if (
            f.latest_step is None
            or (r.get("run_id") or "") != f.latest_step[1]
            or not f.lo <= r["ts"] <= f.hi
        ):
            return
        epoch = r.get("epoch")
        if epoch is not None:
            span = self.epochs.setdefault(epoch, [r["step"], r["step"]])
            span[0], span[1] = min(span[0], r["step"]), max(span[1], r["step"])
        if r["ts"] < f.latest_step[0] - int(PROGRESS_WINDOW_S * 1000):
            return
        w = self.window
        if w is None:
            w = self.window = {"steps": set(), "tokens": None, "epoch": None}
            w.update(first_step=r["step"], last_step=r["step"], first_ms=r["ts"], last_ms=r["ts"])
        w["first_step"], w["last_step"] = min(w["first_step"], r["step"]), max(w["last_step"], r["step"])
        w["first_ms"], w["last_ms"] = min(w["first_ms"], r["ts"]), max(w["last_ms"], r["ts"])
        w["steps"].add(r["step"])
        if r.get("tokens") is not None:
            w["tokens"] = (w["tokens"] or 0) + r["tokens"]
        if epoch is not None and (w["epoch"] is None or r["ts"] >= w["epoch"][0]):
            w["epoch"] = (r["ts"], epoch)

    def _gpu_extra(self, r: dict[str, Any]) -> None:
        # GPM means and fault samples of the job's GPUs over the raw samples in [start, end).
        f = self.f
        if r["cluster"] != self.cluster or not f.start <= r["ts"] < f.end:
            return
        i = self.gpu_index.get((r["node"], r["gpu_index"]))
        if i is None:
            return
        sm, tensor = r.get("sm_active_pct"), r.get("tensor_active_pct")
        if sm is not None or tensor is not None:
            x = (r["ts"] // f.width * f.width - f.start) // f.width
            cell = self.gpm.setdefault((x, i), [_Mean(), _Mean()])
            cell[0].add(sm)
            cell[1].add(tensor)
        xid, ecc = r.get("xid"), r.get("ecc_uncorrected")
        if xid is not None or (ecc is not None and ecc > 0):
            fault = self.gpu_faults.setdefault(
                (r["node"], r["gpu_index"]), [r["ts"], r["ts"], set(), None, 0]
            )
            fault[0], fault[1] = min(fault[0], r["ts"]), max(fault[1], r["ts"])
            if xid is not None:
                fault[2].add(xid)
                fault[4] += 1
            if ecc is not None and (fault[3] is None or ecc > fault[3]):
                fault[3] = ecc

    def _datapath(self, r: dict[str, Any]) -> None:
        b = self._bucket(r["ts"])
        if b is None:
            return
        cell = self.datapath.get(b)
        if cell is None:
            cell = self.datapath[b] = [[] for _ in DATAPATH_METRICS] + [None, None]
        workers, expected, read = r.get("workers"), r.get("workers_expected"), r.get("read_bytes_s")
        values = {
            "batch_prep_s": r.get("batch_prep_s"),
            "read_latency_s": r.get("read_latency_s"),
            "read_mb_s": None if read is None else read / 1000000,
            "cache_hit_ratio": r.get("cache_hit_ratio"),
            "workers_live": workers / expected if workers is not None and expected else None,
            "file_opens_s": r.get("file_opens_s"),
        }
        for i, (name, _, _, _) in enumerate(DATAPATH_METRICS):
            if values[name] is not None:
                cell[i].append((values[name], r["rank"]))
        n = len(DATAPATH_METRICS)
        for j, key in enumerate(("errors", "file_open_errors")):
            if r.get(key) is not None:
                cell[n + j] = (cell[n + j] or 0) + r[key]

    # -- the page ---------------------------------------------------------------------------------

    def _progress_panel(self) -> dict[str, Any]:
        f = self.f
        w = self.window
        window = None
        if w is not None:
            window = {k: w[k] for k in ("first_step", "last_step", "first_ms", "last_ms", "tokens")}
            window["steps"] = len(w["steps"])
            window["epoch"] = None if w["epoch"] is None else w["epoch"][1]
        meta = f.meta
        epochs: list[tuple[int, int, int]] = []
        if meta.get("target_epochs") and not (meta.get("target_steps") or meta.get("target_tokens")):
            epochs = [(e, a, b) for e, (a, b) in sorted(self.epochs.items())]
        return progress_panel(meta, window, epochs, f.state)

    def _faults_panel(self) -> dict[str, Any]:
        ranks = sorted(self.rank_faults, key=lambda x: (x["ts"], x["rank"], x["kind"]))[:MAX_FAULTS]
        gpus = [
            {
                "node": node,
                "gpu_index": gpu,
                "first_ms": first,
                "last_ms": last,
                "xids": sorted(xids),
                "xid_samples": count,
                "ecc_uncorrected": ecc,
            }
            for (node, gpu), (first, last, xids, ecc, count) in sorted(self.gpu_faults.items())
        ]
        return {"ranks": ranks, "gpus": gpus}

    def _gpm_panel(self) -> dict[str, Any]:
        columns: list[list[Any]] = [[], [], [], []]
        for (x, i), (sm, tensor) in sorted(self.gpm.items()):
            columns[0].append(x)
            columns[1].append(i)
            columns[2].append(_ch(sm.value(), 1))
            columns[3].append(_ch(tensor.value(), 1))
        # ClickHouse writes no rows as `[]`.
        return {
            "columns": ["bucket index", "gpu", "sm_active", "tensor_active"],
            "cells": columns if columns[0] else [],
        }

    def _datapath_panel(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        rows = sorted(self.datapath.items())
        for i, (name, _, digits, low) in enumerate(DATAPATH_METRICS):
            median: list[list[Any]] = []
            worst: list[list[Any]] = []
            for b, cell in rows:
                values = cell[i]
                if not values:
                    continue
                ordered = sorted(v for v, _ in values)
                median.append([b, _num(ordered[len(ordered) // 2], digits)])
                # argMin / argMax over the table's order (job, rank, time): of equal values, the lowest rank's.
                value, rank = (min if low else max)(values, key=lambda p: (p[0], p[1] if low else -p[1]))
                worst.append([b, _num(value, digits), rank])
            out[name] = {"median": median, "worst": worst}
        n = len(DATAPATH_METRICS)
        out["errors"] = [[b, int(c[n] or 0), int(c[n + 1] or 0)] for b, c in rows if c[n] or c[n + 1]]
        return out

    def _heatmap(self) -> dict[str, Any]:
        derived = self.f.width >= _DERIVED_HOP_MS and bool(self.windows)
        cells = self.windows if derived else self.rank_steps
        columns: list[list[Any]] = [[], [], [], [], [], []]
        for (x, rank), means in sorted(cells.items()):
            columns[0].append(x)
            columns[1].append(rank)
            for i, mean in enumerate(means):
                columns[2 + i].append(_ch(mean.value()))
        return {
            "source": "derived_rank_windows" if derived else "steps",
            "columns": ["bucket index", "rank", "compute", "step", "comm", "wait"],
            "cells": columns,
        }

    def _steps(self, from_windows: bool) -> dict[str, Any]:
        f = self.f
        progress = sorted(self.progress.items())
        if from_windows:
            names = ("data_wait", "compute", "comm", "other")
            rows = sorted(self.window_segments.items())
            segments = {n: [[b, _ch(m[i].value())] for b, m in rows] for i, n in enumerate(names)}
        else:
            rows = sorted(self.step_segments.items())
            segments = {n: [[b, _ch(m[i].value())] for b, m in rows] for i, n in enumerate(SEGMENTS)}
        return {
            "segments": segments,
            "segments_source": "derived_rank_windows" if from_windows else "steps",
            "step_time": [[b, _ch(p[3].value())] for b, p in progress],
            "step_rate": step_rate([(b, p[4]) for b, p in progress], f.start, f.end, f.width),
            "loss": [[b, _ch(p[0].value(), 5)] for b, p in progress],
            "lr": [[b, _ch(p[1].value(), 9)] for b, p in progress],
            "grad_norm": [[b, _ch(p[2].value())] for b, p in progress],
            "skipped": [[b, p[5]] for b, p in progress if p[5]],
        }

    def _gpus(self) -> dict[str, Any]:
        f = self.f
        if not f.gpu_keys:
            return {"source": None, "labels": [], "keys": [], "columns": [], "cells": []}
        rank_of = {(r["node"], r["gpu_index"]): r["rank"] for r in f.ranks}
        columns: list[list[Any]] = [[], [], [], [], [], []]
        for (x, i), (util, power, clock, mem) in sorted(self.gpus.items()):
            columns[0].append(x)
            columns[1].append(i)
            columns[2].append(_ch(util.value(), 1))
            columns[3].append(_ch(power.value(), 1))
            columns[4].append(_ch(clock.value(), 0))
            columns[5].append(_ch(None if mem is None else mem / _GIB, 2))
        return {
            "source": "gpu_minute" if f.width >= _MINUTE_MS else "gpu_samples",
            "labels": [f"{node}/gpu{gpu} r{rank_of[(node, gpu)]}" for node, gpu in f.gpu_keys],
            "keys": [[n, g] for n, g in f.gpu_keys],
            "columns": ["bucket index", "gpu", "util", "power", "sm_clock", "mem_used"],
            "cells": columns,
        }

    def _hosts(self) -> dict[str, Any]:
        if not self.f.nodes:
            return {"nodes": [], "cpu": {}, "mem_pct": {}, "retrans": {}, "ib_errors": {}}
        out: dict[str, Any] = {
            "nodes": sorted(self.f.nodes),
            "cpu": {},
            "mem_pct": {},
            "retrans": {},
            "ib_errors": {},
        }
        for (node, b), (cpu, mem, retrans, ib) in sorted(self.hosts.items()):
            out["cpu"].setdefault(node, []).append([b, _num(cpu.value(), 1)])
            out["mem_pct"].setdefault(node, []).append([b, _num(mem.value(), 1)])
            out["retrans"].setdefault(node, []).append([b, _num(retrans.value(), 1)])
            out["ib_errors"].setdefault(node, []).append([b, None if ib is None else int(ib)])
        return out

    def _loader_panel(self) -> dict[str, Any]:
        rows = sorted(self.loader.items())
        return {
            "wait_frac_avg": [[b, _num(c[0].value())] for b, c in rows],
            "wait_frac_max": [[b, _num(c[1]), c[2]] for b, c in rows if c[1] is not None],
            "queue_depth_avg": [[b, _num(c[3].value(), 2)] for b, c in rows],
            "queue_depth_min": [[b, _num(c[4], 2)] for b, c in rows],
        }

    def _collectives_panel(self) -> dict[str, Any]:
        out: dict[str, dict[str, list[list[Any]]]] = {}
        for (op, b), (time_s, interval_s, _, bw) in sorted(self.collectives.items()):
            series = out.setdefault(op, {"time_frac": [], "bus_bw_gbps": []})
            series["time_frac"].append([b, _num(time_s / interval_s) if interval_s else None])
            series["bus_bw_gbps"].append([b, _num(bw.value(), 2)])
        return out

    def _phases_panel(self, table: str) -> list[dict[str, Any]]:
        out = []
        for key, p in sorted(self.phases[table].items(), key=lambda kv: kv[1]["first"]):
            start = p["started"] if p["started"] else p["first"]
            last = p["ended"] if p["ended"] else p["last"][0]
            done = bool(p["phases"] & {"completed", "failed", "verified", "restored"})
            if last < self.f.start and done:
                continue
            out.append(
                {
                    "id": key,
                    "step": p["step"],
                    "start_ms": start,
                    "end_ms": last if done else None,
                    "status": p["last"][1] if done else "open",
                    "label": p["label"],
                    "error": p["error"],
                }
            )
        return out

    def page(self) -> dict[str, Any]:
        """The job page's JSON (`ui.queries.job_page` without the efficiency panel)."""
        f = self.f
        heatmap = self._heatmap()
        page: dict[str, Any] = {
            "job": f.meta,
            "range": {"from_ms": f.start, "to_ms": f.end, "bucket_ms": f.width, "span": list(f.span)},
            "ranks": f.ranks,
            "heatmap": heatmap,
            "steps": self._steps(heatmap["source"] == "derived_rank_windows"),
            "validation": {k: sorted(v, key=lambda p: p[0]) for k, v in self.validation.items()},
            "gpus": self._gpus(),
            "hosts": self._hosts(),
            "dataloader": self._loader_panel(),
            "collectives": self._collectives_panel(),
            "checkpoints": self._phases_panel("checkpoints"),
            "evaluations": self._phases_panel("evaluations"),
            "states": sorted(self.states, key=lambda s: s["ts"]),
            "alerts": f.alerts,
            "actions": f.actions,
            "datapath": self._datapath_panel(),
            "gpm": self._gpm_panel(),
            "faults": self._faults_panel(),
            "progress": self._progress_panel(),
            "checkpoint": checkpoint_facts(
                self.checkpoint_records, f.span[1], f.meta.get("checkpoint_max_age_s")
            ),
        }
        # State wins over averages: a stalled, hung or overdue job shows no ETA and says since when.
        now_ms = max([f.span[1], *(a.get("updated_ms") or 0 for a in f.alerts)])
        page["condition"] = job_condition(page["progress"], f.alerts, now_ms)
        without_eta(page["progress"], page["condition"])
        return page

    def compare_rows(self) -> dict[tuple[str, str], list[BucketRow]]:
        """The compared runs' rows per step bucket."""
        rows: dict[tuple[str, str], list[BucketRow]] = defaultdict(list)
        for (job, run, s), (steps, step_time, segments, loss, tokens) in sorted(self.compare.items()):
            rows[(job, run)].append(
                BucketRow(
                    s, len(steps), step_time.value(), tuple(m.value() for m in segments), loss.value(), tokens
                )
            )
        return rows


def _compare_frame(found: Scan, job_id: str) -> tuple[list[Run], str, int]:
    runs, family = choose_runs(list(found.runs.values()), [job_id])
    for run in runs:
        run.config = config_of(found.jobs[run.job_id].started.get(run.run_id, {}))
    width = step_bucket(max((found.last_step.get((r.job_id, r.run_id), 0) for r in runs), default=0))
    return runs, family, width


def job_report(
    events: EventSource,
    job_id: str,
    *,
    t0: int | None = None,
    t1: int | None = None,
    prices: PriceList | None = None,
    target: int = TARGET_BUCKETS,
    sources: EventSource | None = None,
    kinds: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A job report's data from two passes: the job page, its efficiency panel, its comparison.

    `events` is the replay (source events with the detectors' alerts and derived windows). With
    `sources` (the same source events without detection), the detectors run once: pass 1 keeps the
    job's derived rank windows (six numbers each) and pass 2 reads `sources`.
    """
    from ui.efficiency import RunTally

    lo, hi = plausible_bounds()
    found, tally = Scan(lo, hi), RunTally()
    windows: list[dict[str, Any]] = []
    for event in events():
        found.feed(event)
        tally.plan(event)
        if sources is not None and event.type == "RankWindowStats" and event.record["job_id"] == job_id:
            r = event.record
            windows.append({k: r.get(k) for k in _WINDOW_FIELDS})
    if job_id not in found.jobs or (found.jobs[job_id].minutes is None and not found.jobs[job_id].started):
        jobs = sorted(j for j, info in found.jobs.items() if info.minutes is not None)
        raise UiError(f"job {job_id!r} is not in the recording (it holds: {', '.join(jobs) or 'none'})")
    frame = _frame(found, job_id, t0, t1, target, kinds)
    runs, family, width = _compare_frame(found, job_id) if found.jobs[job_id].started else ([], "", 1)
    panels = Panels(frame, runs, width)
    tally.select([job_id] + [r.job_id for r in runs])
    for event in (sources or events)():
        panels.feed(event)
        tally.feed(event)
    for window in windows:
        panels.feed(Event("RankWindowStats", window))
    page = panels.page()
    page["efficiency"] = tally.efficiency(job_id, prices or PriceList())
    page["compare"] = (
        assemble(runs, panels.compare_rows(), width, tally.run_goodput(), family) if runs else None
    )
    page["_events"] = found.events
    return page


def alert_report(
    events: EventSource, alert_id: str, *, target: int = TARGET_BUCKETS, kinds: dict[str, str] | None = None
) -> dict[str, Any]:
    """An alert report's data: the alert (`ui.queries.alert_page`) and its job's panels around it."""
    found = scan(events())
    records = found.alert_records(alert_id)
    if not records:
        raise NotFoundError("alert", alert_id)
    spec = table_specs()["Alert"]
    convert = row_converter("Alert")
    names = [c.name for c in spec.columns]
    latest_values = dict(zip(names, convert(records[-1]), strict=True))
    alert: dict[str, Any] = {
        k: _num(v, 6) if isinstance(v, float) else v
        for k, v in latest_values.items()
        if not k.startswith("history.")
    }
    latest = records[-1]
    alert["history"] = [[p["ts"], _num(p["value"], 5)] for p in latest.get("history") or []]
    alert["transitions"] = transitions(records)
    fired = [r for r in records if r["status"] == "firing"] or records
    alert["summary"] = fired[-1]["summary"]
    alert["resolution"] = latest["summary"] if latest["status"] == "resolved" else ""
    alert["observed_fired"] = _num(fired[-1].get("observed"), 6)
    alert.update(units_of(fired[-1], [r for r in records if r.get("expected") is not None]))
    thresholds = [r["expected"] for r in records if r.get("expected") is not None]
    alert["threshold"] = _num(thresholds[-1], 6) if thresholds else None
    alert["starts_ms"] = min(r["starts_at"] for r in records)
    ends = [r["ends_at"] for r in records if r.get("ends_at") is not None]
    alert["ends_ms"] = max(ends) if ends and latest["status"] == "resolved" else None
    alert["status"] = latest["status"]
    alert["copies"] = routed_copies(records, kinds)
    alert["inhibited_by"] = latest.get("inhibited_by") or ""
    found.fold([alert], kinds)
    muted = [
        (min(r["starts_at"] for r in rs), other, rs[0]["rule"])
        for other, rs in found.all_alerts().items()
        if other != alert_id and any(r.get("inhibited_by") == alert_id for r in rs)
    ]
    alert["mutes"] = [{"alert_id": other, "rule": rule} for _, other, rule in sorted(muted)]
    alert["actions"] = found.actions_of("alert_id", alert_id)
    evidence = None
    if alert.get("job_id"):
        window_end = (alert["ends_ms"] or latest["ts"]) + _ALERT_MARGIN_MS
        try:
            frame = _frame(
                found, alert["job_id"], alert["starts_ms"] - _ALERT_MARGIN_MS, window_end, target, kinds
            )
        except NotFoundError:
            frame = None
        if frame is not None:
            panels = Panels(frame)
            for event in events():
                panels.feed(event)
            evidence = panels.page()
    return {"alert": alert, "evidence": evidence, "_events": found.events}


def _as_merged(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What `SELECT ... FROM alerts FINAL` returns of these records: per (team, fingerprint,
    status), the one with the greatest ts, the later one on a tie."""
    kept: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in records:
        key = (r.get("team"), r.get("fingerprint"), r.get("status"))
        if key not in kept or r["ts"] >= kept[key]["ts"]:
            kept[key] = r
    return sorted(kept.values(), key=lambda a: a["ts"])
