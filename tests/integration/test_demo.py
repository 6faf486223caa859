"""The demo runs the whole pipeline: simulator -> Kafka -> worker + sink -> alerts and ClickHouse."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ranksight.demo import DemoOptions, run_demo
from ranksight.settings import Settings


def test_demo_stores_every_event_once_and_fires_and_resolves_the_labelled_alert(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    out = Console(width=160, record=True, force_terminal=False)
    settings = Settings(kafka_bootstrap=kafka_bootstrap, home=tmp_path)
    summary = run_demo(settings, DemoOptions(scenario="nan_loss", speed=200.0, timeout_s=180), out)

    published, rows = summary["published"], summary["rows"]
    assert published["StepCompleted"] > 10_000
    assert rows["steps"] == published["StepCompleted"]
    assert rows["gpu_samples"] == published["GpuSample"]
    assert summary["alerts"]["fired"] >= 1 and summary["alerts"]["resolved"] >= 1
    assert rows["alerts"] >= 2
    text = out.export_text()
    assert "nonfinite_loss" in text
    assert "MISMATCH" not in text
