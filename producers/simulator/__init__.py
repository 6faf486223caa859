"""Cluster simulator: correlated GPU/host telemetry and training events with labelled faults.

Pure: no Kafka, no wall clock. `simulate(load_scenario("straggler_gpu"), seed=1).events()`
yields `Event`s in event-time order; `.labels` says which fault is where and which alert
rule it must raise.
"""

from __future__ import annotations

from producers.simulator.ending import run_ends
from producers.simulator.engine import Progress, Simulation, simulate
from producers.simulator.errors import ScenarioError, SimulatorError
from producers.simulator.faults import FAULTS, FaultKind
from producers.simulator.labels import write_labels
from producers.simulator.pacing import paced
from producers.simulator.scenario import Scenario, builtin_scenarios, load_scenario, parse_duration

__all__ = [
    "FAULTS",
    "FaultKind",
    "Progress",
    "Scenario",
    "ScenarioError",
    "Simulation",
    "SimulatorError",
    "builtin_scenarios",
    "load_scenario",
    "paced",
    "parse_duration",
    "run_ends",
    "simulate",
    "write_labels",
]
