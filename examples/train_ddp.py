"""Data-parallel training of a small MLP on synthetic data, reported to ranksight; with fault injection.

One process per rank over torch.distributed (gloo, CPU). Launch with torchrun or let the script
spawn its ranks:

    torchrun --nproc_per_node 4 examples/train_ddp.py --steps 50
    python examples/train_ddp.py --spawn 4 --steps 50 --to file:///tmp/steps.avro
    python examples/train_ddp.py --spawn 4 --straggler-rank 2 --straggler-delay 0.05
    torchrun --nproc_per_node 2 -m producers.training.launch examples/train_ddp.py --die-rank 1

The last runs each rank under ranksight's launcher, which reports a rank that dies without a
Python exception (`--die-how kill|segfault|oom`) as `rank_failed` at once.

Gradients are averaged by an explicit all-reduce inside the `comm` segment, so a slow rank shows
up as communication wait on the others. With `--ddp` the model is a stock
`DistributedDataParallel` (its all-reduce overlaps backward, no hand timing) and
`reporter.watch_ddp(model)` measures the collective time itself.
Faults: `--straggler-rank R --straggler-delay S` (sleep in forward), `--nan-at-step S` (the loss
becomes NaN), `--hang-rank R --hang-at-step S [--hang-seconds T]` (one rank stops; the others
block in the all-reduce; every rank's SDK sends a heartbeat while its step is stuck, so the
hang is seen and the hung rank named even when nobody finishes a step). Destination:
`--to kafka|file://...` or RANKSIGHT_DESTINATION, KAFKA_BOOTSTRAP, RANKSIGHT_TOPIC_PREFIX,
RANKSIGHT_JOB_ID.

Needs torch. PyPI's wheel brings ~3 GB of CUDA libraries; for this CPU example a CPU-only torch
is enough:

    pip install torch --index-url https://download.pytorch.org/whl/cpu
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import tempfile
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from producers.training import Reporter


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line knobs."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--spawn", type=int, default=0, help="spawn this many ranks (instead of torchrun)")
    p.add_argument(
        "--to", default=None, help="kafka or file:///path.avro (default: RANKSIGHT_DESTINATION or kafka)"
    )
    p.add_argument("--job-id", default=None, help="default: RANKSIGHT_JOB_ID, torchrun's run id, or a new id")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--checkpoint-every", type=int, default=25, help="0 disables checkpoints")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-max-age-s", type=float, default=3600.0, help="the job's checkpoint policy")
    p.add_argument("--straggler-rank", type=int, default=None)
    p.add_argument(
        "--straggler-delay", type=float, default=0.05, help="seconds slept in forward by the straggler"
    )
    p.add_argument("--straggler-from-step", type=int, default=0)
    p.add_argument("--nan-at-step", type=int, default=None)
    p.add_argument("--hang-rank", type=int, default=None)
    p.add_argument("--hang-at-step", type=int, default=None)
    p.add_argument("--hang-seconds", type=float, default=3600.0)
    p.add_argument(
        "--step-delay", type=float, default=0.0, help="seconds every rank waits for data each step"
    )
    p.add_argument(
        "--ddp", action="store_true", help="stock DistributedDataParallel, timed by the SDK's comm hook"
    )
    p.add_argument("--die-rank", type=int, default=None, help="this rank dies at --die-at-step (--die-how)")
    p.add_argument("--die-at-step", type=int, default=5)
    p.add_argument(
        "--die-how",
        choices=("kill", "segfault", "oom"),
        default="kill",
        help="SIGKILL, a segfault, or memory",
    )
    p.add_argument("--die-note", default=None, help="write the wall time of the death here (tests)")
    return p.parse_args(argv)


def _die(how: str, note: str | None) -> None:
    """Fault injection: end this process the way no `except` block sees."""
    if note:
        Path(note).write_text(f"{time.time():.3f}")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "segfault":
        import ctypes

        ctypes.string_at(0)
    else:  # grow until the memory limit (the launcher's --memory-limit) stops it
        hog = []
        while True:
            hog.append(bytearray(64 << 20))
            hog[-1][::4096] = b"x" * len(hog[-1][::4096])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train(args: argparse.Namespace) -> None:
    """One rank's training loop (rank and world size from the torch.distributed environment)."""
    torch.set_num_threads(1)  # several ranks share a few CPU cores
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)  # same initial weights on every rank
    model = nn.Sequential(
        nn.Linear(64, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, 1),
    )
    if args.ddp:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    # The job starts once it can train: the first optimizer alone imports for seconds in torch 2.x.
    reporter = Reporter(args.job_id, rank, world_size=world, destination=args.to)
    if args.ddp:
        reporter.watch_ddp(model)  # comm_s per step from DDP's own all-reduce
    if rank == 0:
        reporter.job_started(
            owner=os.environ.get("USER", "example"),
            team="ml-platform",
            model_name="mlp",
            model_version="1",
            dataset_version="synthetic-v1",
            workload_family="example-mlp",
            global_batch_size=args.batch * world,
            gpu_class="cpu",
            checkpoint_max_age_s=args.checkpoint_max_age_s,
            checkpoint_timeout_s=120,
        )
        reporter.state("running")
    true_w = torch.randn(64, 1)
    data_rng = torch.Generator().manual_seed(rank)
    ckpt_dir = Path(args.checkpoint_dir or tempfile.mkdtemp(prefix="ranksight-example-ckpt-"))
    try:
        for step in range(args.steps):
            with reporter.step(step) as s:
                with s.segment("data_wait"):
                    if args.die_rank == rank and args.die_at_step == step:
                        _die(args.die_how, args.die_note)
                    if args.step_delay:
                        time.sleep(args.step_delay)
                    x = torch.randn(args.batch, 64, generator=data_rng)
                    y = x @ true_w + 0.1 * torch.randn(args.batch, 1, generator=data_rng)
                with s.segment("forward"):
                    if args.hang_rank == rank and args.hang_at_step == step:
                        time.sleep(args.hang_seconds)
                    if args.straggler_rank == rank and step >= args.straggler_from_step:
                        time.sleep(args.straggler_delay)
                    loss = nn.functional.mse_loss(model(x), y)
                    if args.nan_at_step is not None and step >= args.nan_at_step:
                        loss = loss * float("nan")
                with s.segment("backward"):
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()  # with --ddp the all-reduce runs in here, overlapped
                if not args.ddp:
                    with s.segment("comm"):
                        grads = [p.grad for p in model.parameters() if p.grad is not None]
                        flat = torch.cat([g.reshape(-1) for g in grads])
                        dist.all_reduce(flat)
                        flat /= world
                        offset = 0
                        for g in grads:
                            g.copy_(flat[offset : offset + g.numel()].view_as(g))
                            offset += g.numel()
                with s.segment("optimizer"):
                    grads = [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
                    grad_norm = torch.linalg.vector_norm(torch.cat(grads))
                    optimizer.step()
                s.record(
                    loss=loss.detach(),
                    lr=args.lr,
                    grad_norm=grad_norm,
                    samples=args.batch,
                    tokens=args.batch * 64,
                )
            if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and rank == 0:
                path = ckpt_dir / f"step{step + 1}.pt"
                # Read back and verified off the training thread once the block completes.
                with reporter.checkpoint(step + 1, path.as_uri()) as ck:
                    torch.save(model.state_dict(), path)
                    ck.bytes = path.stat().st_size
        if rank == 0:
            reporter.validation(args.steps, {"train_loss": float(loss.detach())})
            reporter.state("completed")
    except BaseException as exc:
        reporter.fault("exit", f"{type(exc).__name__}: {exc}")
        # A collective error here is most often another rank's death; that rank's own report (its
        # launcher's) may come a moment later, and the job's end would drop it: the launcher and the
        # scheduler say when the job failed, not the first rank that noticed.
        if rank == 0 and not isinstance(exc, RuntimeError):
            reporter.state("failed", reason=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        reporter.close()
        dist.destroy_process_group()


def _spawned(local_rank: int, args: argparse.Namespace, world: int, port: int, job_id: str) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(local_rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world),
            "RANKSIGHT_JOB_ID": job_id,
        }
    )
    train(args)


def main(argv: list[str] | None = None) -> None:
    """Run under torchrun, or spawn `--spawn N` ranks."""
    args = parse_args(argv)
    if args.spawn:
        job_id = args.job_id or os.environ.get("RANKSIGHT_JOB_ID") or f"example-{uuid.uuid4().hex[:8]}"
        print(f"job {job_id}: {args.spawn} ranks, {args.steps} steps", flush=True)
        mp.spawn(_spawned, args=(args, args.spawn, _free_port(), job_id), nprocs=args.spawn, join=True)
    else:
        train(args)


if __name__ == "__main__":
    main()
