"""After a resume, the framework-free hook driver (what the Lightning and HF callbacks call) reports a
restore test: what was loaded, the saved loss against the first resumed one, the runtime."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from producers.publisher import MemoryPublisher
from producers.training import Reporter
from producers.training.hooks import LoopHooks
from tests.unit.producers.test_training_callbacks import FakeClock, hf_module, lightning_module  # noqa: F401

ALL = ["model", "optimizer", "scheduler", "data"]


def _hooks(publisher: MemoryPublisher, clock: FakeClock, rank: int = 0, steps: int = 3) -> LoopHooks:
    hooks = LoopHooks(
        lambda **ident: Reporter(
            "rt-job", **ident, node="n", publisher=publisher, bind=False, env={}, mono_ns=clock, wall_ns=clock
        ),
        job_info={"owner": "ada", "team": "nlp"},
        restore_test_steps=steps,
    )
    return hooks


def _batches(hooks: LoopHooks, clock: FakeClock, first: int, losses: list[float]) -> None:
    for n, loss in enumerate(losses):
        hooks.batch_start(first + n)
        clock.advance(0.01)
        hooks.batch_end(loss=loss)


def _tests(hooks: LoopHooks, publisher: MemoryPublisher) -> list[dict[str, Any]]:
    assert hooks.reporter is not None and hooks.reporter.flush(5) == 0
    return [e.record for e in publisher.events if e.type == "RestoreTest"]


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = types.ModuleType("torch")
    torch.__version__ = "2.4.0"  # type: ignore[attr-defined]
    torch.version = types.SimpleNamespace(cuda="12.4")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)


def test_a_resume_with_everything_restored_and_a_continuous_loss_passes(fake_torch: None) -> None:
    clock, pub = FakeClock(), MemoryPublisher()
    hooks = _hooks(pub, clock)
    hooks.checkpoint_loaded(100, restored=ALL, loss_before=2.0, run_id="run-that-wrote-it")
    hooks.train_start(rank=0, world_size=1, local_rank=0, is_zero=True)
    _batches(hooks, clock, 100, [2.02, 2.01, 2.0, 1.99, 1.98])
    (t,) = _tests(hooks, pub)
    assert t["passed"] is True and t["error"] is None
    assert (t["checkpoint_id"], t["step"], t["run_id"], t["steps_resumed"]) == (
        "rt-job-step100", 100, "run-that-wrote-it", 3,
    )  # fmt: skip
    assert (t["loss_before"], t["loss_after"]) == (2.0, 2.02)
    assert t["runtime_version"] == "torch 2.4.0 cuda 12.4"
    restored = [
        e.record for e in pub.events if e.type == "CheckpointEvent" and e.record["phase"] == "restored"
    ]
    assert len(restored) == 1 and restored[0]["step"] == 100, (
        "the resume is announced once the reporter exists"
    )


def test_a_resume_without_optimizer_state_or_with_a_loss_jump_fails() -> None:
    clock, pub = FakeClock(), MemoryPublisher()
    hooks = _hooks(pub, clock)
    hooks.train_start(rank=0, world_size=1, local_rank=0, is_zero=True)
    hooks.checkpoint_loaded(50, restored=["model", "scheduler", "data"], loss_before=2.0)
    _batches(hooks, clock, 50, [2.0] * 3)
    hooks.checkpoint_loaded(80, restored=ALL, loss_before=2.0)
    _batches(hooks, clock, 80, [3.1] * 3)
    first, second = _tests(hooks, pub)
    assert not first["passed"] and "not restored: optimizer" in first["error"]
    assert not second["passed"] and "loss jumped" in second["error"]


def test_other_ranks_and_a_run_that_never_resumed_report_no_restore_test() -> None:
    clock, pub = FakeClock(), MemoryPublisher()
    fresh = _hooks(pub, clock)
    fresh.train_start(rank=0, world_size=2, local_rank=0, is_zero=True)
    _batches(fresh, clock, 0, [2.0] * 5)
    other = _hooks(pub, clock)
    other.train_start(rank=1, world_size=2, local_rank=1, is_zero=False)
    other.checkpoint_loaded(10, restored=ALL, loss_before=2.0)
    _batches(other, clock, 10, [2.0] * 5)
    assert _tests(fresh, pub) == [] and _tests(other, pub) == []


def test_a_run_ending_before_n_steps_still_reports_what_it_resumed() -> None:
    clock, pub = FakeClock(), MemoryPublisher()
    hooks = _hooks(pub, clock, steps=10)
    hooks.train_start(rank=0, world_size=1, local_rank=0, is_zero=True)
    hooks.checkpoint_loaded(7, restored=ALL)
    _batches(hooks, clock, 7, [2.0, 2.0])
    hooks.train_end(is_zero=True)
    (t,) = [e.record for e in pub.events if e.type == "RestoreTest"]
    assert t["steps_resumed"] == 2 and t["passed"]


def test_lightning_saves_the_loss_with_the_checkpoint_and_judges_the_resume_against_it(
    lightning_module: Any,  # noqa: F811
) -> None:
    clock, pub = FakeClock(), MemoryPublisher()
    trainer = types.SimpleNamespace(
        is_global_zero=True, global_rank=0, world_size=1, local_rank=0, global_step=0
    )
    writer = lightning_module.RanksightCallback(None, owner="a", team="t")
    writer.hooks.reporter = Reporter(
        "lt-job", 0, node="n", publisher=pub, bind=False, env={}, mono_ns=clock, wall_ns=clock, run_id="run-1"
    )
    _batches(writer.hooks, clock, 0, [2.5, 2.4])
    saved: dict[str, Any] = {"state_dict": {"w": 1}, "optimizer_states": [{}], "lr_schedulers": [{"s": 1}],
                             "loops": {"fit_loop": {}}, "global_step": 2}  # fmt: skip
    writer.on_save_checkpoint(trainer, None, saved)
    assert saved["ranksight"] == {"loss": 2.4, "run_id": "run-1"}
    saved["optimizer_states"] = []  # this resume loses the optimizer state
    resumer = lightning_module.RanksightCallback(
        Reporter("lt-job", 0, node="n", publisher=pub, bind=False, env={}, mono_ns=clock, wall_ns=clock),
    )
    resumer.hooks.restore_test_steps = 2
    resumer.on_load_checkpoint(trainer, None, saved)
    _batches(resumer.hooks, clock, 2, [2.39, 2.38])
    (t,) = _tests(resumer.hooks, pub)
    assert (t["run_id"], t["loss_before"], t["restored_optimizer"], t["passed"]) == (
        "run-1",
        2.4,
        False,
        False,
    )


def test_hf_resume_reads_what_the_checkpoint_folder_held_and_the_last_logged_loss(
    hf_module: Any,  # noqa: F811
    tmp_path: Any,
) -> None:
    clock, pub = FakeClock(), MemoryPublisher()
    ckpt = tmp_path / "checkpoint-40"
    ckpt.mkdir()
    for name in ("model.safetensors", "scheduler.pt", "trainer_state.json"):  # no optimizer.pt
        (ckpt / name).write_bytes(b"x")
    cb = hf_module.RanksightCallback(
        Reporter("hf-job", 0, node="n", publisher=pub, bind=False, env={}, mono_ns=clock, wall_ns=clock)
    )
    cb.hooks.restore_test_steps = 2
    args = types.SimpleNamespace(process_index=0, world_size=1, local_process_index=0, output_dir=str(tmp_path),
                                 per_device_train_batch_size=4, gradient_accumulation_steps=1)  # fmt: skip
    state = types.SimpleNamespace(
        global_step=40, is_world_process_zero=True, log_history=[{"loss": 1.5}, {"eval_loss": 1.7}]
    )
    control = types.SimpleNamespace(should_log=True, should_evaluate=False, should_save=False)
    cb.on_train_begin(args, state, control)
    for _ in range(2):
        cb.on_step_begin(args, state, control)
        clock.advance(0.05)
        state.global_step += 1
        cb.on_step_end(args, state, control)
        cb.on_log(args, state, control, logs={"loss": 1.52})
    (t,) = _tests(cb.hooks, pub)
    assert (t["step"], t["loss_before"], t["loss_after"], t["steps_resumed"]) == (40, 1.5, 1.52, 2)
    assert (t["restored_model"], t["restored_optimizer"], t["restored_scheduler"], t["restored_data_position"]) == (
        True, False, True, True,
    )  # fmt: skip
    assert not t["passed"] and "not restored: optimizer" in t["error"]
