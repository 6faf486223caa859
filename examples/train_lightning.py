"""A Lightning `Trainer` (DDP on CPU over gloo) with ranksight's callback: the one line is `callbacks=[...]`.

    torchrun --nproc-per-node 2 examples/train_lightning.py --steps 40

Steps, segments, evaluations and checkpoints (ModelCheckpoint every `--checkpoint-every` steps,
each read back and verified off the training thread) go to Kafka (KAFKA_BOOTSTRAP,
RANKSIGHT_TOPIC_PREFIX, RANKSIGHT_JOB_ID). Fault: `--nan-at-step S` (the loss becomes NaN).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from producers.training.lightning import RanksightCallback


class Regression(pl.LightningModule):
    """A small MLP on synthetic regression data."""

    def __init__(self, nan_at_step: int | None, step_delay: float = 0.0) -> None:
        super().__init__()
        self.step_delay = step_delay
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.nan_at_step = nan_at_step

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        if self.step_delay:
            time.sleep(self.step_delay)  # every rank alike: a slower model, not a straggler
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if self.nan_at_step is not None and self.global_step >= self.nan_at_step:
            loss = loss * float("nan")
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    """Train for `--steps` steps on every rank torchrun started."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--checkpoint-max-age-s", type=float, default=3600.0)
    p.add_argument("--nan-at-step", type=int, default=None)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds added to every step")
    p.add_argument("--root", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(int(os.environ.get("RANK", "0")))
    x = torch.randn(2048, 32, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=False)
    root = args.root or tempfile.mkdtemp(prefix="ranksight-lightning-")
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto",
        callbacks=[
            ModelCheckpoint(dirpath=root, every_n_train_steps=args.checkpoint_every, save_top_k=-1),
            RanksightCallback(  # the one line
                owner="example",
                team="ml-platform",
                model_name="mlp",
                workload_family="example-lightning",
                checkpoint_max_age_s=args.checkpoint_max_age_s,
            ),
        ],
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=True,
    )
    trainer.fit(Regression(args.nan_at_step, args.step_delay), loader)


if __name__ == "__main__":
    main()
