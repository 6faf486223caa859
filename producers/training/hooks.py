"""Framework hooks -> SDK calls: the logic shared by the Lightning and Hugging Face callbacks.

`LoopHooks` knows nothing about either framework: the adapters (`lightning.py`, `hf.py`) call
it with plain values from their hooks, so its behaviour is tested without the frameworks. One
StepCompleted per training batch:

- `data_wait`: from the end of the previous batch to the start of this one (the data loader);
- `forward` / `backward` / `optimizer`: between the hooks that bound them, where the framework
  has them (Lightning: all three; Hugging Face: `forward` covers forward *and* backward, which
  its `Trainer` runs in one call without a hook in between);
- loss, lr, grad norm, samples, tokens as the framework exposes them.

The run's target (max steps, max epochs) goes into JobStarted and each batch carries its epoch,
as the framework counts them. A checkpoint carries the framework's retention (`keep`); saved
checkpoints whose files are gone when a later one completes are reported as `deleted` by it.
An exception that ends the loop is a RankFault of its kind (CUDA out of memory, a collective or
storage timeout, or another exception).

After a resume from a checkpoint (`checkpoint_loaded`), the first `restore_test_steps` batches
are a restore test: rank 0 reports a RestoreTest with what the framework actually loaded, the
loss saved with the checkpoint (`checkpoint_metadata`) against the first resumed loss, and the
runtime (`torch <version> cuda <version>`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from producers.training.reporter import CheckpointReport, EvaluationReport, Reporter, Step

__all__ = ["LoopHooks", "path_bytes", "runtime_version", "tensor_batch_size"]

log = logging.getLogger(__name__)


def tensor_batch_size(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of the first tensor found (dict, list, tuple or tensor)."""
    if hasattr(batch, "shape") and getattr(batch, "shape", None):
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        for value in batch.values():
            n = tensor_batch_size(value)
            if n is not None:
                return n
    if isinstance(batch, (list, tuple)):
        for value in batch:
            n = tensor_batch_size(value)
            if n is not None:
                return n
    return None


def path_bytes(path: str | os.PathLike[str] | None) -> int | None:
    """Size of a checkpoint file, or of every file under a checkpoint directory."""
    if not path:
        return None
    p = Path(path)
    try:
        if p.is_file():
            return p.stat().st_size
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    except OSError:
        return None
    return None


