"""`ranksight report` of a recording: time and peak memory, streamed per panel vs through a chDB store.

Simulates one job (`straggler_gpu`, its GPU straggler included) of `--ranks` ranks for
`--minutes` minutes into an Avro recording (beyond 16 ranks x 60 minutes a streamed synthetic job
of the same shape: the simulator holds a whole run in memory), then writes the job's report
twice, each in a fresh process so its peak RSS is its own:

- (a) baseline, the way `ranksight report` worked before: the recording replayed through the
  detectors into a temporary chDB store, then the pages queried from it;
- (b) `ranksight report` now: the detectors run once, the recording is read twice and folded per
  panel (each page's fold in `ui.pages`), no store.

    .venv/bin/python bench/bench_report.py                          # 16 ranks, 20 minutes: target < 5 s, < 200 MB
    .venv/bin/python bench/bench_report.py --ranks 512 --minutes 120 --no-baseline
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ranksight.signals import run_main

if TYPE_CHECKING:
    from schemas.records import Event

JOB = "pretrain-7b-0002"  # the straggler_gpu scenario's job


def _synthetic(ranks: int, minutes: float, start_ms: int = 1_767_225_600_000) -> Iterator[Event]:
    """A `ranks`-rank job of `minutes`, generated as a stream (the simulator keeps a whole run in
    memory: 4.5 GB and growing for 512 ranks x 2 hours): 1.5 s steps, rank 137 (or the last) a
    straggler in the second half, 10 s GPU, host, data-loader and collective samples, a
    checkpoint every 10 minutes, in event-time order."""
    from schemas.records import Event

    nodes = max(1, ranks // 8)
    node = [f"node-{r // 8:03d}" for r in range(ranks)]
    run, slow = f"{JOB}-r0", min(137, ranks - 1)
    yield Event("JobStarted", {"ts": start_ms, "job_id": JOB, "run_id": run, "owner": "bench", "team": "llm-pretrain",
                               "cluster": "bench", "model_name": "llama", "model_version": "v1", "world_size": ranks,
                               "nodes": sorted(set(node)), "gpu_class": "H100-80GB", "workload_family": "llama-pretrain"})  # fmt: skip
    yield Event("JobStateChanged", {"ts": start_ms, "job_id": JOB, "run_id": run, "state": "running"})
    for r in range(ranks):
        yield Event("RankBound", {"ts": start_ms + 1, "job_id": JOB, "run_id": run, "rank": r, "local_rank": r % 8,
                                  "node": node[r], "gpu_index": r % 8, "gpu_uuid": f"GPU-{r}", "pid": 1000 + r})  # fmt: skip
    seconds, step = int(minutes * 60), 0
    for tick in range(10, seconds, 10):
        t = start_ms + tick * 1000
        for r in range(ranks):
            yield Event("GpuSample", {"ts": t, "cluster": "bench", "node": node[r], "gpu_index": r % 8,
                                      "gpu_uuid": f"GPU-{r}", "gpu_util_pct": 96.0 + r % 4, "mem_used_bytes": 70 * 2**30,
                                      "power_w": 650.0 + r % 50, "sm_clock_mhz": 1980, "energy_mj": tick * 650_000})  # fmt: skip
        for n in range(nodes):
            yield Event("HostSample", {"ts": t, "cluster": "bench", "node": f"node-{n:03d}", "cpu_util_pct": 40.0,
                                       "mem_used_bytes": 200 * 2**30, "mem_total_bytes": 1000 * 2**30,
                                       "tcp_retrans_segs_s": float(n % 5)})  # fmt: skip
        for r in range(ranks):
            yield Event("DataLoaderSample", {"ts": t, "job_id": JOB, "run_id": run, "rank": r, "interval_s": 10.0,
                                             "wait_s": 0.2, "queue_depth": 8, "workers": 4})  # fmt: skip
            yield Event("CollectiveSample", {"ts": t, "job_id": JOB, "run_id": run, "rank": r, "op": "allreduce",
                                             "interval_s": 10.0, "count": 7, "time_s": 1.2, "bus_bw_gbps": 180.0})  # fmt: skip
        if tick % 600 == 0:
            ckpt = f"ckpt-{tick}"
            for phase, dt in (("started", 0), ("completed", 5000)):
                yield Event("CheckpointEvent", {"ts": t + dt, "job_id": JOB, "run_id": run, "rank": 0,
                                                "checkpoint_id": ckpt, "step": step, "phase": phase,
                                                "duration_s": 5.0 if phase == "completed" else None})  # fmt: skip
        while 1500 * (step + 1) < tick * 1000 + 10_000:
            done = start_ms + 1500 * (step + 1)
            late = step > seconds / 3
            for r in range(ranks):
                forward = 0.4 * (1.4 if late and r == slow else 1.0)
                yield Event("StepCompleted", {"ts": done + r % 50, "job_id": JOB, "run_id": run, "rank": r, "step": step,
                                              "samples": 8, "tokens": 32768, "loss": 3 - step / 10_000, "lr": 3e-4,
                                              "grad_norm": 1.0, "step_time_s": 1.5, "data_wait_s": 0.02,
                                              "forward_s": forward, "backward_s": 0.8, "optimizer_s": 0.1,
                                              "comm_s": 0.18, "skipped": False})  # fmt: skip
            step += 1


def _recording(path: Path, ranks: int, minutes: float) -> int:
    from producers.simulator import load_scenario, simulate
    from schemas.files import write_container

    if ranks * minutes > 16 * 60:
        return write_container(path, _synthetic(ranks, minutes))
    scenario = load_scenario("straggler_gpu").with_overrides(duration=minutes * 60)
    nodes = max(1, ranks // 8)
    names = tuple(f"node-{i + 1:02d}" for i in range(nodes))
    scenario = replace(
        scenario,
        cluster=replace(scenario.cluster, nodes=nodes),
        jobs=tuple(replace(j, nodes=names) for j in scenario.jobs),
    )
    return write_container(path, simulate(scenario, 0).events())


def _child(mode: str, recording: Path, out: Path) -> None:
    """Write the report one way; print wall seconds and this process's peak RSS as JSON."""
    started = time.perf_counter()
    if mode == "digest":
        from ranksight.commands.report import recorded, replayed
        from ui.report import report_from_events

        result = report_from_events(
            lambda: replayed([recording]), out, job_id=JOB, sources=lambda: recorded([recording])
        )
    else:
        from ranksight.commands.report import replayed
        from sinks.clickhouse import close, connect
        from sinks.ddl import migrate
        from ui.report import write_report
        from ui.store import load_events

        with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
            dsn = f"chdb://{Path(tmp) / 'chdb'}"
            client = connect(dsn)
            try:
                migrate(client, ttl_days=None)
                load_events(client, replayed([recording]))
                result = write_report(client, out, job_id=JOB)
            finally:
                close(dsn)
    wall = time.perf_counter() - started
    # VmHWM (this process's peak resident memory); ru_maxrss would keep a forking parent's peak.
    with open("/proc/self/status") as status:
        hwm = next((line.split()[1] for line in status if line.startswith("VmHWM")), None)
    peak_mb = int(hwm) / 1024 if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"wall_s": wall, "peak_mb": peak_mb, "bytes": result["bytes"]}))


