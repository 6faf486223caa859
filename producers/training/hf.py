"""Hugging Face `Trainer`: `Trainer(..., callbacks=[RanksightCallback()])` reports steps, evaluations, checkpoints.

The `Trainer` runs forward and backward in one call with no hook in between, so a step's
`forward` segment covers both (`backward_s` stays null); `optimizer` runs from
`on_pre_optimizer_step` to `on_optimizer_step`; `data_wait` from the previous step's end to this
step's begin. Loss, learning rate and grad norm are what the Trainer logs (`on_log`, every
`logging_steps`): a step that is logged waits for them, the others carry none. Evaluations send
EvaluationEvent started (when the Trainer decides to evaluate) and completed with the metrics;
checkpoints open when the Trainer decides to save and complete at `on_save` with the size of
`checkpoint-<step>`. The parallel layout comes from the arguments (FSDP, DeepSpeed's ZeRO stage,
accelerate's parallelism config). Identity: process index and world size from `TrainingArguments`, the job
from the environment.
"""

from __future__ import annotations

import os
from typing import Any

from producers.training.hooks import LoopHooks
from producers.training.layout import hf_layout
from producers.training.reporter import Reporter

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError(
        "ranksight's Hugging Face callback needs transformers: pip install transformers"
    ) from exc

__all__ = ["RanksightCallback"]

_LOG_KEYS = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm"}


class RanksightCallback(TrainerCallback):
    """Reports a `Trainer` run to ranksight; `job_info` goes to `Reporter.job_started` (owner, team, model...)."""

    def __init__(
        self,
        reporter: Reporter | None = None,
        *,
        tokens_per_sample: int | None = None,
        reporter_options: dict[str, Any] | None = None,
        **job_info: Any,
    ) -> None:
        options = dict(reporter_options or {})
        self.hooks = LoopHooks(
            lambda **ident: Reporter(**ident, **options),
            job_info=job_info,
            tokens_per_sample=tokens_per_sample,
        )
        self.hooks.reporter = reporter
        self._eval_due = False
        self._training = False

    @property
    def reporter(self) -> Reporter | None:
        """The reporter (created at train begin unless one was passed)."""
        return self.hooks.reporter

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._training = True
        self.hooks.train_start(
            rank=int(getattr(args, "process_index", 0)),
            world_size=int(getattr(args, "world_size", 1)),
            local_rank=int(getattr(args, "local_process_index", 0)),
            is_zero=bool(state.is_world_process_zero),
            targets={
                # The Trainer sets state.max_steps (from max_steps or epochs x batches) before this hook.
                "target_steps": getattr(state, "max_steps", None),
                "target_epochs": getattr(state, "num_train_epochs", None)
                or getattr(args, "num_train_epochs", None),
            },
            layout=hf_layout(args),
        )
        if int(getattr(state, "global_step", 0) or 0) > 0:
            self._resumed(args, state)

    def _resumed(self, args: Any, state: Any) -> None:
        """The Trainer resumed from `checkpoint-<global_step>`: what its files held is what it restored."""
        step = int(state.global_step)
        path = os.path.join(str(args.output_dir), f"checkpoint-{step}")
        try:
            files = set(os.listdir(path))
        except OSError:
            files = set()
        model = any(f.startswith(("model", "pytorch_model", "adapter_model")) for f in files)
        restored = [
            part
            for part, present in (
                ("model", model),
                ("optimizer", "optimizer.pt" in files),
                ("scheduler", "scheduler.pt" in files),
                ("data", "trainer_state.json" in files and not getattr(args, "ignore_data_skip", False)),
            )
            if present
        ]
        logged = [e["loss"] for e in getattr(state, "log_history", None) or [] if "loss" in e]
        self.hooks.checkpoint_loaded(step, restored=restored, loss_before=logged[-1] if logged else None)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        epoch = getattr(state, "epoch", None)  # a float: 1.25 is a quarter into the second epoch
        self.hooks.batch_start(int(state.global_step), None if epoch is None else int(epoch))

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.hooks.segment("optimizer")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = self.hooks._step
        if step is not None:
            step.segment_end()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # DefaultFlowCallback ran first and set what happens after this step.
        samples = int(getattr(args, "per_device_train_batch_size", 0) or 0) * int(
            getattr(args, "gradient_accumulation_steps", 1) or 1
        )
        tokens = samples * self.hooks.tokens_per_sample if self.hooks.tokens_per_sample and samples else None
        self.hooks.batch_end(wait_for_values=bool(control.should_log), samples=samples or None, tokens=tokens)
        self._eval_due = bool(control.should_evaluate)
        if control.should_save and state.is_world_process_zero:
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            keep = getattr(args, "save_total_limit", None)
            self.hooks.checkpoint_started(
                int(state.global_step), f"file://{path}", keep=keep if isinstance(keep, int) else None
            )

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        values = {ours: (logs or {}).get(theirs) for theirs, ours in _LOG_KEYS.items()}
        self.hooks.values_arrived(**values)
        if self._eval_due:
            self._eval_due = False
            self.hooks.evaluation_start(int(state.global_step), "eval")

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._training and self.hooks._evaluation is None:
            self._eval_due = False
            self.hooks.evaluation_start(int(state.global_step), "eval")

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self.hooks.evaluation_end(int(state.global_step), metrics or {})

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.hooks.checkpoint_finished(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._training = False
        self.hooks.train_end(is_zero=bool(state.is_world_process_zero))