def runtime_version() -> str | None:
    """`torch <version> cuda <version>` of the torch this process already imported, or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return f"torch {getattr(torch, '__version__', '?')} cuda {getattr(getattr(torch, 'version', None), 'cuda', None)}"


class LoopHooks:
    """Turns a framework's training-loop hooks into one reporter's steps, evaluations and checkpoints."""

    def __init__(
        self,
        reporter_factory: Callable[..., Reporter],
        *,
        job_info: Mapping[str, Any] | None = None,
        tokens_per_sample: int | None = None,
        restore_test_steps: int = 10,
    ) -> None:
        self._factory = reporter_factory
        self.restore_test_steps = restore_test_steps
        self._resumed: dict[str, Any] | None = None  # a restore test in progress (after checkpoint_loaded)
        self._last_loss: Any = None
        self.job_info = dict(job_info or {})
        self.tokens_per_sample = tokens_per_sample
        self.reporter: Reporter | None = None
        self._step: Step | None = None
        self._waiting: Step | None = None  # a batch's data wait, opened at the end of the previous batch
        self._pending: Step | None = None  # ended on the clock, published when its values arrive
        self._evaluation: EvaluationReport | None = None
        self._checkpoint: tuple[CheckpointReport, str | None] | None = None
        self._saved: dict[str, str] = {}  # checkpoint id -> local path, to notice what retention deletes
        self._owns_reporter = False

    # -- lifecycle ------------------------------------------------------------------------------

    def train_start(
        self,
        *,
        rank: int,
        world_size: int,
        local_rank: int | None,
        is_zero: bool,
        targets: Mapping[str, Any] | None = None,
        layout: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the reporter (identity from the framework, job from the environment); rank 0 describes the job.

        `targets` (target_steps, target_epochs, target_tokens) and `layout` (the parallel layout,
        `producers.training.layout`) come from the framework's trainer; values the user passed in
        `job_info` win.
        """
        if self.reporter is None:
            self.reporter = self._factory(rank=rank, world_size=world_size, local_rank=local_rank)
            self._owns_reporter = True
        if is_zero:
            known = {k: v for k, v in {**(targets or {}), **(layout or {})}.items() if v is not None}
            self.reporter.job_started(**{**known, **self.job_info})
            self.reporter.state("running")
        resumed = self._resumed
        if resumed is not None and not resumed["announced"]:
            resumed["announced"] = True
            self.reporter.checkpoint_restored(resumed["step"])

    def watch_comm(self, model: Any) -> bool:
        """Time a DistributedDataParallel model's all-reduce (`Reporter.watch_ddp`); False when it is not one or has a hook.

        DDP takes one communication hook: a model the user gave their own keeps it (logged once).
        """
        r = self.reporter
        if r is None or type(model).__name__ != "DistributedDataParallel":
            return False
        try:
            r.watch_ddp(model)
        except Exception as exc:  # a hook registered already, or registered too late
            log.warning(
                "ranksight: DDP communication is not timed (%s); pass your hook to reporter.watch_ddp", exc
            )
            return False
        return True

    def train_end(self, *, is_zero: bool) -> None:
        """Publish what is pending; rank 0 marks the job completed; close the reporter we created."""
        r = self.reporter
        if r is None:
            return
        self.flush_pending()
        self._drop_waiting()
        self.checkpoint_finished()
        if self._resumed is not None:
            self._report_restore_test()
        if is_zero:
            r.state("completed")
        if self._owns_reporter:
            r.close()
        else:
            r.flush()

    def exception(self, exc: BaseException, *, is_zero: bool) -> None:
        """The loop raised: a RankFault, and (rank 0) the job failed."""
        r = self.reporter
        if r is None:
            return
        self._step = None
        self._drop_waiting()
        r.exception(exc)
        if is_zero:
            r.state("failed", reason=f"{type(exc).__name__}: {exc}"[:500])

    # -- steps ----------------------------------------------------------------------------------

    def batch_start(self, step: int, epoch: int | None = None) -> None:
        """A training batch begins (after the data loader delivered it); `epoch` as the framework counts it."""
        r = self.reporter
        if r is None:
            return
        if epoch is not None:
            r.set_epoch(epoch)
        self.flush_pending()
        self.checkpoint_finished()
        current = self._waiting
        self._waiting = None
        if current is None:
            current = r.step_begin(step)
        else:
            current.step = step
            r._current = current
        current.segment_begin("forward")
        self._step = current

    def segment(self, name: str) -> None:
        """The next part of the current batch starts (ending the one before)."""
        if self._step is not None:
            self._step.segment_begin(name)

    def batch_end(self, *, wait_for_values: bool = False, **values: Any) -> None:
        """The batch is done; with `wait_for_values` its record waits for `values_arrived` (logged loss)."""
        r, current = self.reporter, self._step
        if r is None or current is None:
            return
        self._step = None
        r._current = None
        clean = {k: v for k, v in values.items() if v is not None}
        if clean:
            current.record(**clean)
        self._resumed_batch(clean.get("loss"), counts=True)
        if wait_for_values:
            current.stop_clock()
            self._pending = current
        else:
            current.end()
        # The next batch's data wait starts now.
        self._waiting = r.step_begin(current.step + 1)
        self._waiting.segment_begin("data_wait")

    def values_arrived(self, **values: Any) -> None:
        """Loss / lr / grad norm logged after the batch: attach them and publish its record."""
        pending = self._pending
        if pending is None:
            return
        clean = {k: v for k, v in values.items() if v is not None}
        if clean:
            pending.record(**clean)
        self._resumed_batch(clean.get("loss"), counts=False)
        self.flush_pending()

    def flush_pending(self) -> None:
        """Publish a batch that was waiting for values."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.end()

    def _drop_waiting(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None and self.reporter is not None:
            if self.reporter._current is waiting:
                self.reporter._current = None
            if self.reporter._live_step is waiting:
                self.reporter._live_step = None

    def samples_tokens(self, batch: Any) -> dict[str, int | None]:
        """samples (batch size) and tokens (samples x tokens_per_sample, or input_ids' numel)."""
        samples = tensor_batch_size(batch)
        tokens: int | None = None
        if self.tokens_per_sample and samples is not None:
            tokens = samples * self.tokens_per_sample
        elif isinstance(batch, Mapping) and hasattr(batch.get("input_ids"), "numel"):
            tokens = int(batch["input_ids"].numel())
        return {"samples": samples, "tokens": tokens}

    # -- restore tests --------------------------------------------------------------------------

    def checkpoint_loaded(
        self,
        step: int,
        *,
        restored: list[str],
        loss_before: float | None = None,
        run_id: str | None = None,
    ) -> None:
        """The framework restored the checkpoint of `step` (`restored`: model, optimizer, scheduler, data)."""
        self._resumed = {
            "step": int(step),
            "restored": list(restored),
            "loss_before": loss_before,
            "run_id": run_id,
            "steps": 0,
            "loss_after": None,
            "announced": False,
        }
        if self.reporter is not None:
            self._resumed["announced"] = True
            self.reporter.checkpoint_restored(int(step))
        if self.restore_test_steps <= 0:
            self._resumed = None

    def checkpoint_metadata(self) -> dict[str, Any]:
        """What to save with a checkpoint so its restore can be judged: the last loss and the writing run."""
        loss = self._last_loss
        try:
            loss = None if loss is None else float(loss)
        except (TypeError, ValueError):
            loss = None
        run = self.reporter.identity.run_id if self.reporter is not None else None
        return {"loss": loss, "run_id": run}

    def _resumed_batch(self, loss: Any, *, counts: bool) -> None:
        if loss is not None:
            self._last_loss = loss
        resumed = self._resumed
        if resumed is None:
            return
        if resumed["loss_after"] is None and loss is not None:
            resumed["loss_after"] = loss
        if counts:
            resumed["steps"] += 1
        if (resumed["steps"] >= self.restore_test_steps and resumed["loss_after"] is not None) or (
            resumed["steps"] >= 2 * self.restore_test_steps
        ):
            self._report_restore_test()

    def _report_restore_test(self) -> None:
        resumed, self._resumed = self._resumed, None
        r = self.reporter
        if resumed is None or r is None:
            return
        loss_after = resumed["loss_after"]
        try:
            loss_after = None if loss_after is None else float(loss_after)
        except (TypeError, ValueError):
            loss_after = None
        r.restore_test(
            f"{r.identity.job_id}-step{resumed['step']}",
            restored=resumed["restored"],
            steps_resumed=resumed["steps"],
            step=resumed["step"],
            loss_before=resumed["loss_before"],
            loss_after=loss_after,
            code_version=os.environ.get("RANKSIGHT_CODE_VERSION"),
            runtime_version=runtime_version(),
            run_id=resumed["run_id"],
        )

    # -- evaluations and checkpoints ------------------------------------------------------------

    def evaluation_start(self, step: int, name: str | None = "val") -> None:
        """Validation begins: training pauses (the pause is announced, not a stall)."""
        r = self.reporter
        if r is None or self._evaluation is not None:
            return
        self.flush_pending()
        self._drop_waiting()
        self._evaluation = r.evaluation(step, name).begin()

    def evaluation_end(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Validation ended: EvaluationEvent completed, and its metrics as a ValidationResult."""
        r = self.reporter
        if r is None:
            return
        evaluation, self._evaluation = self._evaluation, None
        if evaluation is not None:
            evaluation.end()
        numbers = {}
        for key, value in (metrics or {}).items():
            try:
                numbers[str(key)] = float(value)
            except (TypeError, ValueError):
                continue
        if numbers:
            r.validation(step, numbers)

    def checkpoint_started(self, step: int, uri: str | None = None, *, keep: int | None = None) -> None:
        """A checkpoint is being written (a previous one still open is completed first); `keep`: retention."""
        r = self.reporter
        if r is None:
            return
        self.checkpoint_finished()
        ck = r.checkpoint(step, uri, keep=keep if keep is not None and keep > 0 else None)
        ck.__enter__()
        self._checkpoint = (ck, uri)

    def checkpoint_finished(self, path: str | os.PathLike[str] | None = None) -> None:
        """The open checkpoint is on disk: completed, with its size when the path is known."""
        entry, self._checkpoint = self._checkpoint, None
        if entry is None:
            return
        ck, uri = entry
        where = path or (uri[len("file://") :] if uri and uri.startswith("file://") else uri)
        ck.bytes = path_bytes(where)
        # Retention runs when a checkpoint is saved: earlier ones whose files are gone were deleted.
        gone = [cid for cid, p in self._saved.items() if not os.path.exists(p)]
        for cid in gone:
            del self._saved[cid]
        ck.deleted = gone
        if where and "://" not in str(where):
            ck.path = str(where)  # what the reporter reads back to verify
        if where and "://" not in str(where) and os.path.exists(where):
            self._saved[ck.checkpoint_id] = str(where)
        ck.__exit__(None, None, None)
