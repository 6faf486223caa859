"""JobWindowStats split the GPU's idle time in a window into data wait, communication and other causes."""

from __future__ import annotations

import pytest

from schemas.codec import Codec
from schemas.records import Event
from streams.detectors.base import Topology
from streams.detectors.imbalance import ImbalanceDetector
from tests.unit.streams.builders import T0, job_started, job_state, rank_bound, step
from tests.unit.streams.stages import job_stage_input

RANKS = 4


def _windows(**segments: float | None) -> list[dict]:
    """JobWindowStats of a 4-rank job stepping once a second for 130 s with the given segments."""
    topo = Topology()
    det = ImbalanceDetector(topo)
    events: list[Event] = [job_started("job-1", T0, world_size=RANKS), job_state("job-1", T0, "running")]
    events += [rank_bound("job-1", r, T0) for r in range(RANKS)]
    events += [step("job-1", r, i, T0 + i * 1000, **segments) for i in range(1, 131) for r in range(RANKS)]  # type: ignore[arg-type]
    derived: list[Event] = []
    for e in job_stage_input(events):
        topo.observe(e)
        det.observe(e)
        det.advance(e.record["ts"] - 5000)
        derived += det.drain_derived()
    out = [e for e in derived if e.type == "JobWindowStats"]
    assert out
    for e in out:
        Codec().encode(e)  # the new fields are in the contract
    return [e.record for e in out]


def test_a_data_starved_job_attributes_its_idle_gpu_time_to_data_wait() -> None:
    (w, *_) = _windows(step_time=1.0, compute=0.4, data_wait=0.45, comm=0.1)
    assert w["gpu_idle_frac"] == pytest.approx(0.6)
    assert w["idle_data_wait_frac"] == pytest.approx(0.45)
    assert w["idle_comm_frac"] == pytest.approx(0.1)
    assert w["idle_other_frac"] == pytest.approx(0.05)


def test_unmarked_time_is_other_and_steps_without_compute_segments_are_left_out() -> None:
    (w, *_) = _windows(step_time=1.0, compute=0.5, data_wait=None, comm=None)
    assert (w["gpu_idle_frac"], w["idle_data_wait_frac"], w["idle_other_frac"]) == pytest.approx(
        (0.5, 0.0, 0.5)
    )
    (none, *_) = _windows(step_time=1.0, compute=None, data_wait=None, comm=None)
    assert none["gpu_idle_frac"] is None and none["idle_other_frac"] is None


def test_overlapping_segments_never_make_other_negative() -> None:
    (w, *_) = _windows(step_time=1.0, compute=0.8, data_wait=0.2, comm=0.2)
    assert w["idle_other_frac"] == 0.0 and w["gpu_idle_frac"] == pytest.approx(0.2)
