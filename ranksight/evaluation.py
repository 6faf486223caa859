"""Cases for `ranksight evaluate`: the simulator's scenarios and generated cases, as case sources.

Wiring only: the simulator (`producers.simulator`) makes the events and labels, the offline
evaluator (`streams.offline.evaluate`) replays and scores them; neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.simulator import Scenario, load_scenario, simulate
from schemas.records import Event
from streams.alerting.routing import Router
from streams.config import EngineConfig
from streams.offline.evaluate import ScenarioRun, replay_case

__all__ = ["SimulatedCase", "generated_cases", "run_scenario", "scenario_cases"]


@dataclass(frozen=True)
class SimulatedCase:
    """A scenario (built-in name, YAML file or `Scenario`) simulated with a seed: a picklable case source."""

    scenario: str | Path | Scenario
    seed: int

    def __call__(self) -> tuple[str, Iterable[Event], list[dict[str, Any]]]:
        scenario = self.scenario if isinstance(self.scenario, Scenario) else load_scenario(self.scenario)
        sim = simulate(scenario, self.seed)
        return _name(self.scenario, scenario), sim.events(), list(sim.labels)


def _name(source: str | Path | Scenario, scenario: Scenario) -> str:
    if isinstance(source, Scenario):
        return scenario.name
    return Path(source).stem if str(source).endswith((".yaml", ".yml")) else str(source)


def scenario_cases(paths: Iterable[str | Path], seed: int) -> list[SimulatedCase]:
    """One case per scenario file (or built-in name)."""
    return [SimulatedCase(path, seed) for path in paths]


def generated_cases(n: int, seed: int) -> list[SimulatedCase]:
    """`n` generated cases from `seed`: faults and their must-not-alert twins."""
    from producers.simulator.generator import generate

    return [SimulatedCase(scenario, seed) for scenario in generate(n, seed)]


def run_scenario(
    scenario: str | Path | Scenario, seed: int, config: EngineConfig, router: Router
) -> ScenarioRun:
    """Simulate one scenario and replay it through a fresh engine."""
    name, events, labels = SimulatedCase(scenario, seed)()
    return replay_case(name, events, labels, config, router)
