"""The SDK reports a run's target and epochs, classifies failures (CUDA OOM, dependency timeouts), counts live
loader workers and reports checkpoint retention and failed verifications (issue 23)."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from producers.publisher import MemoryPublisher
from producers.training import Reporter
from producers.training.faults import fault_kind
from producers.training.identity import expand_hostlist, job_nodes, resolve_identity
from producers.training.loader import MonitoredLoader, live_workers
from schemas.codec import Codec


def _reporter(publisher: MemoryPublisher, **kw: Any) -> Reporter:
    return Reporter(
        "job-9", 1, world_size=4, local_rank=1, node="n1", publisher=publisher, bind=False, env={}, **kw
    )


def _events(reporter: Reporter, publisher: MemoryPublisher, kind: str) -> list[dict[str, Any]]:
    assert reporter.flush(5) == 0
    return [e.record for e in publisher.events if e.type == kind]


# -- fault kinds without torch ---------------------------------------------------------------------


def _torch_class(module: str, name: str, base: type[BaseException] = RuntimeError) -> type[BaseException]:
    """A class that looks like torch's (same module and name) without importing torch."""
    return type(name, (base,), {"__module__": module})


def test_torch_cuda_out_of_memory_is_cuda_oom_by_class_and_by_old_message() -> None:
    oom = _torch_class("torch.cuda", "OutOfMemoryError")
    assert fault_kind(oom("CUDA out of memory. Tried to allocate 2.00 GiB")) == "cuda_oom"
    assert fault_kind(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")) == "cuda_oom"
    # Host memory is not CUDA memory: a plain MemoryError stays an exception.
    assert fault_kind(MemoryError("cannot allocate")) == "exception"


def test_collective_and_store_timeouts_are_collective_timeouts() -> None:
    dist = _torch_class("torch.distributed", "DistBackendError")
    watchdog = dist(
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE) ran for "
        "600000 milliseconds before timing out."
    )
    assert fault_kind(watchdog) == "collective_timeout"
    store = _torch_class("torch.distributed", "DistStoreError")
    assert fault_kind(store("Timed out after 901 seconds waiting for clients")) == "collective_timeout"
    assert fault_kind(RuntimeError("NCCL communicator was aborted")) == "exception"


def test_io_timeouts_are_storage_timeouts() -> None:
    assert fault_kind(TimeoutError("read timed out")) == "storage_timeout"
    assert fault_kind(TimeoutError("timed out")) == "storage_timeout"
    assert fault_kind(OSError(errno.ETIMEDOUT, "Connection timed out")) == "storage_timeout"
    botocore = _torch_class("botocore.exceptions", "ReadTimeoutError", Exception)
    assert fault_kind(botocore("Read timeout on endpoint URL")) == "storage_timeout"
    assert fault_kind(OSError(errno.ENOENT, "No such file")) == "exception"


def test_a_cuda_oom_in_a_step_is_reported_with_its_kind_and_reraised() -> None:
    publisher = MemoryPublisher()
    reporter = _reporter(publisher)
    oom = _torch_class("torch.cuda", "OutOfMemoryError")
    with pytest.raises(oom), reporter.step(12):
        raise oom("CUDA out of memory. Tried to allocate 4.00 GiB")
    [fault] = _events(reporter, publisher, "RankFault")
    assert fault["kind"] == "cuda_oom" and fault["rank"] == 1 and fault["node"] == "n1"
    assert fault["detail"].startswith("step 12: OutOfMemoryError: CUDA out of memory")
    reporter.close()


def test_the_sdk_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import producers.training, producers.training.loader, producers.training.faults; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the data loader: timeouts, live workers, epochs ------------------------------------------------


def test_a_storage_timeout_in_the_loader_is_one_rank_fault_even_inside_a_step() -> None:
    publisher = MemoryPublisher()
    reporter = _reporter(publisher)

    def batches() -> Any:
        yield {"x": 1}
        raise TimeoutError("GET s3://bucket/shard-0042 timed out after 120 s")

    loader = iter(reporter.wrap_loader(batches(), interval_s=1e9))
    next(loader)
    with pytest.raises(TimeoutError), reporter.step(3):
        next(loader)  # the batch is fetched inside the step: reported once, by the loader
    [fault] = _events(reporter, publisher, "RankFault")
    assert fault["kind"] == "storage_timeout"
    assert fault["detail"].startswith("data loader: TimeoutError: GET s3://bucket/shard-0042")
    reporter.close()


class _Proc:
    def __init__(self, alive: bool) -> None:
        self.alive = alive

    def is_alive(self) -> bool:
        return self.alive


class _WorkerIter:
    """Shaped like torch's _MultiProcessingDataLoaderIter: worker processes and which are still active."""

    def __init__(self, loader: _Loader) -> None:
        self._workers = loader.procs
        self._workers_status = loader.status
        self._items = iter(range(loader.n))

    def __next__(self) -> int:
        return next(self._items)

    def __iter__(self) -> _WorkerIter:
        return self


