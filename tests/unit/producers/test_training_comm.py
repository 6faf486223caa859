"""Collective time without hand timing: the exposed-time arithmetic, a DDP hook and wrapped
torch.distributed collectives driven with a fake clock, fake futures and a fake `dist` module (the
real DDP/FSDP jobs run in tests/integration/producers/test_comm_jobs.py)."""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable
from typing import Any

import pytest

from producers.publisher import MemoryPublisher
from producers.training import Reporter
from producers.training.comm import exposed_spans, subtract_spans


class Clock:
    """A monotonic clock in ns that only the test moves."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


class Future:
    """torch.futures.Future's surface the SDK uses: `add_done_callback`, completed by the test."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[Any], None]] = []

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self.callbacks.append(fn)

    def complete(self) -> None:
        for fn in self.callbacks:
            fn(self)


class Buffer:
    def __init__(self, n: int) -> None:
        self.n = n

    def numel(self) -> int:
        return self.n

    def element_size(self) -> int:
        return 4


class Bucket:
    def __init__(self, n: int) -> None:
        self._buffer = Buffer(n)

    def buffer(self) -> Buffer:
        return self._buffer


class DdpModel:
    """DistributedDataParallel's `register_comm_hook` surface."""

    def __init__(self) -> None:
        self.hook: Any = None
        self.state: Any = None

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        assert self.hook is None, "DDP takes one hook"
        self.state, self.hook = state, hook


def _reporter(clock: Clock, publisher: MemoryPublisher, **kw: Any) -> Reporter:
    return Reporter(
        "job-comm",
        0,
        node="n1",
        publisher=publisher,
        bind=False,
        env={},
        timing="host",
        mono_ns=clock,
        heartbeat_s=0,
        **kw,
    )


def _steps(publisher: MemoryPublisher) -> list[dict[str, Any]]:
    return [e.record for e in publisher.events if e.type == "StepCompleted"]


def test_exposed_time_is_the_async_tail_plus_every_blocking_call() -> None:
    spans = [
        ("allreduce", 0.10, 0.30, False),  # bucket 1, overlapped with the rest of backward
        ("allreduce", 0.20, 0.35, False),  # the last bucket: backward's compute is done at 0.20
        ("barrier", 0.50, 0.60, True),
    ]
    assert exposed_spans(spans) == [("allreduce", 0.20, 0.35), ("barrier", 0.50, 0.60)]
    # Overlapping pieces merge, named after the one that ended last (a lone async call: its whole wait).
    assert exposed_spans([("allreduce", 0.0, 0.2, False), ("broadcast", 0.1, 0.3, True)]) == [
        ("broadcast", 0.0, 0.3)
    ]
    assert exposed_spans([]) == []


def test_exposed_time_comes_out_of_the_segments_it_fell_in() -> None:
    segments = {"forward": [(0.0, 0.1)], "backward": [(0.1, 0.4)], "optimizer": [(0.4, 0.5)]}
    covered = subtract_spans(segments, [("allreduce", 0.3, 0.45)])
    assert covered == pytest.approx({"backward": 0.1, "optimizer": 0.05})


