"""Rank imbalance over hopping event-time windows: `straggler`, `gpu_imbalance`, `network_degradation`.

Per job, windows of `window_s` (default 60 s) every `hop_s` (default 30 s) close when the
watermark passes their end. For each closed window:

- every rank's median *busy* time per step (compute = forward + backward + optimizer, plus data
  wait: everything but communication and checkpointing; `step_time_s` when a step has no
  segments) gives `straggler_score = job median busy / rank median busy` (1 is typical; a rank
  twice as slow scores 0.5). A rank scoring below `straggler_threshold` (0.75, as in NVIDIA's
  resiliency tooling) in `straggler_windows` consecutive windows is a straggler; so is a rank whose
  score drifted below its own normal by a sustained margin (a one-sided CUSUM per rank,
  `streams.detectors.changepoint`: 1.2-1.3x slowdowns are caught in two or three windows, long
  before they cross the threshold). Suspected layer:
  `data` when its data wait grew more than its compute, else `gpu` (the finding quotes its GPU's
  SM clock, throttle reasons and power next to its peers'). A node of two ranks or more whose
  *fastest* rank scores below the threshold against the ranks on the job's other nodes, in
  `straggler_windows` windows, is one straggler for the node (slow storage, host or NIC under it:
  half a job's ranks slow drag the job median along, so their own scores stay near 0.8); no new
  per-rank straggler is raised on its ranks while it lasts.
- every GPU bound to the job is compared with its peers on activity and power (robust z-score
  with a relative floor); one out of line for `imbalance_windows` windows is `gpu_imbalance`.
  Only windows where the job made progress count (a stalled job idles unevenly by nature).
- the job's *intrinsic* communication time -- the lowest per-rank median `comm_s`, i.e. what even
  the slowest rank waits, which a straggler does not inflate -- is compared with the job's own
  normal learned over its first `network_learn_windows` windows; sustained growth is
  `network_degradation`, naming the job node with InfiniBand port errors or else elevated TCP
  retransmits (HostSample), if any.

Each closed window also yields `RankWindowStats` per rank and one `JobWindowStats` (its
`healthy` flag is set by the engine from the alert state) via `drain_derived()`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, JobAndHostDetector, JobInfo
from streams.detectors.changepoint import RelativeSpeedCusum
from streams.detectors.stats import finite, mean, median, robust_scorer, weighted_median
from streams.summary import stat_mean, stat_median

__all__ = ["DEFAULTS", "ImbalanceDetector", "baseline_key"]

DEFAULTS: dict[str, Any] = {
    "window_s": 60.0,  # window length
    "hop_s": 30.0,  # a window closes every hop
    "min_steps": 5,  # a rank needs this many steps in a window to be scored
    "straggler_threshold": 0.75,  # straggler_score below this is a low window
    "straggler_windows": 2,  # consecutive low windows before a rank is a straggler
    "cusum_skip_windows": 2,  # first scored windows of a rank (warm-up) that teach the CUSUM nothing
    "cusum_learn_windows": 6,  # scored windows that learn each rank's normal score (CUSUM reference)
    "cusum_slack": 0.08,  # score shortfall below the rank's normal tolerated forever (CUSUM k)
    "cusum_threshold": 0.25,  # accumulated shortfall that makes a straggler (CUSUM h)
    "cusum_sigma_slack": 1.5,  # k is at least this many robust sigmas of the learned scores...
    "cusum_sigma_threshold": 6.0,  # ...and h at least this many (noisy ranks need more evidence)
    "imbalance_metrics": ["gpu_util_pct", "power_w"],  # GPU metrics compared across the job's GPUs
    "imbalance_z": 4.0,  # robust z-score beyond which a GPU is out of line
    "imbalance_min_rel": 0.15,  # ...and at least this relative distance from the peers' median
    "imbalance_windows": 2,  # consecutive windows out of line before gpu_imbalance
    "imbalance_min_gpus": 4,  # fewer GPUs than this: no peer comparison
    "network_learn_windows": 4,  # windows that learn the job's normal communication time
    "network_ratio": 1.5,  # communication this many times its normal is degraded...
    "network_min_increase_s": 0.05,  # ...and at least this many seconds more per step
    "network_windows": 2,  # consecutive degraded windows before network_degradation
    "retrans_factor": 5.0,  # a node retransmitting this many times its peers' median is named
    "retrans_min_per_s": 50.0,  # ...with at least this many retransmitted segments per second
    "ib_min_errors": 10.0,  # a node counting this many InfiniBand port errors in a window (and retrans_factor x its peers) is named first
    "history_points": 10,  # points of metric history carried on a finding
}

# NVML clock-event reasons worth quoting when a GPU is slow.
_THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}

# A rank's steps over one summary bucket (plain lists: they go into the snapshot as they are); the
# Stats are `streams.summary` ones ({n, sum, min, max, med, values}).
_TS, _RANK, _BUSY, _COMPUTE, _WAIT, _COMM, _STEP_TIME, _TOKENS, _SAMPLES, _LOSS, _STEP, _N, _ATTR = range(13)
# A rank's GPU over one bucket.
_G_TS, _G_RANK, _G_UTIL, _G_POWER, _G_CLOCK, _G_REASONS, _G_MEM = range(7)


def baseline_key(job: JobInfo) -> str:
    """Workload family | model version | GPU class | node count | batch | sequence length."""
    return "|".join(
        (
            job.workload_family or job.model_name or "unknown",
            job.model_version or "-",
            job.gpu_class or "-",
            f"{len(job.nodes)}n",
            f"bs{job.global_batch_size}" if job.global_batch_size is not None else "bs-",
            f"seq{job.seq_len}" if job.seq_len is not None else "seq-",
        )
    )


def _opt_sum(*values: float | None) -> float | None:
    if any(v is None for v in values):
        return None
    return math.fsum(v for v in values if v is not None)


def _throttle_names(mask: int) -> list[str]:
    return [name for bit, name in sorted(_THROTTLE_BITS.items()) if mask & bit]


class ImbalanceDetector(JobAndHostDetector):
    """Per-job window statistics and the rank/GPU/network imbalance rules built on them."""

    stage: ClassVar[str] = "job"  # reads the rank stage's summaries of the job's ranks

    rules: ClassVar[tuple[str, ...]] = ("straggler", "gpu_imbalance", "network_degradation")

    def __init__(self, topology: Any, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**DEFAULTS, **self.params}
        self.window_ms = int(float(p["window_s"]) * 1000)
        self.hop_ms = int(float(p["hop_s"]) * 1000)
        if self.hop_ms <= 0 or self.window_ms < self.hop_ms:
            raise ValueError("imbalance: hop_s must be > 0 and window_s >= hop_s")
        self.min_steps = int(p["min_steps"])
        self.threshold = float(p["straggler_threshold"])
        self.straggler_windows = int(p["straggler_windows"])
        self.cusum = RelativeSpeedCusum(
            skip_windows=int(p["cusum_skip_windows"]),
            learn_windows=int(p["cusum_learn_windows"]),
            slack=float(p["cusum_slack"]),
            threshold=float(p["cusum_threshold"]),
            sigma_slack=float(p["cusum_sigma_slack"]),
            sigma_threshold=float(p["cusum_sigma_threshold"]),
        )
        self.imb_metrics = [str(m) for m in p["imbalance_metrics"]]
        self.imb_z = float(p["imbalance_z"])
        self.imb_rel = float(p["imbalance_min_rel"])
        self.imb_windows = int(p["imbalance_windows"])
        self.imb_min_gpus = int(p["imbalance_min_gpus"])
        self.net_learn = int(p["network_learn_windows"])
        self.net_ratio = float(p["network_ratio"])
        self.net_min_inc = float(p["network_min_increase_s"])
        self.net_windows = int(p["network_windows"])
        self.retrans_factor = float(p["retrans_factor"])
        self.retrans_min = float(p["retrans_min_per_s"])
        self.ib_min_errors = float(p["ib_min_errors"])
        self.history_points = int(p["history_points"])
        # self.hosts: node -> [[ts, tcp_retrans_segs_s, ib_errors]] (older snapshots hold [ts, retrans])
        self._derived: list[Event] = []
        # Windows looked at by `advance` (closed or jumped over): a work counter, not state.
        self.window_iterations = 0

    # -- input -------------------------------------------------------------------------
    def _job(self, job_id: str, ts: int) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            first_end = (ts // self.hop_ms) * self.hop_ms + self.window_ms
            job = {
                "next_end": first_end,
                "steps": [],
                "gpu": [],
                "low": {},  # str(rank) -> consecutive low windows
                "straggler": {},  # str(rank) -> since ts (active stragglers)
                "score_hist": {},  # str(rank) -> recent [ts, score]
                "imb": {},  # gpu_uuid -> consecutive out-of-line windows
                "imb_active": {},  # gpu_uuid -> since
                "net_learn": [],  # intrinsic comm of the first windows
                "net_high": 0,
                "net_active": None,  # [since, node]
                "net_hist": [],
            }
            self.jobs[job_id] = job
        return job

    def observe(self, event: Event) -> list[Finding]:
        """Buffer each rank's summary (steps, GPU) and each node's (host) for the windows they fall in."""
        if event.type != "RankSummary":
            return []
        r = event.record
        ts = int(r["bucket_start"])
        rank = r.get("rank")
        if rank is None:
            retrans = stat_mean([r.get("tcp_retrans_segs_s")])
            if retrans is not None or r.get("ib_errors") is not None:
                self.hosts.setdefault(r["node"], []).append([ts, retrans, r.get("ib_errors")])
            return []
        if r.get("steps"):
            job = self._job(r["job_id"], ts)
            job["steps"].append(
                [
                    ts,
                    rank,
                    r.get("busy_s"),
                    r.get("compute_s"),
                    r.get("data_wait_s"),
                    r.get("comm_s"),
                    r.get("step_time_s"),
                    r.get("tokens"),
                    r.get("samples"),
                    r.get("loss"),
                    r.get("last_step"),
                    int(r["steps"]),
                    [r["attr_step_time_s"], r["attr_idle_s"], r["attr_wait_s"], r["attr_comm_s"]],
                ]
            )
        if r.get("gpu_n") and r["job_id"] in self.jobs:
            self.jobs[r["job_id"]]["gpu"].append(
                [
                    ts,
                    rank,
                    r.get("gpu_util_pct"),
                    r.get("power_w"),
                    r.get("sm_clock_mhz"),
                    r.get("throttle_reasons") or 0,
                    r.get("mem_frac"),
                ]
            )
        return []

    def drain_derived(self) -> list[Event]:
        """RankWindowStats / JobWindowStats of the windows closed since the last call."""
        out, self._derived = self._derived, []
        return out

    # -- windows -----------------------------------------------------------------------
    def advance(self, watermark: int) -> list[Finding]:
        """Close every window that ended at or before the watermark.

        Costs O(windows holding data), never O(event time elapsed): a window without a buffered
        row closes with no output, so the hop grid jumps straight to the first window that holds
        one (or past the watermark), whatever the gap (a multi-day pause in a replay).
        """
        out: list[Finding] = []
        for job_id in sorted(self.jobs):
            job = self.jobs[job_id]
            while job["next_end"] <= watermark:
                self.window_iterations += 1
                end = job["next_end"]
                start = end - self.window_ms
                never = watermark + self.window_ms
                earliest = min(
                    min((s[_TS] for s in job["steps"]), default=never),
                    min((g[_G_TS] for g in job["gpu"]), default=never),
                )
                if earliest >= end:
                    # This window is empty: jump (on the hop grid) to the first window that can
                    # hold the earliest buffered row, or to the first one ending past the watermark.
                    target = min(earliest, watermark)
                    job["next_end"] = end + ((target - end) // self.hop_ms + 1) * self.hop_ms
                    continue
                out.extend(self._close(job_id, job, start, end))
                job["next_end"] = end + self.hop_ms
                keep_from = job["next_end"] - self.window_ms
                job["steps"] = [s for s in job["steps"] if s[_TS] >= keep_from]
                job["gpu"] = [g for g in job["gpu"] if g[_G_TS] >= keep_from]
        oldest = min(
            (j["next_end"] - self.window_ms for j in self.jobs.values()), default=watermark - self.window_ms
        )
        for node in sorted(self.hosts):
            kept = [h for h in self.hosts[node] if h[0] >= oldest]
            if kept:
                self.hosts[node] = kept
            else:
                del self.hosts[node]
        return out

    def _close(self, job_id: str, job: dict[str, Any], start: int, end: int) -> list[Finding]:
        steps = [s for s in job["steps"] if start <= s[_TS] < end]
        gpus = [g for g in job["gpu"] if start <= g[_G_TS] < end]
        info = self.topology.jobs.get(job_id)
        by_rank: dict[int, list[list[Any]]] = {}
        for s in steps:
            by_rank.setdefault(int(s[_RANK]), []).append(s)
        gpu_by_rank: dict[int, list[list[Any]]] = {}
        for g in gpus:
            gpu_by_rank.setdefault(int(g[_G_RANK]), []).append(g)

        rank_stats: dict[int, dict[str, Any]] = {}
        for rank in sorted(by_rank):
            rows = by_rank[rank]
            g = gpu_by_rank.get(rank, [])
            rank_stats[rank] = {
                "steps": sum(int(r[_N]) for r in rows),
                "busy": stat_median([r[_BUSY] for r in rows]),
                "compute": stat_median([r[_COMPUTE] for r in rows]),
                "wait": stat_median([r[_WAIT] for r in rows]),
                "comm": stat_median([r[_COMM] for r in rows]),
                "step_time": stat_median([r[_STEP_TIME] for r in rows]),
                "util": stat_mean([x[_G_UTIL] for x in g]),
                "power": stat_mean([x[_G_POWER] for x in g]),
                "clock": stat_mean([x[_G_CLOCK] for x in g]),
                "reasons": _or_all(x[_G_REASONS] for x in g),
                "mem": stat_mean([x[_G_MEM] for x in g]),
            }
        scored = {k: v for k, v in rank_stats.items() if v["steps"] >= self.min_steps and v["busy"]}
        job_busy = median([v["busy"] for v in scored.values()]) if scored else None
        for v in rank_stats.values():
            v["score"] = (
                (job_busy / v["busy"]) if job_busy and v["busy"] and v["steps"] >= self.min_steps else None
            )

        out: list[Finding] = []
        if len(scored) >= 2:
            out.extend(self._node_stragglers(job_id, job, rank_stats, end))
            out.extend(self._stragglers(job_id, job, rank_stats, end))
            out.extend(self._network(job_id, job, rank_stats, info, start, end))
        if scored:
            out.extend(self._imbalance(job_id, job, rank_stats, end))
        self._emit_stats(job_id, info, steps, gpus, rank_stats, start, end)
        return out

    # -- straggler ---------------------------------------------------------------------
    def _stragglers(
        self, job_id: str, job: dict[str, Any], stats: dict[int, dict[str, Any]], end: int
    ) -> list[Finding]:
        out: list[Finding] = []
        job_compute = median(finite(v["compute"] for v in stats.values()))
        job_wait = median(finite(v["wait"] for v in stats.values()))
        job_clock = median(finite(v["clock"] for v in stats.values()))
        job_power = median(finite(v["power"] for v in stats.values()))
        slow_nodes = set(job.get("node_straggler", {}))
        for rank in sorted(stats):
            v = stats[rank]
            key = str(rank)
            if v["score"] is None:
                continue  # too few steps to say anything: keep the current verdict
            hist = [*job["score_hist"].get(key, []), [end, round(v["score"], 4)]][-self.history_points :]
            job["score_hist"][key] = hist
            cusum = job.setdefault("cusum", {}).setdefault(key, self.cusum.new_state())
            drift = self.cusum.update(cusum, v["score"], end)
            if v["score"] < self.threshold:
                job["low"][key] = job["low"].get(key, 0) + 1
            elif not drift:
                job["low"].pop(key, None)
                if key in job["straggler"]:
                    out.append(
                        self._straggler_finding(job_id, rank, v, end, False, "unknown", "", hist, None)
                    )
                    del job["straggler"][key]
                # A healthy rank keeps no history: snapshots stay small on big jobs.
                job["score_hist"].pop(key, None)
                continue
            if job["low"].get(key, 0) < self.straggler_windows and not drift:
                continue
            if key not in job["straggler"] and self._node_of(job_id, rank) in slow_nodes:
                continue  # one incident: the node-level straggler already names this rank's node
            d_wait = (v["wait"] or 0.0) - (job_wait or 0.0)
            d_compute = (
                (v["compute"] - job_compute) if v["compute"] is not None and job_compute is not None else None
            )
            if d_compute is None:
                layer = "data" if d_wait > 0 and v["wait"] is not None else "unknown"
            else:
                layer = "data" if d_wait > d_compute else "gpu"
            detail = self._gpu_detail(v, job_clock, job_power)
            if key not in job["straggler"]:
                job["straggler"][key] = (
                    end - self.straggler_windows * self.hop_ms - (self.window_ms - self.hop_ms)
                )
                if drift and job["low"].get(key, 0) < self.straggler_windows:
                    job["straggler"][key] = cusum["start"] - self.window_ms
            if drift and v["score"] >= self.threshold:
                detail = "; ".join(p for p in (self.cusum.describe(cusum), detail) if p)
            out.append(
                self._straggler_finding(
                    job_id, rank, v, end, True, layer, detail, hist, job["straggler"][key]
                )
            )
        return out

    def _node_of(self, job_id: str, rank: int) -> str | None:
        b = self.topology.bindings.get((job_id, rank))
        return b.node if b else None

    def _node_stragglers(
        self, job_id: str, job: dict[str, Any], stats: dict[int, dict[str, Any]], end: int
    ) -> list[Finding]:
        """A node whose every rank is slow (its storage, host, NIC): one straggler for the node.

        A per-rank score is judged against the job median, which a node holding half the job's
        ranks drags along (8 slow ranks of 16 score ~0.8, not 0.5). Here each node's *fastest*
        rank is compared with the median of the ranks on the job's other nodes: only when even
        that rank is slow is the fault the node's, not one GPU's (a node needs two ranks or more).
        """
        by_node: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for rank in sorted(stats):
            v = stats[rank]
            node = self._node_of(job_id, rank)
            if v["score"] is not None and node is not None:
                by_node.setdefault(node, []).append((rank, v))
        active: dict[str, int] = job.setdefault("node_straggler", {})
        low: dict[str, int] = job.setdefault("node_low", {})
        out: list[Finding] = []
        if len(by_node) < 2:
            return out
        for node in sorted(by_node):
            own = by_node[node]
            peers = [v for n in sorted(by_node) if n != node for _, v in by_node[n]]
            ref = median([v["busy"] for v in peers])
            if len(own) < 2 or not ref:
                continue  # one rank is the rank's straggler, not its node's; no peers, no verdict
            fastest = min(v["busy"] for _, v in own)
            score = ref / fastest
            if score < self.threshold:
                low[node] = low.get(node, 0) + 1
            else:
                low.pop(node, None)
                if node in active:
                    out.append(
                        self._node_finding(job_id, node, own, peers, score, end, False, active.pop(node))
                    )
                continue
            if low[node] < self.straggler_windows:
                continue
            if node not in active:
                active[node] = end - self.straggler_windows * self.hop_ms - (self.window_ms - self.hop_ms)
            out.append(self._node_finding(job_id, node, own, peers, score, end, True, active[node]))
        return out

    def _node_finding(
        self,
        job_id: str,
        node: str,
        own: list[tuple[int, dict[str, Any]]],
        peers: list[dict[str, Any]],
        score: float,
        end: int,
        active: bool,
        since: int,
    ) -> Finding:
        ranks = [r for r, _ in own]
        if active:
            d_wait = (median(finite(v["wait"] for _, v in own)) or 0.0) - (
                median(finite(v["wait"] for v in peers)) or 0.0
            )
            own_compute = median(finite(v["compute"] for _, v in own))
            peer_compute = median(finite(v["compute"] for v in peers))
            d_compute = (
                own_compute - peer_compute if own_compute is not None and peer_compute is not None else None
            )
            if d_compute is None:
                layer = "data" if d_wait > 0 else "unknown"
            else:
                layer = "data" if d_wait > d_compute else "gpu"
            what = {
                "data": f"its data path (the node's storage, cache or loader host): data wait "
                f"{d_wait:+.3f} s per step against the ranks on the job's other nodes",
                "gpu": f"the node's GPUs or host: compute {d_compute or 0.0:+.3f} s per step against the "
                "ranks on the job's other nodes",
            }.get(layer, "an unknown layer")
            summary = (
                f"node {node} of job {job_id} is a straggler: all its {len(ranks)} ranks "
                f"({_rank_list(ranks)}) run slower than the job's ranks on its other nodes "
                f"(score {score:.2f}); suspect {what}"
            )
        else:
            layer = "unknown"
            summary = f"node {node} of job {job_id} keeps pace again (score {score:.2f})"
        return Finding(
            rule="straggler",
            key=(job_id, f"node:{node}"),
            active=active,
            ts=end,
            category="data" if layer == "data" else "platform",
            severity="warning",
            job_id=job_id,
            node=node,
            since=since,
            invariant=(
                "every node's fastest rank scores >= "
                f"{self.threshold} against the median rank on the job's other nodes"
            ),
            observed=score,
            expected=self.threshold,
            summary=summary,
            suspected_layer=layer,
            history_metric="straggler_score",
        )

    def _gpu_detail(self, v: dict[str, Any], job_clock: float | None, job_power: float | None) -> str:
        parts = []
        if v["clock"] is not None and job_clock:
            parts.append(f"SM clock {v['clock']:.0f} MHz vs {job_clock:.0f} MHz on its peers")
        if v["reasons"]:
            parts.append("throttle reasons " + ",".join(_throttle_names(v["reasons"]) or [hex(v["reasons"])]))
        if v["power"] is not None and job_power:
            parts.append(f"power {v['power']:.0f} W vs {job_power:.0f} W")
        return "; ".join(parts)

    def _straggler_finding(
        self,
        job_id: str,
        rank: int,
        v: dict[str, Any],
        end: int,
        active: bool,
        layer: str,
        detail: str,
        hist: list[list[Any]],
        since: int | None,
    ) -> Finding:
        b = self.topology.bindings.get((job_id, rank))
        if active:
            what = "data loading" if layer == "data" else "its GPU" if layer == "gpu" else "an unknown layer"
            summary = f"rank {rank} of job {job_id} is a straggler (score {v['score']:.2f}): suspect {what}"
            if v["wait"] is not None and v["compute"] is not None:
                summary += f"; compute {v['compute']:.3f} s, data wait {v['wait']:.3f} s per step"
            if layer == "gpu" and detail:
                summary += f"; {detail}"
        else:
            summary = f"rank {rank} of job {job_id} keeps pace again (score {v['score']:.2f})"
        return Finding(
            rule="straggler",
            key=(job_id, str(rank)),
            active=active,
            ts=end,
            category="data" if layer == "data" else "platform",
            severity="warning",
            job_id=job_id,
            node=b.node if b else None,
            rank=rank,
            gpu_uuid=b.gpu_uuid if b else None,
            gpu_index=b.gpu_index if b else None,
            since=since,
            invariant=f"every rank's straggler score (job median busy time / rank busy time) stays >= {self.threshold}",
            observed=v["score"],
            expected=self.threshold,
            summary=summary,
            suspected_layer=layer,
            history_metric="straggler_score",
            history=tuple((int(t), float(s)) for t, s in hist),
        )

    # -- GPU imbalance -----------------------------------------------------------------
    def _imbalance(
        self, job_id: str, job: dict[str, Any], stats: dict[int, dict[str, Any]], end: int
    ) -> list[Finding]:
        out: list[Finding] = []
        field_of = {"gpu_util_pct": "util", "power_w": "power", "mem_used_frac": "mem"}
        bound = {r: self.topology.bindings.get((job_id, r)) for r in sorted(stats)}
        flagged: dict[str, tuple[int, str, float, float]] = {}
        for metric in self.imb_metrics:
            name = field_of.get(metric)
            if name is None:
                continue
            values = {r: v[name] for r, v in stats.items() if v[name] is not None}
            if len(values) < self.imb_min_gpus:
                continue
            peers = list(values.values())
            mid = median(peers)
            assert mid is not None
            floor = max(abs(mid) * self.imb_rel / 3.0, 1e-9)
            z_of = robust_scorer(peers, min_scale=floor)
            assert z_of is not None
            for rank in sorted(values):
                x = values[rank]
                z = z_of(x)
                if abs(z) < self.imb_z or abs(x - mid) < self.imb_rel * abs(mid):
                    continue
                b = bound.get(rank)
                uuid = b.gpu_uuid if b and b.gpu_uuid else f"rank{rank}"
                if uuid not in flagged:
                    flagged[uuid] = (rank, metric, x, mid)
        for uuid in sorted(set(job["imb"]) | set(flagged)):
            if uuid in flagged:
                job["imb"][uuid] = job["imb"].get(uuid, 0) + 1
                if job["imb"][uuid] >= self.imb_windows:
                    job["imb_active"].setdefault(uuid, end)
                    out.append(
                        self._imb_finding(job_id, uuid, flagged[uuid], end, True, job["imb_active"][uuid])
                    )
            else:
                job["imb"].pop(uuid, None)
                if uuid in job["imb_active"]:
                    rank = next((r for r, b in bound.items() if b and b.gpu_uuid == uuid), -1)
                    out.append(
                        self._imb_finding(
                            job_id, uuid, (rank, "", 0.0, 0.0), end, False, job["imb_active"].pop(uuid)
                        )
                    )
        return out

    def _imb_finding(
        self, job_id: str, uuid: str, what: tuple[int, str, float, float], end: int, active: bool, since: int
    ) -> Finding:
        rank, metric, x, mid = what
        b = self.topology.bindings.get((job_id, rank))
        return Finding(
            rule="gpu_imbalance",
            key=(job_id, uuid),
            active=active,
            ts=end,
            category="infra",
            severity="warning",
            job_id=job_id,
            node=b.node if b else None,
            rank=rank if rank >= 0 else None,
            gpu_uuid=b.gpu_uuid if b else None,
            gpu_index=b.gpu_index if b else None,
            since=since,
            invariant="the GPUs of one job show similar activity and power",
            observed=x if active else None,
            expected=mid if active else None,
            summary=(
                f"GPU {uuid} (rank {rank}) of job {job_id}: {metric} {x:.1f} vs {mid:.1f} on its peers"
                if active
                else f"GPU {uuid} of job {job_id} is in line with its peers again"
            ),
            suspected_layer="gpu",
            history_metric=metric,
        )

    # -- network -----------------------------------------------------------------------
    def _network(
        self,
        job_id: str,
        job: dict[str, Any],
        stats: dict[int, dict[str, Any]],
        info: JobInfo | None,
        start: int,
        end: int,
    ) -> list[Finding]:
        comms = finite(v["comm"] for v in stats.values() if v["steps"] >= self.min_steps)
        if len(comms) < 2:
            return []
        intrinsic = min(comms)
        job["net_hist"] = [*job["net_hist"], [end, round(intrinsic, 6)]][-self.history_points :]
        if len(job["net_learn"]) < self.net_learn:
            job["net_learn"].append(intrinsic)
            return []
        normal = median(job["net_learn"])
        assert normal is not None
        degraded = intrinsic > normal * self.net_ratio and intrinsic - normal >= self.net_min_inc
        out: list[Finding] = []
        if degraded:
            job["net_high"] += 1
            if job["net_high"] >= self.net_windows:
                node, signal = self._network_node(info, start, end)
                if job["net_active"] is None:
                    job["net_active"] = [
                        end - self.net_windows * self.hop_ms - (self.window_ms - self.hop_ms),
                        node,
                        signal,
                    ]
                elif node is not None:
                    job["net_active"][1:] = [node, signal]
                out.append(self._net_finding(job_id, job, intrinsic, normal, end, True))
        else:
            job["net_high"] = 0
            if job["net_active"] is not None:
                out.append(self._net_finding(job_id, job, intrinsic, normal, end, False))
                job["net_active"] = None
        return out

    def _network_node(self, info: JobInfo | None, start: int, end: int) -> tuple[str | None, str]:
        """The job's node whose network looks at fault: InfiniBand port errors first, then TCP retransmits."""
        nodes = sorted(
            set(info.nodes if info and info.nodes else [])
            | {b.node for b in (self.topology.ranks_of(info.job_id) if info else [])}
        )
        ib = self._ib_node(nodes, start, end)
        if ib is not None:
            return ib, "InfiniBand port errors"
        return self._retrans_node(nodes, start, end), "TCP retransmits elevated"

    def _ib_node(self, nodes: list[str], start: int, end: int) -> str | None:
        # Error counters of a healthy fabric stay at zero: the one node counting errors while its
        # peers count (almost) none is the suspect.
        errors: dict[str, float] = {}
        for node in nodes:
            vals = finite(h[2] for h in self.hosts.get(node, []) if len(h) > 2 and start <= h[0] < end)
            if vals:
                errors[node] = sum(vals)
        if not errors:
            return None
        worst = max(sorted(errors), key=lambda n: errors[n])
        others = [v for n, v in errors.items() if n != worst]
        ref = median(others) if others else 0.0
        assert ref is not None
        if errors[worst] >= self.ib_min_errors and errors[worst] >= self.retrans_factor * max(ref, 1.0):
            return worst
        return None

    def _retrans_node(self, nodes: list[str], start: int, end: int) -> str | None:
        rates: dict[str, float] = {}
        for node in nodes:
            vals = finite(h[1] for h in self.hosts.get(node, []) if start <= h[0] < end)
            m = mean(vals)
            if m is not None:
                rates[node] = m
        if not rates:
            return None
        worst = max(sorted(rates), key=lambda n: rates[n])
        others = [v for n, v in rates.items() if n != worst]
        ref = median(others) if others else 0.0
        assert ref is not None
        if rates[worst] >= self.retrans_min and rates[worst] >= self.retrans_factor * max(ref, 1.0):
            return worst
        return None

    def _net_finding(
        self, job_id: str, job: dict[str, Any], intrinsic: float, normal: float, end: int, active: bool
    ) -> Finding:
        since, node, *rest = job["net_active"]
        signal = rest[0] if rest else "TCP retransmits elevated"
        return Finding(
            rule="network_degradation",
            key=(job_id,),
            active=active,
            ts=end,
            category="infra",
            severity="warning",
            job_id=job_id,
            node=node,
            since=since,
            invariant=f"collective communication per step stays within {self.net_ratio}x of the job's normal",
            observed=intrinsic,
            expected=normal,
            summary=(
                f"job {job_id}: communication {intrinsic:.3f} s per step vs {normal:.3f} s normal"
                + (
                    f"; {signal} on {node}"
                    if node
                    else "; no node shows InfiniBand errors or elevated TCP retransmits"
                )
                if active
                else f"job {job_id}: communication back to normal ({intrinsic:.3f} s per step)"
            ),
            suspected_layer="network",
            history_metric="comm_s",
            history=tuple((int(t), float(v)) for t, v in job["net_hist"]),
        )

    # -- derived stats -----------------------------------------------------------------
    def _emit_stats(
        self,
        job_id: str,
        info: JobInfo | None,
        steps: list[list[Any]],
        gpus: list[list[Any]],
        stats: dict[int, dict[str, Any]],
        start: int,
        end: int,
    ) -> None:
        run_id = info.run_id if info else ""
        for rank in sorted(stats):
            v = stats[rank]
            b = self.topology.bindings.get((job_id, rank))
            self._derived.append(
                Event(
                    "RankWindowStats",
                    {
                        "window_start": start,
                        "window_end": end,
                        "job_id": job_id,
                        "run_id": run_id,
                        "rank": rank,
                        "node": b.node if b else None,
                        "gpu_uuid": b.gpu_uuid if b else None,
                        "steps": v["steps"],
                        "step_time_s": v["step_time"],
                        "compute_s": v["compute"],
                        "data_wait_s": v["wait"],
                        "comm_s": v["comm"],
                        "straggler_score": v["score"],
                        "gpu_util_pct": v["util"],
                        "power_w": v["power"],
                        "sm_clock_mhz": v["clock"],
                    },
                )
            )
        if not steps:
            return
        # Each bucket's rate counts as many times as it has steps: the median over the window's steps.
        tps = weighted_median((_rate(s[_TOKENS], s[_STEP_TIME]), _steps_in(s)) for s in steps)
        per_rank_sps = [
            weighted_median((_rate(s[_SAMPLES], s[_STEP_TIME]), _steps_in(s)) for s in rows)
            for rows in _group(steps).values()
        ]
        sps = finite(per_rank_sps)
        wait_frac = weighted_median(
            (_rate(s[_WAIT]["sum"] if s[_WAIT] else None, s[_STEP_TIME]), _steps_in(s)) for s in steps
        )
        scores = finite(v["score"] for v in stats.values())
        self._derived.append(
            Event(
                "JobWindowStats",
                {
                    "window_start": start,
                    "window_end": end,
                    "job_id": job_id,
                    "run_id": run_id,
                    "workload_family": info.workload_family if info else "",
                    "baseline_key": baseline_key(info) if info else "",
                    "healthy": True,
                    "ranks": len(stats),
                    "last_step": max(int(s[_STEP]) for s in steps if s[_STEP] is not None),
                    "step_time_s": median(finite(v["step_time"] for v in stats.values())),
                    "tokens_per_s_per_gpu": tps,
                    "samples_per_s": math.fsum(sps) if sps else None,
                    "data_wait_frac": wait_frac,
                    "gpu_util_pct": stat_mean([g[_G_UTIL] for g in gpus]),
                    "power_w": stat_mean([g[_G_POWER] for g in gpus]),
                    "loss": stat_median([s[_LOSS] for s in steps]),
                    "min_straggler_score": min(scores) if scores else None,
                    **_idle_attribution(steps),
                },
            )
        )


