"""`ranksight report` of a recording: time and peak memory, streamed per panel vs through a chDB store.

Simulates one job (`straggler_gpu`, its GPU straggler included) of `--ranks` ranks for
`--minutes` minutes into an Avro recording, then writes the job's report twice, each in a fresh
process so its peak RSS is its own:

- (a) baseline, the way `ranksight report` worked before: the recording replayed through the
  detectors into a temporary chDB store, then the pages queried from it;
- (b) `ranksight report` now: the detectors run once, the recording is read twice and folded per
  panel (`ui.digest`), no store.

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
from dataclasses import replace
from pathlib import Path

JOB = "pretrain-7b-0002"  # the straggler_gpu scenario's job


def _recording(path: Path, ranks: int, minutes: float) -> int:
    from producers.simulator import load_scenario, simulate
    from schemas.files import write_container

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
    main()
