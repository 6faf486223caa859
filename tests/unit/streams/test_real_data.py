"""Real public training data through the detectors: no false numerical alerts, the known straggler found.

The data lives outside the repository (`RANKSIGHT_REAL_DATA`, else ../shared/data/real next to
it; see its PROVENANCE.md). CI has it: a missing folder fails these tests, it does not skip them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from producers.importers import convert_nanogpt, convert_pai, convert_pythia
from schemas.files import write_container
from schemas.records import Event
from streams.config import config_section
from streams.detectors import ALL_DETECTORS
from streams.detectors.base import Finding, Topology
from streams.offline.replay import replay_offline

REPO = Path(__file__).resolve().parents[3]
NANOGPT = [
    "eb5659d0-fb6a-49e5-a311-f1f89412f726.txt",  # Muon: one-step loss jumps (919: 5.06 vs ~3.8)
    "5bdc3988-496c-4232-b4ef-53764cb81c92.txt",  # SOAP: every 10th step 5x slower
    "c0078066-c8c9-49c8-868a-ff4d4f32e615.txt",  # 1.5B: 31 isolated loss spikes, 15k steps
]
NUMERICAL = {"nonfinite_loss", "nonfinite_grad", "loss_divergence", "grad_spike", "lr_invalid"}


@pytest.fixture(scope="module")
def real() -> Path:
    """The real-data folder: required (CI has it)."""
    path = Path(os.environ.get("RANKSIGHT_REAL_DATA") or REPO.parent / "shared" / "data" / "real")
    if not (path / "PROVENANCE.md").is_file():
        pytest.fail(
            f"real training data not found at {path}: set RANKSIGHT_REAL_DATA to the folder holding "
            "alibaba-pai-minibatch/, modded-nanogpt/ and pythia/ (see its PROVENANCE.md)"
        )
    return path


def numerical_findings(events: Any) -> list[Finding]:
    """The numerical rules alone (section `numerical`), advanced as the engine does (watermark 5 s behind)."""
    topo = Topology()
    dets = [cls(topo) for cls in ALL_DETECTORS if config_section(cls) == "numerical"]
    assert {r for d in dets for r in d.rules} == NUMERICAL
    out: list[Finding] = []
    for ev in events:
        topo.observe(ev)
        for det in dets:
            out += det.observe(ev)
        for det in dets:
            out += det.advance(ev.record["ts"] - 5000)
    return out


def replay_alerts(events: list[Event], tmp_path: Path, name: str) -> list[dict[str, Any]]:
    """Write the events to a container file and replay it through the whole engine."""
    path = tmp_path / f"{name}.avro"
    write_container(path, events)
    return [e.record for e in replay_offline([path]) if e.type == "Alert"]


@pytest.mark.parametrize("log", NANOGPT, ids=["muon", "soap", "scaleup-1.5b"])
def test_nanogpt_runs_raise_no_numerical_finding(real: Path, log: str) -> None:
    found = numerical_findings(convert_nanogpt(real / "modded-nanogpt" / log))
    assert [f.summary for f in found if f.active] == []


def test_pythia_70m_late_drift_raises_no_numerical_finding(real: Path) -> None:
    found = numerical_findings(convert_pythia(real / "pythia" / "70m-0.csv"))
    assert [f.summary for f in found if f.active] == []


@pytest.mark.parametrize("log", NANOGPT, ids=["muon", "soap", "scaleup-1.5b"])
def test_engine_replay_of_nanogpt_fires_no_numerical_alert(real: Path, tmp_path: Path, log: str) -> None:
    alerts = replay_alerts(list(convert_nanogpt(real / "modded-nanogpt" / log)), tmp_path, "nanogpt")
    assert [a["summary"] for a in alerts if a["rule"] in NUMERICAL] == []


def test_engine_replay_of_pythia_fires_no_numerical_alert(real: Path, tmp_path: Path) -> None:
    alerts = replay_alerts(list(convert_pythia(real / "pythia" / "70m-0.csv", every=10)), tmp_path, "pythia")
    assert [a["summary"] for a in alerts if a["rule"] in NUMERICAL] == []


def test_engine_replay_of_pai_job1_finds_worker_6_as_the_straggler_in_its_window(
    real: Path, tmp_path: Path
) -> None:
    events = convert_pai(real / "alibaba-pai-minibatch" / "job_1_norm.csv")
    steps = [e.record for e in events if e.type == "StepCompleted"]
    window_start = min(s["ts"] for s in steps if s["step"] == 1811)
    window_end = max(s["ts"] for s in steps if s["step"] == 1941)
    alerts = replay_alerts(events, tmp_path, "pai1")
    stragglers = [a for a in alerts if a["rule"] == "straggler" and a["status"] == "firing"]
    assert {a["rank"] for a in stragglers} == {6}, [a["summary"] for a in stragglers]
    first = min(stragglers, key=lambda a: a["ts"])
    # The condition starts with the first low window; windows hop on 30 s boundaries, so the
    # window holding the first slow steps may open up to one window before them.
    assert window_start - 60_000 <= first["starts_at"] <= window_end
    assert window_start <= first["ts"] <= window_end
    # A GPU straggler is a platform alert: the platform team's copy, and the job's team informed.
    assert first["job_id"] == "pai-job_1"
    assert {a["team"] for a in stragglers if a["alert_id"] == first["alert_id"]} == {"platform", "pai"}
    resolved = [a for a in alerts if a["rule"] == "straggler" and a["status"] == "resolved"]
    assert resolved and resolved[0]["ts"] > first["ts"]
