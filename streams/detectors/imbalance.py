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

from typing import Any, ClassVar

from streams.detectors.base import Finding
from streams.detectors.stats import median, stat_mean, stat_median
from streams.detectors.straggler import StragglerRule
from streams.detectors.windows import (
    _BUSY,
    _COMM,
    _COMPUTE,
    _G_CLOCK,
    _G_MEM,
    _G_POWER,
    _G_RANK,
    _G_REASONS,
    _G_TS,
    _G_UTIL,
    _N,
    _RANK,
    _STEP_TIME,
    _TS,
    _WAIT,
    DEFAULTS,
    _or_all,
    baseline_key,
)

__all__ = ["DEFAULTS", "ImbalanceDetector", "baseline_key"]


class ImbalanceDetector(StragglerRule):
    """Per-job window statistics and the rank/GPU/network imbalance rules built on them."""

    stage: ClassVar[str] = "job"  # reads the rank stage's summaries of the job's ranks

    rules: ClassVar[tuple[str, ...]] = ("straggler", "gpu_imbalance", "network_degradation")

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
