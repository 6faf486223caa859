"""A stock DDP job, then an FSDP2 job, on the ranks torchrun starts (gloo, CPU): no hand timing.

The SDK times the collectives itself (`watch_ddp`, `watch_collectives`); rank `--slow-rank` sleeps
in forward from step `--slow-from` of each phase. Each phase reports to its own job through the
file destination (`<out>/<phase>.rank<N>.avro`). Run by test_comm_jobs.py.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn

from producers.training import Reporter


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))


def _phase(name: str, model: nn.Module, reporter: Reporter, args: argparse.Namespace, rank: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        with reporter.step(step) as s:
            with s.segment("forward"):
                if rank == args.slow_rank and step >= args.slow_from:
                    time.sleep(args.delay)
                loss = model(torch.randn(32, 64, generator=data)).pow(2).mean()
            with s.segment("backward"):
                loss.backward()
            with s.segment("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            s.record(loss=loss.detach(), samples=32)
    dist.barrier()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-from", type=int, default=15)
    p.add_argument("--delay", type=float, default=0.03)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    # Stock DDP: DDP's own all-reduce, overlapped with backward, timed by the SDK's comm hook.
    ddp = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.25)
    reporter = Reporter("comm-ddp", rank, world_size=world, destination=f"file://{args.out}/ddp.avro")
    reporter.watch_ddp(ddp)
    _phase("ddp", ddp, reporter, args, rank)
    reporter.close()

    # FSDP2 (fully_shard): its all-gathers and reduce-scatters through the wrapped torch.distributed.
    from torch.distributed.fsdp import fully_shard

    reporter = Reporter("comm-fsdp", rank, world_size=world, destination=f"file://{args.out}/fsdp.avro")
    reporter.watch_collectives()
    sharded = _model()
    for layer in sharded:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(sharded)
    _phase("fsdp", sharded, reporter, args, rank)
    reporter.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
