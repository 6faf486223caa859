"""A Hugging Face `Trainer` on a tiny GPT-2 built from a config (nothing downloaded), with ranksight's callback.

    torchrun --nproc-per-node 2 examples/train_hf.py --steps 30

CPU, gloo. Steps, evaluations and checkpoints (`save_steps`, each `checkpoint-<step>` folder read
back and verified off the training thread: safetensors header, torch zips, checksum manifest)
go to Kafka (KAFKA_BOOTSTRAP, RANKSIGHT_TOPIC_PREFIX, RANKSIGHT_JOB_ID). Fault:
`--nan-at-step S` (the loss becomes NaN).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import torch
import transformers

from producers.training.hf import RanksightCallback


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random token sequences: a causal language model's input and labels."""

    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class NanAfter(transformers.TrainerCallback):
    """Fault injection: from step S on, the model's output head yields NaN."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        if state.global_step == self.step and model is not None:
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(float("nan"))


class Slower(transformers.TrainerCallback):
    """Every rank alike spends `delay` more seconds per step (a bigger model, not a straggler)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        time.sleep(self.delay)


def main() -> None:
    """Train for `--steps` steps on every rank torchrun started."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--checkpoint-max-age-s", type=float, default=3600.0)
    p.add_argument("--nan-at-step", type=int, default=None)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds added to every step")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=128)
    model = transformers.GPT2LMHeadModel(config)
    training = transformers.TrainingArguments(
        output_dir=args.out or tempfile.mkdtemp(prefix="ranksight-hf-"),
        max_steps=args.steps,
        per_device_train_batch_size=8,
        logging_steps=1,
        save_strategy="steps",
        save_steps=args.checkpoint_every,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    callbacks: list[Any] = [
        RanksightCallback(  # the one line
            owner="example",
            team="nlp",
            model_name="gpt2-tiny",
            workload_family="example-hf",
            checkpoint_max_age_s=args.checkpoint_max_age_s,
        )
    ]
    if args.nan_at_step is not None:
        callbacks.append(NanAfter(args.nan_at_step))
    if args.step_delay:
        callbacks.append(Slower(args.step_delay))
    trainer = transformers.Trainer(
        model=model, args=training, train_dataset=Tokens(1024, 32, 128), callbacks=callbacks
    )
    trainer.train()


if __name__ == "__main__":
    main()
