"""Memory headroom and throttle clocks learned per GPU class from healthy completed runs (issue 35.1)."""

from __future__ import annotations

from typing import Any

from schemas.records import Event
from streams.config import load_config
from streams.detectors.base import Detector, Finding, Topology
from streams.detectors.class_normals import ClassNormals
from streams.detectors.gpu_memory_pressure import GpuMemoryPressureDetector
from streams.detectors.gpu_throttling import GpuThrottlingDetector
from streams.overrides import build_detector
from tests.unit.streams.builders import T0, gpu_sample, job_started, job_state

GIB = 2**30
POWER_CAP = 0x4


def _events(
    job: str, gpu_class: str, start: int, *, end: str | None = "completed", **sample: Any
) -> list[Event]:
    """One job on its own node's GPU 0: 30 samples 10 s apart, then its end state."""
    node = f"node-{job}"
    events = [
        job_started(job, start, world_size=1, gpu_class=gpu_class),
        Event(
            "RankBound",
            {
                "ts": start,
                "job_id": job,
                "run_id": f"{job}-run-1",
                "rank": 0,
                "local_rank": 0,
                "node": node,
                "gpu_index": 0,
                "gpu_uuid": f"GPU-{node}-0",
                "pid": 1000,
            },
        ),
        *(gpu_sample(node, 0, start + (i + 1) * 10_000, pids=[1000], **sample) for i in range(30)),
    ]
    if end:
        events.append(job_state(job, start + 320_000, end))
    return events


def _run(
    det: Detector, job: str, gpu_class: str, start: int, *, end: str | None = "completed", **sample: Any
) -> list[Finding]:
    """`_events` through one detector."""
    out: list[Finding] = []
    for ev in _events(job, gpu_class, start, end=end, **sample):
        det.topology.observe(ev)
        out += det.observe(ev)
    return out


def _fired(found: list[Finding], rule: str, sustain_ms: int) -> list[Finding]:
    """Findings that held the condition for the rule's sustain (what the lifecycle would fire)."""
    return [
        f
        for f in found
        if f.rule == rule and f.active and f.since is not None and f.ts - f.since >= sustain_ms
    ]


def test_three_healthy_runs_teach_a_class_its_memory_headroom_and_only_that_class() -> None:
    det = GpuMemoryPressureDetector(Topology())
    full = {"mem_used": int(0.985 * 80 * GIB)}  # 98.5 % of memory: this class's normal
    first = _run(det, "a1", "A100-40GB", T0, **full)
    assert _fired(first, "gpu_memory_pressure", 60_000), "before anything is learned the shipped 97 % pages"
    _run(det, "a2", "A100-40GB", T0 + 10**6, **full)
    _run(det, "a3", "A100-40GB", T0 + 2 * 10**6, **full)
    assert det.limit("A100-40GB") == (0.995, "learned from 3 healthy runs of A100-40GB")
    assert not _run(det, "a4", "A100-40GB", T0 + 3 * 10**6, end=None, **full), "now the class's normal"
    other = _fired(
        _run(det, "h1", "H100-80GB", T0 + 3 * 10**6, end=None, **full), "gpu_memory_pressure", 60_000
    )
    assert other and "97% of total" in other[0].invariant and other[0].expected == 0.97
    over = {"mem_used": int(0.999 * 80 * GIB)}
    paged = _fired(
        _run(det, "a5", "A100-40GB", T0 + 4 * 10**6, end=None, **over), "gpu_memory_pressure", 60_000
    )
    assert paged and paged[0].expected == 0.995
    assert "(learned from 3 healthy runs of A100-40GB)" in paged[0].invariant


def test_failed_runs_teach_nothing_and_a_set_knob_is_never_replaced() -> None:
    det = GpuMemoryPressureDetector(Topology())
    full = {"mem_used": int(0.985 * 80 * GIB)}
    for n in range(3):
        _run(det, f"f{n}", "A100-40GB", T0 + n * 10**6, end="failed", **full)
    assert det.limit("A100-40GB") == (0.97, "")
    set_by_config = GpuMemoryPressureDetector(Topology(), {"gpu_mem_ratio": 0.96})
    for n in range(3):
        _run(set_by_config, f"a{n}", "A100-40GB", T0 + n * 10**6, **full)
    assert set_by_config.limit("A100-40GB") == (0.96, ""), "the config file's value wins over learning"