def test_ddp_hook_times_buckets_and_takes_the_wait_out_of_backward() -> None:
    clock, publisher = Clock(), MemoryPublisher()
    reporter = _reporter(clock, publisher)
    model = DdpModel()
    launched: list[tuple[Any, Any]] = []
    futures: list[Future] = []

    def inner(state: Any, bucket: Any) -> Future:
        launched.append((state, bucket))
        futures.append(Future())
        return futures[-1]

    reporter.watch_ddp(model, hook=inner, state="pg")
    with reporter.step(7) as s:
        with s.segment("forward"):
            clock.advance(0.100)
        with s.segment("backward"):
            clock.advance(0.050)
            model.hook(model.state, Bucket(1000))  # bucket 1 ready mid-backward
            clock.advance(0.050)
            model.hook(model.state, Bucket(250))  # the last bucket: backward's compute is done
            clock.advance(0.010)
            futures[0].complete()
            clock.advance(0.290)  # a slow peer: DDP's backward waits for the last bucket
            futures[1].complete()
        with s.segment("optimizer"):
            clock.advance(0.020)
    reporter.close()
    [step] = _steps(publisher)
    assert [st for st, _ in launched] == ["pg", "pg"], "the wrapped hook does the all-reduce"
    assert step["comm_s"] == pytest.approx(0.300)  # from the last launch to the last completion
    assert step["backward_s"] == pytest.approx(0.100)  # 0.400 on the clock, less the wait
    assert step["forward_s"] == pytest.approx(0.100)
    assert step["step_time_s"] == pytest.approx(0.520)
    [sample] = [e.record for e in publisher.events if e.type == "CollectiveSample"]
    assert sample["op"] == "allreduce" and sample["count"] == 2
    assert sample["bytes"] == 1250 * 4
    assert sample["time_s"] == pytest.approx(0.300)


