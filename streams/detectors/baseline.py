"""Baseline deviation: a run compared with earlier healthy runs of the same workload (`baseline_deviation`).

Baselines are keyed by `baseline_key` (workload family | model version | GPU class | node count |
batch size | sequence length, then the parallel layout and the data path where the job names them,
see `windows.baseline_key`) and built from the `JobWindowStats`
of *earlier, completed* runs: while a job runs, its healthy windows (no alert of the job firing)
are buffered; when it completes (JobStateChanged `completed`), each metric's median over the run
becomes one run summary of its baseline (the most recent `max_runs` runs are kept). A failed run
contributes nothing: it may have been degraded before it failed.

Every window of a running job is compared with the baseline of its key built from *other* jobs,
once at least `min_runs` runs built it: a metric deviates when it is worse than the baseline
median by more than `max(mad_k x 1.4826 x MAD, rel_tolerance x median)` (worse = step time and
data-wait fraction up; tokens/s per GPU, GPU activity and power down). `deviation_windows`
consecutive deviating windows fire one alert per job naming the worst metric, the baseline key
and how many runs built it; one clean window resolves it. GPU activity and power are only
compared in windows without a training pause (checkpoint, evaluation), detected from the step
rate, because a pause lowers them for reasons that are not a regression.

The alert names the suspected layer the deviating metric points to: data for the data-wait
fraction, gpu for GPU activity and power. A slower step (step time, tokens/s) is split into its
parts, each in seconds per step from the window's time attribution (GPU compute, data wait,
communication, other host time), against the same parts of the baseline runs: the part that grew
the most names the layer (gpu, data, network, host). Baseline runs learned before the parts were
kept fall back to where the slow window's step time goes.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Detector, Finding
from streams.detectors.catalogue import catalogued
from streams.detectors.stats import MAD_TO_SIGMA, mad, median

__all__ = ["DEFAULTS", "METRICS", "BaselineDetector", "key_words"]

# metric -> +1 when higher is worse, -1 when lower is worse
METRICS: dict[str, int] = {
    "step_time_s": +1,
    "tokens_per_s_per_gpu": -1,
    "gpu_util_pct": -1,
    "power_w": -1,
    "data_wait_frac": +1,
}
_PAUSE_SENSITIVE = ("gpu_util_pct", "power_w")
# Parts of a step (seconds per step, from JobWindowStats' time attribution) kept beside the metrics
# in a run's summary (`part_*` keys of BaselineRun.metrics), and the layer each one names.
_PARTS: dict[str, str] = {
    "part_compute_s": "gpu",
    "part_data_wait_s": "data",
    "part_comm_s": "network",
    "part_other_s": "host",
}
_PART_WORDS = {
    "part_compute_s": "GPU compute",
    "part_data_wait_s": "data wait",
    "part_comm_s": "communication",
    "part_other_s": "other host time",
}
_STEP_METRICS = ("step_time_s", "tokens_per_s_per_gpu")
_KEY_PARTS = ("workload family", "model version", "GPU class", "node count", "batch size", "sequence length")


def scaling_config(key: str) -> tuple[str, int] | None:
    """A baseline key without its node count and data-parallel size (they grow with the nodes), and
    the node count: runs of one configuration on different numbers of nodes share the first part."""
    parts = key.split("|")
    if len(parts) < len(_KEY_PARTS) or not parts[3].endswith("n") or not parts[3][:-1].isdigit():
        return None
    rest = [
        ".".join(t for t in part.split(".") if not (t.startswith("dp") and t[2:].isdigit()))
        if i >= len(_KEY_PARTS) and not part.startswith("data:")
        else part
        for i, part in enumerate(parts)
        if i != 3
    ]
    return "|".join(rest), int(parts[3][:-1])


def key_words(key: str) -> str:
    """Which parts of a baseline key matched, in words: `same workload family, ..., parallel layout dp8.tp1`."""
    parts = key.split("|")
    words = list(_KEY_PARTS[: min(len(parts), len(_KEY_PARTS))])
    for extra in parts[len(_KEY_PARTS) :]:
        words.append(f"data path {extra[5:]}" if extra.startswith("data:") else f"parallel layout {extra}")
    return "same " + ", ".join(words)


DEFAULTS: dict[str, Any] = {
    "metrics": list(METRICS),  # metrics compared with the baseline
    "min_runs": 2,  # a baseline needs this many earlier runs before it is used
    "max_runs": 20,  # most recent runs kept per baseline key
    "mad_k": 4.0,  # deviation beyond this many robust sigmas (1.4826 x MAD) of the run medians...
    "rel_tolerance": 0.15,  # ...and beyond this fraction of the baseline median
    "deviation_windows": 2,  # consecutive deviating windows before the alert
    "build_skip_windows": 2,  # first windows of a run (warm-up) never build a baseline
    "judge_skip_windows": 0,  # first windows of a run never judged (raise it for long warm-ups)
    "min_windows_per_run": 4,  # a completed run needs this many healthy windows to count
    "max_windows_per_run": 240,  # healthy windows buffered per running job (bounded state)
    "pause_busy_fraction": 0.85,  # step rate below this fraction of 1/step_time marks a paused window
    "history_points": 10,  # points of metric history carried on a finding
    # Scaling efficiency (scaling_efficiency_low): off until a team sets a floor in the overrides file.
    "scaling_efficiency_floor": None,  # tokens/s per GPU below this fraction of the same configuration on fewer nodes
    "scaling_windows": 3,  # consecutive windows below the floor before the alert
}


BASELINE_DEVIATION = catalogued("baseline_deviation")

SCALING_EFFICIENCY_LOW = catalogued("scaling_efficiency_low")


class BaselineDetector(Detector):
    """Learns per-workload baselines from completed healthy runs; flags runs that deviate."""

    stage: ClassVar[str] = "job"  # reads the job's window statistics

    rules: ClassVar[tuple[str, ...]] = ("baseline_deviation", "scaling_efficiency_low")

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        unknown = [m for m in p["metrics"] if m not in METRICS]
        if unknown:
            raise ValueError(f"baseline: unknown metric {unknown[0]!r}; known: {', '.join(METRICS)}")
        self.metrics = [m for m in METRICS if m in p["metrics"]]
        self.min_runs = int(p["min_runs"])
        self.max_runs = int(p["max_runs"])
        self.mad_k = float(p["mad_k"])
        self.rel = float(p["rel_tolerance"])
        self.windows_needed = int(p["deviation_windows"])
        self.skip = int(p["build_skip_windows"])
        self.judge_skip = int(p["judge_skip_windows"])
        self.min_windows = int(p["min_windows_per_run"])
        self.max_windows = int(p["max_windows_per_run"])
        self.pause_frac = float(p["pause_busy_fraction"])
        self.history_points = int(p["history_points"])
        floor = p["scaling_efficiency_floor"]
        self.scaling_floor = None if floor is None else float(floor)
        if self.scaling_floor is not None and not 0.0 < self.scaling_floor <= 1.0:
            raise ValueError(f"baseline: scaling_efficiency_floor must be in (0, 1], not {floor!r}")
        self.scaling_windows = max(1, int(p["scaling_windows"]))
        self.baselines_by_key: dict[str, list[dict[str, Any]]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.learned: list[dict[str, Any]] = []  # committed runs not yet shared (`drain_learned`)

    # -- input -------------------------------------------------------------------------
    def observe(self, event: Event) -> list[Finding]:
        """Learn from and judge JobWindowStats; commit a run's summary when its job completes."""
        if event.type == "JobWindowStats":
            return self._window(event.record)
        if event.type == "JobStateChanged" and event.record["state"] == "completed":
            self._commit(event.record["job_id"], event.record["ts"])
        return []

    def _window(self, r: dict[str, Any]) -> list[Finding]:
        key = r.get("baseline_key") or ""
        if not key:
            return []
        job = self.jobs.setdefault(
            r["job_id"],
            {
                "key": key,
                "run_id": r.get("run_id", ""),
                "n": 0,
                "values": {m: [] for m in self.metrics},
                "parts": {p: [] for p in _PARTS},
                "prev": None,
                "fracs": [],
                "dev": 0,
                "active": None,
                "hist": [],
            },
        )
        job["n"] += 1
        paused = self._paused(job, r)
        values = {m: r.get(m) for m in self.metrics}
        if paused:
            for m in _PAUSE_SENSITIVE:
                values[m] = None
        if r.get("healthy", True) and job["n"] > self.skip:
            for m, v in values.items():
                if v is not None and v == v:  # NaN never builds a baseline
                    job["values"][m] = [*job["values"][m], v][-self.max_windows :]
            parts = job.setdefault("parts", {p: [] for p in _PARTS})
            for name, v in _step_parts(r).items():
                parts[name] = [*parts.get(name, []), v][-self.max_windows :]
        if job["n"] <= self.judge_skip:
            return []
        return [*self._judge(r, job, key, values), *self._scaling(r, job, key, values, paused)]

    def _paused(self, job: dict[str, Any], r: dict[str, Any]) -> bool:
        """True when the window holds a training pause (steps slower than their own step time)."""
        prev = job["prev"]
        last_step, end, step_time = r.get("last_step"), r["window_end"], r.get("step_time_s")
        job["prev"] = [end, last_step]
        if prev is None or last_step is None or prev[1] is None or not step_time or end <= prev[0]:
            job["fracs"] = []
            return True
        frac = (last_step - prev[1]) * step_time / ((end - prev[0]) / 1000.0)
        job["fracs"] = [*job["fracs"], frac][-2:]
        return min(job["fracs"]) < self.pause_frac or len(job["fracs"]) < 2

    def _judge(
        self, r: dict[str, Any], job: dict[str, Any], key: str, values: dict[str, Any]
    ) -> list[Finding]:
        runs = [run for run in self.baselines_by_key.get(key, []) if run["job_id"] != r["job_id"]]
        if len(runs) < self.min_runs:
            return []
        worst: tuple[float, str, float, float, float] | None = None
        deviating: list[str] = []
        for m in self.metrics:
            x = values.get(m)
            summaries = [run["metrics"][m] for run in runs if run["metrics"].get(m) is not None]
            if x is None or x != x or len(summaries) < self.min_runs:
                continue
            center = median(summaries)
            spread = mad(summaries, center)
            assert center is not None and spread is not None
            tolerance = max(self.mad_k * MAD_TO_SIGMA * spread, self.rel * abs(center))
            excess = (x - center) * METRICS[m]
            if excess > tolerance:
                deviating.append(m)
                severity = excess / tolerance if tolerance > 0 else float("inf")
                if worst is None or severity > worst[0]:
                    worst = (severity, m, x, center, tolerance)
        end = r["window_end"]
        if worst is None:
            job["dev"] = 0
            if job["active"] is not None:
                since = job["active"]["since"]
                job["active"] = None
                return [self._finding(r, job, key, len(runs), None, since, False, [])]
            return []
        job["dev"] += 1
        job["hist"] = [*job["hist"], [end, worst[2]]][-self.history_points :]
        if job["dev"] < self.windows_needed:
            return []
        if job["active"] is None:
            job["active"] = {"since": r["window_start"]}
        return [self._finding(r, job, key, len(runs), worst, job["active"]["since"], True, deviating)]

    def _finding(
        self,
        r: dict[str, Any],
        job: dict[str, Any],
        key: str,
        runs: int,
        worst: tuple[float, str, float, float, float] | None,
        since: int,
        active: bool,
        deviating: list[str],
    ) -> Finding:
        job_id = r["job_id"]
        if worst is not None:
            _, metric, x, center, _tol = worst
            pct = 100.0 * (x - center) / center if center else 0.0
            summary = (
                f"job {job_id}: {metric} {x:.4g} vs baseline {center:.4g} ({pct:+.0f}%) of {runs} earlier runs "
                f"of {key} ({key_words(key)})"
            )
            if len(deviating) > 1:
                summary += f"; also off: {', '.join(m for m in deviating if m != metric)}"
            layer, why = _layer(metric, r, self._base_parts(job_id, key))
            if why:
                summary += f"; {why}"
        else:
            metric, x, center = "", None, None
            summary = f"job {job_id} is back in line with its baseline {key}"
            layer = "unknown"
        return BASELINE_DEVIATION.for_job(
            job_id,
            active,
            r["window_end"],
            since=since,
            invariant=BASELINE_DEVIATION.says(metric=metric or "performance", key=key),
            observed=x,
            expected=center,
            summary=summary,
            suspected_layer=layer,
            history_metric=metric,
            history=tuple((int(t), float(v)) for t, v in job["hist"]) if active else (),
            baseline=key,
            baseline_runs=runs,
        )

    # -- scaling efficiency ----------------------------------------------------------------
    def _reference(self, key: str, job_id: str) -> tuple[int, list[dict[str, Any]]] | None:
        """The fewest-node runs of the same configuration on fewer nodes than `key` (at least `min_runs`)."""
        mine = scaling_config(key)
        if mine is None:
            return None
        config, nodes = mine
        by_nodes: dict[int, list[dict[str, Any]]] = {}
        for other, runs in self.baselines_by_key.items():
            theirs = scaling_config(other)
            if theirs is None or theirs[0] != config or theirs[1] >= nodes:
                continue
            usable = [
                run
                for run in runs
                if run["job_id"] != job_id and run["metrics"].get("tokens_per_s_per_gpu") is not None
            ]
            by_nodes.setdefault(theirs[1], []).extend(usable)
        for count in sorted(by_nodes):
            if len(by_nodes[count]) >= self.min_runs:
                return count, by_nodes[count]
        return None

    def _scaling(
        self, r: dict[str, Any], job: dict[str, Any], key: str, values: dict[str, Any], paused: bool
    ) -> list[Finding]:
        """This window's tokens/s per GPU against the same configuration on fewer nodes, below the team's floor."""
        if self.scaling_floor is None or paused:
            return []
        x = values.get("tokens_per_s_per_gpu")
        ref = self._reference(key, r["job_id"])
        scale = job.setdefault("scale", {"below": 0, "active": None, "hist": []})
        if x is None or x != x or ref is None:
            return []
        nodes, runs = ref
        center = median([run["metrics"]["tokens_per_s_per_gpu"] for run in runs])
        if not center:
            return []
        efficiency = x / center
        scale["hist"] = [*scale["hist"], [r["window_end"], round(efficiency, 4)]][-self.history_points :]
        if efficiency >= self.scaling_floor:
            scale["below"] = 0
            if scale["active"] is None:
                return []
            active, scale["active"] = scale["active"], None
            return [self._scaling_finding(r, job, efficiency, nodes, runs, active["since"], False)]
        scale["below"] += 1
        if scale["below"] < self.scaling_windows:
            return []
        if scale["active"] is None:
            scale["active"] = {"since": r["window_start"]}
        return [self._scaling_finding(r, job, efficiency, nodes, runs, scale["active"]["since"], True)]

    def _scaling_finding(
        self,
        r: dict[str, Any],
        job: dict[str, Any],
        efficiency: float,
        nodes: int,
        runs: list[dict[str, Any]],
        since: int,
        active: bool,
    ) -> Finding:
        job_id, floor = r["job_id"], self.scaling_floor or 0.0
        mine = scaling_config(job["key"])
        here = mine[1] if mine else 0
        layer, why = "unknown", ""
        if active:
            base: dict[str, float] = {}
            for name in _PARTS:
                vals = [run["metrics"][name] for run in runs if run["metrics"].get(name) is not None]
                if len(vals) >= self.min_runs:
                    base[name] = median(vals) or 0.0
            layer, why = _layer("tokens_per_s_per_gpu", r, base)
        summary = (
            f"job {job_id} on {here} nodes makes {efficiency:.0%} of the tokens/s per GPU that {len(runs)} runs of "
            f"the same configuration made on {nodes} node(s) (floor {floor:.0%})"
            + (f"; {why}" if why else "")
            if active
            else f"job {job_id} scales at {efficiency:.0%} again (floor {floor:.0%})"
        )
        return SCALING_EFFICIENCY_LOW.finding(
            key=(job_id,),
            active=active,
            ts=r["window_end"],
            job_id=job_id,
            since=since,
            invariant=SCALING_EFFICIENCY_LOW.says(floor=floor, nodes=nodes),
            observed=round(efficiency, 4),
            expected=floor,
            summary=summary,
            suspected_layer=layer,
            history_metric="scaling_efficiency_ratio",
            history=tuple((int(t), float(v)) for t, v in job.get("scale", {}).get("hist", ()))
            if active
            else (),
            baseline=(mine[0] if mine else job["key"]) + f" on {nodes}n",
            baseline_runs=len(runs),
        )

    def _commit(self, job_id: str, ts: int) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        counts = [len(v) for v in job["values"].values()]
        if not counts or max(counts) < self.min_windows:
            return
        summary = {m: median(v) if len(v) >= self.min_windows else None for m, v in job["values"].items()}
        for name, v in job.get("parts", {}).items():
            if len(v) >= self.min_windows:
                summary[name] = median(v)
        run = {
            "job_id": job_id,
            "run_id": job["run_id"],
            "end": ts,
            "windows": max(counts),
            "metrics": summary,
        }
        self._add_run(job["key"], run)
        self.learned.append(
            {
                "ts": ts,
                "source": -1,  # the worker names its partition
                "job_id": job_id,
                "run_id": job["run_id"],
                "baseline_key": job["key"],
                "windows": max(counts),
                "metrics": summary,
            }
        )

    def _base_parts(self, job_id: str, key: str) -> dict[str, float]:
        """Median of each step part over the baseline runs of `key` that kept it (not the job's own)."""
        runs = [run for run in self.baselines_by_key.get(key, []) if run["job_id"] != job_id]
        out: dict[str, float] = {}
        for name in _PARTS:
            vals = [run["metrics"][name] for run in runs if run["metrics"].get(name) is not None]
            center = median(vals) if len(vals) >= self.min_runs else None
            if center is not None:
                out[name] = center
        return out

    def _add_run(self, key: str, run: dict[str, Any]) -> None:
        """Keep the newest `max_runs` runs of a key, one per job, in completion order (the same
        whichever order the runs arrive in)."""
        runs = [r for r in self.baselines_by_key.get(key, []) if r["job_id"] != run["job_id"]]
        runs.append(run)
        runs.sort(key=lambda r: (r["end"], r["job_id"]))
        self.baselines_by_key[key] = runs[-self.max_runs :]

    def drain_learned(self) -> list[dict[str, Any]]:
        """Runs committed since the last call, as `BaselineRun` records for the other job stages."""
        out, self.learned = self.learned, []
        return out

    def adopt(self, record: dict[str, Any]) -> None:
        """A run another job-stage partition committed (a `BaselineRun`)."""
        if record.get("job_id") in self.jobs:
            return  # this engine judges (or judged) the job itself: its own summary counts
        self._add_run(
            str(record["baseline_key"]),
            {
                "job_id": record["job_id"],
                "run_id": record.get("run_id", ""),
                "end": int(record["ts"]),
                "windows": int(record["windows"]),
                "metrics": dict(record["metrics"]),
            },
        )

    # -- export ------------------------------------------------------------------------
    def baselines(self) -> list[dict[str, Any]]:
        """One row per baseline key and metric: median, MAD and the runs behind them."""
        out = []
        for key in sorted(self.baselines_by_key):
            runs = self.baselines_by_key[key]
            for m in self.metrics:
                vals = [run["metrics"][m] for run in runs if run["metrics"].get(m) is not None]
                if not vals:
                    continue
                out.append(
                    {
                        "baseline_key": key,
                        "metric": m,
                        "median": median(vals),
                        "mad": mad(vals),
                        "runs": len(vals),
                        "run_ids": [run["run_id"] for run in runs if run["metrics"].get(m) is not None],
                        "usable": len(vals) >= self.min_runs,
                    }
                )
        return out

    # -- state -------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able state: the baselines (kept across restarts) and per-job buffers."""
        return {
            "baselines": {k: self.baselines_by_key[k] for k in sorted(self.baselines_by_key)},
            "jobs": {k: self.jobs[k] for k in sorted(self.jobs)},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        self.baselines_by_key = {k: list(v) for k, v in state.get("baselines", {}).items()}
        self.jobs = {k: dict(v) for k, v in state.get("jobs", {}).items()}

    def forget_job(self, job_id: str) -> None:
        """Drop a finished job's buffers (its summary, if it completed, is already committed)."""
        self.jobs.pop(job_id, None)


def _step_parts(r: dict[str, Any]) -> dict[str, float]:
    """A window's step split into seconds per step: GPU compute, data wait, communication, other."""
    step = r.get("step_time_s")
    names = ("gpu_idle_frac", "idle_data_wait_frac", "idle_comm_frac", "idle_other_frac")
    fracs = [r.get(n) for n in names]
    if step is None or step != step or any(f is None or f != f for f in fracs):
        return {}
    idle, wait, comm, other = (float(f or 0.0) for f in fracs)
    return {
        "part_compute_s": max(0.0, 1.0 - idle) * step,
        "part_data_wait_s": wait * step,
        "part_comm_s": comm * step,
        "part_other_s": other * step,
    }


def _layer(metric: str, r: dict[str, Any], base: dict[str, float]) -> tuple[str, str]:
    """The layer a deviating metric points to, and the evidence in words ('' when it is the metric)."""
    if metric == "data_wait_frac":
        return "data", ""
    if metric in ("gpu_util_pct", "power_w"):
        return "gpu", ""
    if metric not in _STEP_METRICS:
        return "unknown", ""
    parts = _step_parts(r)
    if not parts:
        return "unknown", ""
    if all(name in base for name in parts):
        # The part of the step that grew the most against the baseline runs' same part.
        name = max(parts, key=lambda n: (parts[n] - base[n], n))
        grew = parts[name] - base[name]
        if grew > 0:
            return _PARTS[name], f"{_PART_WORDS[name]} per step {parts[name]:.3g}s vs {base[name]:.3g}s"
    # No parts in the baseline (runs learned before they were kept): where the slow step goes.
    name = max(parts, key=lambda n: (parts[n], n))
    return _PARTS[name], f"{_PART_WORDS[name]} is {parts[name] / (r['step_time_s'] or 1):.0%} of the step"
