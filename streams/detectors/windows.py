"""Imbalance windows: the per-job state, summary buckets and window statistics that the straggler,
GPU-imbalance and network rules are decided on (`imbalance.py` describes the rules together).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from schemas.records import Event
from streams.detectors.base import Finding, JobAndHostDetector, JobInfo
from streams.detectors.changepoint import RelativeSpeedCusum
from streams.detectors.stats import finite, median, stat_mean, stat_median, stat_packed, weighted_median

__all__ = ["DEFAULTS", "ImbalanceWindows", "baseline_key"]

DEFAULTS: dict[str, Any] = {
    "window_s": 60.0,  # window length
    "hop_s": 30.0,  # a window closes every hop
    "min_steps": 5,  # a rank needs this many steps in a window for its window score (derived stats)
    "straggler_threshold": 0.75,  # a bucket's straggler_score below this is a low bucket
    "straggler_buckets": 3,  # consecutive low scored buckets before a rank (or node) is a straggler
    "clear_buckets": 3,  # buckets in a row back in line before a straggler or network alert resolves
    "cusum_skip_buckets": 6,  # first scored buckets of a rank (warm-up) that teach and judge nothing
    "cusum_learn_buckets": 12,  # scored buckets that learn each rank's normal score (CUSUM reference)
    "cusum_slack": 0.12,  # score shortfall below the rank's normal tolerated forever (CUSUM k; real ranks wander +-10 %)
    "cusum_threshold": 0.3,  # accumulated shortfall that makes a straggler (CUSUM h)
    "cusum_min_buckets": 3,  # buckets of evidence an alarm needs at least (one adds <= h / this)
    "cusum_sigma_slack": 2.0,  # k is at least this many robust sigmas of the learned scores...
    "cusum_sigma_threshold": 8.0,  # ...and h at least this many (noisy ranks need more evidence)
    "waited_for_share": 0.5,  # peers must wait for a slow rank: its comm_s below theirs by this share of its extra busy time
    "cross_rank_excess": 0.15,  # DDP: a rank whose unoverlapped work or GPU-busy time is >= 1.15x the others' median...
    "cross_rank_z": 5.0,  # ...and this many robust sigmas of the ranks' spread above it...
    "cross_rank_buckets": 6,  # ...in this many buckets (30 s): straggler (cross-rank path; 2 ranks at least)
    "cross_rank_min_ranks": 8,  # ranks from which that spread is estimated (fewer: the excess alone)
    "imbalance_metrics": ["gpu_util_pct", "power_w", "mem_used_frac"],  # compared across the job's GPUs
    "imbalance_z": 4.0,  # robust z-score beyond which a GPU is out of line
    "imbalance_min_rel": 0.15,  # ...and at least this relative distance from the peers' median
    "imbalance_windows": 2,  # consecutive windows out of line before gpu_imbalance
    "imbalance_min_gpus": 4,  # fewer GPUs than this: no peer comparison
    "network_skip_buckets": 6,  # first buckets of a job (warm-up) that teach the network normal nothing
    "network_learn_buckets": 18,  # buckets that learn the job's normal communication time
    "network_ratio": 1.5,  # communication this many times its normal is degraded...
    "network_min_increase_s": 0.05,  # ...and at least this many seconds more per step
    "network_slack": 0.22,  # log growth of communication tolerated forever (ln 1.25; CUSUM k)
    "network_threshold": 1.2,  # accumulated log growth that makes network_degradation (CUSUM h)
    "network_min_buckets": 4,  # buckets of evidence it needs at least (one adds <= h / this)
    # Corroborated by the host: a job node with InfiniBand port errors or elevated TCP retransmits
    # (what names the node) lets less job-side evidence page, so a port that degrades gradually is
    # paged while it degrades, not once it is twice as slow.
    "network_corroborated_ratio": 1.25,  # with a node at fault, communication this many times normal is degraded
    "network_corroborated_slack": 0.095,  # its CUSUM's k: log growth tolerated (ln 1.1; at least the learned 1.5 sigma)
    "network_corroborated_threshold": 0.6,  # its CUSUM's h (in at least network_min_buckets buckets)
    "retrans_factor": 5.0,  # a node retransmitting this many times its peers' median is named
    "retrans_min_per_s": 50.0,  # ...with at least this many retransmitted segments per second
    "ib_min_errors": 10.0,  # a node counting this many InfiniBand port errors in a window (and retrans_factor x its peers) is named first
    "history_points": 10,  # points of metric history carried on a gpu_imbalance finding (one per window)
    # ...and on a straggler or network_degradation finding (one per 5 s bucket: 6 minutes, so the
    # alert page's chart covers a typical episode from before it fired, not its last 50 s)
    "bucket_history_points": 72,
}

# NVML clock-event reasons worth quoting when a GPU is slow.
_THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}

# A rank's steps over one summary bucket: a tuple of numbers, strings and packed Stats
# (`streams.summary.PackedStat`), which the cyclic collector stops tracking (a 16k-rank job holds
# 200,000 of them per 60 s window); after a snapshot's JSON round trip, lists of the same items.
_TS, _RANK, _BUSY, _COMPUTE, _WAIT, _COMM, _STEP_TIME, _TOKENS, _SAMPLES, _LOSS, _STEP, _N, _ATTR = range(13)
# A rank's GPU over one bucket.
_G_TS, _G_RANK, _G_UTIL, _G_POWER, _G_CLOCK, _G_REASONS, _G_MEM = range(7)


def baseline_key(job: JobInfo) -> str:
    """Workload family | model version | GPU class | node count | batch | sequence length, then
    the parallel layout (DP/TP/PP/EP sizes, ZeRO stage, sharding) and the data path (dataset
    version @ storage tier) where the job names them: a run is compared only with runs laid out and
    fed the same way (a TP=8 run is not a slow TP=4 run). A job naming neither keeps the six-part key."""
    parts = [
        job.workload_family or job.model_name or "unknown",
        job.model_version or "-",
        job.gpu_class or "-",
        f"{len(job.nodes)}n",
        f"bs{job.global_batch_size}" if job.global_batch_size is not None else "bs-",
        f"seq{job.seq_len}" if job.seq_len is not None else "seq-",
    ]
    layout = _layout(job)
    if layout:
        parts.append(layout)
    if job.dataset_version or job.storage_tier:
        parts.append(f"data:{job.dataset_version or '-'}@{job.storage_tier or '-'}")
    return "|".join(parts)


def _layout(job: JobInfo) -> str:
    """`dp64.tp8.pp2.ep4.z3.fsdp:FULL_SHARD`, the sizes and stage the job named ("" if none)."""
    sizes = [
        f"{name}{value}"
        for name, value in (
            ("dp", job.data_parallel),
            ("tp", job.tensor_parallel),
            ("pp", job.pipeline_parallel),
            ("ep", job.expert_parallel),
            ("z", job.zero_stage),
        )
        if value is not None
    ]
    if job.sharding:
        sizes.append(job.sharding)
    return ".".join(sizes)


def _opt_sum(*values: float | None) -> float | None:
    if any(v is None for v in values):
        return None
    return math.fsum(v for v in values if v is not None)


def _med(stat: dict[str, Any] | Sequence[Any] | None) -> float | None:
    """One bucket's median, of a Stat or a packed one: `stat_median([stat])` without building the
    lists (the median of a Stat's values is the `med` the summary computed from the same values)."""
    if not stat:
        return None
    return float(stat["med"] if isinstance(stat, dict) else stat[4])


def _throttle_names(mask: int) -> list[str]:
    return [name for bit, name in sorted(_THROTTLE_BITS.items()) if mask & bit]


class ImbalanceWindows(JobAndHostDetector):
    """Per-job window state and statistics, and the summary buckets the imbalance rules are decided on."""

    def __init__(self, topology: Any, params: dict[str, Any] | None = None) -> None:
        super().__init__(topology, params)
        p = {**DEFAULTS, **self.params}
        self.window_ms = int(float(p["window_s"]) * 1000)
        self.hop_ms = int(float(p["hop_s"]) * 1000)
        if self.hop_ms <= 0 or self.window_ms < self.hop_ms:
            raise ValueError("imbalance: hop_s must be > 0 and window_s >= hop_s")
        self.min_steps = int(p["min_steps"])
        self.threshold = float(p["straggler_threshold"])
        self.straggler_buckets = int(p["straggler_buckets"])
        self.clear_buckets = max(1, int(p["clear_buckets"]))
        h = float(p["cusum_threshold"])
        self.cusum = RelativeSpeedCusum(
            skip_windows=int(p["cusum_skip_buckets"]),
            learn_windows=int(p["cusum_learn_buckets"]),
            slack=float(p["cusum_slack"]),
            threshold=h,
            sigma_slack=float(p["cusum_sigma_slack"]),
            sigma_threshold=float(p["cusum_sigma_threshold"]),
            max_step=h / max(1, int(p["cusum_min_buckets"])),
            clear_after=self.clear_buckets,
        )
        self.waited_share = float(p["waited_for_share"])
        self.cross_excess = float(p["cross_rank_excess"])
        self.cross_z = float(p["cross_rank_z"])
        self.cross_buckets = int(p["cross_rank_buckets"])
        self.cross_min_ranks = int(p["cross_rank_min_ranks"])
        self.imb_metrics = [str(m) for m in p["imbalance_metrics"]]
        self.imb_z = float(p["imbalance_z"])
        self.imb_rel = float(p["imbalance_min_rel"])
        self.imb_windows = int(p["imbalance_windows"])
        self.imb_min_gpus = int(p["imbalance_min_gpus"])
        self.net_skip = int(p["network_skip_buckets"])
        self.net_learn = int(p["network_learn_buckets"])
        self.net_ratio = float(p["network_ratio"])
        self.net_min_inc = float(p["network_min_increase_s"])
        self.net_slack = float(p["network_slack"])
        self.net_h = float(p["network_threshold"])
        self.net_max_step = self.net_h / max(1, int(p["network_min_buckets"]))
        self.net_c_ratio = float(p["network_corroborated_ratio"])
        self.net_c_slack = float(p["network_corroborated_slack"])
        self.net_c_h = float(p["network_corroborated_threshold"])
        self.net_c_max_step = self.net_c_h / max(1, int(p["network_min_buckets"]))
        self.retrans_factor = float(p["retrans_factor"])
        self.retrans_min = float(p["retrans_min_per_s"])
        self.ib_min_errors = float(p["ib_min_errors"])
        self.history_points = int(p["history_points"])
        self.bucket_history_points = int(p["bucket_history_points"])
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
                **self._fresh_job_fields(),
            }
            self.jobs[job_id] = job
        return job

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore from `state()`; a snapshot from before the per-bucket rules (issue 20.1) is migrated,
        and one whose rows hold Stat dicts (before packed Stats) has them packed."""
        super().load_state(state)
        for job in self.jobs.values():
            job["steps"] = [_packed_row(row, _STEP_STATS) for row in job.get("steps", [])]
            job["gpu"] = [_packed_row(row, _GPU_STATS) for row in job.get("gpu", [])]
            if "seq" in job:
                continue
            # Window-era state: its window rows and GPU imbalance carry over; a straggler firing then
            # stays firing under the new test (threshold path on) until 3 buckets clear it.
            fresh = self._fresh_job_fields()
            for key in (
                "low",
                "straggler",
                "score_hist",
                "cusum",
                "node_straggler",
                "node_low",
                "net_learn",
                "net_high",
            ):
                old = job.pop(key, None)
                if key == "straggler" and old:
                    for rank, since in old.items():
                        fresh["seq"][rank] = {
                            **_new_seq(self.cusum),
                            "t": True,
                            "since": int(since),
                            "summary": f"rank {rank} is a straggler (carried over from a restored snapshot)",
                        }
                elif key == "node_straggler" and old:
                    for node, since in old.items():
                        fresh["node_seq"][node] = {**_new_seq(self.cusum), "t": True, "since": int(since)}
            fresh["net_hist"] = job.get("net_hist", [])
            fresh["net_active"] = job.get("net_active")
            job.update({**fresh, "imb": job.get("imb", {}), "imb_active": job.get("imb_active", {})})

    def _fresh_job_fields(self) -> dict[str, Any]:
        """A job's per-bucket state, empty."""
        return {
            # str(bucket start) -> [[rank, node, busy, compute, wait, comm, bucket ms, steps, forward,
            # backward, optimizer, GPU busy]] (medians per step; older snapshots' rows stop earlier)
            "bucket": {},
            "decided": None,  # start of the newest bucket decided
            "run": "",  # run id the sequential states belong to (a new run starts them afresh)
            "seq": {},  # str(rank) -> sequential test state (see _judge)
            "node_seq": {},  # node -> sequential test state of the node's fastest rank
            "imb": {},  # gpu_uuid -> consecutive out-of-line windows
            "imb_active": {},  # gpu_uuid -> since
            "imb_hist": {},  # gpu_uuid -> recent [window end, value] while out of line
            "net": {"n": 0, "learn": [], "normal": None, "k": None, "s": 0.0, "start": None, "ok": 0},
            "net_active": None,  # [since, node, signal]
            "net_hist": [],
        }

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
            busy, compute, wait, comm = (
                stat_packed(r.get(f)) for f in ("busy_s", "compute_s", "data_wait_s", "comm_s")
            )
            if job["decided"] is None or ts > job["decided"]:
                # Kept apart until the bucket is decided (the window rows below are pruned per hop).
                # One bucket's median is its Stat's `med` (`stat_median` of one Stat gives it too).
                job["bucket"].setdefault(str(ts), []).append(
                    [
                        rank,
                        r.get("node") or "",
                        _med(busy),
                        _med(compute),
                        _med(wait),
                        _med(comm),
                        int(r["ts"]) - ts,
                        int(r["steps"]),
                        _med(r.get("forward_s")),
                        _med(r.get("backward_s")),
                        _med(r.get("optimizer_s")),
                        _gpu_busy(r),
                    ]
                )
            job["steps"].append(
                (
                    ts,
                    rank,
                    busy,
                    compute,
                    wait,
                    comm,
                    stat_packed(r.get("step_time_s")),
                    r.get("tokens"),
                    r.get("samples"),
                    stat_packed(r.get("loss")),
                    r.get("last_step"),
                    int(r["steps"]),
                    (r["attr_step_time_s"], r["attr_idle_s"], r["attr_wait_s"], r["attr_comm_s"]),
                )
            )
        if r.get("gpu_n") and r["job_id"] in self.jobs:
            self.jobs[r["job_id"]]["gpu"].append(
                (
                    ts,
                    rank,
                    stat_packed(r.get("gpu_util_pct")),
                    stat_packed(r.get("power_w")),
                    stat_packed(r.get("sm_clock_mhz")),
                    r.get("throttle_reasons") or 0,
                    stat_packed(r.get("mem_frac")),
                )
            )
        return []

    def drain_derived(self) -> list[Event]:
        """RankWindowStats / JobWindowStats of the windows closed since the last call."""
        out, self._derived = self._derived, []
        return out

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
            (_rate(s[_WAIT][1] if s[_WAIT] else None, s[_STEP_TIME]), _steps_in(s)) for s in steps
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


