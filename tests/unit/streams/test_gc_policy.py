"""The worker's collector policy (streams/gc_policy.py) and the premise it rests on: the engine makes
no reference cycles, so a state that stops growing is never walked again."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from ranksight.evaluation import SimulatedCase
from streams import gc_policy
from streams.offline.detection import DetectionEngine

# Scenarios that between them run every stage, the alert lifecycle (fire, group, inhibit, resolve),
# baselines shared between runs, checkpoints, hangs, restarts and node faults.
CASES = [
    "mixed",
    "rank_hang",
    "zombie",
    "restart_loop",
    "colocated_node_fault",
    "checkpoint_verify_failure",
    "throughput_regression",
    "nan_loss",
]


@pytest.fixture
def collector_off() -> Iterator[None]:
    """Automatic collection off for the test (and back on after it)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _cyclic_garbage() -> list[str]:
    """What a full collection finds unreachable now (type names)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    gc.set_debug(0)
    found = sorted(type(o).__name__ for o in gc.garbage)
    gc.garbage.clear()
    return found


@pytest.mark.parametrize("name", CASES)
def test_the_engine_makes_no_reference_cycles(name: str, collector_off: None) -> None:
    _, events, _ = SimulatedCase(name, 0)()
    events = list(events)
    half = len(events) // 2
    engine = DetectionEngine()
    alerts = [o for o in engine.run(events[:half]) if o.type == "Alert"]
    engine = DetectionEngine.restore(engine.snapshot())
    alerts += [o for o in engine.run(events[half:]) if o.type == "Alert"]
    alerts += [o for o in engine.finish() if o.type == "Alert"]
    del engine
    assert alerts, f"{name} raised no alert: the run did not exercise the alert path"
    assert _cyclic_garbage() == []


class _Node:
    def __init__(self) -> None:
        self.other: object = None


@pytest.fixture
def policy() -> Iterator[list[int]]:
    """The worker's policy set; the generations of the collections it runs."""
    runs: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            runs.append(info["generation"])

    gc.collect()
    gc_policy.for_long_lived_state()
    gc.callbacks.append(count)
    try:
        yield runs
    finally:
        gc.callbacks.remove(count)
        gc_policy.python_default()
        gc.unfreeze()


def test_a_state_that_stops_growing_is_not_walked_again(policy: list[int]) -> None:
    # A state more than doubling the process's containers, built as a job's windows fill...
    size = gc.get_freeze_count() + 200_000
    state = [[i] for i in range(size)]
    built = len(policy)
    assert built >= 1, "a growing state is collected (and frozen) as it doubles"
    # ...then turned over a window's hop at a time: a third of it made anew, then the oldest third
    # dropped (Python's own collector, or a young generation sized below the hop, walks each hop).
    hop = size // 3
    for n in range(12):
        state.extend([[n, i] for i in range(hop)])
        del state[:hop]
    assert len(policy) == built, "a steady state was walked again"


def test_cyclic_garbage_is_still_collected(policy: list[int]) -> None:
    first = _Node()
    first.other = first
    probe = weakref.ref(first)
    del first
    # Garbage cycles, as many as there are live containers (the policy's bound), and more.
    for _ in range(gc.get_freeze_count() + 200_000):
        node = _Node()
        node.other = node
    del node
    assert policy, "no collection ran"
    assert probe() is None, "a garbage cycle survived"
