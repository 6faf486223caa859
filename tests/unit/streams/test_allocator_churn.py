"""allocator_churn: a rank whose CUDA allocator keeps retrying pages; an odd retry does not; the alert
carries the job's image and workspace; the SDK reads the allocator at most once per interval."""

from __future__ import annotations

from typing import Any

from producers.publisher import MemoryPublisher
from producers.training import Reporter
from schemas.codec import Codec
from schemas.records import Event
from streams.config import load_config
from streams.detectors.allocator_churn import AllocatorChurnDetector
from streams.detectors.base import Finding, Topology
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import T0, job_started, step

JOB = "job-1"
GIB = 2**30


def _steps(
    retries: list[int | None], *, rank: int = 0, every_s: int = 10, run_id: str | None = None
) -> list[Event]:
    """One step per read (`every_s` apart) carrying the cumulative retry counter (None: not read)."""
    out = []
    for i, count in enumerate(retries):
        ev = step(JOB, rank, i + 1, T0 + (i + 1) * every_s * 1000, run_id=run_id)
        if count is not None:
            ev.record.update(alloc_retries=count, mem_allocated_bytes=30 * GIB, mem_reserved_bytes=60 * GIB)
        out.append(ev)
    return out


def _drive(det: AllocatorChurnDetector, events: list[Event]) -> list[Finding]:
    out: list[Finding] = []
    for ev in events:
        det.topology.observe(ev)
        out += det.observe(ev)
    return out


def test_retries_growing_on_every_read_hold_the_condition_and_two_quiet_reads_resolve_it() -> None:
    det = AllocatorChurnDetector(Topology())
    found = _drive(det, [job_started(JOB, T0), *_steps([0, 2, 5, 9, 14, 20, 27, 27, 27])])
    active = [f for f in found if f.active]
    assert len(active) == 6 and all(f.since == T0 + 20_000 for f in active), (
        "one condition from the first growth"
    )
    assert active[0].sustain_ms == 60_000 and active[0].key == (JOB, "0") and active[0].rank == 0
    assert active[-1].observed == round(27 / (50 / 60), 3), "retries per minute over the condition"
    assert "50% of its 60.0 GiB reserved holds no tensor" in active[-1].summary
    resolved = [f for f in found if not f.active]
    assert [f.ts for f in resolved] == [T0 + 90_000], "after two reads without a new retry"


def test_an_occasional_retry_opens_and_closes_before_the_sustain() -> None:
    det = AllocatorChurnDetector(Topology())
    found = _drive(det, [job_started(JOB, T0), *_steps([0, 1, 1, 1, 1, 2, 2, 2, None, 2])])
    spans = [(f.since, f.ts) for f in found if f.active]
    assert spans and all(ts - since < 60_000 for since, ts in spans), (
        "never held 60 s: the lifecycle never fires it"
    )


def test_a_counter_that_goes_down_is_a_new_process_not_churn() -> None:
    det = AllocatorChurnDetector(Topology())
    found = _drive(det, [job_started(JOB, T0), *_steps([50, 60, 3, 4])])
    assert [f.active for f in found] == [True, False, True], "closed at the restart, a new growth after"


def test_state_survives_a_snapshot() -> None:
    events = [job_started(JOB, T0), *_steps([0, 2, 5, 9, 14, 20, 27, 27, 27])]
    whole = _drive(AllocatorChurnDetector(Topology()), events)
    first = AllocatorChurnDetector(Topology())
    _drive(first, events[:5])
    second = AllocatorChurnDetector(first.topology)
    second.from_bytes(first.to_bytes())
    assert _drive(second, events[5:]) == [f for f in whole if f.ts > events[4].record["ts"]]


def test_the_alert_fires_after_the_sustain_and_carries_image_and_workspace() -> None:
    started = job_started(JOB, T0, image="nvcr.io/nvidia/pytorch:25.01-py3", workspace="llm-pretrain")
    engine = DetectionEngine(load_config(None))
    out = engine.run([started, *_steps(list(range(0, 30, 3)))])
    alerts = [e.record for e in out if e.type == "Alert" and e.record["rule"] == "allocator_churn"]
    assert alerts and alerts[0]["status"] == "firing"
    assert alerts[0]["ts"] - alerts[0]["starts_at"] >= 60_000, "pending until it held sustain_s"
    assert (alerts[0]["image"], alerts[0]["workspace"]) == (
        "nvcr.io/nvidia/pytorch:25.01-py3",
        "llm-pretrain",
    )
    assert (alerts[0]["observed_unit"], alerts[0]["history_unit"]) == ("/min", "count")
    codec = Codec()
    assert codec.decode(codec.encode(Event("Alert", alerts[0]))).record["image"] == alerts[0]["image"]


class _Clock:
    def __init__(self) -> None:
        self.ns = 1_700_000_000_000_000_000

    def __call__(self) -> int:
        return self.ns


def test_the_sdk_reads_the_allocator_once_per_interval_and_reports_it_on_that_step() -> None:
    clock, publisher, reads = _Clock(), MemoryPublisher(), []

    def stats() -> dict[str, Any]:
        reads.append(clock.ns)
        return {
            "num_alloc_retries": len(reads),
            "allocated_bytes.all.current": 10,
            "reserved_bytes.all.current": 20,
        }

    reporter = Reporter(
        JOB,
        0,
        node="n",
        publisher=publisher,
        bind=False,
        env={},
        mono_ns=clock,
        wall_ns=clock,
        allocator_stats=stats,
    )
    for n in range(40):  # 40 steps of 0.5 s: reads at 0, 10 and 20 s
        with reporter.step(n):
            clock.ns += 500_000_000
    reporter.close()
    steps = [e.record for e in publisher.events if e.type == "StepCompleted"]
    carrying = [
        (s["step"], s["alloc_retries"], s["mem_reserved_bytes"]) for s in steps if s.get("alloc_retries")
    ]
    assert carrying == [(0, 1, 20), (20, 2, 20)] and len(reads) == 2
    assert all(s.get("alloc_retries") is None for s in steps if s["step"] not in (0, 20))


def test_without_torch_or_cuda_the_sdk_reports_nothing_and_turning_it_off_reads_nothing() -> None:
    from producers.training.allocator import AllocatorProbe, torch_memory_stats

    assert torch_memory_stats() is None  # this process never initialised CUDA
    calls: list[int] = []
    probe = AllocatorProbe(lambda: 0, interval_s=0, stats=lambda: calls.append(1) or {})  # type: ignore[func-returns-value]
    assert probe.sample() is None and calls == []


def test_a_reader_that_raises_never_reaches_the_training_loop() -> None:
    from producers.training.allocator import AllocatorProbe

    def broken() -> dict[str, Any]:
        raise RuntimeError("CUDA driver error")

    probe = AllocatorProbe(lambda: 0, stats=broken)
    assert probe.sample() is None and probe.reads == 1