def _new_seq(cusum: RelativeSpeedCusum) -> dict[str, Any]:
    """A rank's (or node's) sequential test state: the CUSUM's, the threshold path's, the alert's."""
    return {"c": cusum.new_state(), "low": 0, "from": None, "t": False, "ok": 0, "since": None}


def _pre_sync(row: list[Any]) -> float | None:
    """A bucket row's work before its first wait: median forward plus data wait (older snapshots' rows hold no forward)."""
    value = row[8] if len(row) > 8 else None
    if value is None or value <= 0:
        return None
    return float(value) + float(row[4] or 0.0)


def _gpu_busy(r: dict[str, Any]) -> float | None:
    """A rank's GPU-busy seconds per step over a bucket: its GPM SM activity times its median step
    time (None without GPM samples or steps). NVML's utilisation counts a spinning NCCL kernel as
    busy; SM activity does not, so a rank its peers wait for is the busiest."""
    active, step_time = _med(r.get("sm_active_pct")), _med(r.get("step_time_s"))
    if active is None or step_time is None or step_time <= 0:
        return None
    return float(active) / 100.0 * float(step_time)


def _unoverlapped(row: list[Any]) -> float | None:
    """A bucket row's work no peer's wait hides under DDP: data wait + forward + optimizer (the
    optimizer runs after the all-reduce; rows without it count data wait + forward)."""
    early = _pre_sync(row)
    if early is None:
        return None
    optimizer = row[10] if len(row) > 10 else None
    return early + float(optimizer or 0.0)


