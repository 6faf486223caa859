"""Rank imbalance: `straggler` and `network_degradation` per summary bucket, `gpu_imbalance` per window.

**Decided per bucket, in seconds** (issue 20.1). The job stage receives one `RankSummary` per
rank per bucket (`engine.summary_bucket_s`, 5 s). Once the watermark passes a bucket's end, every
rank with steps in it gets that bucket's *straggler score* = job median busy time / the rank's
busy time (medians of the bucket's steps; busy = forward + backward + optimizer + data wait:
everything but communication and checkpointing; `step_time_s` when a step has no segments), and
a sequential test per rank decides:

- **threshold:** a score below `straggler_threshold` (0.75, as in NVIDIA's resiliency tooling)
  in `straggler_buckets` (3) scored buckets in a row;
- **change point:** a one-sided CUSUM of the score's shortfall below the rank's own normal
  (`streams.detectors.changepoint`, learned over `cusum_learn_buckets` after
  `cusum_skip_buckets` of warm-up), one bucket adding at most `cusum_threshold /
  cusum_min_buckets`, so an alarm needs at least 3 buckets of evidence however odd one bucket is
  (a step spanning an evaluation, a bucket boundary splitting a step): a rank 1.25x slow fires on
  its third slow bucket (~15 s), 1.1x within a minute or two, a rank persistently a few percent
  slower is its own normal;
- **confirmed by the collective wait:** in synchronous training the slow rank waits least in
  the collective and its peers wait for it, so a bucket counts as evidence only when the rank's
  `comm_s` is below the job median by at least `waited_for_share` (half) of its extra busy time
  (when the job reports `comm_s`). Busy time that nobody waits for (measurement that overlaps
  the collective, an asynchronous loader) holds the job back in no way and pages no one.

The alert resolves after `clear_buckets` (3) buckets in a row back in line. Suspected layer:
`data` when its data wait grew more than its compute (over its last buckets), else `gpu` (the
finding quotes its GPU's SM clock, throttle reasons and power next to its peers'). A node of two
ranks or more whose *fastest* rank is slow against the ranks on the job's other nodes (the same
test on that score) is one straggler for the node (slow storage, host or NIC under it: half a
job's ranks slow drag the job median along, so their own scores stay near 0.8); no new per-rank
straggler is raised on a node whose own test is accumulating evidence or firing.

The job's *intrinsic* communication time per bucket -- the lowest per-rank median `comm_s`, what
even the slowest rank waits, which a straggler does not inflate -- is compared with the job's
normal learned over `network_learn_buckets` after `network_skip_buckets`: a CUSUM of its log
growth beyond `network_slack` (1.25x) reaching `network_threshold`, in at least
`network_min_buckets` (4) buckets, while the latest bucket is >= `network_ratio` (1.5x) and
`network_min_increase_s` above normal, is `network_degradation` (a 2x degradation pages ~20 s in,
1.5x ~35 s), naming the job node with InfiniBand port errors or else elevated TCP retransmits
(HostSample) over the last window, if any. While such a node exists, a second CUSUM with less
slack (`network_corroborated_slack`, ln 1.1) reaching `network_corroborated_threshold` with the
latest bucket >= `network_corroborated_ratio` (1.25x) pages too: host and job agree, so a port
degrading gradually pages while it degrades (2x over 2 min: ~45 s in, not ~75 s).

**Per window** (`window_s` 60 s every `hop_s` 30 s): every GPU bound to the job is compared with
its peers on activity, power and memory (robust z-score with a relative floor); one out of line
for `imbalance_windows` windows in which the job made progress is `gpu_imbalance`. Each closed
window also yields `RankWindowStats` per rank and one `JobWindowStats` (its `healthy` flag is set
by the engine from the alert state) via `drain_derived()`.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any, ClassVar

from schemas.records import Event
from streams.detectors.base import Finding, JobAndHostDetector, JobInfo
from streams.detectors.changepoint import RelativeSpeedCusum
from streams.detectors.stats import (
    MAD_TO_SIGMA,
    finite,
    mad,
    mean,
    median,
    robust_scorer,
    stat_mean,
    stat_median,
    stat_packed,
    weighted_median,
)

__all__ = ["DEFAULTS", "ImbalanceDetector", "baseline_key"]

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
    "imbalance_metrics": ["gpu_util_pct", "power_w"],  # GPU metrics compared across the job's GPUs
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
# (`streams.detectors.stats.PackedStat`), which the cyclic collector stops tracking (a 16k-rank job holds
# 200,000 of them per 60 s window); after a snapshot's JSON round trip, lists of the same items.
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
            "bucket": {},  # str(bucket start) -> [[rank, node, busy, compute, wait, comm, bucket ms, steps]]
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
                job["bucket"].setdefault(str(ts), []).append(
                    [
                        rank,
                        r.get("node") or "",
                        stat_median([busy]),
                        stat_median([compute]),
                        stat_median([wait]),
                        stat_median([comm]),
                        int(r["ts"]) - ts,
                        int(r["steps"]),
                        stat_median([r.get("forward_s")]),
                        stat_median([r.get("backward_s")]),
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
            for b in sorted(int(k) for k in job["bucket"]):
                rows = job["bucket"][str(b)]
                # Strictly past its end: a summary stamped with the bucket's end may still come at it.
                if b + max(int(row[6]) for row in rows) >= watermark:
                    break
                del job["bucket"][str(b)]
                job["decided"] = b
                out.extend(self._decide(job_id, job, b, b + max(int(row[6]) for row in rows), rows))
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
        if scored:
            out.extend(self._imbalance(job_id, job, rank_stats, end))
        self._emit_stats(job_id, info, steps, gpus, rank_stats, start, end)
        return out

    # -- straggler and network, per summary bucket ----------------------------------------
    def _decide(
        self, job_id: str, job: dict[str, Any], start: int, end: int, rows: list[list[Any]]
    ) -> list[Finding]:
        """One bucket of the job decided: every rank's and node's sequential test, and the network's."""
        out: list[Finding] = []
        info = self.topology.jobs.get(job_id)
        run = info.run_id if info else ""
        if run != job["run"]:
            if job["run"]:
                # A new run warms up again (and may place ranks elsewhere): its tests start afresh.
                out.extend(self._end_run(job_id, job, end))
            job["run"] = run
        by_rank: dict[int, list[Any]] = {}
        for row in rows:
            if row[2] is not None and row[2] > 0:
                by_rank[int(row[0])] = row
        # A bucket that a step boundary split (most ranks' step landed in the next one) says little.
        if len(by_rank) < max(2, len(self.topology.ranks_of(job_id)) // 2):
            return out
        job_busy = median([r[2] for r in by_rank.values()])
        assert job_busy is not None
        comms = [r[5] for r in by_rank.values() if r[5] is not None]
        job_comm = median(comms) if 2 * len(comms) >= len(by_rank) else None
        # A job that times its collective (comm_s) shows who waits for whom there: the busy score
        # is complete. One that does not (DDP: the wait hides in backward) is also scored on the
        # work before the first wait.
        untimed = job_comm is None
        held = self._node_bucket(job_id, job, by_rank, start, end, out, untimed)
        peers = {
            "busy": job_busy,
            "compute": median(finite(r[3] for r in by_rank.values())),
            "wait": median(finite(r[4] for r in by_rank.values())),
            "pre_sync": None,
            "after": None,
        }
        if untimed:
            pre_syncs = finite(_pre_sync(r) for r in by_rank.values())
            if 2 * len(pre_syncs) >= len(by_rank):
                peers["pre_sync"] = median(pre_syncs)
                peers["after"] = median(finite(_after_pre_sync(r) for r in by_rank.values()))
        for rank in sorted(by_rank):
            row = by_rank[rank]
            key = str(rank)
            score = job_busy / row[2]
            waited = True
            if job_comm is not None and row[5] is not None and row[2] > job_busy:
                # Synchronous training: the ranks wait in the collective for the slow one.
                waited = job_comm - row[5] >= self.waited_share * (row[2] - job_busy)
            early = self._pre_sync_score(row, peers)
            by_pre_sync = early is not None and (early < score or not waited)
            if by_pre_sync:
                score, waited = early, True
            st = job["seq"].get(key)
            if st is None:
                st = job["seq"][key] = _new_seq(self.cusum)
            verdict = self._judge(st, score, start, end, waited, int(row[7]))
            _note(st, end, score, row, peers, self.bucket_history_points)
            if st["since"] is None:
                if not verdict or self._node_of(job_id, rank) in held:
                    if not _has_evidence(st):
                        st.pop("hist", None)  # a healthy rank keeps no history: snapshots stay small
                        st.pop("why", None)
                    continue
                st["since"] = _evidence_start(st, start, end)
                st["summary"] = self._straggler_summary(
                    job_id, job, rank, st, score, row, peers, end, by_pre_sync
                )
                out.append(self._straggler_finding(job_id, rank, st, score, end, True))
            elif verdict:
                out.append(self._straggler_finding(job_id, rank, st, score, end, True))
            else:
                out.append(self._straggler_finding(job_id, rank, st, score, end, False))
                st["since"] = None
                st.pop("hist", None)
                st.pop("why", None)
        out.extend(self._net_bucket(job_id, job, by_rank, info, start, end))
        return out

    def _pre_sync_score(self, row: list[Any], peers: dict[str, Any]) -> float | None:
        """The rank's score on its work before the first wait (job median / its data wait + forward).

        DDP overlaps the gradient all-reduce with backward: a fast rank's backward timer runs
        until the slow rank's gradients arrive, so busy times even out and the busy score sees
        little of a slow GPU or loader. The data wait and the forward pass come before any wait on
        every rank and still differ. The score counts only when the peers' time after it
        (backward + communication) is longer than the rank's by `waited_for_share` of its extra:
        they wait for it, inside backward (DDP) or in the collective. None when it does not apply.
        """
        own, ref = _pre_sync(row), peers["pre_sync"]
        if own is None or ref is None or own <= ref or peers["after"] is None:
            return None
        after = _after_pre_sync(row)
        if after is None or peers["after"] - after < self.waited_share * (own - ref):
            return None
        return float(ref / own)

    def _judge(
        self, st: dict[str, Any], score: float, start: int, end: int, evidence: bool, steps: int
    ) -> bool:
        """One bucket's score into a rank's (or node's) sequential test; True while it says straggler.

        Two paths: the threshold (`straggler_buckets` low buckets in a row, a verdict that clears
        after `clear_buckets` buckets back above it holding `min_steps` steps: a job of long steps
        reports one step a bucket, and a rank hovering at the threshold must not flap) and the CUSUM against the rank's own normal
        (`self.cusum`, with the same hysteresis). A bucket that is not `evidence` (nobody waited
        for the rank) counts as an ordinary one for both, except while the CUSUM still learns.
        """
        c = st["c"]
        learning = c["ref"] is None
        warm = learning and c.get("skip", 0) < self.cusum.skip_windows
        drift = self.cusum.update(c, score if learning or evidence else max(score, 1.0), end)
        # Warm-up (compilation, first batches) teaches and raises nothing; a verdict carried over
        # from a restored snapshot still clears.
        if not warm and evidence and score < self.threshold:
            if st["low"] == 0:
                st["from"] = start
            st["low"] += 1
            st["ok"], st["ok_steps"] = 0, 0
            if st["low"] >= self.straggler_buckets:
                st["t"] = True
        else:
            st["low"] = 0
            if st["t"]:
                st["ok"] += 1
                st["ok_steps"] = st.get("ok_steps", 0) + steps
                if st["ok"] >= self.clear_buckets and st["ok_steps"] >= self.min_steps:
                    st["t"], st["ok"], st["ok_steps"] = False, 0, 0
        return bool(st["t"] or drift)

    def _node_of(self, job_id: str, rank: int) -> str | None:
        b = self.topology.bindings.get((job_id, rank))
        return b.node if b else None

    def _node_bucket(
        self,
        job_id: str,
        job: dict[str, Any],
        by_rank: dict[int, list[Any]],
        start: int,
        end: int,
        out: list[Finding],
        untimed: bool = False,
    ) -> set[str]:
        """A node whose every rank is slow (its storage, host, NIC): one straggler for the node.

        A per-rank score is judged against the job median, which a node holding half the job's
        ranks drags along (8 slow ranks of 16 score ~0.8, not 0.5). Here each node's *fastest*
        rank is compared with the median of the ranks on the job's other nodes: only when even
        that rank is slow is the fault the node's, not one GPU's (a node needs two ranks or more).
        Returns the nodes on which no new per-rank straggler may be raised (the node's own test
        is accumulating evidence or firing: one incident, one alert).
        """
        by_node: dict[str, list[tuple[int, list[Any]]]] = {}
        for rank in sorted(by_rank):
            node = self._node_of(job_id, rank)
            if node is not None:
                by_node.setdefault(node, []).append((rank, by_rank[rank]))
        states: dict[str, dict[str, Any]] = job["node_seq"]
        held: set[str] = set()
        if len(by_node) < 2:
            return held
        everyone = sorted(row[2] for own in by_node.values() for _, row in own)
        # Under DDP the node's work before its first wait (data wait + forward), as per rank:
        # rank -> (data wait + forward, backward + comm), when every rank has both; and both
        # sorted over the job, sorted once for every node's median of the others.
        early: dict[int, tuple[float, float]] | None = None
        if untimed:
            pairs = {rank: (_pre_sync(row), _after_pre_sync(row)) for rank, row in by_rank.items()}
            if all(p is not None and a is not None for p, a in pairs.values()):
                early = {rank: (float(p or 0.0), float(a or 0.0)) for rank, (p, a) in pairs.items()}
                job_pre = sorted(p for p, _ in early.values())
                job_after = sorted(a for _, a in early.values())
        for node in sorted(by_node):
            own = by_node[node]
            if len(own) < 2:
                continue  # one rank is the rank's straggler, not its node's
            ref = _median_without(everyone, sorted(row[2] for _, row in own))
            if not ref:
                continue
            fastest = min(row[2] for _, row in own)
            score = ref / fastest
            if early is not None:
                own_early = [early[rank] for rank, _ in own]
                score = min(score, self._node_pre_sync_score(own_early, job_pre, job_after))
            st = states.get(node)
            if st is None:
                st = states[node] = _new_seq(self.cusum)
            verdict = self._judge(st, score, start, end, True, min(int(row[7]) for _, row in own))
            if _has_evidence(st) or st["since"] is not None:
                held.add(node)
                st["hist"] = [*st.get("hist", []), [end, round(score, 4)]][-self.bucket_history_points :]
            if st["since"] is None:
                if verdict:
                    st["since"] = _evidence_start(st, start, end)
                    out.append(self._node_finding(job_id, node, st, own, by_rank, score, end, True))
                elif not _has_evidence(st):
                    st.pop("hist", None)
            elif verdict:
                out.append(self._node_finding(job_id, node, st, own, by_rank, score, end, True))
            else:
                out.append(self._node_finding(job_id, node, st, own, by_rank, score, end, False))
                st["since"] = None
                st.pop("hist", None)
        return held

    def _node_pre_sync_score(
        self, own: list[tuple[float, float]], job_pre: list[float], job_after: list[float]
    ) -> float:
        """A node's fastest rank's data wait + forward against the other nodes' median (1.0 unless
        the other nodes' ranks wait for it: their backward + comm longer by half its extra).
        `own`: the node's ranks' (data wait + forward, backward + comm); `job_pre`, `job_after`:
        every rank's, sorted."""
        own_pre = sorted(p for p, _ in own)
        ref = _median_without(job_pre, own_pre)
        if not ref or own_pre[0] <= ref:
            return 1.0
        others_after = _median_without(job_after, sorted(a for _, a in own))
        own_after = median([a for _, a in own])
        if others_after is None or own_after is None:
            return 1.0
        if others_after - own_after < self.waited_share * (own_pre[0] - ref):
            return 1.0
        return ref / own_pre[0]

    def _node_finding(
        self,
        job_id: str,
        node: str,
        st: dict[str, Any],
        own: list[tuple[int, list[Any]]],
        by_rank: dict[int, list[Any]],
        score: float,
        end: int,
        active: bool,
    ) -> Finding:
        ranks = [r for r, _ in own]
        layer = "unknown"
        if active:
            mine = set(ranks)
            peers = [row for r, row in by_rank.items() if r not in mine]
            d_wait = (median(finite(row[4] for _, row in own)) or 0.0) - (
                median(finite(row[4] for row in peers)) or 0.0
            )
            own_compute = median(finite(row[3] for _, row in own))
            peer_compute = median(finite(row[3] for row in peers))
            d_compute = (
                own_compute - peer_compute if own_compute is not None and peer_compute is not None else None
            )
            if d_compute is None:
                layer = "data" if d_wait > 0 else "unknown"
            else:
                layer = "data" if d_wait > d_compute else "gpu"
            layer = st.setdefault("layer", layer)  # the alert keeps the layer it fired with
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
            st.pop("layer", None)
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
            since=st["since"],
            invariant=(
                "every node's fastest rank scores >= "
                f"{self.threshold} against the median rank on the job's other nodes"
            ),
            observed=score,
            expected=self.threshold,
            summary=summary,
            suspected_layer=layer,
            history_metric="straggler_score",
            history=tuple((int(t), float(v)) for t, v in st.get("hist", [])),
        )

    def _gpu_detail(self, job: dict[str, Any], rank: int, end: int) -> tuple[str, int]:
        """The rank's GPU over the last window next to its peers' (clocks, throttle reasons, power)."""
        clocks: dict[int, list[Any]] = {}  # rank -> its samples' Stats
        powers: dict[int, list[Any]] = {}
        reasons = 0
        for g in job["gpu"]:
            if not end - self.window_ms <= g[_G_TS] < end:
                continue
            r = int(g[_G_RANK])
            if g[_G_CLOCK] is not None:
                clocks.setdefault(r, []).append(g[_G_CLOCK])
            if g[_G_POWER] is not None:
                powers.setdefault(r, []).append(g[_G_POWER])
            if r == rank:
                reasons |= int(g[_G_REASONS] or 0)
        own_clock, job_clock = (
            stat_mean(clocks.get(rank, [])),
            median(finite(stat_mean(v) for v in clocks.values())),
        )
        own_power, job_power = (
            stat_mean(powers.get(rank, [])),
            median(finite(stat_mean(v) for v in powers.values())),
        )
        parts = []
        if own_clock is not None and job_clock:
            parts.append(f"SM clock {own_clock:.0f} MHz vs {job_clock:.0f} MHz on its peers")
        if reasons:
            parts.append("throttle reasons " + ",".join(_throttle_names(reasons) or [hex(reasons)]))
        if own_power is not None and job_power:
            parts.append(f"power {own_power:.0f} W vs {job_power:.0f} W")
        return "; ".join(parts), reasons

    def _straggler_summary(
        self,
        job_id: str,
        job: dict[str, Any],
        rank: int,
        st: dict[str, Any],
        score: float,
        row: list[Any],
        peers: dict[str, Any],
        end: int,
        by_pre_sync: bool,
    ) -> str:
        """The firing alert's text, fixed when it fires; sets the state's suspected layer.
        `by_pre_sync`: the score is the work-before-the-first-wait one (DDP)."""
        why = st.get("why") or []
        d_wait = median([w[0] for w in why]) if why else None
        d_compute = median(finite(w[1] for w in why)) if why else None
        if d_compute is None:
            layer = "data" if d_wait is not None and d_wait > 0 and row[4] is not None else "unknown"
        else:
            layer = "data" if (d_wait or 0.0) > d_compute else "gpu"
        st["layer"] = layer
        what = "data loading" if layer == "data" else "its GPU" if layer == "gpu" else "an unknown layer"
        summary = f"rank {rank} of job {job_id} is a straggler (score {score:.2f}): suspect {what}"
        if row[4] is not None and row[3] is not None:
            summary += (
                f"; compute {row[3]:.3f} s, data wait {row[4]:.3f} s per step"
                f" (its peers: {peers['compute'] or 0.0:.3f} s, {peers['wait'] or 0.0:.3f} s)"
            )
        if by_pre_sync:
            summary += (
                f"; data wait + forward {_pre_sync(row) or 0.0:.3f} s vs {peers['pre_sync']:.3f} s on its peers,"
                " who wait for it inside backward (the all-reduce overlaps it, as in DDP)"
            )
        c = st["c"]
        if c.get("alarm") and score >= self.threshold:
            summary += "; " + self.cusum.describe(c)
        if layer == "gpu":
            detail, _ = self._gpu_detail(job, rank, end)
            if detail:
                summary += f"; {detail}"
        return summary

    def _straggler_finding(
        self, job_id: str, rank: int, st: dict[str, Any], score: float, end: int, active: bool
    ) -> Finding:
        b = self.topology.bindings.get((job_id, rank))
        layer = st.get("layer", "unknown") if active else "unknown"
        summary = (
            st["summary"] if active else f"rank {rank} of job {job_id} keeps pace again (score {score:.2f})"
        )
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
            since=st["since"],
            invariant=(
                "every rank's straggler score (job median busy time / rank busy time; data wait + forward when"
                f" the all-reduce overlaps backward) stays >= {self.threshold}"
            ),
            observed=score,
            expected=self.threshold,
            summary=summary,
            suspected_layer=layer,
            history_metric="straggler_score",
            history=tuple((int(t), float(s)) for t, s in st.get("hist", [])),
        )

    def _end_run(self, job_id: str, job: dict[str, Any], end: int) -> list[Finding]:
        """Resolve what the previous run left firing and forget its tests (a restart is a new run)."""
        out: list[Finding] = []
        for key in sorted(job["seq"], key=int):
            st = job["seq"][key]
            if st["since"] is not None:
                out.append(self._straggler_finding(job_id, int(key), st, 1.0, end, False))
        for node in sorted(job["node_seq"]):
            st = job["node_seq"][node]
            if st["since"] is not None:
                out.append(self._node_finding(job_id, node, st, [], {}, 1.0, end, False))
        if job["net_active"] is not None:
            out.append(self._net_finding(job_id, job, job["net"]["normal"] or 0.0, end, False))
        job["seq"], job["node_seq"], job["net_active"], job["net_hist"] = {}, {}, None, []
        job["net"] = {"n": 0, "learn": [], "normal": None, "k": None, "s": 0.0, "start": None, "ok": 0}
        return out

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
        hists: dict[str, list[list[Any]]] = job.setdefault("imb_hist", {})
        for uuid in sorted(set(job["imb"]) | set(flagged)):
            if uuid in flagged:
                job["imb"][uuid] = job["imb"].get(uuid, 0) + 1
                x = flagged[uuid][2]
                hists[uuid] = [*hists.get(uuid, []), [end, round(x, 6)]][-self.history_points :]
                if job["imb"][uuid] >= self.imb_windows:
                    job["imb_active"].setdefault(uuid, end)
                    out.append(
                        self._imb_finding(
                            job_id, uuid, flagged[uuid], end, True, job["imb_active"][uuid], hists[uuid]
                        )
                    )
            else:
                job["imb"].pop(uuid, None)
                hist = hists.pop(uuid, [])
                if uuid in job["imb_active"]:
                    rank = next((r for r, b in bound.items() if b and b.gpu_uuid == uuid), -1)
                    out.append(
                        self._imb_finding(
                            job_id, uuid, (rank, "", 0.0, 0.0), end, False, job["imb_active"].pop(uuid), hist
                        )
                    )
        return out

    def _imb_finding(
        self,
        job_id: str,
        uuid: str,
        what: tuple[int, str, float, float],
        end: int,
        active: bool,
        since: int,
        hist: list[list[Any]],
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
            # The GPU's value of the metric that put it out of line, per window while it was.
            history_metric=metric,
            history=tuple((int(t), float(v)) for t, v in hist) if metric else (),
        )

    # -- network -----------------------------------------------------------------------
    def _net_bucket(
        self,
        job_id: str,
        job: dict[str, Any],
        by_rank: dict[int, list[Any]],
        info: JobInfo | None,
        start: int,
        end: int,
    ) -> list[Finding]:
        """The job's intrinsic communication time of one bucket against its learned normal (a CUSUM of its log growth)."""
        comms = finite(r[5] for r in by_rank.values())
        if len(comms) < max(2, len(by_rank) // 2):
            return []
        intrinsic = min(comms)
        net = job["net"]
        net["n"] += 1
        if net["n"] <= self.net_skip:
            return []  # warm-up
        job["net_hist"] = [*job["net_hist"], [end, round(intrinsic, 6)]][-self.bucket_history_points :]
        if net["normal"] is None:
            net["learn"].append(round(intrinsic, 6))
            if len(net["learn"]) >= self.net_learn:
                normal = median(net["learn"])
                assert normal is not None
                logs = [math.log(max(x, 1e-9) / normal) for x in net["learn"]] if normal > 0 else [0.0]
                spread = 3.0 * MAD_TO_SIGMA * (mad(logs) or 0.0)
                net.update(
                    normal=normal,
                    k=max(self.net_slack, spread),
                    # Half the slack's noise floor (1.5 sigma; h 0.6 is still ~8 sigma): the host's
                    # errors are the other half of the evidence.
                    kc=max(self.net_c_slack, spread / 2),
                    learn=[],
                )
            return []
        normal = float(net["normal"])
        if normal <= 0:
            return []  # a job whose ranks never wait in a collective: nothing to compare
        growth = math.log(max(intrinsic, 1e-9) / normal)
        step = min(growth - float(net["k"]), self.net_max_step)
        more = intrinsic - normal >= self.net_min_inc
        degraded = intrinsic > normal * self.net_ratio and more
        if job["net_active"] is None:
            if net["s"] == 0.0:
                net["start"] = start
            net["s"] = round(max(0.0, net["s"] + step), 6)
            if net["s"] == 0.0:
                net["start"] = None
            # The corroborated test: less evidence, paged only with a node at fault (older
            # snapshots learned no kc: they use k).
            c_step = min(growth - float(net.get("kc", net["k"])), self.net_c_max_step)
            if net.get("c", 0.0) == 0.0:
                net["c_start"] = start
            net["c"] = round(max(0.0, net.get("c", 0.0) + c_step), 6)
            if net["c"] == 0.0:
                net["c_start"] = None
            if net["s"] >= self.net_h and degraded:
                node, signal = self._network_node(info, end - self.window_ms, end)
                job["net_active"] = [net["start"], node, signal, self.net_ratio]
            elif net["c"] >= self.net_c_h and more and intrinsic > normal * self.net_c_ratio:
                node, signal = self._network_node(info, end - self.window_ms, end)
                if node is None:
                    return []
                job["net_active"] = [net["c_start"], node, signal, self.net_c_ratio]
            else:
                return []
            net["ok"] = 0
            return [self._net_finding(job_id, job, intrinsic, end, True)]
        # Held at the ratio it fired at (a corroborated alert at its lower one: no flapping).
        ratio = float(job["net_active"][3]) if len(job["net_active"]) > 3 else self.net_ratio
        degraded = intrinsic > normal * ratio and more
        if degraded:
            net["ok"] = 0
            net["s"] = round(min(2 * self.net_h, net["s"] + max(step, 0.0)), 6)
            if job["net_active"][1] is None:
                node, signal = self._network_node(info, end - self.window_ms, end)
                if node is not None:
                    job["net_active"][1:3] = [node, signal]
            return [self._net_finding(job_id, job, intrinsic, end, True)]
        net["ok"] += 1
        if net["ok"] < self.clear_buckets:
            return [self._net_finding(job_id, job, intrinsic, end, True)]
        finding = self._net_finding(job_id, job, intrinsic, end, False)
        job["net_active"] = None
        net.update(s=0.0, start=None, ok=0, c=0.0, c_start=None)
        return [finding]

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
        self, job_id: str, job: dict[str, Any], intrinsic: float, end: int, active: bool
    ) -> Finding:
        since, node, *rest = job["net_active"]
        signal = rest[0] if rest else "TCP retransmits elevated"
        ratio = float(rest[1]) if len(rest) > 1 else self.net_ratio
        normal = float(job["net"]["normal"] or 0.0)
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
            invariant=(
                f"collective communication per step stays within {ratio}x of the job's normal"
                + (" while a job node shows network errors" if ratio < self.net_ratio else "")
            ),
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
