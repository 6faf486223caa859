"""Per-record dispatch (issue 37.1): a detector that declares the record types it reads (`reads`)
decides exactly as when it is handed every record, so the engine hands it only those."""

from __future__ import annotations

from functools import cache

import pytest

from producers.simulator import load_scenario, simulate
from schemas.records import Event
from streams.config import EngineConfig
from streams.detectors import ALL_DETECTORS
from streams.detectors.base import Detector, Finding, Topology
from streams.stages.engine import StageEngine

# Small scenarios with every record type between them (rank faults, loader samples, GPU faults).
_SCENARIOS = ("data_errors", "repeated_batches", "restart_loop", "gpu_outside_allocation")
_DECLARED = [cls for cls in ALL_DETECTORS if cls.reads is not None]


@cache
def _events(name: str) -> tuple[Event, ...]:
    events = sorted(simulate(load_scenario(name), seed=0).events(), key=lambda e: int(e.record["ts"]))
    return tuple(events)


def _run(cls: type[Detector], events: tuple[Event, ...], *, every: bool) -> tuple[list[Finding], bytes]:
    topology = Topology()
    det = cls(topology, EngineConfig.default().params_for(cls))
    found: list[Finding] = []
    for i, event in enumerate(events):
        topology.observe(event)
        if every or event.type in (cls.reads or ()):
            found += det.observe(event)
        if i % 200 == 0:
            found += det.advance(int(event.record["ts"]) - 5_000)
    return found, det.to_bytes()


def test_every_rank_stage_detector_declares_what_it_reads() -> None:
    """The rank stage runs on every raw record: none of its rules is handed records it ignores."""
    assert [type(d).__name__ for d in StageEngine(stage="rank").detectors if d.reads is None] == []


@pytest.mark.parametrize("cls", _DECLARED, ids=lambda c: c.__name__)
def test_a_detector_handed_only_what_it_reads_decides_as_when_handed_everything(cls: type[Detector]) -> None:
    for name in _SCENARIOS:
        events = _events(name)
        assert _run(cls, events, every=False) == _run(cls, events, every=True), f"{cls.__name__} on {name}"


def test_the_engine_hands_each_record_type_to_its_readers_in_the_engine_order() -> None:
    engine = StageEngine(stage="rank")
    readers = engine._reading("HostSample")
    assert readers == [d for d in engine.detectors if d.reads is None or "HostSample" in d.reads]
    names = {type(d).__name__ for d in readers}
    assert "HostMemoryPressureDetector" in names and "NonfiniteLossDetector" not in names