def _row_gpu_busy(row: list[Any]) -> float | None:
    """A bucket row's GPU-busy seconds per step (None in rows without it)."""
    value = row[11] if len(row) > 11 else None
    return None if value is None else float(value)


def _out_of_line(
    values: list[float], own: float, spread: float | None, excess: float, z: float
) -> float | None:
    """The median of a rank's peers (`values`, sorted, the rank's own included) when `own` is out of
    line with them: >= (1 + `excess`) x that median and, where the peers' robust `spread` is known,
    >= `z` spreads above it; else None. The reference leaves the rank out: in a job of 2-7 ranks a
    slow rank would pull the median half way to itself."""
    ref = _median_without(values, [own])
    if not ref or own < ref * (1.0 + excess):
        return None
    if spread is not None and own - ref < z * spread:
        return None
    return ref


def _after_pre_sync(row: list[Any]) -> float | None:
    """A bucket row's median backward plus communication: where a rank waits for a slow peer."""
    backward = row[9] if len(row) > 9 else None
    if backward is None and row[5] is None:
        return None
    return float(backward or 0.0) + float(row[5] or 0.0)


def _has_evidence(st: dict[str, Any]) -> bool:
    """Whether the test holds evidence against its rank (low buckets, an accumulated sum, a verdict)."""
    return bool(st["low"] or st["t"] or st["c"].get("s") or st["c"].get("alarm"))