def _run(mode: str, recording: Path, out: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(recording), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    """Simulate, report both ways, print."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each mode (the best is printed)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the chDB-store baseline")
    parser.add_argument("--recording", type=Path, help="reuse this recording (else one is simulated)")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "RECORDING", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        recording = args.recording or Path(tmp) / "recording.avro"
        if args.recording is None:
            started = time.perf_counter()
            events = _recording(recording, args.ranks, args.minutes)
            print(
                f"recording: {args.ranks} ranks x {args.minutes:g} min, {events:,} events, "
                f"{recording.stat().st_size / 1e6:.0f} MB (simulated in {time.perf_counter() - started:.0f} s)"
            )
        modes = ["digest"] if args.no_baseline else ["store", "digest"]
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.repeat):
            for mode in modes:
                result = _run(mode, recording, Path(tmp) / f"{mode}.html")
                if mode not in best or result["wall_s"] < best[mode]["wall_s"]:
                    best[mode] = result
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; best of {args.repeat}")
        names = {
            "store": "(a) baseline: replay into a temporary chDB store, query",
            "digest": "(b) ranksight report now: detectors once, two streamed passes",
        }
        for mode in modes:
            r = best[mode]
            print(
                f"{names[mode]:<64} {r['wall_s']:7.2f} s  peak RSS {r['peak_mb']:6.0f} MB  "
                f"report {r['bytes'] / 1e6:.1f} MB"
            )
        if args.ranks == 16 and args.minutes == 20:
            print("target (issue 24.7): < 5 s and < 200 MB")


if __name__ == "__main__":
    # SIGINT/SIGTERM unwind through the finally blocks that stop the broker and the processes.
    run_main(main, name="bench_report")