class FakeDist:
    """torch.distributed's module surface: collectives that take `clock` time, sync or async."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.calls: list[str] = []
        self.pending: list[Future] = []

    def all_reduce(self, tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        self.calls.append("all_reduce")
        if async_op:
            work = Work()
            self.pending.append(work.future)
            return work
        self.clock.advance(0.040)
        return None

    def all_gather_into_tensor(self, out: Any, inp: Any, group: Any = None, async_op: bool = False) -> Any:
        self.calls.append("all_gather_into_tensor")
        self.clock.advance(0.010)
        return None

    def all_gather(self, outs: Any, inp: Any, group: Any = None, async_op: bool = False) -> Any:
        # A collective implemented with another one: counted once.
        self.calls.append("all_gather")
        return self.all_gather_into_tensor(outs, inp, group, async_op)


class Work:
    def __init__(self) -> None:
        self.future = Future()

    def get_future(self) -> Future:
        return self.future


def test_wrapped_collectives_blocking_and_async_into_comm_s_and_unwrapped_at_close() -> None:
    clock, publisher = Clock(), MemoryPublisher()
    reporter = _reporter(clock, publisher, comm_interval_s=3600)
    dist = FakeDist(clock)
    originals = (dist.all_reduce, dist.all_gather)
    reporter.watch_collectives(dist)
    assert dist.all_reduce is not originals[0]
    with reporter.step(1) as s:
        with s.segment("forward"):
            clock.advance(0.100)
            dist.all_gather(Buffer(10), Buffer(5))  # FSDP's parameter gather, blocking
        with s.segment("backward"):
            clock.advance(0.050)
            dist.all_reduce(Buffer(100))  # a plain blocking all-reduce
            work = dist.all_reduce(Buffer(100), async_op=True)
            clock.advance(0.005)
            work.get_future().complete()
    with reporter.step(2) as s, s.segment("forward"):
        clock.advance(0.010)
    reporter.close()
    assert dist.calls == ["all_gather", "all_gather_into_tensor", "all_reduce", "all_reduce"]
    first, second = _steps(publisher)
    assert first["comm_s"] == pytest.approx(0.010 + 0.040 + 0.005)
    assert first["forward_s"] == pytest.approx(0.100)
    assert first["backward_s"] == pytest.approx(0.050)
    assert second["comm_s"] is None, "a step with no collective reports none"
    samples = {e.record["op"]: e.record for e in publisher.events if e.type == "CollectiveSample"}
    assert samples["allgather"]["count"] == 1  # all_gather over all_gather_into_tensor: once
    assert samples["allreduce"]["count"] == 2
    assert samples["allreduce"]["time_s"] == pytest.approx(0.045)
    assert (dist.all_reduce, dist.all_gather) == originals, "close() unwraps"


def test_a_comm_segment_timed_by_hand_is_kept() -> None:
    clock, publisher = Clock(), MemoryPublisher()
    reporter = _reporter(clock, publisher)
    dist = FakeDist(clock)
    reporter.watch_collectives(dist)
    with reporter.step(1) as s:
        with s.segment("backward"):
            clock.advance(0.050)
        with s.segment("comm"):
            clock.advance(0.001)
            dist.all_reduce(Buffer(4))
    reporter.close()
    [step] = _steps(publisher)
    assert step["comm_s"] == pytest.approx(0.041)
    assert step["backward_s"] == pytest.approx(0.050)
    assert any(e.type == "CollectiveSample" for e in publisher.events)


def test_a_step_waits_for_its_collective_and_a_failed_step_drops_them() -> None:
    clock, publisher = Clock(), MemoryPublisher()
    reporter = _reporter(clock, publisher)
    dist = FakeDist(clock)
    reporter.watch_collectives(dist)
    with reporter.step(1) as s, s.segment("backward"):
        clock.advance(0.010)
        dist.all_reduce(Buffer(4), async_op=True)  # not complete when the step ends
    time.sleep(0.1)  # several polls of the reporter's thread
    assert _steps(publisher) == []
    clock.advance(0.020)
    dist.pending[0].complete()
    assert reporter.flush(5) == 0
    [step] = _steps(publisher)
    assert step["comm_s"] == pytest.approx(0.020)
    with pytest.raises(RuntimeError), reporter.step(2) as s, s.segment("backward"):
        dist.all_reduce(Buffer(4), async_op=True)
        raise RuntimeError("gloo: connection reset by peer")
    with reporter.step(3) as s, s.segment("forward"):
        clock.advance(0.010)
    reporter.close()
    assert [r["step"] for r in _steps(publisher)] == [1, 3]
    assert _steps(publisher)[-1]["comm_s"] is None


def test_heartbeat_counts_a_rank_blocked_in_a_ddp_bucket_as_in_the_collective() -> None:
    clock, publisher = Clock(), MemoryPublisher()
    reporter = Reporter(
        "job-comm", 0, node="n1", publisher=publisher, bind=False, env={}, timing="host", mono_ns=clock,
        heartbeat_s=10,
    )  # fmt: skip
    model = DdpModel()
    reporter.watch_ddp(model, hook=lambda state, bucket: Future())
    step = reporter.step_begin(3)
    step.segment_begin("backward")
    clock.advance(1.0)
    model.hook(None, Bucket(8))  # launched; the peer never answers
    clock.advance(11.0)
    reporter._heartbeat(clock())
    beats = [e.record for e in publisher.events if e.type == "CollectiveSample"] + [
        e.record for e in reporter._outbox if hasattr(e, "type") and e.type == "CollectiveSample"
    ]
    assert beats and beats[-1]["time_s"] == pytest.approx(10.0)  # the whole heartbeat interval
    reporter.close()


def test_the_callbacks_time_a_ddp_model_and_leave_one_with_its_own_hook_alone(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from producers.training.hooks import LoopHooks

    default_hooks = types.ModuleType("default_hooks")
    default_hooks.allreduce_hook = lambda state, bucket: Future()  # type: ignore[attr-defined]
    monkeypatch.setitem(
        sys.modules, "torch.distributed.algorithms.ddp_comm_hooks.default_hooks", default_hooks
    )

    class DistributedDataParallel(DdpModel):  # what the Lightning strategy hands over
        pass

    publisher = MemoryPublisher()
    hooks = LoopHooks(lambda **ident: _reporter(Clock(), publisher))
    hooks.train_start(rank=0, world_size=2, local_rank=0, is_zero=False)
    model = DistributedDataParallel()
    assert hooks.watch_comm(model) and model.hook is not None
    assert not hooks.watch_comm(model), "DDP takes one hook: the second registration is refused"
    assert "not timed" in caplog.text
    assert not hooks.watch_comm(object()), "not a DDP model"
    hooks.train_end(is_zero=False)
