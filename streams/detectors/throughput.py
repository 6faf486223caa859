"""Self-baseline: `throughput_drop` when a run gets slower than its own recent history.

`baseline_deviation` compares a run with earlier runs of the same configuration; it says nothing
about a run that was fine a minute ago and is not now (on a real H200 a foreign process doubled
the step time, 43 -> 97 ms, for 75 s and no throughput rule fired). This detector judges every
closed window of a job (the `JobWindowStats` and `RankWindowStats` the imbalance detector
derives) against the job's own recent normal:

- the reference is the median step time (and tokens/s per GPU) of the last `history_windows`
  windows that were judged normal, once `min_history` of them exist (the first `skip_windows`
  windows of a run, its warm-up, never count);
- a window whose median step time is above `(1 + drop_ratio) x` the reference (or whose tokens/s
  is below `1 / (1 + drop_ratio)` of it) deviates; `windows` deviating windows in a row raise ONE
  alert for the job; the first window back to normal resolves it. Deviating windows never enter
  the reference, so a sustained drop does not become the new normal while it lasts;
- one window of at least `severe_ratio x` the reference is enough when every rank slowed alike
  (a 75 s episode covers one 60 s window whole and its neighbours only in part); an *uneven*
  slowdown (a rank's straggler score below `even_min_score`: some rank or node is behind) needs
  one window more than `windows`, so the straggler that explains it fires first and mutes this;
- the alert says which step segment expanded most against the reference windows (compute,
  data wait, communication, or the rest of the step: host-side work) and which infrastructure
  signal changed at the same time: the SM clock, GPU activity or power of the job's GPUs, a
  foreign process on one of its GPUs (GpuSample pids that are not the job's), the host CPU of its
  nodes. The suspected layer follows the expanded segment. When the data wait expanded and grew
  on one node's ranks alone, the alert names that node: slow storage under a node shows there,
  and a job wholly on that node has no faster peer to be a straggler against.

A step that contains a checkpoint or an evaluation is attributed to it, never read as a drop: the
detector keeps the job's recent pauses (CheckpointEvent and EvaluationEvent `started` to
`completed`/`failed`, a ValidationResult's `duration_s` before it) and takes the time a window
spent in them out of its step time (spread over the window's steps, as the step that carried the
write spread it) and out of its token rate before judging it. A window slow only by its pauses is
neither a drop nor a normal window (it never enters the reference).

Pure and deterministic: the state is a few numbers per job and window.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, JobAndHostDetector
from streams.detectors.catalogue import catalogued
from streams.detectors.stats import finite, mean, median, stat_mean

__all__ = ["DEFAULTS", "ThroughputDetector"]

DEFAULTS: dict[str, Any] = {
    "drop_ratio": 0.3,  # step time this fraction above the run's own recent normal is a drop
    "windows": 2,  # deviating windows in a row before throughput_drop fires
    "severe_ratio": 1.5,  # one window this many times the normal step time fires at once (short episodes)...
    "severe_min_steps": 5,  # ...when its ranks made this many steps (median) in it...
    "even_min_score": 0.9,  # ...and every rank slowed alike (none scores below this); uneven: one window more
    "node_share": 0.34,  # data wait grown on one node, other nodes' growth below this share of it: name the node
    "history_windows": 10,  # normal windows kept as the run's reference
    "min_history": 4,  # normal windows needed before the run is judged
    "skip_windows": 2,  # first windows of a run (warm-up) never enter the reference
    "clock_drop_ratio": 0.1,  # SM clock this fraction below the reference is a changed signal
    "util_change_pct": 15.0,  # GPU activity this many points off the reference is a changed signal
    "power_drop_ratio": 0.15,  # power this fraction below the reference is a changed signal
    "host_cpu_rise_pct": 20.0,  # host CPU this many points above the reference is a changed signal
}

_SEGMENTS = (
    ("compute", "compute (forward/backward/optimizer)", "gpu"),
    ("wait", "data wait", "data"),
    ("comm", "communication", "network"),
    ("other", "the rest of the step (host-side work)", "host"),
)
_KEEP_MS = 180_000  # raw GPU/host signals (and pauses) kept this long (a window plus slack)
_OPEN_PAUSES = (
    16  # checkpoints/evaluations kept per job: a record is a claim, what it makes us hold is capped
)


def _window_profile(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Median segments and mean GPU signals over a window's ranks, and the data wait per node."""
    step = median(finite(r.get("step_time_s") for r in ranks))
    compute = median(finite(r.get("compute_s") for r in ranks))
    wait = median(finite(r.get("data_wait_s") for r in ranks))
    comm = median(finite(r.get("comm_s") for r in ranks))
    known = [v for v in (compute, wait, comm) if v is not None]
    other = max(0.0, step - sum(known)) if step is not None and known else None
    return {
        "compute": compute,
        "wait": wait,
        "comm": comm,
        "other": other,
        "clock": mean(finite(r.get("sm_clock_mhz") for r in ranks)),
        "util": mean(finite(r.get("gpu_util_pct") for r in ranks)),
        "power": mean(finite(r.get("power_w") for r in ranks)),
        "node_wait": {node: median(finite(waits)) for node, waits in sorted(_by_node(ranks).items())},
    }