class _Sampler:
    epoch = 0


class _Loader:
    def __init__(self, n: int, workers: int) -> None:
        self.n = n
        self.num_workers = workers
        self.procs = [_Proc(True) for _ in range(workers)]
        self.status = [True] * workers
        self.sampler = _Sampler()

    def __iter__(self) -> _WorkerIter:
        return _WorkerIter(self)


def test_live_workers_count_processes_alive_and_not_retired() -> None:
    loader = _Loader(4, 4)
    it = iter(loader)
    assert live_workers(it) == 4
    loader.procs[1].alive = False  # killed (OOM killer)
    loader.status[2] = False  # finished its shard early: retired
    assert live_workers(it) == 2
    assert live_workers(iter([1, 2])) is None  # a plain iterable has no worker processes


def test_loader_samples_report_live_and_expected_workers_and_steps_carry_the_samplers_epoch() -> None:
    publisher = MemoryPublisher()
    clock = [0]
    reporter = _reporter(publisher)
    loader = _Loader(6, 4)
    # A fake clock: one second per batch.
    wrapped = MonitoredLoader(reporter, loader, interval_s=1.0, fingerprint=False, clock_ns=lambda: clock[0])
    loader.sampler.epoch = 7
    for n, _ in enumerate(wrapped):
        clock[0] += 1_000_000_000
        if n == 2:
            loader.procs[0].alive = False
        with reporter.step(n):
            pass
    samples = _events(reporter, publisher, "DataLoaderSample")
    assert samples and all(s["workers_expected"] == 4 for s in samples)
    assert samples[0]["workers"] == 4 and samples[-1]["workers"] == 3
    steps = _events(reporter, publisher, "StepCompleted")
    assert [s["epoch"] for s in steps] == [7] * 6
    for event in publisher.events:
        Codec().encode(event)
    reporter.close()


def test_without_a_sampler_epoch_the_wrapper_counts_its_iterations() -> None:
    publisher = MemoryPublisher()
    reporter = _reporter(publisher)
    wrapped = reporter.wrap_loader([1, 2], fingerprint=False)
    epochs = []
    for _ in range(3):
        for n in wrapped:
            with reporter.step(n):
                pass
    epochs = [s["epoch"] for s in _events(reporter, publisher, "StepCompleted")]
    assert epochs == [0, 0, 1, 1, 2, 2]
    reporter.set_epoch(None)
    reporter.close()


# -- the run's target and its nodes ----------------------------------------------------------------


def test_job_started_carries_the_target_and_unknown_targets_are_null() -> None:
    publisher = MemoryPublisher()
    reporter = _reporter(publisher)
    reporter.job_started(owner="o", team="t", target_steps=20_000, target_tokens=-1, target_epochs=3)
    reporter.job_started(owner="o", team="t", target_steps=float("inf"))  # type: ignore[arg-type]
    first, second = _events(reporter, publisher, "JobStarted")
    assert (first["target_steps"], first["target_tokens"], first["target_epochs"]) == (20_000, None, 3.0)
    assert second["target_steps"] is None
    reporter.close()


def test_slurm_host_lists_expand_and_name_the_jobs_nodes() -> None:
    assert expand_hostlist("gpu-a-[01-03,10],login7") == [
        "gpu-a-01",
        "gpu-a-02",
        "gpu-a-03",
        "gpu-a-10",
        "login7",
    ]
    assert expand_hostlist("r[1-2]n[08-09]") == ["r1n08", "r1n09", "r2n08", "r2n09"]
    ident = resolve_identity("j", 0, world_size=16, node="gpu-a-01", env={})
    assert job_nodes(ident, {"SLURM_JOB_NODELIST": "gpu-a-[01-02]"}) == ["gpu-a-01", "gpu-a-02"]
    # torchrun on several hosts: the nodes are unknown here, so no list (not just this node).
    assert job_nodes(ident, {"LOCAL_WORLD_SIZE": "8"}) == []
    assert job_nodes(ident, {"LOCAL_WORLD_SIZE": "16"}) == ["gpu-a-01"]


# -- checkpoint retention and verification ----------------------------------------------------------


def test_a_checkpoint_reports_retention_and_a_failed_verification() -> None:
    publisher = MemoryPublisher()
    reporter = _reporter(publisher)
    with reporter.checkpoint(300, "s3://ck/300", keep=2) as ck:
        ck.bytes = 10
        ck.deleted = ["job-9-step100"]
    ck.verification_failed(ValueError("checksum mismatch: shard 3"))
    started, completed, failed = _events(reporter, publisher, "CheckpointEvent")
    assert started["retention_keep"] == 2 and started["deleted"] == []
    assert completed["phase"] == "completed" and completed["deleted"] == ["job-9-step100"]
    assert failed["phase"] == "verify_failed" and failed["error"] == "ValueError: checksum mismatch: shard 3"
    for event in publisher.events:
        Codec().encode(event)
    reporter.close()
