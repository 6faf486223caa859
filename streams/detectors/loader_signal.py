"""The machinery shared by the data-path rules: a DataLoaderSample signal judged against the run's own normal.

Not a rule itself: `data_path_slow`, `cache_hit_collapse`, `file_open_drop` and
`loader_workers_lost` subclass `LoaderSignalDetector` and say which fields they read and what a
deviation is. Per rank and run:

- every sample of a loader that delivered batches (a paused loop says nothing about its loader)
  gives each metric's value; the *recent* value is the median of the last `recent_samples`;
- the *reference* is the median of up to `history_samples` earlier values seen while the rank was
  normal, once `min_history` of them exist (the run's own baseline: no other run, GPU class or
  dataset is comparable);
- a rank is in the condition after `sustain_samples` deviating samples in a row and leaves it
  after `resolve_samples` normal ones; a new run (restart) starts over.

Naming the place: ranks in the condition are grouped by node. When at least `node_min_ranks`
ranks of a node, and at least `node_share` of the job's ranks on it, are in the condition, the
finding is one for the node (its storage, page cache or loader host), not one per rank; otherwise
each rank is named with its node and GPU. A rank's own finding fires only after `rank_sustain_s`,
so the node's other ranks, whose samples of the same interval arrive one by one, can join it
first: one incident on a node is one alert.

Whether the GPUs waited: the data wait of the rank's steps (StepCompleted `data_wait_s` over
`step_time_s`, median of the last `wait_recent_steps`, from the rank's first loader sample on)
against the same rank's normal data wait;
it waited when that grew by `wait_ratio` and by `wait_min_increase` of the step. A data-path
problem the prefetching hides is reported as `info`, one that starves the GPUs as `warning`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, PerJobDetector, Topology, module_defaults
from streams.detectors.placement import rank_place, ranks_text
from streams.detectors.stats import median

__all__ = ["LOADER_DEFAULTS", "LoaderSignalDetector"]

LOADER_DEFAULTS: dict[str, Any] = {
    "recent_samples": 3,  # the recent value is the median of this many latest samples
    "history_samples": 60,  # normal samples kept per rank and metric (the run's own baseline)
    "min_history": 10,  # normal samples needed before a rank is judged
    "sustain_samples": 3,  # deviating samples in a row before a rank is in the condition
    "resolve_samples": 3,  # normal samples in a row before it leaves it
    "node_min_ranks": 2,  # this many ranks of one node in the condition...
    "node_share": 0.5,  # ...and this share of the job's ranks on it make it the node's condition
    "wait_recent_steps": 10,  # the rank's recent data wait is the median of this many latest steps
    "wait_ratio": 2.0,  # the GPUs waited when the data wait grew by this factor...
    "wait_min_increase": 0.05,  # ...and by this fraction of the step
    "reemit_s": 60.0,  # re-report an active condition at most this often (event time)
    "rank_sustain_s": 20.0,  # a rank's own finding waits this long for its node's other ranks to join
}

_POINTS = 10  # metric history carried on a finding
_WAIT_HISTORY = 100


class LoaderSignalDetector(PerJobDetector):
    """One DataLoaderSample signal per rank against the run's own normal; see the module doc."""

    reads: ClassVar[frozenset[str] | None] = frozenset({"DataLoaderSample", "StepCompleted"})
    metrics: ClassVar[tuple[str, ...]] = ()
    needs_batches: ClassVar[bool] = True  # skip samples of a loop that received no batch

    def __init__(self, topology: Topology, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**LOADER_DEFAULTS, **(module_defaults(type(self)) or {}), **self.params}  # the subclass's own
        self.p = p
        self._recent = max(1, int(p["recent_samples"]))
        self._history = max(2, int(p["history_samples"]))
        self._min_history = max(1, int(p["min_history"]))
        self._sustain = max(1, int(p["sustain_samples"]))
        self._resolve = max(1, int(p["resolve_samples"]))
        self._node_min = max(1, int(p["node_min_ranks"]))
        self._node_share = float(p["node_share"])
        self._wait_recent = max(1, int(p["wait_recent_steps"]))
        self._wait_ratio = float(p["wait_ratio"])
        self._wait_min = float(p["wait_min_increase"])
        self._reemit_ms = int(float(p["reemit_s"]) * 1000)
        self._rank_sustain_ms = int(float(p["rank_sustain_s"]) * 1000)

    # -- what a subclass says --------------------------------------------------------------------

    def metric_value(self, metric: str, r: dict[str, Any]) -> float | None:
        """A metric's value in one DataLoaderSample (None: not measured)."""
        value = r.get(metric)
        return None if value is None else float(value)

    def reference(self, metric: str, hist: list[float], r: dict[str, Any]) -> float | None:
        """What the metric normally is for this rank (None: not known yet)."""
        return median(hist) if len(hist) >= self._min_history else None

    def deviates(self, metric: str, recent: float, ref: float) -> bool:
        """Whether the recent value is out of line with the reference."""
        raise NotImplementedError

    def describe(self, metric: str, recent: float, ref: float) -> str:
        """The deviation in words, e.g. `read latency 16 ms, 4.0x its normal 4 ms`."""
        return f"{metric} {recent:.4g} (normal {ref:.4g})"

    def layer_of(self, metric: str) -> str:
        """The suspected layer when `metric` is the one out of line."""
        return self.declared.suspected_layer

    # -- state -----------------------------------------------------------------------------------

    def new_job_state(self) -> dict[str, Any]:
        """Per rank: metric windows, runs of samples, step data wait; emitted findings by place."""
        return {"ranks": {}, "emitted": {}}

    def _rank(self, job: dict[str, Any], rank: int, run: str) -> tuple[dict[str, Any], bool]:
        """The rank's state (fresh for a new run); True when a previous run's condition just ended."""
        ranks = job["ranks"]
        state = ranks.get(str(rank))
        ended = False
        if state is not None and state["run"] != run:
            ended = bool(state["active"])
            state = None
        if state is None:
            state = ranks[str(rank)] = {
                "run": run,
                "m": {m: {"hist": [], "recent": []} for m in self.metrics},
                "dev": 0,
                "ok": 0,
                "active": False,
                "obs": None,  # [metric, recent, ref] of the worst deviation
                "points": [],
                "wait": [],
                "wait_hist": [],
            }
        return state, ended

    # -- events ----------------------------------------------------------------------------------

    def observe(self, event: Event) -> list[Finding]:
        """Steps feed the data wait; loader samples are judged."""
        if event.type == "StepCompleted":
            self._step(event.record)
            return []
        if event.type != "DataLoaderSample":
            return []
        r = event.record
        job = self._job(r["job_id"])
        rank = int(r["rank"])
        state, ended = self._rank(job, rank, r.get("run_id", ""))
        changed = ended
        if not (self.needs_batches and not r.get("batches")):
            changed = self._judge(state, r) or changed
        return self._settle(r["job_id"], job, rank, r["ts"], changed)

    def _step(self, r: dict[str, Any]) -> None:
        job = self._jobs.get(r["job_id"])
        if job is None:
            return  # no loader sample of this job yet (most jobs, every step: asked first)
        wait, total = r.get("data_wait_s"), r.get("step_time_s")
        if wait is None or not total or total <= 0 or wait != wait or total != total:
            return
        state = job["ranks"].get(str(r["rank"]))
        if state is None or state["run"] != r.get("run_id", ""):
            return  # no loader sample of this rank (and run) yet: nothing to judge its wait against
        frac = min(1.0, max(0.0, float(wait) / float(total)))
        recent: list[float] = state["wait"]
        recent.append(frac)
        if len(recent) > self._wait_recent:
            del recent[0]
        if not state["active"] and state["dev"] == 0:
            hist: list[float] = state["wait_hist"]
            hist.append(frac)
            if len(hist) > _WAIT_HISTORY:
                del hist[0]

    def _judge(self, state: dict[str, Any], r: dict[str, Any]) -> bool:
        """Update the rank's windows with one sample; True when its condition started or ended."""
        worst: list[Any] | None = None
        worst_score = 0.0
        learn: list[tuple[dict[str, Any], float]] = []
        seen = False
        for metric in self.metrics:
            value = self.metric_value(metric, r)
            if value is None or value != value:
                continue
            seen = True
            slot = state["m"][metric]
            recent: list[float] = slot["recent"]
            recent.append(value)
            if len(recent) > self._recent:
                del recent[0]
            ref = self.reference(metric, slot["hist"], r)
            if ref is None:
                learn.append((slot, value))
                continue
            now = median(recent) or 0.0
            if self.deviates(metric, now, ref):
                score = abs(now - ref) / max(abs(ref), 1e-9)
                if worst is None or score > worst_score:
                    worst, worst_score = [metric, now, ref], score
            else:
                learn.append((slot, value))
        if not seen:
            return False
        if worst is not None:
            state["dev"] += 1
            state["ok"] = 0
            state["obs"] = worst
            points: list[list[Any]] = state["points"]
            points.append([r["ts"], float(worst[1])])
            del points[:-_POINTS]
        else:
            state["ok"] += 1
            state["dev"] = 0
            if not state["active"]:
                for slot, value in learn:
                    hist: list[float] = slot["hist"]
                    hist.append(value)
                    if len(hist) > self._history:
                        del hist[0]
        if not state["active"] and state["dev"] >= self._sustain:
            state["active"] = True
            return True
        if state["active"] and state["ok"] >= self._resolve:
            state["active"] = False
            state["points"] = []
            return True
        return False

    # -- findings by place -----------------------------------------------------------------------

    def _settle(self, job_id: str, job: dict[str, Any], rank: int, ts: int, changed: bool) -> list[Finding]:
        """Bring the emitted findings of the rank's node (or of the rank alone) in line with the ranks' states."""
        if not changed and not job["emitted"]:
            return []  # nothing active anywhere in the job (every rank that turned active was emitted)
        node = rank_place(self.topology, job_id, rank).node
        ranks = job["ranks"]
        if node is None:
            members = [rank]
        else:
            members = [b.rank for b in self.topology.ranks_on_node(job_id, node)]
            if rank not in members:
                members.append(rank)
        active = [m for m in members if ranks.get(str(m), {}).get("active")]
        node_level = (
            node is not None
            and len(active) >= self._node_min
            and len(active) >= self._node_share * len(members)
        )
        wanted = {f"n:{node}"} if node_level else {f"r:{m}" for m in active}
        mine = {f"r:{m}" for m in members} | ({f"n:{node}"} if node is not None else set())
        emitted: dict[str, dict[str, Any]] = job["emitted"]
        out: list[Finding] = []
        for place in sorted((mine & set(emitted)) - wanted):
            out.append(self._finding(job_id, job, place, emitted.pop(place), ts, active=False))
        for place in sorted(wanted):
            known = emitted.get(place)
            # Between re-reports only a new verdict on the GPUs waiting is news (it sets the severity).
            if (
                known is not None
                and not changed
                and ts - known["emit"] < self._reemit_ms
                and self._waited(self._states_of(job_id, job, place))[0] == known.get("waited")
            ):
                continue
            cond: dict[str, Any] = known if known is not None else {"since": ts, "emit": ts}
            emitted[place] = cond
            cond["emit"] = ts
            cond["waited"] = self._waited(self._states_of(job_id, job, place))[0]
            out.append(self._finding(job_id, job, place, cond, ts, active=True))
        return out

    def _states_of(self, job_id: str, job: dict[str, Any], place: str) -> list[dict[str, Any]]:
        """The states of the ranks a place (`r:<rank>` or `n:<node>`) stands for: the affected ones."""
        kind, _, name = place.partition(":")
        ranks = job["ranks"]
        if kind == "r":
            return [ranks[name]] if name in ranks else []
        members = [b.rank for b in self.topology.ranks_on_node(job_id, name)]
        affected = [m for m in members if ranks.get(str(m), {}).get("active")] or members
        return [ranks[str(m)] for m in affected if str(m) in ranks]

    def _waited(self, states: list[dict[str, Any]]) -> tuple[bool | None, float | None, float | None]:
        """Whether the ranks' GPUs waited for data: (verdict, recent data wait, its normal), medians over ranks."""
        recent = [median(s["wait"]) for s in states if s["wait"]]
        normal = [median(s["wait_hist"]) for s in states if len(s["wait_hist"]) >= self._wait_recent]
        now = median([v for v in recent if v is not None])
        ref = median([v for v in normal if v is not None])
        if now is None or ref is None:
            return None, now, ref
        return now >= max(ref * self._wait_ratio, ref + self._wait_min), now, ref

    def _finding(
        self, job_id: str, job: dict[str, Any], place: str, cond: dict[str, Any], ts: int, *, active: bool
    ) -> Finding:
        kind, _, name = place.partition(":")
        states = self._states_of(job_id, job, place)
        if kind == "n":
            members = [b.rank for b in self.topology.ranks_on_node(job_id, name)]
            affected = [m for m in members if job["ranks"].get(str(m), {}).get("active")] or members
            rank: int | None = None
            where = rank_place(self.topology, job_id, None, name)
            who = (
                f"{len(affected)} of the {len(members)} ranks of job {job_id} on node {name} "
                f"(ranks {ranks_text(affected)})"
            )
            key: tuple[str, ...] = (job_id, f"node:{name}")
        else:
            rank = int(name)
            where = rank_place(self.topology, job_id, rank)
            who = f"rank {rank} of job {job_id}" + (f" on {where.words()}" if where.node else "")
            key = (job_id, name)
        obs = [s["obs"] for s in states if s["obs"] is not None]
        metric = obs[0][0] if obs else (self.metrics[0] if self.metrics else "")
        recent = median([o[1] for o in obs if o[0] == metric])
        ref = median([o[2] for o in obs if o[0] == metric])
        waited, wait_now, wait_ref = self._waited(states)
        if waited is None:
            wait_text = "unknown whether the GPUs waited (no step data wait reported)"
        elif waited:
            wait_text = f"the GPUs waited: data wait {wait_now:.0%} of the step (normal {wait_ref:.0%})"
        else:
            wait_text = (
                f"the GPUs did not wait (data wait {wait_now:.0%} of the step, normal {wait_ref:.0%}): "
                "prefetching hides it so far"
            )
        if active and recent is not None and ref is not None:
            summary = f"{self.describe(metric, recent, ref)} on {who}; {wait_text}"
        elif active:
            summary = f"{self.declared.name} on {who}; {wait_text}"
        else:
            summary = f"the data path of {who} is back to its normal"
        points = states[0]["points"] if states else []
        return self.declared.finding(
            key=key,
            active=active,
            ts=ts,
            severity="warning" if waited else "info",
            job_id=job_id,
            rank=rank,
            place=where,
            since=cond["since"],
            observed=recent,
            expected=ref,
            summary=summary,
            suspected_layer=self.layer_of(metric),
            history_metric=metric,
            history=tuple((int(t), float(v)) for t, v in points),
            # A rank alone waits for its node's other ranks (their samples of the same interval come
            # in one by one): when they join, the node's finding replaces it before it ever fires.
            sustain_ms=self._rank_sustain_ms if rank is not None else 0,
        )
