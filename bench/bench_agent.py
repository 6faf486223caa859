"""CPU cost of the node agent, and the cost of each NVML function it calls.

    .venv/bin/python bench/bench_agent.py [--seconds 30] [--gpus 8] [--interval 1.0] [--nvml fake|h200|real]

`fake` (default): the fake NVML module (answers in microseconds), `--gpus` GPUs (H100s: GPM
included). `h200`: one
fake GPU shaped like the real H200 (no NVLink, reason bits, empty pids at idle) whose
`nvmlDeviceGetPcieThroughput` takes its real 20 ms window, so the table shows what a blocking
call would cost if the sampler made it. `real`: the real `pynvml` on this node's GPUs. Prints
the agent's CPU as % of one core, the NVML time per GPU per tick against the 5 ms target, and per
NVML function: calls per GPU per tick, mean cost and cost per GPU per tick, GPM's calls
(`nvmlGpmSampleGet`, `nvmlGpmMetricsGet`) marked and summed. Events are Avro-encoded (as for
Kafka) and discarded.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from typing import Any

import psutil

from producers.agent import Agent, FakeNvml, GpuSampler, HostSampler, load_nvml
from producers.agent.gpu import TimedNvml
from producers.publisher import Publisher
from schemas.codec import Codec
from schemas.records import Event

TARGET_MS_PER_GPU = 5.0
TARGET_CORE_PCT_8_GPUS = 1.0


class _EncodingSink(Publisher):
    """Encodes each event like the Kafka publisher would, then drops it."""

    def __init__(self) -> None:
        self.codec = Codec()
        self.count = 0
        self.bytes = 0

    def publish(self, event: Event) -> None:
        self.bytes += len(self.codec.encode(event))
        self.count += 1

    def flush(self, timeout: float = 30) -> int:
        return 0

    def close(self, timeout: float = 30) -> None:
        pass

    @property
    def stats(self) -> dict[str, int]:
        return {"published": self.count, "bytes": self.bytes}


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _nvml(kind: str, gpus: int) -> Any:
    if kind == "real":
        return load_nvml()
    if kind == "h200":
        return FakeNvml.h200(busy=True, latency_s={"nvmlDeviceGetPcieThroughput": 0.020})
    return FakeNvml(gpus=gpus)


_WATCHER = ("nvmlEventSetWait", "nvmlEventSetFree")  # the XID watcher thread blocks in these by design


def print_costs(timed: TimedNvml, ticks: int, gpus: int) -> None:
    """Per NVML function of the sampling path: calls and cost per GPU per tick, mean, share (GPM marked)."""
    costs = {k: v for k, v in timed.costs().items() if k not in _WATCHER}
    total = sum(s for _, s in costs.values())
    per_gpu_tick = max(1, ticks * gpus)
    print(f"{'NVML function':45s} {'calls/GPU/tick':>14s} {'mean us':>9s} {'us/GPU/tick':>11s} {'share':>7s}")
    gpm_us = 0.0
    for name, (calls, seconds) in costs.items():
        per = calls / per_gpu_tick
        cost_us = seconds / per_gpu_tick * 1e6
        if name.startswith("nvmlGpm"):
            gpm_us += cost_us
        label = f"{name} (GPM)" if name.startswith("nvmlGpm") else name
        print(
            f"{label:45s} {per:14.2f} {seconds / calls * 1e6:9.1f} {cost_us:11.1f} "
            f"{seconds / max(total, 1e-12) * 100:6.1f}%"
        )
    all_us = total / per_gpu_tick * 1e6
    print(f"{'all NVML calls':45s} {'':14s} {'':9s} {all_us:11.1f}")
    print(f"{'of which GPM (SM/tensor/DRAM activity)':45s} {'':14s} {'':9s} {gpm_us:11.1f}")


def main() -> None:
    """Run the agent for a while and report its cost."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--nvml", choices=["fake", "h200", "real"], default="fake")
    args = parser.parse_args()
    proc = psutil.Process(os.getpid())
    node = socket.gethostname()
    count = max(1, int(args.seconds / args.interval))

    # Bare psutil: the same calls the host sampler makes, nothing else.
    host_only = HostSampler(cluster="bench", node=node)
    cpu0 = _cpu_s(proc)
    for _ in range(count):
        host_only.sample(0, time.monotonic())
    bare_per_sample_ms = (_cpu_s(proc) - cpu0) / count * 1000

    timed = TimedNvml(_nvml(args.nvml, args.gpus))
    sampler = GpuSampler(timed, cluster="bench", node=node)
    gpus = sampler.count
    sink = _EncodingSink()
    agent = Agent(sink, host=HostSampler(cluster="bench", node=node), gpus=sampler, interval=args.interval)
    timed._costs.clear()  # count the ticks only, not the start-up
    cpu0, t0 = _cpu_s(proc), time.monotonic()
    stats = agent.run(count=count)
    wall = time.monotonic() - t0 + args.interval  # the last tick's interval is not slept
    cpu = _cpu_s(proc) - cpu0
    nvml_s = sum(s for name, (_, s) in timed.costs().items() if name not in _WATCHER)
    per_gpu_tick_ms = nvml_s / max(1, count * gpus) * 1000
    print(f"{count} intervals of {args.interval:g}s, {gpus} GPU(s) ({args.nvml} NVML) + host")
    print(
        f"agent CPU:            {cpu / wall * 100:6.2f} % of one core ({cpu / count * 1000:.2f} ms per interval)"
    )
    print(
        f"NVML per GPU per tick:{per_gpu_tick_ms:7.3f} ms wall (target < {TARGET_MS_PER_GPU:g} ms); "
        f"8 GPUs at 1 Hz: {per_gpu_tick_ms * 8 / 10:.3f} % of one core (target < {TARGET_CORE_PCT_8_GPUS:g} %)"
    )
    print(
        f"psutil calls alone:   {bare_per_sample_ms / (args.interval * 1000) * 100:6.2f} % of one core "
        f"({bare_per_sample_ms:.2f} ms per sample)"
    )
    print(f"agent RSS:            {proc.memory_info().rss / 2**20:6.1f} MiB")
    print(
        f"events:               {sink.count} ({sink.bytes / max(1, sink.count):.0f} bytes each on average), "
        f"skipped ticks {stats.skipped_ticks}"
    )
    print_costs(timed, count, gpus)
    if args.nvml == "h200":
        nvml = timed._nvml
        t = time.perf_counter()
        nvml.nvmlDeviceGetPcieThroughput(sampler.handles[0], nvml.NVML_PCIE_UTIL_TX_BYTES)
        print(
            f"for comparison, one nvmlDeviceGetPcieThroughput (20 ms window, never called per tick): "
            f"{(time.perf_counter() - t) * 1000:.1f} ms"
        )


if __name__ == "__main__":
    main()