def _evidence_start(st: dict[str, Any], start: int, end: int) -> int:
    """When the evidence that made the verdict began: the first low bucket's or the CUSUM's start."""
    candidates = [start]
    if st["t"] and st["from"] is not None:
        candidates.append(int(st["from"]))
    if st["c"].get("alarm") and st["c"].get("start") is not None:
        candidates.append(int(st["c"]["start"]) - (end - start))
    return min(candidates)


def _note(
    st: dict[str, Any], end: int, score: float, row: list[Any], peers: dict[str, Any], points: int
) -> None:
    """Keep the score history and the last buckets' extra data wait / compute while there is evidence."""
    if not (_has_evidence(st) or st["since"] is not None):
        return
    st["hist"] = [*st.get("hist", []), [end, round(score, 4)]][-points:]
    d_wait = (row[4] or 0.0) - (peers["wait"] or 0.0)
    d_compute = row[3] - peers["compute"] if row[3] is not None and peers["compute"] is not None else None
    own_early, ref_early = _pre_sync(row), peers.get("pre_sync")
    if own_early is not None and ref_early is not None:
        # Under DDP a slow GPU's extra compute shows in its forward only (the peers' backward
        # absorbs the rest as waiting): the larger of the two is the GPU's share.
        d_forward = own_early - ref_early - d_wait
        d_compute = d_forward if d_compute is None else max(d_compute, d_forward)
    st["why"] = [*st.get("why", []), [round(d_wait, 6), None if d_compute is None else round(d_compute, 6)]][
        -3:
    ]