def _by_node(ranks: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Each node's ranks' data waits, in one pass (a scan of every rank per node was quadratic:
    2,048 nodes x 16,384 ranks per window)."""
    out: dict[str, list[Any]] = {}
    for r in ranks:
        node = r.get("node")
        if node:
            out.setdefault(str(node), []).append(r.get("data_wait_s"))
    return out


# The layer is the evidence's (the segment that grew, the node's signals); GPU is the usual one.
THROUGHPUT_DROP = catalogued("throughput_drop")


class ThroughputDetector(JobAndHostDetector, rule=THROUGHPUT_DROP):
    """A run against its own recent history: one `throughput_drop` per slowdown, with its cause."""

    stage: ClassVar[str] = "job"  # reads the rank stage's summaries of the job's ranks

    def configure(self, p: dict[str, Any]) -> None:
        """The knobs (DEFAULTS under the configured values) and empty state."""
        self.ratio = 1.0 + float(p["drop_ratio"])
        self.windows = int(p["windows"])
        self.severe = float(p["severe_ratio"])
        self.severe_min_steps = int(p["severe_min_steps"])
        self.even_min_score = float(p["even_min_score"])
        self.node_share = float(p["node_share"])
        self.history = int(p["history_windows"])
        self.min_history = int(p["min_history"])
        self.skip = int(p["skip_windows"])
        self.clock_drop = float(p["clock_drop_ratio"])
        self.util_change = float(p["util_change_pct"])
        self.power_drop = float(p["power_drop_ratio"])
        self.cpu_rise = float(p["host_cpu_rise_pct"])
        # self.hosts: node -> [[ts, cpu_util_pct]]

    def _job(self, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = {
                "seen": 0,  # windows seen
                "ref": [],  # normal windows: [end, step_time, tokens/s, profile, cpu, foreign]
                "ranks": {},  # str(window_end) -> RankWindowStats rows of the window being closed
                "high": 0,  # deviating windows in a row
                "first": None,  # start of the first deviating window of the current run of them
                "active": None,  # [since, first deviating window end] of an active drop
                "foreign": [],  # [[ts, rank, pid]] foreign processes seen on the job's GPUs
                "pauses": [],  # [[start, end]] recent checkpoints and evaluations (steps that carry them)
                "open": {},  # checkpoint/evaluation id -> start of one still open
            }
        return job

    # -- input -------------------------------------------------------------------------
    def observe(self, event: Event) -> list[Finding]:
        """Window statistics, plus the raw GPU and host signals that explain a drop."""
        r = event.record
        if event.type == "RankWindowStats":
            job = self._job(r["job_id"])
            job["ranks"].setdefault(str(r["window_end"]), []).append(
                {
                    k: r.get(k)
                    for k in (
                        "step_time_s",
                        "compute_s",
                        "data_wait_s",
                        "comm_s",
                        "sm_clock_mhz",
                        "gpu_util_pct",
                        "power_w",
                        "node",
                        "steps",
                        "straggler_score",
                    )
                }
            )
        elif event.type == "JobWindowStats":
            return self._window(r)
        elif event.type == "RankSummary":
            self._summary(r)
        elif event.type in ("CheckpointEvent", "EvaluationEvent", "ValidationResult"):
            self._pause(event.type, r)
        elif event.type == "JobStarted":
            self.jobs.pop(r["job_id"], None)  # a new run has a new normal
        return []

    def _summary(self, r: dict[str, Any]) -> None:
        """A node's host CPU, and a process on a rank's GPU that is none of the job's, per bucket."""
        ts = int(r["ts"])
        if r.get("rank") is None:
            cpu = stat_mean([r.get("cpu_util_pct")])
            if cpu is not None:
                rows = self.hosts.setdefault(r["node"], [])
                rows.append([int(r["bucket_start"]), cpu])
                while rows and rows[0][0] < ts - _KEEP_MS:
                    rows.pop(0)
            return
        job = self.jobs.get(r["job_id"])
        if job is None:
            return
        if r.get("foreign_pid") is not None:
            job["foreign"].append([int(r["foreign_pid_ts"]), int(r["rank"]), int(r["foreign_pid"])])
        job["foreign"] = [f for f in job["foreign"] if f[0] >= ts - _KEEP_MS]

    def _pause(self, kind: str, r: dict[str, Any]) -> None:
        """A checkpoint or an evaluation: the steps around it carry its time."""
        job = self.jobs.get(r["job_id"])
        if job is None:
            return
        job.setdefault("pauses", [])
        job.setdefault("open", {})
        ts = int(r["ts"])
        if kind == "ValidationResult":
            dur = r.get("duration_s")
            if dur:
                job["pauses"].append([ts - int(float(dur) * 1000), ts])
        else:
            ident = f"{kind}:{r.get('checkpoint_id') or r.get('evaluation_id')}"
            if r.get("phase") == "started":
                if len(job["open"]) < _OPEN_PAUSES:
                    job["open"].setdefault(ident, ts)
            elif r.get("phase") in ("completed", "failed"):
                start = job["open"].pop(ident, None)
                dur = r.get("duration_s")
                if start is None and dur:
                    start = ts - int(float(dur) * 1000)
                if start is not None:
                    job["pauses"].append([int(start), ts])
        job["pauses"] = [p for p in job["pauses"] if p[1] >= ts - _KEEP_MS][-_OPEN_PAUSES:]

    def _paused_s(self, job: dict[str, Any], start: int, end: int) -> float:
        """Seconds of the window [start, end) spent in checkpoints and evaluations (open ones to its end)."""
        spans = [*job.get("pauses", []), *([s, end] for s in job.get("open", {}).values())]
        total = 0
        for a, b in spans:
            total += max(0, min(b, end) - max(a, start))
        return min(total, end - start) / 1000.0

    # -- judgement ---------------------------------------------------------------------
    def _window(self, r: dict[str, Any]) -> list[Finding]:
        job_id, start, end = r["job_id"], int(r["window_start"]), int(r["window_end"])
        job = self._job(job_id)
        ranks = job["ranks"].pop(str(end), [])
        for key in [k for k in job["ranks"] if int(k) < end]:
            del job["ranks"][key]  # windows that never closed with a JobWindowStats
        job["seen"] += 1
        step, tps = r.get("step_time_s"), r.get("tokens_per_s_per_gpu")
        if step is None and tps is None:
            return []
        row = [
            end,
            step,
            tps,
            _window_profile(ranks),
            self._host_cpu(job_id, start, end),
            self._foreign(job, start, end),
        ]
        if job["seen"] <= self.skip:
            return []
        ref_step = median(finite(x[1] for x in job["ref"]))
        ref_tps = median(finite(x[2] for x in job["ref"]))
        if len(job["ref"]) < self.min_history or (ref_step is None and ref_tps is None):
            job["ref"] = [*job["ref"], row][-self.history :]
            return []
        slow = self._slow(step, tps, ref_step, ref_tps)
        paused = self._paused_s(job, start, end) if slow else 0.0
        if paused > 0:
            # The steps that carried a checkpoint or an evaluation: judge the window without it.
            steps = median(finite(x.get("steps") for x in ranks)) or 1.0
            net_step = None if step is None else max(0.0, step - paused / max(1.0, steps))
            span = (end - start) / 1000.0
            net_tps = None if tps is None or span - paused <= 0 else tps * span / (span - paused)
            if not self._slow(net_step, net_tps, ref_step, ref_tps):
                job["high"] = 0
                return []
        if not slow:
            job["high"] = 0
            job["ref"] = [*job["ref"], row][-self.history :]
            if job["active"] is not None:
                since = job["active"][0]
                job["active"] = None
                return [self._finding(job_id, job, row, ref_step, ref_tps, end, False, since)]
            return []
        job["high"] += 1
        if job["high"] == 1:
            job["first"] = start
        even = self._even(ranks)
        # An uneven slowdown (some rank or node behind the rest) is the rank-level rules' to name:
        # they judge windows of rank scores, which trip a window after the job's median step time
        # at the onset; one window more lets the root cause fire first and mute this symptom.
        needed = self.windows if even else self.windows + 1
        if job["high"] < needed and not (even and self._severe(step, ref_step, ranks)):
            return []
        if job["active"] is None:
            job["active"] = [job["first"] if job["first"] is not None else start]
        return [self._finding(job_id, job, row, ref_step, ref_tps, end, True, job["active"][0])]

    def _slow(
        self, step: float | None, tps: float | None, ref_step: float | None, ref_tps: float | None
    ) -> bool:
        """Whether a window's step time (or token rate) is a drop against the reference."""
        return (step is not None and ref_step is not None and step > self.ratio * ref_step) or (
            tps is not None and ref_tps is not None and ref_tps > 0 and tps < ref_tps / self.ratio
        )

    def _even(self, ranks: list[dict[str, Any]]) -> bool:
        """Every scored rank of the window kept pace with the job median (no rank or node behind)."""
        scores = finite(r.get("straggler_score") for r in ranks)
        return not scores or min(scores) >= self.even_min_score

    def _severe(self, step: float | None, ref_step: float | None, ranks: list[dict[str, Any]]) -> bool:
        """One window is enough: a large slowdown of every rank alike over a window of ordinary steps.

        A 75 s episode covers one 60 s window whole and its neighbours only in part (their
        median step stays normal), so waiting for a second window would miss it. The caller
        takes this path only for an even slowdown: when some rank or node is behind the rest,
        the rank-level rules judge it (and their root cause mutes this alert), at their own pace.
        """
        if step is None or ref_step is None or step < self.severe * ref_step:
            return False
        steps = median(finite(r.get("steps") for r in ranks))
        return steps is not None and steps >= self.severe_min_steps

    def _host_cpu(self, job_id: str, start: int, end: int) -> float | None:
        nodes = {b.node for b in self.topology.ranks_of(job_id)}
        info = self.topology.jobs.get(job_id)
        if info is not None and info.nodes:
            # The listed nodes that sent host samples (the nodes heard are capped; a listing is a claim).
            listed = info.node_set()
            nodes.update(n for n in self.hosts if n in listed)
        vals = finite(v for n in sorted(nodes) for t, v in self.hosts.get(n, []) if start <= t < end)
        return mean(vals)

    def _foreign(self, job: dict[str, Any], start: int, end: int) -> list[int] | None:
        seen = [f for f in job["foreign"] if start <= f[0] < end]
        return [int(seen[0][1]), int(seen[0][2])] if seen else None

    # -- the alert ---------------------------------------------------------------------
    def _data_node(self, job: dict[str, Any], prof: dict[str, Any]) -> tuple[str | None, float]:
        """The node whose ranks' data wait grew, when the growth sits on that node alone.

        Storage, page cache and loader workers are per node: slow storage under one node makes
        that node's ranks wait for data while the ranks elsewhere wait for them in collectives.
        """
        grown: dict[str, float] = {}
        for node, now in sorted((prof.get("node_wait") or {}).items()):
            base = median(finite((x[3].get("node_wait") or {}).get(node) for x in job["ref"]))
            if now is not None and base is not None:
                grown[node] = now - base
        if not grown:
            return None, 0.0
        top = max(sorted(grown), key=lambda n: grown[n])
        if grown[top] <= 0 or any(d > self.node_share * grown[top] for n, d in grown.items() if n != top):
            return None, 0.0
        return top, grown[top]

    def _explain(self, job: dict[str, Any], row: list[Any]) -> tuple[str, str, str, str | None]:
        """(segment clause, signals clause, suspected layer, node) of a deviating window."""
        ref = job["ref"]
        prof = row[3]
        grown: list[tuple[float, str, str]] = []
        for key, name, layer in _SEGMENTS:
            base = median(finite(x[3].get(key) for x in ref))
            now = prof.get(key)
            if base is not None and now is not None and now - base > 0:
                grown.append((now - base, name, layer))
        node = None
        if grown:
            delta, name, layer = max(grown, key=lambda g: (g[0], g[1]))
            segment = f"{name} expanded most (+{1000 * delta:.1f} ms per step)"
            if layer == "data":
                node, node_delta = self._data_node(job, prof)
                if node is not None:
                    segment += (
                        f", on the ranks of node {node} (+{1000 * node_delta:.1f} ms): suspect that node's "
                        "data path (its storage mount, page cache or loader host)"
                    )
        else:
            segment, layer = "no step segment is reported (step time only)", "unknown"
        signals: list[str] = []
        if row[5] is not None:
            signals.append(f"a foreign process (pid {row[5][1]}) on the GPU of rank {row[5][0]}")
        for key, label, unit in (
            ("clock", "SM clock", "MHz"),
            ("util", "GPU activity", "%"),
            ("power", "GPU power", "W"),
        ):
            base = median(finite(x[3].get(key) for x in ref))
            now = prof.get(key)
            if base is None or now is None or base <= 0:
                continue
            changed = (
                (key == "clock" and now < base * (1 - self.clock_drop))
                or (key == "util" and abs(now - base) >= self.util_change)
                or (key == "power" and now < base * (1 - self.power_drop))
            )
            if changed:
                signals.append(f"{label} {now:.0f} {unit} vs {base:.0f} {unit}")
        base_cpu = median(finite(x[4] for x in ref))
        if row[4] is not None and base_cpu is not None and row[4] - base_cpu >= self.cpu_rise:
            signals.append(f"host CPU {row[4]:.0f}% vs {base_cpu:.0f}%")
        clause = (
            "at the same time: " + ", ".join(signals)
            if signals
            else "no infrastructure signal changed with it"
        )
        return segment, clause, layer, node

    def _finding(
        self,
        job_id: str,
        job: dict[str, Any],
        row: list[Any],
        ref_step: float | None,
        ref_tps: float | None,
        end: int,
        active: bool,
        since: int,
    ) -> Finding:
        step, tps = row[1], row[2]
        use_step = step is not None and ref_step is not None
        observed = step if use_step else tps
        expected = ref_step if use_step else ref_tps
        node = None
        if active:
            segment, signals, layer, node = self._explain(job, row)
            if len(job["active"]) < 2:
                job["active"].append(node)  # the node named when it fired stays the alert's
            node = job["active"][1]
            if step is not None and ref_step is not None:
                what = f"step time {1000 * step:.1f} ms vs {1000 * ref_step:.1f} ms ({step / ref_step:.2f}x)"
            else:
                what = f"tokens/s per GPU {tps:.0f} vs {ref_tps:.0f}"
            summary = (
                f"job {job_id} slowed against its own last {len(job['ref'])} windows: {what}; "
                f"{segment}; {signals}"
            )
        else:
            layer = "unknown"
            summary = f"job {job_id} is back to its own normal pace"
        history = tuple(
            (int(x[0]), float(x[1] if use_step else x[2]))
            for x in job["ref"][-5:]
            if (x[1] if use_step else x[2]) is not None
        )
        return THROUGHPUT_DROP.for_job(
            job_id,
            active,
            end,
            node=node,
            since=since,
            invariant=THROUGHPUT_DROP.says(ratio=self.ratio),
            observed=observed,
            expected=expected,
            summary=summary,
            suspected_layer=layer,
            history_metric="step_time_s" if use_step else "tokens_per_s_per_gpu",
            history=(*history, (end, float(observed))) if observed is not None else history,
        )
