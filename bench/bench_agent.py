"""CPU and memory cost of the node agent: 8 simulated GPUs + host sampling at a 1 s interval.

    .venv/bin/python bench/bench_agent.py [--seconds 30] [--gpus 8] [--interval 1.0]

Prints the agent's CPU as % of one core and its RSS, next to the bare cost of the psutil calls
alone. Events are Avro-encoded (as for Kafka) and discarded. The fake NVML answers in microseconds;
real NVML calls cost more (tens of microseconds each), so on a GPU node expect a little higher.
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import psutil

from producers.agent import Agent, FakeNvml, GpuSampler, HostSampler
from producers.publisher import Publisher
from schemas.codec import Codec
from schemas.records import Event


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


def main() -> None:
    """Run the agent for a while and report its cost."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    proc = psutil.Process(os.getpid())
    node = socket.gethostname()
    count = max(1, int(args.seconds / args.interval))

    # Bare psutil: the same calls the host sampler makes, nothing else.
    host_only = HostSampler(cluster="bench", node=node)
    cpu0, t0 = _cpu_s(proc), time.monotonic()
    for _ in range(count):
        host_only.sample(0, time.monotonic())
    bare_per_sample_ms = (_cpu_s(proc) - cpu0) / count * 1000

    sink = _EncodingSink()
    agent = Agent(
        sink,
        host=HostSampler(cluster="bench", node=node),
        gpus=GpuSampler(FakeNvml(gpus=args.gpus), cluster="bench", node=node),
        interval=args.interval,
    )
    cpu0, t0 = _cpu_s(proc), time.monotonic()
    stats = agent.run(count=count)
    wall = time.monotonic() - t0 + args.interval  # the last tick's interval is not slept
    cpu = _cpu_s(proc) - cpu0
    print(f"{count} intervals of {args.interval:g}s, {args.gpus} simulated GPUs + host")
    print(
        f"agent CPU:            {cpu / wall * 100:6.2f} % of one core ({cpu / count * 1000:.2f} ms per interval)"
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


if __name__ == "__main__":
    main()
