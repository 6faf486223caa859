"""What checkpoint verification costs the training loop: the same torch loop with checkpoints, three ways.

    .venv/frameworks/bin/python bench/bench_verify.py [--steps 300] [--every 20] [--hidden 512]

1. baseline: the loop and `torch.save` every `--every` steps, no ranksight;
2. reporter: the same loop reported (steps, segments, checkpoints), verification off;
3. verified: the same, every checkpoint read back on the verifier thread (the default).

Prints the median and mean step time of each (the steps with a save included) and the verifier's
own time per checkpoint (read back, SHA-256, zip CRCs). On a machine with few cores the verifier
thread competes with the loop for a core while it reads: that contention is what (3) - (2) shows.
Needs torch (the framework venv: `make framework-torch`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from producers.publisher import MemoryPublisher
from producers.training import Reporter
from producers.training.verify import verify_path


def _loop(steps: int, every: int, hidden: int, folder: Path, reporter: Reporter | None) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randn(64, 1)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        if reporter is None:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        else:
            with reporter.step(step) as s:
                with s.segment("forward"):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                with s.segment("backward"):
                    opt.zero_grad()
                    loss.backward()
                with s.segment("optimizer"):
                    opt.step()
                s.record(loss=loss.detach(), samples=64)
        if (step + 1) % every == 0:
            path = folder / f"step{step + 1}.pt"
            if reporter is None:
                torch.save(model.state_dict(), path)
            else:
                with reporter.checkpoint(step + 1, str(path)):
                    torch.save(model.state_dict(), path)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    """Run the three variants on the same loop and print step times side by side."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    results: dict[str, list[float]] = {"baseline": [], "reporter": [], "verified": []}
    verified_events = 0
    for _ in range(args.repeats):
        for name in results:
            with tempfile.TemporaryDirectory() as tmp:
                reporter = None
                publisher = MemoryPublisher()
                if name != "baseline":
                    reporter = Reporter(
                        "bench", 0, node="n", publisher=publisher, bind=False, env={}, timing="host",
                        verify_checkpoints=name == "verified",
                    )  # fmt: skip
                results[name] += _loop(args.steps, args.every, args.hidden, Path(tmp), reporter)
                if reporter is not None:
                    reporter.close()
                    verified_events += sum(
                        e.type == "CheckpointEvent" and e.record["phase"] == "verified"
                        for e in publisher.events
                    )
    base = statistics.median(results["baseline"])
    print(f"{args.steps} steps x {args.repeats}, a checkpoint every {args.every} steps, hidden {args.hidden}")
    for name, times in results.items():
        med, mean = statistics.median(times), statistics.fmean(times)
        print(
            f"  {name:9s} median {med * 1e3:7.3f} ms  mean {mean * 1e3:7.3f} ms  (median +{(med - base) * 1e6:6.1f} us)"
        )
    print(f"  verified checkpoints reported: {verified_events}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.pt"
        model = torch.nn.Sequential(torch.nn.Linear(256, args.hidden), torch.nn.Linear(args.hidden, 1))
        torch.save(model.state_dict(), path)
        t0 = time.perf_counter()
        for _ in range(20):
            verify_path(path)
        per = (time.perf_counter() - t0) / 20
        size = path.stat().st_size
        print(
            f"  verifier thread: {per * 1e3:.2f} ms per checkpoint of {size / 1e6:.2f} MB ({size / per / 1e6:.0f} MB/s)"
        )


if __name__ == "__main__":
    main()
