"""The Lightning and Hugging Face callbacks, driven hook by hook in the order each framework calls them
(the frameworks replaced by minimal stand-in base classes: the real ones run in the opt-in
tests/integration/producers/test_training_frameworks.py)."""

from __future__ import annotations

import importlib
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from producers.publisher import MemoryPublisher
from producers.training import Reporter


class FakeClock:
    def __init__(self) -> None:
        self.ns = 1_700_000_000_000_000_000

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


def _reporter(clock: FakeClock, publisher: MemoryPublisher) -> Reporter:
    return Reporter(
        "cb-job", 0, node="n", publisher=publisher, bind=False, env={}, mono_ns=clock, wall_ns=clock
    )


@pytest.fixture
def lightning_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    pkg, sub = types.ModuleType("lightning"), types.ModuleType("lightning.pytorch")
    sub.Callback = type("Callback", (), {})  # type: ignore[attr-defined]
    pkg.pytorch = sub  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning", pkg)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", sub)
    monkeypatch.delitem(sys.modules, "producers.training.lightning", raising=False)
    yield importlib.import_module("producers.training.lightning")
    sys.modules.pop("producers.training.lightning", None)


@pytest.fixture
def hf_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    pkg = types.ModuleType("transformers")
    pkg.TrainerCallback = type("TrainerCallback", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", pkg)
    monkeypatch.delitem(sys.modules, "producers.training.hf", raising=False)
    yield importlib.import_module("producers.training.hf")
    sys.modules.pop("producers.training.hf", None)


class Batch:
    shape = (16, 32)


def test_lightning_callback_reports_segments_loss_lr_evaluations_and_checkpoints(
    lightning_module: Any, tmp_path: Path
) -> None:
    clock, publisher = FakeClock(), MemoryPublisher()
    ckpt = tmp_path / "epoch=0-step=2.ckpt"
    cb = lightning_module.RanksightCallback(
        _reporter(clock, publisher), owner="ada", team="vision", model_name="resnet", grad_norm=False
    )
    trainer = SimpleNamespace(
        global_rank=0,
        world_size=1,
        local_rank=0,
        is_global_zero=True,
        global_step=0,
        sanity_checking=False,
        optimizers=[SimpleNamespace(param_groups=[{"lr": 0.01}])],
        callback_metrics={"val_loss": 0.25, "note": "text is skipped"},
        checkpoint_callback=SimpleNamespace(_last_checkpoint_saved=str(ckpt)),
    )
    module = SimpleNamespace()
    cb.on_train_start(trainer, module)
    for n in range(3):
        clock.advance(0.005)  # the data loader
        cb.on_train_batch_start(trainer, module, Batch(), n)
        clock.advance(0.02)
        cb.on_before_backward(trainer, module, 1.0)
        clock.advance(0.04)
        cb.on_before_optimizer_step(trainer, module, None)
        clock.advance(0.01)
        cb.on_train_batch_end(trainer, module, {"loss": 2.0 - n}, Batch(), n)
        trainer.global_step += 1
        if n == 1:
            cb.on_validation_start(trainer, module)
            clock.advance(3.0)
            cb.on_validation_end(trainer, module)
            cb.on_save_checkpoint(trainer, module, {})
            with zipfile.ZipFile(ckpt, "w") as zf:  # the layout torch.save writes
                zf.writestr("archive/data.pkl", b"x" * 1000)
    cb.on_train_end(trainer, module)
    events = publisher.events
    steps = [e.record for e in events if e.type == "StepCompleted"]
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert [s["loss"] for s in steps] == [2.0, 1.0, 0.0]
    assert all(s["lr"] == 0.01 and s["samples"] == 16 for s in steps)
    assert steps[0]["data_wait_s"] is None, "the first batch has no previous batch end"
    assert steps[1]["data_wait_s"] == pytest.approx(0.005)
    assert steps[1]["forward_s"] == pytest.approx(0.02)
    assert steps[1]["backward_s"] == pytest.approx(0.04)
    assert steps[1]["optimizer_s"] == pytest.approx(0.01)
    evals = [(e.record["phase"], e.record["step"]) for e in events if e.type == "EvaluationEvent"]
    assert evals == [("started", 2), ("completed", 2)]
    [val] = [e.record for e in events if e.type == "ValidationResult"]
    assert val["metrics"] == {"val_loss": 0.25}
    size = ckpt.stat().st_size
    ck = [(e.record["phase"], e.record["bytes"]) for e in events if e.type == "CheckpointEvent"]
    assert ck == [("started", None), ("completed", size), ("verified", size)], "read back off-thread"
    [verified] = [e.record for e in events if e.type == "CheckpointEvent" and e.record["phase"] == "verified"]
    assert verified["checksum"].startswith("sha256:")
    [started] = [e.record for e in events if e.type == "JobStarted"]
    assert (started["owner"], started["team"], started["model_name"]) == ("ada", "vision", "resnet")
    states = [e.record["state"] for e in events if e.type == "JobStateChanged"]
    assert states == ["running", "completed"]


def test_lightning_exception_is_a_rank_fault_and_a_failed_job(lightning_module: Any) -> None:
    clock, publisher = FakeClock(), MemoryPublisher()
    cb = lightning_module.RanksightCallback(_reporter(clock, publisher), owner="o", team="t", grad_norm=False)
    trainer = SimpleNamespace(global_rank=0, world_size=1, local_rank=0, is_global_zero=True, global_step=0)
    cb.on_train_start(trainer, None)
    cb.on_train_batch_start(trainer, None, Batch(), 0)
    cb.on_exception(trainer, None, RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    cb.reporter.flush(5)
    assert [e.record["kind"] for e in publisher.events if e.type == "RankFault"] == ["cuda_oom"]
    assert [e.record["state"] for e in publisher.events if e.type == "JobStateChanged"][-1] == "failed"
    assert not [e for e in publisher.events if e.type == "StepCompleted"]


def test_hf_callback_waits_for_logged_values_and_reports_eval_and_save(
    hf_module: Any, tmp_path: Path
) -> None:
    clock, publisher = FakeClock(), MemoryPublisher()
    cb = hf_module.RanksightCallback(
        _reporter(clock, publisher), owner="ada", team="nlp", tokens_per_sample=128
    )
    args = SimpleNamespace(
        process_index=0,
        world_size=1,
        local_process_index=0,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        output_dir=str(tmp_path),
    )
    state = SimpleNamespace(global_step=0, is_world_process_zero=True)
    control = SimpleNamespace(should_log=False, should_evaluate=False, should_save=False)
    cb.on_train_begin(args, state, control)
    for n in range(4):
        clock.advance(0.002)
        cb.on_step_begin(args, state, control)
        clock.advance(0.05)  # forward + backward, one call in the Trainer
        cb.on_pre_optimizer_step(args, state, control)
        clock.advance(0.01)
        cb.on_optimizer_step(args, state, control)
        state.global_step += 1
        last = n == 3
        control.should_log = n % 2 == 1
        control.should_evaluate = control.should_save = last
        cb.on_step_end(args, state, control)
        if control.should_log:
            cb.on_log(args, state, control, logs={"loss": 0.5 * n, "learning_rate": 1e-4, "grad_norm": 2.0})
        if last:
            clock.advance(4.0)
            cb.on_evaluate(args, state, control, metrics={"eval_loss": 0.3, "epoch": 1.0})
            ckpt = tmp_path / "checkpoint-4"
            ckpt.mkdir()
            (ckpt / "model.safetensors").write_bytes(b"w" * 4096)
            cb.on_save(args, state, control)
    cb.on_train_end(args, state, control)
    events = publisher.events
    steps = [e.record for e in events if e.type == "StepCompleted"]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert [s["loss"] for s in steps] == [None, 0.5, None, 1.5], "only logged steps carry the loss"
    assert steps[1]["lr"] == 1e-4 and steps[1]["grad_norm"] == 2.0
    assert steps[1]["forward_s"] == pytest.approx(0.05) and steps[1]["backward_s"] is None
    assert steps[1]["optimizer_s"] == pytest.approx(0.01)
    assert steps[1]["data_wait_s"] == pytest.approx(0.002)
    assert steps[0]["samples"] == 8 and steps[0]["tokens"] == 8 * 128
    evals = [(e.record["phase"], e.record["step"]) for e in events if e.type == "EvaluationEvent"]
    assert evals == [("started", 4), ("completed", 4)]
    [completed] = [
        e.record for e in events if e.type == "EvaluationEvent" and e.record["phase"] == "completed"
    ]
    assert completed["duration_s"] == pytest.approx(4.0)
    ck = [(e.record["phase"], e.record["bytes"]) for e in events if e.type == "CheckpointEvent"]
    assert ck == [("started", None), ("completed", 4096), ("verify_failed", 4096)], "not a safetensors file"
    [failed] = [
        e.record for e in events if e.type == "CheckpointEvent" and e.record["phase"] == "verify_failed"
    ]
    assert "model.safetensors" in failed["error"] and "truncated or corrupt" in failed["error"]
    assert [e.record["state"] for e in events if e.type == "JobStateChanged"] == ["running", "completed"]


def test_a_missing_framework_is_one_clear_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "producers.training.hf", raising=False)
    with pytest.raises(ImportError, match="pip install transformers"):
        importlib.import_module("producers.training.hf")


def test_lightning_reports_the_trainers_target_epochs_and_checkpoint_retention(
    lightning_module: Any, tmp_path: Path
) -> None:
    clock, publisher = FakeClock(), MemoryPublisher()
    cb = lightning_module.RanksightCallback(_reporter(clock, publisher), owner="o", team="t", grad_norm=False)
    saved = SimpleNamespace(save_top_k=1, _last_checkpoint_saved=None)
    trainer = SimpleNamespace(
        global_rank=0,
        world_size=1,
        local_rank=0,
        is_global_zero=True,
        global_step=0,
        current_epoch=0,
        max_steps=-1,  # unset: the estimated stepping batches stand in
        max_epochs=3,
        estimated_stepping_batches=600,
        sanity_checking=False,
        optimizers=[],
        checkpoint_callback=saved,
    )
    cb.on_train_start(trainer, None)
    paths = []
    for n in range(4):
        trainer.current_epoch = n // 2
        cb.on_train_batch_start(trainer, None, Batch(), n)
        cb.on_train_batch_end(trainer, None, {"loss": 1.0}, Batch(), n)
        trainer.global_step += 1
        if n in (1, 3):
            cb.on_save_checkpoint(trainer, None, {})
            path = tmp_path / f"step={n}.ckpt"
            path.write_bytes(b"c")
            if paths:
                paths[-1].unlink()  # save_top_k=1: ModelCheckpoint removes the previous file
            paths.append(path)
            saved._last_checkpoint_saved = str(path)
    cb.on_train_end(trainer, None)
    [started] = [e.record for e in publisher.events if e.type == "JobStarted"]
    assert (started["target_steps"], started["target_epochs"]) == (600, 3.0)
    steps = [e.record for e in publisher.events if e.type == "StepCompleted"]
    assert [s["epoch"] for s in steps] == [0, 0, 1, 1]
    done = [
        e.record for e in publisher.events if e.type == "CheckpointEvent" and e.record["phase"] == "completed"
    ]
    assert [c["retention_keep"] for c in done] == [1, 1]
    assert [c["deleted"] for c in done] == [[], ["cb-job-step2"]]


def test_hf_reports_max_steps_epochs_and_the_checkpoints_rotation_deleted(
    hf_module: Any, tmp_path: Path
) -> None:
    clock, publisher = FakeClock(), MemoryPublisher()
    cb = hf_module.RanksightCallback(_reporter(clock, publisher), owner="o", team="t")
    args = SimpleNamespace(
        process_index=0,
        world_size=1,
        local_process_index=0,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        output_dir=str(tmp_path),
        num_train_epochs=2.0,
        save_total_limit=1,
    )
    state = SimpleNamespace(
        global_step=0, is_world_process_zero=True, max_steps=8, num_train_epochs=2, epoch=0.0
    )
    control = SimpleNamespace(should_log=False, should_evaluate=False, should_save=False)
    cb.on_train_begin(args, state, control)
    for n in range(4):
        state.epoch = n / 2  # two steps per epoch
        cb.on_step_begin(args, state, control)
        state.global_step += 1
        control.should_save = n in (1, 3)
        cb.on_step_end(args, state, control)
        if control.should_save:
            ckpt = tmp_path / f"checkpoint-{state.global_step}"
            ckpt.mkdir()
            (ckpt / "model.safetensors").write_bytes(b"w")
            if n == 3:  # save_total_limit=1: the Trainer rotated checkpoint-2 out before on_save
                for f in (tmp_path / "checkpoint-2").iterdir():
                    f.unlink()
                (tmp_path / "checkpoint-2").rmdir()
            cb.on_save(args, state, control)
    cb.on_train_end(args, state, control)
    [started] = [e.record for e in publisher.events if e.type == "JobStarted"]
    assert (started["target_steps"], started["target_epochs"]) == (8, 2.0)
    assert [e.record["epoch"] for e in publisher.events if e.type == "StepCompleted"] == [0, 0, 1, 1]
    done = [
        e.record for e in publisher.events if e.type == "CheckpointEvent" and e.record["phase"] == "completed"
    ]
    assert [(c["step"], c["retention_keep"], c["deleted"]) for c in done] == [
        (2, 1, []),
        (4, 1, ["cb-job-step2"]),
    ]
