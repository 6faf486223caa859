"""The invariant detectors are deterministic and their state survives a snapshot mid-stream."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.records import Event
from streams.detectors.base import Detector, Finding, Topology
from streams.detectors.checkpoint_failed import CheckpointFailedDetector
from streams.detectors.checkpoint_stale import CheckpointStaleDetector
from streams.detectors.checkpoint_stuck import CheckpointStuckDetector
from streams.detectors.ecc_uncorrectable import EccUncorrectableDetector
from streams.detectors.gpu_memory_pressure import GpuMemoryPressureDetector
from streams.detectors.gpu_throttling import GpuThrottlingDetector
from streams.detectors.grad_spike import GradSpikeDetector
from streams.detectors.host_memory_pressure import HostMemoryPressureDetector
from streams.detectors.long_pending import LongPendingDetector
from streams.detectors.loss_divergence import LossDivergenceDetector
from streams.detectors.nonfinite_grad import NonfiniteGradDetector
from streams.detectors.nonfinite_loss import NonfiniteLossDetector
from streams.detectors.resource import ResourceDetector
from streams.detectors.restart_loop import RestartLoopDetector
from streams.detectors.telemetry_missing import TelemetryMissingDetector
from streams.detectors.xid_error import XidErrorDetector
from tests.unit.streams.builders import (
    T0,
    checkpoint,
    gpu_sample,
    host_sample,
    job_started,
    job_state,
    rank_bound,
    step,
)

DETECTORS: list[type[Detector]] = [
    NonfiniteLossDetector,
    NonfiniteGradDetector,
    LossDivergenceDetector,
    GradSpikeDetector,
    CheckpointStuckDetector,
    CheckpointFailedDetector,
    CheckpointStaleDetector,
    ResourceDetector,
    TelemetryMissingDetector,
    XidErrorDetector,
    EccUncorrectableDetector,
    GpuThrottlingDetector,
    GpuMemoryPressureDetector,
    HostMemoryPressureDetector,
    LongPendingDetector,
    RestartLoopDetector,
]
JOB = "job-1"


def _stream() -> list[Event]:
    """Twelve minutes of a two-node job with a fault for every rule along the way."""
    events: list[Event] = [
        job_started(JOB, T0, world_size=16, nodes=2, checkpoint_max_age_s=300.0, checkpoint_timeout_s=120.0)
    ]
    events += [rank_bound(JOB, r, T0) for r in range(16)]
    events.append(job_state("job-2", T0, "pending"))
    for s in range(1, 721):
        ts = T0 + s * 1000
        loss = math.nan if 100 <= s < 105 else 2.5 + (0.01 * (s - 400) if s > 400 else 0.0)
        grad = 80.0 if s == 200 else 1.0
        events += [step(JOB, r, s, ts, loss=loss, grad_norm=grad) for r in range(0, 16, 5)]
        if s % 10 == 0:
            for node in ("node-01", "node-02"):
                if node == "node-02" and 300 <= s < 400:
                    continue  # the agent of node-02 is silent for 100 s
                events.append(host_sample(node, ts))
                for idx in range(2):
                    ev = gpu_sample(node, idx, ts, pids=[1000 + idx + (8 if node == "node-02" else 0)])
                    if node == "node-01" and idx == 1 and 150 <= s < 200:
                        ev.record["pids"] = [1001, 4242]
                    if node == "node-01" and idx == 0 and 200 <= s < 400:
                        ev.record.update(clock_event_reasons=0x40, sm_clock_mhz=1300)
                    if node == "node-02" and idx == 1 and s == 250:
                        ev.record.update(xid=79, ecc_uncorrected=1)
                    events.append(ev)
        if s == 60:
            events.append(checkpoint(JOB, ts, "started", ckpt="c1"))
        if s == 90:
            events.append(checkpoint(JOB, ts, "failed", ckpt="c1"))
        if s == 120:
            events.append(checkpoint(JOB, ts, "started", ckpt="c2"))
        if s in (500, 560, 620):
            events.append(job_state(JOB, ts, "restarting", restart_count=(s - 440) // 60))
            events.append(job_state(JOB, ts + 1, "running", restart_count=(s - 440) // 60))
    return events


STREAM = _stream()


def _run(det: Detector, events: list[Event]) -> list[Finding]:
    out: list[Finding] = []
    for ev in events:
        det.topology.observe(ev)
        out += det.observe(ev)
        out += det.advance(ev.record["ts"] - 2000)
    return out


@pytest.mark.parametrize("cls", DETECTORS, ids=lambda c: c.__name__)
def test_the_same_events_give_identical_findings_and_state_bytes(cls: type[Detector]) -> None:
    a, b = cls(Topology()), cls(Topology())
    found_a, found_b = _run(a, STREAM), _run(b, STREAM)
    assert found_a == found_b
    assert a.to_bytes() == b.to_bytes()


def test_the_stream_exercises_every_invariant_rule() -> None:
    fired: set[str] = set()
    for cls in DETECTORS:
        fired |= {f.rule for f in _run(cls(Topology()), STREAM) if f.active}
    expected = {
        "nonfinite_loss",
        "loss_divergence",
        "grad_spike",
        "checkpoint_failed",
        "checkpoint_stuck",
        "checkpoint_stale",
        "foreign_process",
        "xid_error",
        "ecc_uncorrectable",
        "gpu_throttling",
        "telemetry_missing",
        "restart_loop",
    }
    assert expected <= fired


@settings(max_examples=25, deadline=None)
@given(cls=st.sampled_from(DETECTORS), cut=st.integers(min_value=0, max_value=len(STREAM)))
def test_state_round_trip_mid_stream_gives_identical_findings(cls: type[Detector], cut: int) -> None:
    whole = cls(Topology())
    expected = _run(whole, STREAM)
    first = cls(Topology())
    before = _run(first, STREAM[:cut])
    blob, topo_state = first.to_bytes(), first.topology.state()
    resumed = cls(Topology.from_state(_json_round_trip(topo_state)))
    resumed.from_bytes(blob)
    after = _run(resumed, STREAM[cut:])
    assert before + after == expected
    assert resumed.to_bytes() == whole.to_bytes()


def _json_round_trip(state: dict[str, Any]) -> dict[str, Any]:
    from streams.detectors.base import dumps_state, loads_state

    result: dict[str, Any] = loads_state(dumps_state(state))
    return result
