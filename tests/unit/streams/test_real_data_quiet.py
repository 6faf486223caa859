"""Real training runs under change detection and the self-baseline: no new straggler, no throughput drop.

The ranks of the Alibaba PAI jobs wander +-10 % around the job median for whole traces (a rank
that starts 9 % fast drifts back to the median); the CUSUM's per-rank reference (capped at the
median) and slack must absorb that, so it adds no straggler to those the 0.75 threshold finds.
The modded-nanogpt SOAP run has every 10th step 5x slower: the self-baseline judges windows, not
steps. Data: as test_real_data.py (required, CI has it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from producers.importers import convert_nanogpt, convert_pai
from schemas.records import Event
from streams.config import load_config
from streams.engine import DetectionEngine
from tests.unit.streams.test_real_data import real  # noqa: F401  (the fixture)

NO_CUSUM = {"detectors": {"imbalance": {"cusum_threshold": 1e9, "cusum_sigma_threshold": 0.0}}}


def _stragglers(events: list[Event], overrides: dict[str, Any] | None = None) -> set[int]:
    out = DetectionEngine(load_config(overrides=overrides)).run(events)
    return {e.record["rank"] for e in out if e.type == "Alert" and e.record["rule"] == "straggler"}


@pytest.mark.parametrize("job", [1, 2, 3, 4])
def test_change_detection_adds_no_straggler_on_real_pai_jobs(real: Path, job: int) -> None:  # noqa: F811
    events = sorted(
        convert_pai(real / "alibaba-pai-minibatch" / f"job_{job}_norm.csv"), key=lambda e: e.record["ts"]
    )
    assert _stragglers(events) == _stragglers(events, NO_CUSUM)


def test_a_run_with_periodic_slow_steps_raises_no_throughput_drop(real: Path) -> None:  # noqa: F811
    events = list(convert_nanogpt(real / "modded-nanogpt" / "5bdc3988-496c-4232-b4ef-53764cb81c92.txt"))
    events.sort(key=lambda e: e.record["ts"])
    alerts = [e.record for e in DetectionEngine().run(events) if e.type == "Alert"]
    assert [a["summary"] for a in alerts if a["rule"] in ("throughput_drop", "straggler")] == []
