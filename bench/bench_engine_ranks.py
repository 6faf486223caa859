"""Engine cost per raw event against job size: one job of 16 to 16,384 ranks (issue 19.1).

Usage: python bench/bench_engine_ranks.py [--seconds 180] [--ranks 16,1024,4096,16384] [--cpu]

One job of N ranks (8 GPUs per node; rank 5 a straggler at 1.5x its step time from a third of the way on),
time-compressed to `--seconds` of event time: a StepCompleted per rank per second (with its node,
as the SDK sends it), a GpuSample per GPU every 5 s, a HostSample per node every 10 s. The events
are made one second at a time and only the offline two-stage `DetectionEngine` (rank stages on 6
partitions, job stages on their summaries) is timed, so the generator's own cost is not counted.

Printed per size: events/s, microseconds per raw event (and the ratio to the smallest job: flat
means the job stage does not grow per raw event), the share of the time in the rank and the job
stages, the job stage's input per raw event, the collector's time per raw event and its longest
collection (a pause), the alerts (the straggler must be found at every size) and the engine's peak
resident memory; then the time per raw event after the first `WARMUP_S` (90) s of event time, when
the state is as large as it gets (steady state: what a job that runs for hours costs). A size
runs again (a fresh engine, the same input) until its runs add up to `--min-wall` seconds, and the
median run is printed with the range. Before the two stages (issue 19's own measurement of the
single engine): 25 us/event at 16 ranks, 38 at 1,024, 46 at 4,096.

Where the time goes when it is not flat: run one size under a cache simulator twice, with the
engine and with `--input-only` (the same input, no engine), and subtract: instructions, and cache
misses per raw event, of the engine alone (docs/worker.md has the numbers):

    valgrind --tool=cachegrind --cache-sim=yes --LL=33554432,16,64 \
        python bench/bench_engine_ranks.py --seconds 20 --ranks 4096 --min-wall 0 [--input-only]
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import time
from collections.abc import Iterator

from schemas.records import Event
from streams import gc_policy
from streams.offline.detection import DetectionEngine
from streams.stages.engine import StageEngine

T0 = 1_780_000_000_000
JOB = "giant-0001"
STRAGGLER = 5


def _start(ranks: int) -> list[Event]:
    nodes = [f"node-{n:05d}" for n in range(ranks // 8)]
    out = [
        Event(
            "JobStarted",
            {
                "ts": T0,
                "job_id": JOB,
                "run_id": f"{JOB}-r0",
                "owner": "alice",
                "team": "llm-pretrain",
                "cluster": "sim-a",
                "model_name": "llama",
                "model_version": "v1",
                "dataset_version": "d1",
                "workload_family": "llama-pretrain",
                "world_size": ranks,
                "nodes": nodes,
                "gpu_class": "H100-80GB",
                "global_batch_size": 4 * ranks,
                "seq_len": 4096,
                "checkpoint_max_age_s": None,
                "checkpoint_timeout_s": None,
                "labels": {},
            },
        ),
        Event(
            "JobStateChanged",
            {
                "ts": T0,
                "job_id": JOB,
                "run_id": f"{JOB}-r0",
                "state": "running",
                "reason": "",
                "exit_code": None,
            },
        ),
    ]
    for r in range(ranks):
        node = nodes[r // 8]
        out.append(
            Event(
                "RankBound",
                {
                    "ts": T0,
                    "job_id": JOB,
                    "run_id": f"{JOB}-r0",
                    "rank": r,
                    "local_rank": r % 8,
                    "node": node,
                    "gpu_index": r % 8,
                    "gpu_uuid": f"GPU-{node}-{r % 8}",
                    "pid": 1000 + r,
                },
            )
        )
    return out


# Event time after which the state is as large as it gets: the imbalance rule's 60 s window and
# its 30 s hop. From then on the engine frees about what it makes (steady state), as it does for
# all but the first minute and a half of a job that runs for hours.
WARMUP_S = 90

# What the engine's time is read with: wall time (the default), or with `--cpu` the process's CPU
# time (`time.process_time`), which other work on a shared machine inflates far less.
_CLOCK = [time.perf_counter]

BATCH = 500  # records per timed call, about what one consumer poll hands the worker

# A second's records are planned as ints (offset in the second, kind, rank or node) and made into
# events one batch at a time, so the input the bench holds alive does not grow with the job: a whole
# second of a 16,384-rank job held as Event dicts is ~40,000 young objects that the collector
# walked on the engine's time, which no worker holds (it reads a poll's batch at a time).
_STEP, _GPU, _HOST = 0, 1, 2


def _second(ranks: int, second: int, seconds: int, rng: random.Random) -> Iterator[list[Event]]:
    """Every record of one second of event time, in time order, in batches of `BATCH`."""
    slow = second >= seconds // 3
    base = T0 + second * 1000
    # Synchronous data parallelism: every rank's step ends with the slowest one's (the others wait
    # for the straggler in the collective, their comm_s grows), as the straggler rule expects.
    computes = [
        0.85 * (1.5 if slow and r == STRAGGLER else 1.0) * rng.uniform(0.98, 1.02) for r in range(ranks)
    ]
    step_time = max(computes) + 0.03 + 0.12
    # (ms into the second, kind, index) packed in one int: sorted, the order of a stable sort by time
    # of steps (by rank), then GPU samples (by rank), then host samples (by node).
    plan = [(rng.randrange(0, 1000) << 22) | (_STEP << 20) | r for r in range(ranks)]
    if second % 5 == 0:
        plan += [(_GPU << 20) | r for r in range(ranks)]
    if second % 10 == 0:
        plan += [(_HOST << 20) | n for n in range(ranks // 8)]
    plan.sort()
    for i in range(0, len(plan), BATCH):
        yield [
            _event(key & 0xFFFFF, (key >> 20) & 3, base + (key >> 22), second, computes, step_time)
            for key in plan[i : i + BATCH]
        ]


def _event(index: int, kind: int, ts: int, second: int, computes: list[float], step_time: float) -> Event:
    """One planned record: a rank's step, a rank's GPU sample or a node's host sample."""
    if kind == _STEP:
        compute = computes[index]
        return Event(
            "StepCompleted",
            {
                "ts": ts,
                "job_id": JOB,
                "run_id": f"{JOB}-r0",
                "rank": index,
                "node": f"node-{index // 8:05d}",
                "step": second,
                "samples": 4,
                "tokens": 16384,
                "loss": 2.5,
                "lr": 3e-4,
                "grad_norm": 1.0,
                "step_time_s": step_time,
                "data_wait_s": 0.03,
                "forward_s": compute / 3,
                "backward_s": compute / 2,
                "optimizer_s": compute / 6,
                "comm_s": max(0.0, step_time - compute - 0.03),
                "checkpoint_s": None,
                "skipped": False,
            },
        )
    if kind == _GPU:
        node = f"node-{index // 8:05d}"
        return Event(
            "GpuSample",
            {
                "ts": ts,
                "cluster": "sim-a",
                "node": node,
                "gpu_index": index % 8,
                "gpu_uuid": f"GPU-{node}-{index % 8}",
                "gpu_name": "H100",
                "job_id": JOB,
                "gpu_util_pct": 95.0,
                "mem_util_pct": 50.0,
                "mem_used_bytes": 60 * 2**30,
                "mem_total_bytes": 80 * 2**30,
                "power_w": 600.0,
                "power_limit_w": 700.0,
                "temp_gpu_c": 60.0,
                "sm_clock_mhz": 1980,
                "sm_clock_max_mhz": 1980,
                "clock_event_reasons": 0,
                "ecc_uncorrected": 0,
                "xid": None,
                "pids": [1000 + index],
            },
        )
    return Event(
        "HostSample",
        {
            "ts": ts,
            "cluster": "sim-a",
            "node": f"node-{index:05d}",
            "job_ids": [JOB],
            "cpu_util_pct": 40.0,
            "mem_available_bytes": 900 * 2**30,
            "mem_total_bytes": 1024 * 2**30,
            "oom_kills": 0,
            "tcp_retrans_segs_s": 1.0,
        },
    )


