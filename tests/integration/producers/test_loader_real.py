"""`reporter.wrap_loader` around a real PyTorch DataLoader with worker processes reading real files:
read bytes and file opens without the dataset's help, prefetch depth, a slow worker's wait and a
worker that dies. Opt-in: `make test-frameworks` (RANKSIGHT_TORCH_TESTS=1, torch from PyPI)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from producers.publisher import MemoryPublisher
from producers.training import Reporter

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        os.environ.get("RANKSIGHT_TORCH_TESTS") != "1",
        reason="set RANKSIGHT_TORCH_TESTS=1 (make test-frameworks) to run a real DataLoader",
    ),
]

SAMPLES, ROW = 32, 16_384  # 32 files of 128 KiB


class Files:
    """A dataset of .npy files read with numpy in the worker processes (no ranksight_stats)."""

    def __init__(self, folder: Path, *, slow_worker: int | None = None, die_at: int | None = None) -> None:
        self.paths = sorted(folder.glob("*.npy"))
        self.slow_worker, self.die_at = slow_worker, die_at

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Any:
        import torch

        info = torch.utils.data.get_worker_info()
        if self.slow_worker is not None and info is not None and info.id == self.slow_worker:
            time.sleep(0.05)
        if self.die_at == i:
            os.kill(os.getpid(), signal.SIGKILL)  # a worker killed from outside (the OOM killer)
        return torch.from_numpy(np.load(self.paths[i]))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("samples")
    for i in range(SAMPLES):
        np.save(out / f"{i:03d}.npy", np.full(ROW, i, dtype=np.float64))
    return out


def _run(dataset: Files, publisher: MemoryPublisher) -> None:
    torch = pytest.importorskip("torch")
    reporter = Reporter("loader-job", 0, node="n", publisher=publisher, bind=False, env={}, timing="host")
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2, prefetch_factor=2)
    try:
        for step, batch in enumerate(reporter.wrap_loader(loader, interval_s=0.2)):
            with reporter.step(step) as s, s.segment("forward"):
                s.record(loss=float(batch.mean()), samples=len(batch))
                time.sleep(0.02)
    finally:
        reporter.close()


def _samples(publisher: MemoryPublisher, kind: str = "DataLoaderSample") -> list[dict[str, Any]]:
    return [e.record for e in publisher.events if e.type == kind]


def test_a_stock_loader_reports_read_bytes_file_opens_and_prefetch(folder: Path) -> None:
    publisher = MemoryPublisher()
    _run(Files(folder), publisher)
    samples = _samples(publisher)
    assert sum(s["batches"] for s in samples) == SAMPLES // 4
    read = sum(s["read_bytes_s"] * s["interval_s"] for s in samples if s["read_bytes_s"] is not None)
    # /proc/<pid>/io of a worker that already exited cannot be read: what a worker read after the
    # last sample before it stopped is not counted (under load ~3 % of this small run was missed).
    assert read >= 0.9 * SAMPLES * ROW * 8, f"the workers read {read:.0f} bytes"
    opens = sum(s["file_opens_s"] * s["interval_s"] for s in samples if s["file_opens_s"] is not None)
    assert opens == pytest.approx(SAMPLES, abs=0.5), "one open per .npy file"
    assert all(s["workers"] == s["workers_expected"] == 2 for s in samples)
    assert any(s["queue_depth"] is not None for s in samples)


def test_a_slow_worker_shows_as_data_wait_and_a_dead_one_as_a_fault_and_a_lost_worker(folder: Path) -> None:
    publisher = MemoryPublisher()
    _run(Files(folder, slow_worker=1), publisher)
    waits = [s["data_wait_s"] for s in _samples(publisher, "StepCompleted")]
    # Worker 1's batches (every other one) take 4 x 50 ms to prepare, the loop 20 ms per batch.
    assert sorted(waits)[len(waits) // 2] >= 0.05

    publisher = MemoryPublisher()
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        _run(Files(folder, die_at=13), publisher)
    [fault] = _samples(publisher, "RankFault")
    assert fault["kind"] == "exception" and "data loader" in fault["detail"]
    assert _samples(publisher)[-1]["workers"] < 2 == _samples(publisher)[-1]["workers_expected"]
