"""What healthy runs of one GPU class do: a value learned per GPU class from completed runs (issue 35.1).

Not a rule itself: `gpu_memory_pressure` learns how full healthy runs fill each GPU class's memory
(each run's peak), `gpu_throttling` how low their SM clock runs while a counted clock-event
reason is set (each run's 5th percentile), and each uses the learned value instead of its shipped
knob where that is looser and no configuration or override set the knob.

Per running job, each GPU sample's value goes into a fixed-size summary (a running maximum, or a
100-bin histogram of ratios for a low percentile): bounded whatever the job's length. When the
job completes (JobStateChanged `completed`) the summary becomes one run of its GPU class (the
job's JobStarted `gpu_class`): a run that completed shows the level did not break it, even if the
shipped knob paged it (else a class that runs at 98 % by design could never be learned). A failed,
cancelled or preempted run teaches nothing. The newest `max_runs` runs of a class are kept (one
per job, ordered by completion time then job id: the same however records interleave); the
learned value is the median over them, so one odd run does not move it. A class is learned from
`min_runs` runs on. Everything is event time; the state is plain JSON in the owning detector's
snapshot.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from schemas.records import Event
from streams.detectors.base import Finding, Topology, module_defaults
from streams.detectors.infra_signal import GpuDetector

__all__ = ["ClassNormals"]

_BINS = 100  # histogram bins over [0, 1] for a low percentile of a ratio
_MAX_JOBS = 10_000  # running jobs summarised at once (the engine's own job cap)
_MAX_CLASSES = 256  # GPU classes remembered (a class name is a job's claim: bounded)


class ClassNormals:
    """One learned value per GPU class: the median of run peaks (`max`) or of runs' 5th percentiles (`low`)."""

    def __init__(
        self, how: Literal["max", "low"], *, min_runs: int = 3, max_runs: int = 20, min_samples: int = 10
    ):
        self.how = how
        self.min_runs = max(1, min_runs)
        self.max_runs = max(self.min_runs, max_runs)
        self.min_samples = max(1, min_samples)
        self.jobs: dict[str, dict[str, Any]] = {}  # job id -> {"n", "max" | "bins"}
        self.classes: dict[str, list[list[Any]]] = {}  # gpu class -> [[end ts, job id, value], ...]

    # -- per job ------------------------------------------------------------------------
    def add(self, job_id: str, value: float) -> None:
        """One sample's value for a running job (a ratio in [0, 1] for `low`)."""
        if not math.isfinite(value):
            return
        job = self.jobs.get(job_id)
        if job is None:
            if len(self.jobs) >= _MAX_JOBS:
                return
            job = self.jobs[job_id] = {"n": 0}
            if self.how == "max":
                job["max"] = value
            else:
                job["bins"] = [0] * _BINS
        job["n"] += 1
        if self.how == "max":
            job["max"] = max(job["max"], value)
        else:
            job["bins"][min(_BINS - 1, max(0, int(value * _BINS)))] += 1

    def completed(self, job_id: str, gpu_class: str, ts: int) -> None:
        """The job completed: a healthy run with enough samples becomes one run of its class."""
        job = self.jobs.pop(job_id, None)
        if job is None or job["n"] < self.min_samples or not gpu_class:
            return
        value = job["max"] if self.how == "max" else _low(job["bins"], job["n"])
        runs = [run for run in self.classes.get(gpu_class, []) if run[1] != job_id]
        if gpu_class not in self.classes and len(self.classes) >= _MAX_CLASSES:
            return
        runs.append([int(ts), job_id, round(float(value), 4)])
        runs.sort(key=lambda run: (run[0], run[1]))
        self.classes[gpu_class] = runs[-self.max_runs :]

    def forget(self, job_id: str) -> None:
        """A job that ended otherwise (failed, cancelled): nothing learned from it."""
        self.jobs.pop(job_id, None)

    # -- what was learned ---------------------------------------------------------------
    def learned(self, gpu_class: str) -> tuple[float, int] | None:
        """(value, runs) for a class learned from at least `min_runs` runs, else None."""
        runs = self.classes.get(gpu_class) or []
        if len(runs) < self.min_runs:
            return None
        values = sorted(float(run[2]) for run in runs)
        mid = len(values) // 2
        center = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
        return center, len(runs)

    # -- state --------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able state (sorted: deterministic bytes)."""
        return {
            "jobs": {k: self.jobs[k] for k in sorted(self.jobs)},
            "classes": {k: self.classes[k] for k in sorted(self.classes)},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()` (an older snapshot without it: nothing learned yet)."""
        self.jobs = {str(k): dict(v) for k, v in (state.get("jobs") or {}).items()}
        self.classes = {str(k): [list(run) for run in v] for k, v in (state.get("classes") or {}).items()}


def _low(bins: list[int], n: int) -> float:
    """The 5th percentile of the histogrammed ratios (the lower edge of its bin)."""
    target = max(1, math.ceil(0.05 * n))
    seen = 0
    for i, count in enumerate(bins):
        seen += count
        if seen >= target:
            return i / _BINS
    return 1.0


class LearningGpuDetector(GpuDetector):
    """A per-GPU rule whose limit (a ratio) a GPU class's healthy runs can loosen: a job's end
    teaches its class (completed) or nothing (failed, cancelled, preempted).

    The subclass names the knob it learns (`learned_knob`), how (`learns`: "max", a ceiling the
    class's healthy peaks may raise; "low", a floor their low values may lower) and the prefix of
    its knobs (`<learn_prefix>_sustain_s`, how long the limit must be broken to fire; `_learn_runs`,
    `_learn_margin`, and the bound `_learn_max` for a ceiling or `_learn_min` for a floor). Its
    invariant has the fields `ratio_pct` and `why`.
    """

    reads: ClassVar[frozenset[str] | None] = frozenset({"GpuSample", "JobStateChanged"})
    learned_knob: ClassVar[str] = ""
    learns: ClassVar[Literal["max", "low"]] = "max"
    learn_prefix: ClassVar[str] = ""
    history_metric: ClassVar[str] = ""  # the metric its findings' history holds

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p, prefix = self.p, self.learn_prefix
        self._ratio = float(p[self.learned_knob])
        self._sustain = int(float(p[f"{prefix}_sustain_s"]) * 1000)
        # Learned only where nobody set the knob (its value is the shipped default).
        self._learn = self._ratio == (module_defaults(type(self)) or {})[self.learned_knob]
        self._margin = float(p[f"{prefix}_learn_margin"])
        self._bound = float(p[f"{prefix}_learn_{'max' if self.learns == 'max' else 'min'}"])
        self.normals = ClassNormals(self.learns, min_runs=int(p[f"{prefix}_learn_runs"]))

    def limit(self, gpu_class: str) -> tuple[float, str]:
        """The limit a job of `gpu_class` is held to, and where it comes from ("" = the knob): its
        class's healthy runs widened by the margin and held to the bound, where that is looser."""
        learned = self.normals.learned(gpu_class) if self._learn and gpu_class else None
        if learned is not None:
            if self.learns == "max":
                value = min(self._bound, learned[0] + self._margin)
                looser = value > self._ratio
            else:
                value = max(self._bound, learned[0] - self._margin)
                looser = value < self._ratio
            if looser:
                return value, f"learned from {learned[1]} healthy runs of {gpu_class}"
        return self._ratio, ""

    def limit_finding(
        self,
        node: str,
        uuid: str,
        g: dict[str, Any],
        ts: int,
        active: bool,
        cond: dict[str, Any],
        **evidence: Any,
    ) -> Finding:
        """The rule's finding about a GPU whose condition `cond` (`since`, `ratio`, and the `limit`
        it was judged by with `why`) holds or ended: the limit is the invariant's and the expected value."""
        limit = cond.get("limit", self._ratio)
        return self.gpu_finding(
            self.declared,
            node,
            uuid,
            g,
            ts,
            active=active,
            since=cond["since"],
            invariant=self.declared.says(
                ratio_pct=round(100 * limit, 2), why=f" ({cond['why']})" if cond.get("why") else ""
            ),
            observed=cond["ratio"],
            expected=limit,
            history_metric=self.history_metric,
            sustain_ms=self._sustain,
            **evidence,
        )

    def learned_knobs(self, gpu_class: str) -> dict[str, tuple[float, str]]:
        """The knobs a job of `gpu_class` gets from what its class taught (for `rules explain`)."""
        value, why = self.limit(gpu_class)
        return {self.learned_knob: (value, why)} if why else {}

    def observe(self, event: Event) -> list[Finding]:
        """GpuSamples are judged; a job's end teaches its GPU class (completed) or nothing (otherwise)."""
        if event.type == "JobStateChanged":
            r = event.record
            job = self.topology.jobs.get(r["job_id"])
            if r["state"] == "completed":
                self.normals.completed(r["job_id"], job.gpu_class if job else "", r["ts"])
            elif r["state"] in ("failed", "cancelled", "preempted"):
                self.normals.forget(r["job_id"])
            return []
        return super().observe(event)

    def state(self) -> dict[str, Any]:
        """Per GPU, and what each GPU class taught."""
        return {**super().state(), "learned": self.normals.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`."""
        super().load_state(state)
        self.normals.load_state(state.get("learned") or {})

    def forget_job(self, job_id: str) -> None:
        """A job that ended: its unfinished summary goes (a completed one was taken at its end)."""
        self.normals.forget(job_id)