def _timed(engine: DetectionEngine) -> tuple[float, float]:
    """Wrap the stage engines' `process` to time the rank and the job stages apart."""
    spent = {"rank": 0.0, "job": 0.0}

    def wrap(eng: StageEngine, kind: str) -> None:
        inner = eng.process

        def process(event: Event, **kw: object) -> list[Event]:
            t = _CLOCK[0]()
            try:
                return inner(event, **kw)  # type: ignore[arg-type]
            finally:
                spent[kind] += _CLOCK[0]() - t

        eng.process = process  # type: ignore[method-assign]

    for eng in engine.rank_stages:
        wrap(eng, "rank")
    for eng in engine.job_stages:
        wrap(eng, "job")
    return spent  # type: ignore[return-value]


def _run(ranks: int, seconds: int, input_only: bool = False) -> dict[str, float]:
    rng = random.Random(ranks)
    engine = DetectionEngine()
    spent = _timed(engine)
    chunks: Iterator[tuple[int, list[Event]]] = (
        (s, chunk)
        for s in range(seconds + 1)
        for chunk in (_second(ranks, s, seconds, rng) if s else [_start(ranks)])
    )
    n = 0
    elapsed = 0.0
    steady_n = 0
    steady_s = 0.0
    alerts: set[tuple[str, object]] = set()
    gc_s = _GcClock()
    gc_warm = 0.0  # the collector's seconds through the warm-up
    for second, chunk in chunks:
        t = _CLOCK[0]()
        out = [] if input_only else [o for e in chunk for o in engine.process(e)]
        took = _CLOCK[0]() - t
        elapsed += took
        n += len(chunk)
        if second >= WARMUP_S:
            steady_n += len(chunk)
            steady_s += took
        else:
            gc_warm = gc_s.spent
        alerts |= {(o.record["rule"], o.record.get("rank")) for o in out if o.type == "Alert"}
    t = _CLOCK[0]()
    out = [] if input_only else engine.finish()
    elapsed += _CLOCK[0]() - t
    alerts |= {(o.record["rule"], o.record.get("rank")) for o in out if o.type == "Alert"}
    job_in = sum(e.stats["events"] for e in engine.job_stages)
    return {
        "events": n,
        "elapsed": elapsed,
        "rank_s": spent["rank"],
        "job_s": spent["job"],
        "job_in": job_in,
        "straggler": float(("straggler", STRAGGLER) in alerts),
        "alerts": float(len(alerts)),
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "gc_s": gc_s.stop(),
        "gc_longest_s": gc_s.longest,
        "steady_events": steady_n,
        "steady_s": steady_s,
        "steady_gc_s": gc_s.spent - gc_warm if steady_n else 0.0,
    }


