"""What timing DDP's collectives costs a training step: the same 2-rank gloo DDP loop, four ways.

    .venv/frameworks/bin/python bench/bench_comm.py [--steps 300] [--ranks 2] [--repeats 3]

1. ddp: DistributedDataParallel with its built-in (C++) all-reduce, no ranksight;
2. ddp+hook: the same with DDP's default Python `allreduce_hook` registered, no ranksight (what
   any Python communication hook costs by itself);
3. reporter: the built-in all-reduce, the loop reported (steps and segments), no comm timing;
4. reporter+comm: the loop reported and `reporter.watch_ddp(model)` (the timing hook wrapping the
   default all-reduce: two clock reads and a future callback per bucket, the step's exposed time
   computed off the training thread).

Variants run interleaved (`--repeats` rounds), each on a fresh model; prints rank 0's median of
the per-round median step times per variant (a shared machine's load moves whole rounds) and the
differences that matter: (4) - (3) is the comm timing's cost, (2) - (1) the part any Python hook
pays. Then the hook's own cost per bucket in isolation (the timing wrapper around a hook that
returns a completed torch Future, against that hook alone), which load does not blur. Needs torch (the framework venv: `make framework-torch`).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from producers.publisher import MemoryPublisher
from producers.training import Reporter

VARIANTS = ("ddp", "ddp+hook", "reporter", "reporter+comm")


def _model(hidden: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(256, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
    )


def _run(variant: str, steps: int, hidden: int, rank: int, world: int) -> list[float]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = nn.parallel.DistributedDataParallel(_model(hidden), bucket_cap_mb=1)
    reporter = None
    if variant == "ddp+hook":
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    if variant.startswith("reporter"):
        reporter = Reporter(
            "bench-comm", rank, world_size=world, node="n", publisher=MemoryPublisher(validate=False),
            bind=False, env={}, timing="host", heartbeat_s=0, verify_checkpoints=False,
        )  # fmt: skip
        if variant == "reporter+comm":
            reporter.watch_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randn(64, 1)
    times = []
    for step in range(steps):
        dist.barrier()  # every variant's step starts together on every rank
        t0 = time.perf_counter()
        if reporter is None:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        else:
            with reporter.step(step) as s:
                with s.segment("forward"):
                    loss = nn.functional.mse_loss(model(x), y)
                with s.segment("backward"):
                    opt.zero_grad()
                    loss.backward()
                with s.segment("optimizer"):
                    opt.step()
                s.record(loss=loss.detach(), samples=64)
        times.append(time.perf_counter() - t0)
    if reporter is not None:
        reporter.close()
    return times[5:]  # warm-up


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for variant in VARIANTS:
            results[variant].append(statistics.median(_run(variant, args.steps, args.hidden, rank, world)))
    if rank == 0:
        out.put(results)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    """Run the variants on 2 (or `--ranks`) gloo ranks and print rank 0's step times side by side."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_rank, args=(args.ranks, port, args, queue), nprocs=args.ranks, start_method="spawn")
    results: dict[str, list[float]] = queue.get()
    print(
        f"{args.ranks} ranks (gloo, CPU), {args.repeats} x {args.steps} steps per variant, hidden {args.hidden}"
    )
    base: dict[str, float] = {}
    for variant in VARIANTS:
        rounds = results[variant]
        base[variant] = statistics.median(rounds)
        spread = " ".join(f"{1e3 * r:.3f}" for r in rounds)
        print(f"  {variant:14s} median {1e3 * base[variant]:7.3f} ms  (rounds: {spread})")
    print(
        f"  comm timing (reporter+comm - reporter): {1e6 * (base['reporter+comm'] - base['reporter']):+.1f} us/step"
    )
    print(f"  any Python hook (ddp+hook - ddp):       {1e6 * (base['ddp+hook'] - base['ddp']):+.1f} us/step")
    print(
        f"  all of ranksight (reporter+comm - ddp): {1e6 * (base['reporter+comm'] - base['ddp']):+.1f} us/step"
    )
    bare, timed = _hook_cost()
    print(
        f"  per bucket, in isolation: hook alone {bare:.2f} us, timed {timed:.2f} us: +{timed - bare:.2f} us"
    )


def _hook_cost(calls: int = 20_000) -> tuple[float, float]:
    """Microseconds per call: a hook returning a completed Future, bare and wrapped by the comm meter."""
    reporter = Reporter(
        "bench-hook", 0, node="n", publisher=MemoryPublisher(validate=False), bind=False, env={},
        timing="host", heartbeat_s=0, verify_checkpoints=False,
    )  # fmt: skip
    tensor = torch.zeros(1024)

    class Bucket:
        def buffer(self) -> torch.Tensor:
            return tensor

    def inner(state: Any, bucket: Any) -> Any:
        fut: Any = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    timed_hook = reporter.comm.ddp_hook(inner)
    bucket = Bucket()
    out = []
    for hook in (inner, timed_hook, inner, timed_hook):
        t0 = time.perf_counter()
        for _ in range(calls):
            hook(None, bucket)
        out.append((time.perf_counter() - t0) / calls * 1e6)
        reporter.comm.take()
    reporter.close()
    return min(out[0], out[2]), min(out[1], out[3])


if __name__ == "__main__":
    main()
