"""`reporter.wrap_loader`: data wait, batch fingerprints and DataLoaderSamples without the user's help,
and `Reporter.restore_test` / `job_started(restore_test_max_age_s=...)`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from producers.publisher import MemoryPublisher
from producers.training import Reporter
from producers.training.loader import batch_fingerprint


class FakeClock:
    """Monotonic nanoseconds that only move when a test says so."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


class SlowDataset:
    """Yields numpy batches, taking `prep_s` of the fake clock each; counts reads like a real dataset could."""

    def __init__(self, clock: FakeClock, batches: list[Any], prep_s: float) -> None:
        self.clock, self.batches, self.prep_s = clock, batches, prep_s
        self.opened = 0
        self.failed = 0

    def __iter__(self) -> Iterator[Any]:
        for b in self.batches:
            self.clock.advance(self.prep_s)
            self.opened += 1
            yield b

    def __len__(self) -> int:
        return len(self.batches)

    def ranksight_stats(self) -> dict[str, float]:
        return {"file_opens": self.opened, "file_open_errors": self.failed, "errors": self.failed,
                "read_bytes": self.opened * 1e6, "reads": self.opened, "read_time_s": self.opened * 0.01,
                "cache_hits": self.opened, "cache_misses": self.opened}  # fmt: skip


def _reporter(pub: MemoryPublisher, clock: FakeClock, rank: int = 0) -> Reporter:
    return Reporter("job-1", rank, world_size=2, node="n1", publisher=pub, bind=False, env={}, mono_ns=clock)


def _train(reporter: Reporter, loader: Any, clock: FakeClock) -> None:
    for i, batch in enumerate(loader):
        with reporter.step(i) as s:
            clock.advance(0.5)
            s.record(loss=float(batch.mean()))


def test_wrapped_loader_reports_wait_fingerprints_and_loader_samples() -> None:
    clock, pub = FakeClock(), MemoryPublisher()
    reporter = _reporter(pub, clock)
    batches = [np.full((4, 8), k, dtype=np.float32) for k in range(6)]
    dataset = SlowDataset(clock, batches, prep_s=0.25)
    dataset.failed = 0
    loader = reporter.wrap_loader(dataset, interval_s=1.0)
    assert len(loader) == 6
    _train(reporter, loader, clock)
    assert reporter.flush(5) == 0
    steps = [e.record for e in pub.events if e.type == "StepCompleted"]
    assert [s["data_wait_s"] for s in steps] == [0.25] * 6, (
        "the time blocked in next() is the step's data wait"
    )
    fps = [s["batch_fingerprint"] for s in steps]
    assert len(set(fps)) == 6 and fps[0] == batch_fingerprint(batches[0])
    samples = [e.record for e in pub.events if e.type == "DataLoaderSample"]
    assert sum(s["batches"] for s in samples) == 6 and len(samples) >= 2
    first = samples[0]
    assert first["batch_prep_s"] == 0.25 and first["workers"] is None
    assert first["file_opens_s"] > 0 and first["cache_hit_ratio"] == 0.5
    assert first["read_latency_s"] == 0.01 and first["errors"] == 0


def test_the_same_batch_again_has_the_same_fingerprint_and_a_different_one_does_not() -> None:
    a = {"input_ids": np.arange(4096).reshape(8, 512), "names": ["x", "y"]}
    same = {"names": ["x", "y"], "input_ids": np.arange(4096).reshape(8, 512)}
    other = {"input_ids": np.arange(1, 4097).reshape(8, 512), "names": ["x", "y"]}
    assert batch_fingerprint(a) == batch_fingerprint(same) != batch_fingerprint(other)
    assert len(batch_fingerprint(a)) == 16


def test_padded_batches_that_differ_only_in_short_contents_get_different_fingerprints() -> None:
    """Right- or left-padded sequences sharing their first token: the row edges carry the difference."""
    right = np.zeros((8, 4096), dtype=np.int64)
    right[:, 0] = 1  # BOS
    other = right.copy()
    right[:, 1:10], other[:, 1:10] = 5, 6
    assert batch_fingerprint(right) != batch_fingerprint(other)
    assert batch_fingerprint(right[:, ::-1].copy()) != batch_fingerprint(other[:, ::-1].copy())
    assert batch_fingerprint(np.zeros((0, 4))) == batch_fingerprint(np.zeros((0, 4)))


def test_loader_errors_are_counted_per_interval() -> None:
    clock, pub = FakeClock(), MemoryPublisher()
    reporter = _reporter(pub, clock)
    dataset = SlowDataset(clock, [np.zeros(2)] * 4, prep_s=0.6)
    loader = reporter.wrap_loader(dataset, interval_s=1.0)
    for i, _ in enumerate(loader):
        dataset.failed += 2  # the dataset skipped two unreadable files for this batch
        with reporter.step(i):
            clock.advance(0.1)
    assert reporter.flush(5) == 0
    samples = [e.record for e in pub.events if e.type == "DataLoaderSample"]
    assert sum(s["errors"] for s in samples) == 8 and all(
        s["file_open_errors"] == s["errors"] for s in samples
    )


def test_a_loader_whose_stats_raise_still_iterates_and_counts_an_sdk_error() -> None:
    class Broken(SlowDataset):
        def ranksight_stats(self) -> dict[str, float]:
            raise RuntimeError("boom")

    clock, pub = FakeClock(), MemoryPublisher()
    reporter = _reporter(pub, clock)
    _train(reporter, reporter.wrap_loader(Broken(clock, [np.ones(3)] * 3, 0.1)), clock)
    assert reporter.flush(5) == 0
    assert reporter.stats["sdk_errors"] == 1
    assert len([e for e in pub.events if e.type == "StepCompleted"]) == 3


def test_restore_test_is_emitted_by_rank_zero_and_judged_when_not_told() -> None:
    clock, pub = FakeClock(), MemoryPublisher()
    zero, one = _reporter(pub, clock), _reporter(pub, clock, rank=1)
    kwargs: dict[str, Any] = dict(
        restored=["model", "optimizer", "scheduler", "data"], steps_resumed=10, step=500,
        loss_before=2.0, loss_after=2.5, loss_tolerance=0.05, code_version="abc123",
        runtime_version="torch 2.4.0 cuda 12.4",
    )  # fmt: skip
    zero.restore_test("ck-500", run_id="run-that-wrote-it", **kwargs)
    one.restore_test("ck-500", **kwargs)
    zero.restore_test(
        "ck-600", restored=["model", "banana"], steps_resumed=1
    )  # a bad part: counted, not raised
    assert zero.flush(5) == 0 and one.flush(5) == 0
    tests = [e.record for e in pub.events if e.type == "RestoreTest"]
    assert len(tests) == 1
    t = tests[0]
    assert (t["job_id"], t["run_id"], t["checkpoint_id"], t["step"]) == (
        "job-1",
        "run-that-wrote-it",
        "ck-500",
        500,
    )
    assert t["passed"] is False and "loss jumped" in t["error"]
    assert zero.stats["sdk_errors"] == 1


def test_job_started_carries_the_restore_test_policy() -> None:
    clock, pub = FakeClock(), MemoryPublisher()
    reporter = _reporter(pub, clock)
    reporter.job_started(owner="a", team="t", restore_test_max_age_s=86400.0)
    assert reporter.flush(5) == 0
    (started,) = [e.record for e in pub.events if e.type == "JobStarted"]
    assert started["restore_test_max_age_s"] == 86400.0
