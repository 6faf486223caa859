"""The efficiency panel and the fleet's goodput column: from the store's views, or folded from a recording.

From a store, `efficiency` and `fleet_goodput` read `run_efficiency` / `job_efficiency`
(`sinks.efficiency`). A report from a recording has no store, so `RunTally` computes the same views
from the events, for the reported job and the runs it is compared with, with the same formulas
(docs/efficiency.md): each run's steps become its progress heartbeat (a step is done when its
last rank reports it); a step is credited with its own step time, never more than its interval
less the checkpoint writes and evaluations that ended in it, and never more than one normal
(median) interval when the interval is over `STALL_INTERVAL_FACTOR` x the normal one; the rest is
stall. `tests/integration/ui/test_digest.py` holds both to the same answer on one recording.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from clickhouse_connect.driver.client import Client

from schemas.records import Event
from sinks.efficiency import PriceList, job_and_runs, job_rows
from sinks.errors import QueryError
from ui.pages.common import rounded

__all__ = ["STALL_INTERVAL_FACTOR", "RunTally", "efficiency", "fleet_goodput"]

# `sinks.efficiency_sql.STALL_INTERVAL_FACTOR` (kept here: the UI reads no sink SQL module).
STALL_INTERVAL_FACTOR = 3.0
_FAR_FUTURE_MS = 7_258_118_400_000  # 2200-01-01
_LOST = ("restarted", "failed", "preempted")
_SPENT = ("productive", "stall", "restart", "skipped", "checkpoint", "evaluation")


@dataclass
class _Run:
    started: int
    gpus: int = 0
    gpu_class: str = ""
    workload_family: str = ""
    team: str = ""
    owner: str = ""
    node_count: int = 0
    latest: int = 0  # ts of the JobStarted the argMax fields come from
    steps: dict[int, list[Any]] = field(
        default_factory=dict
    )  # step -> [done_ts, step_s, skipped, tokens, samples, reports]
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    evaluations: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_activity: int | None = None
    energy: dict[tuple[str, str, str], list[int]] = field(
        default_factory=dict
    )  # (holder, node, uuid) -> [min, max]


def _phase_agg(table: dict[str, dict[str, Any]], key: str, r: dict[str, Any]) -> None:
    p = table.setdefault(
        key, {"dur": None, "end_ts": None, "ended": False, "verified": False, "v_step": None, "v_ts": None}
    )
    if r["phase"] in ("completed", "failed"):
        p["ended"] = True
        p["end_ts"] = r["ts"] if p["end_ts"] is None else max(p["end_ts"], r["ts"])
        if r.get("duration_s") is not None:
            p["dur"] = r["duration_s"] if p["dur"] is None else max(p["dur"], r["duration_s"])
    elif r["phase"] == "verified":
        p["verified"] = True
        p["v_step"] = r["step"] if p["v_step"] is None else max(p["v_step"], r["step"])
        p["v_ts"] = r["ts"] if p["v_ts"] is None else max(p["v_ts"], r["ts"])


class RunTally:
    """Efficiency of the runs of some jobs, folded from their events (two passes: `plan` then `feed`)."""

    def __init__(self, jobs: Iterable[str] | None = None) -> None:
        # Pass 1 plans every job (runs and bindings are small) unless told which; `select` narrows pass 2.
        self.jobs: set[str] | None = None if jobs is None else set(jobs)
        self._last: dict[tuple[str, str], int] = {}
        self.runs: dict[tuple[str, str], _Run] = {}
        self.states: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.bindings: dict[tuple[str, str, str, str], int] = {}  # (job, run, node, uuid) -> first bound
        self._attributed: dict[str, list[tuple[str, int, int]]] = {}
        self._unattributed: dict[tuple[str, str], list[tuple[str, str, int, int]]] = {}
        self._planned = False

    # -- pass 1: runs, their last activity and their GPUs' windows ----------------------------------

    def plan(self, event: Event) -> None:
        """Pass 1: the runs, their activity and GPU bindings (to know each GPU's energy window)."""
        kind, r = event.type, event.record
        if not self._wanted(r.get("job_id")):
            return
        key = (r["job_id"], r.get("run_id") or "")
        if kind == "JobStarted":
            run = self.runs.get(key)
            if run is None:
                run = self.runs[key] = _Run(started=r["ts"], latest=r["ts"] - 1)
            run.started = min(run.started, r["ts"])
            if r["ts"] >= run.latest:
                run.latest = r["ts"]
                run.gpus = int(r.get("world_size") or 0)
                run.gpu_class = r.get("gpu_class") or ""
                run.workload_family = r.get("workload_family") or ""
                run.team, run.owner = r.get("team") or "", r.get("owner") or ""
                run.node_count = len(r.get("nodes") or [])
        elif kind in ("StepCompleted", "CheckpointEvent", "EvaluationEvent"):
            self._activity(key, r["ts"])
        elif kind == "RankBound" and r.get("gpu_uuid") is not None:
            bound = (r["job_id"], r.get("run_id") or "", r["node"], r["gpu_uuid"])
            self.bindings[bound] = min(self.bindings.get(bound, r["ts"]), r["ts"])

    def _activity(self, key: tuple[str, str], ts: int) -> None:
        self._last[key] = max(self._last.get(key, ts), ts)

    def select(self, jobs: Iterable[str]) -> None:
        """Tally only these jobs in pass 2 (and forget the runs of the others)."""
        self.jobs = set(jobs)
        self.runs = {k: v for k, v in self.runs.items() if k[0] in self.jobs}
        self.bindings = {k: v for k, v in self.bindings.items() if k[0] in self.jobs}
        self._planned = False

    def _wanted(self, job: Any) -> bool:
        return job is not None and (self.jobs is None or job in self.jobs)

    def _windows(self) -> None:
        # The energy windows of `run_efficiency`: the job's own (attributed) samples from a run's start to
        # the next run's start; a bound GPU's unattributed samples from the binding to the run's last activity.
        by_job: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for (job, run), info in self.runs.items():
            by_job[job].append((info.started, run))
        for job, starts in by_job.items():
            starts.sort()
            self._attributed[job] = [
                (run, start, starts[i + 1][0] if i + 1 < len(starts) else _FAR_FUTURE_MS)
                for i, (start, run) in enumerate(starts)
            ]
        for (job, run, node, uuid), bound in self.bindings.items():
            last = self._last.get((job, run))
            if last is not None:
                self._unattributed.setdefault((node, uuid), []).append((job, run, bound, last + 1))
        self._planned = True

    # -- pass 2: steps, checkpoints, evaluations, states, energy ------------------------------------

    def feed(self, event: Event) -> None:
        """Pass 2: fold one event."""
        if not self._planned:
            self._windows()
        kind, r = event.type, event.record
        if kind == "GpuSample":
            if r.get("energy_mj") is not None:
                self._energy(r)
            return
        if not self._wanted(r.get("job_id")):
            return
        if kind == "JobStateChanged":
            self.states[r["job_id"]].append(r)
            return
        run = self.runs.get((r["job_id"], r.get("run_id") or ""))
        if run is None:
            return
        if kind == "StepCompleted":
            s = run.steps.get(r["step"])
            if s is None:
                run.steps[r["step"]] = [r["ts"], r["step_time_s"], bool(r.get("skipped")), r.get("tokens") or 0,
                                        r.get("samples") or 0, 1]  # fmt: skip
            else:
                s[0] = max(s[0], r["ts"])
                s[1] = max(s[1], r["step_time_s"])
                s[2] = s[2] or bool(r.get("skipped"))
                s[3] += r.get("tokens") or 0
                s[4] += r.get("samples") or 0
                s[5] += 1
        elif kind == "CheckpointEvent":
            _phase_agg(run.checkpoints, r["checkpoint_id"], r)
        elif kind == "EvaluationEvent":
            _phase_agg(run.evaluations, r["evaluation_id"], r)

    def _energy(self, r: dict[str, Any]) -> None:
        holder = r.get("job_id") or ""
        value, ts = r["energy_mj"], r["ts"]
        targets: list[tuple[str, str]] = []
        if holder:
            targets = [
                (holder, run) for run, start, end in self._attributed.get(holder, ()) if start <= ts < end
            ]
        else:
            targets = [(job, run) for job, run, start, end in self._unattributed.get((r["node"], r["gpu_uuid"]), ())
                       if start <= ts < end]  # fmt: skip
        for key in targets:
            cell = self.runs[key].energy.setdefault((holder, r["node"], r["gpu_uuid"]), [value, value])
            cell[0], cell[1] = min(cell[0], value), max(cell[1], value)

    # -- the views ------------------------------------------------------------------------------------

    def _run_row(self, job: str, run_id: str, run: _Run, is_last: bool) -> dict[str, Any]:
        beats = sorted(((s[0], step, *s[1:]) for step, s in run.steps.items()), key=lambda b: (b[0], b[1]))
        checkpoints = list(run.checkpoints.values())
        evaluations = list(run.evaluations.values())
        verified = [c for c in checkpoints if c["verified"]]
        verified_n = len(verified)
        verified_step = max((c["v_step"] for c in verified), default=0)
        verified_ts = max((c["v_ts"] for c in verified), default=0)
        pauses = [(c["end_ts"], c["dur"] or 0.0) for c in checkpoints + evaluations if c["ended"]]
        done = [b[0] for b in beats]
        intervals = [max(0, t - p) / 1000 for t, p in zip(done, [run.started, *done[:-1]], strict=True)]
        timeline = sorted(
            [(t, 0, length) for t, length in pauses] + [(t, 1, 0.0) for t in done], key=lambda x: (x[0], x[1])
        )
        paused_by, total = [], 0.0
        for _t, kind, length in timeline:
            total += length
            if kind == 1:
                paused_by.append(total)
        paused = [a - b for a, b in zip(paused_by, [0.0, *paused_by[:-1]], strict=True)]
        tail_pause = sum(length for _, length in pauses) - (paused_by[-1] if paused_by else 0.0)
        rest = sorted(intervals[1:])
        normal = rest[len(rest) // 2] if len(intervals) > 1 else 0.0
        opened = [max(0.0, g - q) for g, q in zip(intervals, paused, strict=True)]
        k = STALL_INTERVAL_FACTOR
        work = [
            min(b[2], normal if normal > 0 and o > k * normal else o)
            for o, b in zip(opened, beats, strict=True)
        ]
        once = [min(1.0, run.gpus / max(b[6], 1)) if run.gpus > 0 else 1.0 for b in beats]
        tokens = [round(b[4] * o) for b, o in zip(beats, once, strict=True)]
        samples = [round(b[5] * o) for b, o in zip(beats, once, strict=True)]
        skipped = [b[3] for b in beats]
        saved = [verified_n > 0 and b[1] <= verified_step for b in beats]
        step_s = sum(work)
        between_s = sum(opened) - step_s
        skipped_s = sum(w for w, f in zip(work, skipped, strict=True) if f)
        unsaved_s = sum(w for w, f, v in zip(work, skipped, saved, strict=True) if not (f or v))
        tokens_all = sum(t for t, f in zip(tokens, skipped, strict=True) if not f)
        unsaved_tokens = sum(t for t, f, v in zip(tokens, skipped, saved, strict=True) if not (f or v))
        samples_all = sum(t for t, f in zip(samples, skipped, strict=True) if not f)
        unsaved_samples = sum(t for t, f, v in zip(samples, skipped, saved, strict=True) if not (f or v))
        last_step_ts = done[-1] if done else run.started
        states = self.states.get(job, [])
        state_ts = max((s["ts"] for s in states), default=0)
        state = max(states, key=lambda s: s["ts"])["state"] if states else ""
        if not is_last:
            outcome = "restarted"
        elif state_ts < run.started:
            outcome = "running"
        elif state in ("pending", "restarting"):
            outcome = "restarted"
        elif state in ("completed", "failed", "preempted"):
            outcome = state
        else:
            outcome = "running"
        last_activity = self._last.get((job, run_id), 0)
        ended = max(run.started, last_activity, state_ts if is_last and outcome != "running" else run.started)
        wall_s = (ended - run.started) / 1000
        allocated = run.gpus * wall_s / 3600
        lost = outcome in _LOST
        restart_lost_s = unsaved_s if lost else 0.0
        productive_s = step_s - skipped_s - restart_lost_s
        tokens_total = tokens_all - (unsaved_tokens if lost else 0)
        samples_total = samples_all - (unsaved_samples if lost else 0)
        energy_mj = sum(hi - lo for lo, hi in run.energy.values())
        energy_kwh = energy_mj / 3.6e9
        return {
            "job_id": job,
            "run_id": run_id,
            "team": run.team,
            "owner": run.owner,
            "gpu_class": run.gpu_class,
            "workload_family": run.workload_family,
            "node_count": run.node_count,
            "gpus": run.gpus,
            "outcome": outcome,
            "started": run.started,
            "ended": ended,
            "wall_s": wall_s,
            "allocated_gpu_h": allocated,
            "steps": len(beats),
            "step_s": step_s,
            "restart_lost_s": restart_lost_s,
            "skipped_s": skipped_s,
            "productive_s": productive_s,
            "checkpoint_s": sum(c["dur"] or 0.0 for c in checkpoints),
            "evaluation_s": sum(e["dur"] or 0.0 for e in evaluations),
            "stall_s": between_s + max(0.0, (ended - last_step_ts) / 1000 - tail_pause),
            "goodput_pct": min(100.0, 100 * productive_s / wall_s) if wall_s > 0 else None,
            "tokens": tokens_total,
            "samples": samples_total,
            "tokens_per_gpu_h": tokens_total / allocated if allocated > 0 else None,
            "samples_per_gpu_h": samples_total / allocated if allocated > 0 else None,
            "tokens_per_gpu_s": tokens_total / (productive_s * run.gpus)
            if productive_s > 0 and run.gpus > 0
            else None,
            "energy_kwh": energy_kwh,
            "kwh_per_billion_tokens": energy_kwh / (tokens_total / 1e9) if tokens_total > 0 else None,
            "failed_work_s": (ended - (max(verified_ts, run.started) if verified_n else run.started)) / 1000
            if lost
            else 0.0,
        }

    def run_rows(self, job: str | None = None) -> list[dict[str, Any]]:
        """`run_efficiency` rows (of one job, or of every job tallied), in start order."""
        if not self._planned:
            self._windows()
        out = []
        for (j, run_id), run in self.runs.items():
            if job is not None and j != job:
                continue
            latest = max(r.started for (jj, _), r in self.runs.items() if jj == j)
            out.append(self._run_row(j, run_id, run, run.started == latest))
        return sorted(out, key=lambda r: (r["job_id"], r["started"]))

    def run_goodput(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Goodput and outcome by (job, run), for the compare page."""
        return {(r["job_id"], r["run_id"]): r for r in self.run_rows()}

    def _queue_s(self, job: str) -> float | None:
        states = self.states.get(job, [])
        attempts: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for s in states:
            if s.get("submit_ts") is not None:
                attempts[s["submit_ts"]].append(s)
        if attempts:
            total = 0.0
            for submit, rows in attempts.items():
                running = [s["ts"] for s in rows if s["state"] == "running"]
                ended = [s["ts"] for s in rows if s["state"] in ("completed", "failed")]
                left = min(running) if running else min(ended) if ended else int(time.time() * 1000)
                total += max(0, left - submit)
            return total / 1000
        pending = [s["ts"] for s in states if s["state"] == "pending"]
        running = [s["ts"] for s in states if s["state"] == "running"]
        return (min(running) - min(pending)) / 1000 if pending and running else None

    def efficiency(self, job: str, prices: PriceList) -> dict[str, Any] | None:
        """The job's efficiency panel, as `efficiency` answers it from the views."""

        runs = self.run_rows(job)
        if not runs:
            return None
        last = max(runs, key=lambda r: r["started"])
        allocated = sum(r["allocated_gpu_h"] for r in runs)
        gpu_h = {k: sum(r["gpus"] * r[f"{k}_s"] for r in runs) / 3600 for k in ("productive", "stall", "skipped",
                 "checkpoint", "evaluation", "failed_work")}  # fmt: skip
        gpu_h["restart"] = sum(r["gpus"] * r["restart_lost_s"] for r in runs) / 3600
        tokens = sum(r["tokens"] for r in runs)
        samples = sum(r["samples"] for r in runs)
        energy = sum(r["energy_kwh"] for r in runs)
        price = prices.price(last["gpu_class"])
        cost = None if price is None else allocated * price
        row = {
            "outcome": last["outcome"],
            "runs": len(runs),
            "gpus": last["gpus"],
            "gpu_class": last["gpu_class"],
            "allocated_gpu_h": allocated,
            "goodput_pct": min(100.0, 100 * gpu_h["productive"] / allocated) if allocated > 0 else None,
            "tokens": tokens,
            "samples": samples,
            "tokens_per_gpu_h": tokens / allocated if allocated > 0 else None,
            "samples_per_gpu_h": samples / allocated if allocated > 0 else None,
            "energy_kwh": energy,
            "kwh_per_billion_tokens": energy / (tokens / 1e9) if tokens > 0 else None,
            "queue_s": self._queue_s(job),
            "failed_work_pct": 100 * gpu_h["failed_work"] / allocated if allocated > 0 else None,
            "cost": cost,
            "cost_per_successful_run": cost if last["outcome"] == "completed" else None,
        }
        out: dict[str, Any] = {k: _figure(row[k]) for k in _JOB_FIGURES}
        out["price_per_gpu_h"] = price
        out["spent_gpu_h"] = {k: rounded(gpu_h[k], 6) for k in _SPENT}
        out["queue_gpu_h"] = rounded((row["queue_s"] or 0) * (row["gpus"] or 0) / 3600, 6)
        per_run = []
        for run in runs:
            item = {k: _figure(run[k]) for k in _RUN_FIGURES}
            gpus = run["gpus"] or 0
            item["spent_gpu_h"] = {
                "productive": rounded(gpus * run["productive_s"] / 3600, 6),
                "stall": rounded(gpus * run["stall_s"] / 3600, 6),
                "restart": rounded(gpus * run["restart_lost_s"] / 3600, 6),
                "skipped": rounded(gpus * run["skipped_s"] / 3600, 6),
                "checkpoint": rounded(gpus * run["checkpoint_s"] / 3600, 6),
                "evaluation": rounded(gpus * run["evaluation_s"] / 3600, 6),
            }
            run_price = prices.price(run["gpu_class"])
            item["cost"] = rounded(None if run_price is None else run["allocated_gpu_h"] * run_price, 6)
            per_run.append(item)
        out["per_run"] = per_run
        return out


_JOB_FIGURES = (
    "outcome",
    "runs",
    "gpus",
    "gpu_class",
    "allocated_gpu_h",
    "goodput_pct",
    "tokens",
    "samples",
    "tokens_per_gpu_h",
    "samples_per_gpu_h",
    "energy_kwh",
    "kwh_per_billion_tokens",
    "queue_s",
    "failed_work_pct",
    "cost",
    "cost_per_successful_run",
)
_RUN_FIGURES = (
    "run_id",
    "outcome",
    "gpus",
    "allocated_gpu_h",
    "goodput_pct",
    "tokens_per_gpu_h",
    "samples_per_gpu_h",
    "energy_kwh",
    "kwh_per_billion_tokens",
)


def _efficiency_rows(client: Client, prices: PriceList, job_id: str | None = None) -> list[dict[str, Any]]:
    # A store the efficiency views are missing from answers "unknown", not an error page.
    try:
        return job_rows(client, prices, job=job_id)
    except QueryError:
        return []


def _figure(value: Any) -> Any:
    return value if isinstance(value, str | int) and not isinstance(value, bool) else rounded(value, 6)


def fleet_goodput(client: Client) -> dict[str, float | None]:
    """ML goodput per job from `job_efficiency` (docs/efficiency.md): productive / allocated GPU-hours, %."""
    return {row["job_id"]: rounded(row["goodput_pct"], 2) for row in _efficiency_rows(client, PriceList())}


def efficiency(client: Client, job_id: str, prices: PriceList | None = None) -> dict[str, Any] | None:
    """The job's efficiency panel: `job_efficiency` and its runs, priced by `prices` (None: unknown)."""
    prices = prices or PriceList()
    # The job's row and its runs from one statement: the run SQL is planned and run once, not twice.
    try:
        row, run_list = job_and_runs(client, prices, job_id)
    except QueryError:  # a store the efficiency views are missing from answers "unknown"
        return None
    if row is None or row["runs"] == 0:
        return None
    out: dict[str, Any] = {k: _figure(row[k]) for k in _JOB_FIGURES}
    out["price_per_gpu_h"] = prices.price(row["gpu_class"])
    out["spent_gpu_h"] = {k: rounded(row[f"{k}_gpu_h"], 6) for k in _SPENT}
    out["queue_gpu_h"] = rounded((row["queue_s"] or 0) * (row["gpus"] or 0) / 3600, 6)
    runs = []
    for run in run_list:
        item = {k: _figure(run[k]) for k in _RUN_FIGURES}
        gpus = run["gpus"] or 0
        item["spent_gpu_h"] = {
            "productive": rounded(gpus * run["productive_s"] / 3600, 6),
            "stall": rounded(gpus * run["stall_s"] / 3600, 6),
            "restart": rounded(gpus * run["restart_lost_s"] / 3600, 6),
            "skipped": rounded(gpus * run["skipped_s"] / 3600, 6),
            "checkpoint": rounded(gpus * run["checkpoint_s"] / 3600, 6),
            "evaluation": rounded(gpus * run["evaluation_s"] / 3600, 6),
        }
        item["cost"] = rounded(run["cost"], 6)
        runs.append(item)
    out["per_run"] = runs
    return out