class _GcClock:
    """Seconds the cyclic garbage collector ran (also while the bench made its input: a small part)."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.longest = 0.0  # the longest collection: a pause in the records' processing
        self._began = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            took = time.perf_counter() - self._began
            self.spent += took
            self.longest = max(self.longest, took)

    def stop(self) -> float:
        """Stop counting; the seconds counted."""
        gc.callbacks.remove(self._tick)
        return self.spent


def main() -> None:
    """Run each size and print the numbers."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seconds", type=int, default=180, help="event time per size (one step per rank per second)"
    )
    parser.add_argument(
        "--ranks", default="16,1024,4096,16384", help="comma-separated rank counts (multiples of 8)"
    )
    parser.add_argument(
        "--gc",
        choices=("tuned", "default", "both"),
        default="tuned",
        help="the collector as the worker sets it (streams/gc_policy.py), Python's default, or both",
    )
    parser.add_argument(
        "--min-wall",
        type=float,
        default=30.0,
        help="run a size again (a fresh engine, the same input) until its timed work adds up to this"
        " many seconds, and print the median run: a small job's run is a few seconds, and one such"
        " run's time moves by 15%% with what else the machine does",
    )
    parser.add_argument(
        "--input-only",
        action="store_true",
        help="make the same input and feed no engine: what to subtract when the bench runs under a"
        " cache simulator (valgrind --tool=cachegrind), which counts the whole process",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="time the engine in CPU time of this process (time.process_time), not wall time: on a"
        " shared machine, compare two codes this way, alternated (docs/worker.md, 'Per-event cost')",
    )
    args = parser.parse_args()
    if args.cpu:
        _CLOCK[0] = time.process_time
    modes = ["default", "tuned"] if args.gc == "both" else [args.gc]
    for mode in modes:
        _sizes(args.ranks, args.seconds, mode, args.min_wall, args.input_only)