def test_an_override_for_the_class_wins_over_what_was_learned(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "overrides:\n  - name: a100\n    match: {gpu_class: 'A100*'}\n"
        "    detectors:\n      infrastructure: {gpu_mem_ratio: 0.98}\n"
    )
    det = build_detector(GpuMemoryPressureDetector, Topology(), load_config(path))
    full = {"mem_used": int(0.985 * 80 * GIB)}
    for n in range(3):
        _run(det, f"a{n}", "A100-40GB", T0 + n * 10**6, **full)
    found = _fired(
        _run(det, "a9", "A100-40GB", T0 + 4 * 10**6, end=None, **full), "gpu_memory_pressure", 60_000
    )
    assert found and found[0].expected == 0.98, "the override's 98 %, not the learned 99.5 %"


def test_a_power_capped_class_learns_its_clock_and_still_pages_a_real_slowdown() -> None:
    det = GpuThrottlingDetector(Topology())
    capped = {"sm_clock": int(0.80 * 1980), "throttle": POWER_CAP}
    first = _fired(_run(det, "l1", "L4", T0, **capped), "gpu_throttling", 120_000)
    assert first, "the shipped 85 % pages every capped run at first"
    _run(det, "l2", "L4", T0 + 10**6, **capped)
    _run(det, "l3", "L4", T0 + 2 * 10**6, **capped)
    ratio, why = det.limit("L4")
    assert abs(ratio - 0.77) < 1e-9 and why == "learned from 3 healthy runs of L4"
    assert not _fired(_run(det, "l4", "L4", T0 + 3 * 10**6, end=None, **capped), "gpu_throttling", 120_000)
    slow = {
        "sm_clock": int(0.55 * 1980),
        "throttle": 0x40,
    }  # HW thermal slowdown far below the class's normal
    found = _fired(_run(det, "l5", "L4", T0 + 4 * 10**6, end=None, **slow), "gpu_throttling", 120_000)
    assert found and "learned from 3 healthy runs of L4" in found[0].invariant


def test_what_a_class_learned_survives_a_snapshot_and_stays_bounded() -> None:
    det = GpuMemoryPressureDetector(Topology())
    full = {"mem_used": int(0.985 * 80 * GIB)}
    for n in range(3):
        _run(det, f"a{n}", "A100-40GB", T0 + n * 10**6, **full)
    restored = GpuMemoryPressureDetector(Topology())
    restored.from_bytes(det.to_bytes())
    assert restored.limit("A100-40GB") == det.limit("A100-40GB")
    normals = ClassNormals("low", min_runs=1, max_runs=4, min_samples=1)
    for n in range(10):
        for i in range(1000):
            normals.add(f"j{n}", (i % 100) / 100)
        assert len(normals.jobs[f"j{n}"]["bins"]) == 100, "a fixed histogram whatever the job's length"
        normals.completed(f"j{n}", "L4", T0 + n)
    assert [run[1] for run in normals.classes["L4"]] == ["j6", "j7", "j8", "j9"], "the newest max_runs runs"
    assert normals.learned("L4") == (0.04, 4)


def test_the_stage_engine_hands_job_ends_to_the_learning_rules() -> None:
    """Through the engine's per-type dispatch, not only the detector: a GPU rule that learns from
    job ends must be handed JobStateChanged (it was not, once rules declared what they read)."""
    from streams.stages.engine import StageEngine

    engine = StageEngine(stage="rank")
    full = {"mem_used": int(0.985 * 80 * GIB)}
    for n in range(3):
        for ev in _events(f"e{n}", "A100-40GB", T0 + n * 10**6, **full):
            engine.process(ev, received_ts=int(ev.record["ts"]))
    (det,) = [d for d in engine.detectors if isinstance(d, GpuMemoryPressureDetector)]
    assert det.limit("A100-40GB")[1] == "learned from 3 healthy runs of A100-40GB"