def _or_all(values: Any) -> int:
    mask = 0
    for v in values:
        mask |= int(v or 0)
    return mask


def _rank_list(ranks: list[int]) -> str:
    """`ranks 8-15`, or the ranks themselves when they are not one run."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def _group(steps: list[list[Any]]) -> dict[int, list[list[Any]]]:
    out: dict[int, list[list[Any]]] = {}
    for s in steps:
        out.setdefault(int(s[_RANK]), []).append(s)
    return out


def _steps_in(row: list[Any]) -> float:
    """How many steps a bucket row's step times cover."""
    st = row[_STEP_TIME]
    return float(st["n"]) if st else 0.0


def _rate(amount: float | None, step_time: dict[str, Any] | None) -> float | None:
    """Per second over a bucket's steps: an amount (tokens, samples, wait) over their step time."""
    if amount is None or not step_time or not step_time["sum"]:
        return None
    return float(amount) / float(step_time["sum"])


def _idle_attribution(steps: list[list[Any]]) -> dict[str, float | None]:
    """GPU idle time of a window's steps split into data wait, communication and other causes (fractions of step time)."""
    total = math.fsum(s[_ATTR][0] for s in steps)
    idle = math.fsum(s[_ATTR][1] for s in steps)
    wait = math.fsum(s[_ATTR][2] for s in steps)
    comm = math.fsum(s[_ATTR][3] for s in steps)
    if total <= 0:
        return {
            "gpu_idle_frac": None,
            "idle_data_wait_frac": None,
            "idle_comm_frac": None,
            "idle_other_frac": None,
        }
    return {
        "gpu_idle_frac": idle / total,
        "idle_data_wait_frac": wait / total,
        "idle_comm_frac": comm / total,
        "idle_other_frac": max(0.0, idle - wait - comm) / total,
    }
