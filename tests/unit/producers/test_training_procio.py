"""Read bytes from /proc (a fake tree), file opens from the audit hook, and prefetch depth from a
loader iterator's queues: the data path measured without the dataset's help."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

from producers.training.loader import prefetched
from producers.training.procio import OpenCounter, ReadCounter, read_rchar


def _io(root: Path, pid: int | str, rchar: int) -> None:
    folder = root / str(pid)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "io").write_text(f"rchar: {rchar}\nwchar: 5\nsyscr: 3\nread_bytes: 0\n")


def test_read_counter_sums_increments_over_workers_that_come_and_go(tmp_path: Path) -> None:
    _io(tmp_path, 10, 1000)
    _io(tmp_path, 11, 500)
    reads = ReadCounter(tmp_path)
    assert reads.sample([10, 11]) == 1500  # workers read only for the loader: all of it counts
    _io(tmp_path, 10, 4000)
    (tmp_path / "11" / "io").unlink()  # worker 11 exited
    assert reads.sample([10, 11]) == 4500
    _io(tmp_path, 11, 200)  # a new process under the reused pid
    assert reads.sample([10, 11]) == 4700
    assert read_rchar(99, tmp_path) is None


def test_the_training_threads_first_reading_is_a_baseline(tmp_path: Path) -> None:
    _io(tmp_path, "self/task/7", 10_000_000)
    reads = ReadCounter(tmp_path)
    assert reads.sample(["self/task/7"], born_for_loader=False) == 0
    _io(tmp_path, "self/task/7", 10_004_096)
    assert reads.sample(["self/task/7"], born_for_loader=False) == 4096


def test_opens_on_the_loaders_thread_are_counted_and_other_threads_are_not(tmp_path: Path) -> None:
    path = tmp_path / "sample.bin"
    path.write_bytes(b"x" * 10)
    opens = OpenCounter()
    opens.count_here()
    before = opens.total()
    for _ in range(3):
        with open(path, "rb") as f:
            f.read()
    other = threading.Thread(target=lambda: path.read_bytes())
    other.start()
    other.join()
    assert opens.total() - before == 3


class _Loader:
    num_workers = 2
    worker_init_fn = None


def test_attach_wraps_the_worker_init_fn_and_still_calls_the_users() -> None:
    called: list[int] = []
    loader = _Loader()
    loader.worker_init_fn = called.append  # type: ignore[assignment]
    opens = OpenCounter()
    assert opens.attach(loader)
    loader.worker_init_fn(1)  # what a worker process runs first
    assert called == [1]
    assert not OpenCounter().attach(type("InProcess", (), {"num_workers": 0})())


class _Iter:
    def __init__(self, ready: int, early: int) -> None:
        self._data_queue: queue.Queue[Any] = queue.Queue()
        for i in range(ready):
            self._data_queue.put(i)
        self._task_info = {i: (0,) for i in range(5)}
        self._task_info.update({10 + i: (1, "batch") for i in range(early)})


def test_prefetched_counts_queued_and_out_of_order_batches() -> None:
    assert prefetched(_Iter(ready=3, early=2)) == 5
    assert prefetched(iter([1, 2])) is None  # a plain iterable has no prefetch queue
