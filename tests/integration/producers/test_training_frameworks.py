"""The Lightning and Hugging Face callbacks inside the real frameworks (CPU, a tiny model, a few steps).

Opt-in: `make test-frameworks` (its own venv with a CPU-only torch, lightning and transformers;
sets RANKSIGHT_FRAMEWORK_TESTS=1). No model or data set is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from producers.publisher import MemoryPublisher
from producers.training import Reporter

pytestmark = [
    pytest.mark.frameworks,
    # The frameworks' own advice (srun, num_workers, ...) is not what these tests are about.
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.skipif(
        os.environ.get("RANKSIGHT_FRAMEWORK_TESTS") != "1",
        reason="set RANKSIGHT_FRAMEWORK_TESTS=1 (make test-frameworks) to run the real Lightning / Transformers",
    ),
]

STEPS = 6


def _reporter(publisher: MemoryPublisher) -> Reporter:
    return Reporter("fw-job", 0, node="n", publisher=publisher, bind=False, env={}, timing="host")


def _by_type(publisher: MemoryPublisher, kind: str) -> list[dict[str, Any]]:
    return [e.record for e in publisher.events if e.type == kind]


def test_lightning_trainer_reports_every_step_with_segments(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pl = pytest.importorskip("lightning.pytorch")
    from producers.training.lightning import RanksightCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    publisher = MemoryPublisher()
    callback = RanksightCallback(_reporter(publisher), owner="ada", team="vision")
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        callbacks=[callback],  # the one line
        val_check_interval=3,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
        logger=False,
        enable_progress_bar=False,
    )
    trainer.fit(Tiny(), loader, loader)
    steps = _by_type(publisher, "StepCompleted")
    assert [s["step"] for s in steps] == list(range(STEPS))
    for s in steps:
        assert s["forward_s"] > 0 and s["backward_s"] > 0 and s["optimizer_s"] > 0
        assert s["loss"] is not None and s["lr"] == 0.05 and s["samples"] == 8
        assert s["grad_norm"] is not None and s["grad_norm"] > 0
    phases = [e["phase"] for e in _by_type(publisher, "EvaluationEvent")]
    assert phases[:2] == ["started", "completed"]
    assert any("val_loss" in v["metrics"] for v in _by_type(publisher, "ValidationResult"))
    ck = _by_type(publisher, "CheckpointEvent")
    assert [c["phase"] for c in ck][:2] == ["started", "completed"] and ck[1]["bytes"] > 0
    assert [s["state"] for s in _by_type(publisher, "JobStateChanged")] == ["running", "completed"]


def test_hf_trainer_reports_every_step_evaluations_and_checkpoints(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from producers.training.hf import RanksightCallback

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
            out = self.net(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    class Data(torch.utils.data.Dataset):
        def __init__(self) -> None:
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(64, 8, generator=g)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"x": self.x[i], "labels": self.x[i].sum(0, keepdim=True)}

    publisher = MemoryPublisher()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=3,
        save_strategy="steps",
        save_steps=3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=Tiny(),
        args=args,
        train_dataset=Data(),
        eval_dataset=Data(),
        callbacks=[RanksightCallback(_reporter(publisher), owner="ada", team="nlp")],  # the one line
    )
    trainer.train()
    steps = _by_type(publisher, "StepCompleted")
    assert [s["step"] for s in steps] == list(range(STEPS))
    assert all(s["forward_s"] > 0 and s["optimizer_s"] is not None for s in steps)
    logged = [s for s in steps if s["loss"] is not None]
    assert logged and all(s["lr"] is not None for s in logged)
    phases = [e["phase"] for e in _by_type(publisher, "EvaluationEvent")]
    assert phases.count("started") == phases.count("completed") >= 1
    ck = [c for c in _by_type(publisher, "CheckpointEvent") if c["phase"] == "completed"]
    assert ck and ck[0]["bytes"] > 0


_STAND_IN_CUDA = """
import runpy, sys, time, torch

class Event:  # host-clock stand-in for torch.cuda.Event: same calls, no GPU
    def __init__(self, enable_timing=False):
        self.t = None
    def record(self, stream=None):
        self.t = time.perf_counter()
    def query(self):
        return True
    def synchronize(self):
        pass
    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3

torch.cuda.is_available = lambda: True
torch.cuda.Event = Event
torch.cuda.synchronize = lambda *a: None
torch.cuda.get_device_name = lambda *a: "stand-in"
torch.optim.Optimizer._accelerator_graph_capture_health_check = lambda self: None
torch.nn.Module.cuda = lambda self, *a: self
torch.Tensor.pin_memory = lambda self: self
_to = torch.Tensor.to
torch.Tensor.to = lambda self, *a, **k: self if a and a[0] == "cuda" else _to(self, *a, **k)
sys.argv = ["gpu_check.py", "--steps", "8", "--hidden", "64", "--layers", "2", "--batch", "32",
            "--agent-ticks", "3", "--json", sys.argv[1]]
runpy.run_path("bench/gpu_check.py", run_name="__main__")
"""


def test_gpu_check_runs_end_to_end_with_stand_in_cuda_events(tmp_path: Path) -> None:
    """The GPU session has minutes: the script's own code path is exercised here first (numbers meaningless)."""
    pytest.importorskip("torch")
    harness = tmp_path / "harness.py"
    harness.write_text(_STAND_IN_CUDA)
    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "gpu.json"
    run = subprocess.run(
        [sys.executable, str(harness), str(out)], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "== 1. segment times" in run.stdout and "== 2. step time" in run.stdout
    assert "== 3. node agent" in run.stdout
    report = json.loads(out.read_text())
    assert set(report["segments"]) == {"data_wait", "forward", "backward", "optimizer", "step"}
    assert report["sdk_errors"] == 0
