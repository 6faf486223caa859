"""PyTorch Lightning: `Trainer(callbacks=[RanksightCallback()])` reports every batch, evaluation and checkpoint.

Segments come from Lightning's hooks: `data_wait` (previous batch end -> batch start), `forward`
(batch start -> `on_before_backward`), `backward` (-> `on_before_optimizer_step`) and
`optimizer` (-> batch end). Loss is the training step's `loss`, lr the first optimizer's first
param group, grad norm the 2-norm of all gradients before the optimizer step (computed on the GPU
and read off-thread). Validation runs (not the sanity check) send EvaluationEvent
started/completed and the logged metrics; `on_save_checkpoint` opens a checkpoint that completes
(with the file's size) at the next hook. The parallel layout comes from the Trainer's strategy
(DDP, FSDP's sharding strategy, DeepSpeed's ZeRO stage, ModelParallel's sizes). Identity: rank and world size from the Trainer, the job
from the launcher environment (RANKSIGHT_JOB_ID, Slurm, torchrun, Kubernetes).
"""

from __future__ import annotations

from typing import Any

from producers.training.hooks import LoopHooks
from producers.training.layout import lightning_layout
from producers.training.reporter import Reporter

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    try:
        from pytorch_lightning import Callback
    except ImportError as exc:
        raise ImportError(
            "ranksight's Lightning callback needs PyTorch Lightning: pip install lightning"
        ) from exc

__all__ = ["RanksightCallback"]


def _targets(trainer: Any) -> dict[str, Any]:
    """max_steps / max_epochs of a Trainer (-1 and None are unset), else its estimated stepping batches."""
    steps = getattr(trainer, "max_steps", None)
    epochs = getattr(trainer, "max_epochs", None)
    if steps is None or steps < 0:
        try:
            steps = trainer.estimated_stepping_batches  # inf for an unbounded loop
        except Exception:  # needs the data loaders; not every trainer can answer at train start
            steps = None
    return {
        "target_steps": steps,
        "target_epochs": epochs if epochs is not None and epochs > 0 else None,
    }


def _keep(trainer: Any) -> int | None:
    """Checkpoints ModelCheckpoint keeps (save_top_k; -1: all, so no limit)."""
    top_k = getattr(getattr(trainer, "checkpoint_callback", None), "save_top_k", None)
    return top_k if isinstance(top_k, int) and top_k > 0 else None


def _grad_norm(pl_module: Any) -> Any:
    import torch

    grads = [p.grad.detach() for p in pl_module.parameters() if p.grad is not None]
    if not grads:
        return None
    norms = torch._foreach_norm(grads) if hasattr(torch, "_foreach_norm") else [g.norm() for g in grads]
    return torch.linalg.vector_norm(torch.stack(list(norms)))


class RanksightCallback(Callback):
    """Reports a Lightning run to ranksight; `job_info` goes to `Reporter.job_started` (owner, team, model...)."""

    def __init__(
        self,
        reporter: Reporter | None = None,
        *,
        tokens_per_sample: int | None = None,
        grad_norm: bool = True,
        reporter_options: dict[str, Any] | None = None,
        **job_info: Any,
    ) -> None:
        super().__init__()
        options = dict(reporter_options or {})
        self.hooks = LoopHooks(
            lambda **ident: Reporter(**ident, **options),
            job_info=job_info,
            tokens_per_sample=tokens_per_sample,
        )
        self.hooks.reporter = reporter
        self.grad_norm = grad_norm
        self._grad: Any = None

    @property
    def reporter(self) -> Reporter | None:
        """The reporter (created at train start unless one was passed)."""
        return self.hooks.reporter

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.hooks.train_start(
            rank=int(trainer.global_rank),
            world_size=int(trainer.world_size),
            local_rank=int(trainer.local_rank),
            is_zero=bool(trainer.is_global_zero),
            targets=_targets(trainer),
            layout=lightning_layout(trainer),
        )
        # DDP's gradient all-reduce overlaps backward: the SDK's hook times it (comm_s per step).
        self.hooks.watch_comm(getattr(getattr(trainer, "strategy", None), "model", None))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._grad = None
        if self.hooks._checkpoint:  # the checkpoint saved after the previous batch is on disk now
            self.hooks.checkpoint_finished(self._saved_path())
        epoch = getattr(trainer, "current_epoch", None)
        self.hooks.batch_start(int(trainer.global_step), None if epoch is None else int(epoch))

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.hooks.segment("backward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.grad_norm:
            try:
                self._grad = _grad_norm(pl_module)
            except Exception:
                self._grad = None
        self.hooks.segment("optimizer")

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        counts = self.hooks.samples_tokens(batch)
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        lr = None
        optimizers = getattr(trainer, "optimizers", None) or []
        if optimizers and optimizers[0].param_groups:
            lr = optimizers[0].param_groups[0].get("lr")
        self.hooks.batch_end(
            loss=None if loss is None else loss.detach() if hasattr(loss, "detach") else loss,
            lr=lr,
            grad_norm=self._grad,
            samples=counts["samples"],
            tokens=counts["tokens"],
        )

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not getattr(trainer, "sanity_checking", False):
            self.hooks.evaluation_start(int(trainer.global_step), "val")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not getattr(trainer, "sanity_checking", False):
            self.hooks.evaluation_end(
                int(trainer.global_step), dict(getattr(trainer, "callback_metrics", {}))
            )

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        checkpoint["ranksight"] = self.hooks.checkpoint_metadata()
        if trainer.is_global_zero:
            self.hooks.checkpoint_started(int(trainer.global_step), keep=_keep(trainer))
            self._ckpt_callback = getattr(trainer, "checkpoint_callback", None)

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # What Lightning restores from this dict: the module, optimizers, schedulers, loop positions.
        restored = [
            part
            for part, key in (
                ("model", "state_dict"),
                ("optimizer", "optimizer_states"),
                ("scheduler", "lr_schedulers"),
                ("data", "loops"),
            )
            if checkpoint.get(key)
        ]
        saved = checkpoint.get("ranksight") or {}
        self.hooks.checkpoint_loaded(
            int(checkpoint.get("global_step", 0)),
            restored=restored,
            loss_before=saved.get("loss"),
            run_id=saved.get("run_id"),
        )

    def _saved_path(self) -> str | None:
        cb = getattr(self, "_ckpt_callback", None)
        return getattr(cb, "_last_checkpoint_saved", None) or getattr(cb, "last_model_path", None) or None

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.hooks._checkpoint:
            self.hooks.checkpoint_finished(self._saved_path())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.hooks._checkpoint:
            self.hooks.checkpoint_finished(self._saved_path())
        self.hooks.train_end(is_zero=bool(trainer.is_global_zero))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.hooks.exception(exception, is_zero=bool(trainer.is_global_zero))
        reporter = self.hooks.reporter
        if reporter is not None and self.hooks._owns_reporter:
            reporter.close()