def _median_without(values: list[float], removed: list[float]) -> float | None:
    """Median of the sorted multiset `values` less the sorted sub-multiset `removed`, in O(log^2 n)
    (each node of a 16k-rank job against all the others, every bucket)."""
    n = len(values) - len(removed)
    if n <= 0:
        return None

    def kth(k: int) -> float:
        lo, hi = 0, len(values) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            x = values[mid]
            if bisect_right(values, x) - bisect_right(removed, x) >= k + 1:
                hi = mid
            else:
                lo = mid + 1
        return values[lo]

    if n % 2:
        return kth(n // 2)
    return (kth(n // 2 - 1) + kth(n // 2)) / 2.0


def _history(points: Sequence[Sequence[Any]]) -> tuple[tuple[int, float], ...]:
    """A finding's metric history from the [time, value] points a rule keeps in its state."""
    return tuple((int(t), float(v)) for t, v in points)


def _named_outlier(values: dict[str, float], factor: float, minimum: float) -> str | None:
    """The node whose value stands out: the highest, at least `minimum` and `factor` times the
    median of the others (taken as 1 at least: counters of a healthy fabric sit at zero)."""
    if not values:
        return None
    worst = max(sorted(values), key=lambda n: values[n])
    others = [v for n, v in values.items() if n != worst]
    ref = median(others) if others else 0.0
    assert ref is not None
    if values[worst] >= minimum and values[worst] >= factor * max(ref, 1.0):
        return worst
    return None


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


# The items of a step row and of a GPU row that are Stats.
_STEP_STATS = frozenset({_BUSY, _COMPUTE, _WAIT, _COMM, _STEP_TIME, _LOSS})
_GPU_STATS = frozenset({_G_UTIL, _G_POWER, _G_CLOCK, _G_MEM})


def _packed_row(row: Sequence[Any], stats: frozenset[int]) -> tuple[Any, ...]:
    """A restored row as `observe` makes it: a tuple, its Stats packed (a snapshot holds lists, and
    Stat dicts before Stats were packed)."""
    return tuple(
        stat_packed(v) if i in stats else (tuple(v) if isinstance(v, list) else v) for i, v in enumerate(row)
    )


def _steps_in(row: Sequence[Any]) -> float:
    """How many steps a bucket row's step times cover."""
    st = row[_STEP_TIME]
    return float(st[0]) if st else 0.0


def _rate(amount: float | None, step_time: Sequence[Any] | None) -> float | None:
    """Per second over a bucket's steps: an amount (tokens, samples, wait) over their step time (a packed Stat)."""
    if amount is None or not step_time or not step_time[1]:
        return None
    return float(amount) / float(step_time[1])


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
