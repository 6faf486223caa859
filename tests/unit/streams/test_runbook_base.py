"""Alerts carry an absolute runbook link once a base is configured (issue 24.2, alert side)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streams.alerting.routing import RUNBOOK_BASE_ENV, load_router
from streams.errors import RoutingError
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import T0, gpu_sample, training_job


def _stall_alerts(engine: DetectionEngine) -> list[dict[str, object]]:
    events = training_job(seconds=100)
    events += [
        gpu_sample("node-01", i, T0 + s * 1000, pids=[1000 + i]) for s in range(101, 400, 5) for i in range(4)
    ]
    out = engine.run(sorted(events, key=lambda e: e.record["ts"]))
    return [e.record for e in out if e.type == "Alert" and e.record["rule"] == "job_stall"]


def test_the_environment_setting_makes_every_runbook_link_absolute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUNBOOK_BASE_ENV, "https://ranksight.example.com/runbooks")
    alerts = _stall_alerts(DetectionEngine(router=load_router()))
    assert alerts and {a["runbook_url"] for a in alerts} == {
        "https://ranksight.example.com/runbooks/job_stall"
    }


def test_without_a_base_the_link_stays_the_repository_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUNBOOK_BASE_ENV, raising=False)
    alerts = _stall_alerts(DetectionEngine(router=load_router()))
    assert {a["runbook_url"] for a in alerts} == {"docs/runbooks/job_stall"}


def test_the_routing_file_can_name_the_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUNBOOK_BASE_ENV, raising=False)
    shipped = yaml.safe_load(Path(load_router().ownership.source).read_text())  # type: ignore[union-attr]
    (tmp_path / "ownership.yaml").write_text(yaml.safe_dump(shipped))
    routing = {"ownership": "ownership.yaml", "runbook_base_url": "http://ui.internal:8080/runbooks/"}
    (tmp_path / "routing.yaml").write_text(yaml.safe_dump(routing))
    alerts = _stall_alerts(DetectionEngine(router=load_router(tmp_path / "routing.yaml")))
    assert {a["runbook_url"] for a in alerts} == {"http://ui.internal:8080/runbooks/job_stall"}


def test_a_relative_base_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUNBOOK_BASE_ENV, "runbooks/")
    with pytest.raises(RoutingError, match="not an absolute URL"):
        load_router()