def _sizes(sizes: str, seconds: int, mode: str, min_wall: float, input_only: bool) -> None:
    """Each size, as often as `min_wall` asks, with the collector set as `mode` says."""
    if mode == "tuned":
        gc_policy.for_long_lived_state()
    else:
        gc_policy.python_default()
    print(f"-- garbage collector: {mode}", flush=True)
    base: float | None = None
    steady_base: float | None = None
    for ranks in (int(r) for r in sizes.split(",")):
        runs: list[dict[str, float]] = []
        while not runs or (not input_only and sum(r["elapsed"] for r in runs) < min_wall):
            runs.append(_run(ranks, seconds, input_only))
            gc.unfreeze()
            gc.collect()
        runs.sort(key=lambda r: r["elapsed"])
        m = runs[(len(runs) - 1) // 2]  # the median, the faster of the middle two
        if input_only:
            print(f"{ranks:>6} ranks: {int(m['events']):>9,} events made, no engine", flush=True)
            continue
        us = 1e6 * m["elapsed"] / m["events"]
        base = us if base is None else base
        spread = (
            f" (median of {len(runs)} runs: {1e6 * runs[0]['elapsed'] / m['events']:.1f}"
            f" to {1e6 * runs[-1]['elapsed'] / m['events']:.1f})"
            if len(runs) > 1
            else " (one run)"
        )
        print(
            f"{ranks:>6} ranks: {int(m['events']):>9,} events in {m['elapsed']:7.1f} s ="
            f" {m['events'] / m['elapsed']:>7,.0f} events/s, {us:5.1f} us/event{spread}"
            f" ({us / base:.2f}x the smallest); rank stages {m['rank_s'] / m['elapsed']:.0%},"
            f" job stages {m['job_s'] / m['elapsed']:.0%} of it on {m['job_in'] / m['events']:.2f} records"
            f" per raw event, garbage collector {1e6 * m['gc_s'] / m['events']:.1f} us/event"
            f" (longest collection {1e3 * m['gc_longest_s']:,.0f} ms);"
            f" straggler rank {STRAGGLER} found: {'yes' if m['straggler'] else 'NO'},"
            f" {int(m['alerts'])} alert kinds; peak RSS {m['rss_mb']:,.0f} MB",
            flush=True,
        )
        if m["steady_events"]:
            steady = 1e6 * m["steady_s"] / m["steady_events"]
            steady_base = steady if steady_base is None else steady_base
            print(
                f"{'':>14}after warm-up (event time >= {WARMUP_S} s, {int(m['steady_events']):,} events):"
                f" {steady:5.1f} us/event ({steady / steady_base:.2f}x the smallest's), garbage collector"
                f" {1e6 * m['steady_gc_s'] / m['steady_events']:.1f} us/event",
                flush=True,
            )


if __name__ == "__main__":
    main()
