"""GPU-hour prices for the efficiency view: parsing, files, and the cost per successful run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sinks.efficiency import PriceList, PriceListError, summarise


def test_prices_parse_from_the_command_line_over_a_file(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("H100-80GB: 2.9\ndefault: 1.5\n")
    prices = PriceList.parse(["A100-40GB=1.2", "H100-80GB=3.1"], PriceList.load(path))
    assert prices.price("H100-80GB") == 3.1 and prices.price("A100-40GB") == 1.2
    assert prices.price("L4") == 1.5 and PriceList().price("L4") is None
    for bad in ("H100", "H100=cheap", "=2", "H100=-1"):
        with pytest.raises(PriceListError, match="CLASS=USD_PER_GPU_HOUR"):
            PriceList.parse([bad])
    path.write_text("- 2.9\n")
    with pytest.raises(PriceListError, match="must map GPU classes"):
        PriceList.load(path)
    with pytest.raises(PriceListError, match="cannot read"):
        PriceList.load(tmp_path / "missing.yaml")


def _job(outcome: str, gpu_h: float, cost: float | None) -> dict[str, Any]:
    return {"outcome": outcome, "allocated_gpu_h": gpu_h, "productive_gpu_h": gpu_h / 2, "tokens": 1000,
            "energy_kwh": 1.0, "cost": cost}  # fmt: skip


def test_failed_jobs_make_each_successful_run_more_expensive() -> None:
    total = summarise([_job("completed", 10, 30.0), _job("failed", 5, 15.0), _job("completed", 5, 15.0)])
    assert total["cost"] == 60.0 and total["completed"] == 2 and total["cost_per_successful_run"] == 30.0
    assert total["goodput_pct"] == 50.0
    # An unpriced job leaves the per-success figure unknown rather than too low.
    assert (
        summarise([_job("completed", 10, 30.0), _job("failed", 5, None)])["cost_per_successful_run"] is None
    )
    assert summarise([_job("failed", 5, 15.0)])["cost_per_successful_run"] is None
