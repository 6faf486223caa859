"""Every shipped scenario, simulated (seed 0) and replayed offline, raises exactly its labelled alerts.

A label is detected when its rule fires for the right job, rank/GPU/node and team within 120 s
(two windows) of the fault's start, plus the rule's inherent delay (`streams.offline.evaluate.rule_delay_ms`:
a zombie only after its grace period, a stuck checkpoint only after its timeout). A transient
fault's alert resolves after the fault ends. No alert matches no label; healthy and
long_checkpoint raise nothing.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from producers.simulator import builtin_scenarios, load_scenario, simulate
from ranksight.evaluation import run_scenario
from schemas.codec import Codec
from streams.alerting.routing import load_router
from streams.config import load_config
from streams.offline.evaluate import ScenarioResult, ScenarioRun, evaluate_alerts
from streams.runtime.options import WorkerOptions
from tests.unit.streams.runtime.fake_kafka import FakeKafka, alerts_of, drive

SCENARIOS = builtin_scenarios()
_CODEC = Codec()

# Scenarios written from issue 10 that today's detectors do not pass yet: (test, scenario) -> the
# detector gap. strict: the detector work that closes a gap must remove its entry.
_MISSED = "test_labelled_alerts_fire_for_the_right_identity_and_team_in_time"
_UNEXPLAINED = "test_no_alert_fires_without_a_label_explaining_it"
DETECTOR_GAPS: dict[tuple[str, str], str] = {}


def _cases(test: str) -> list[object]:
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=DETECTOR_GAPS[(test, name)]))
        if (test, name) in DETECTOR_GAPS
        else name
        for name in SCENARIOS
    ]


@cache
def _run(name: str) -> ScenarioRun:
    return run_scenario(name, 0, load_config(None), load_router())


@cache
def _result(name: str) -> ScenarioResult:
    run = _run(name)
    return evaluate_alerts(name, run.alerts, run.labels, load_config(None), jobs=run.jobs)


def test_every_fault_scenario_is_shipped() -> None:
    assert {
        "healthy",
        "straggler_gpu",
        "slow_data_worker",
        "network_degradation",
        "rank_hang",
        "job_stall",
        "long_checkpoint",
        "throughput_regression",
        "zombie",
        "mixed",
    } <= set(SCENARIOS)


@pytest.mark.parametrize("name", _cases(_MISSED))
def test_labelled_alerts_fire_for_the_right_identity_and_team_in_time(name: str) -> None:
    result = _result(name)
    missed = [
        f"{lab.fault}: {lab.alert} for {lab.job_id} {lab.identity}"
        + (" (wrong team)" if lab.wrong_team else "")
        for lab in result.labels
        if lab.alert is not None and not lab.detected
    ]
    assert not missed, f"{name}: not detected in time: {missed}; alerts: {_alerts(name)}"


@pytest.mark.parametrize("name", SCENARIOS)
def test_transient_faults_resolve_after_they_end(name: str) -> None:
    result = _result(name)
    unresolved = [
        f"{lab.fault}: {lab.alert} {lab.identity}" for lab in result.labels if lab.resolved is False
    ]
    assert not unresolved, f"{name}: still firing after the fault ended: {unresolved}"


@pytest.mark.parametrize("name", _cases(_UNEXPLAINED))
def test_no_alert_fires_without_a_label_explaining_it(name: str) -> None:
    fps = [
        f"{a['rule']} {a['job_id']} rank={a['rank']} node={a['node']}: {a['summary']}"
        for a in _result(name).false_positives
    ]
    assert not fps, f"{name}: unexpected alerts: {fps}"


# The core-vs-offline comparison costs ~8 s a scenario: `make test` runs it on these, which
# between them raise every rule any shipped scenario raises (`test_the_core_cases_cover_every_rule`
# holds them to it) plus `healthy`; RANKSIGHT_ALL_SCENARIOS=1 (`make test-scenarios`) runs all.
CORE_SCENARIOS = (
    "healthy", "mixed", "throughput_regression", "slow_data_worker", "checkpoint_never_completes",
    "restart_loop", "rank_hang", "agent_silent", "checkpoint_retention_unverified",
    "checkpoint_verify_failure", "data_errors", "file_open_stall", "foreign_process",
    "gpu_allocated_idle", "gpu_outside_allocation", "grad_spike", "ib_degradation",
    "loader_workers_die", "long_pending", "loss_divergence", "rank_outside_nodes",
    "repeated_batches", "restore_test_failure", "skip_steps", "validation_divergence",
    "validation_missing", "colocated_node_fault", "gpu_memory_pressure", "nan_loss", "zombie",
)  # fmt: skip
_CORE_CASES = SCENARIOS if os.environ.get("RANKSIGHT_ALL_SCENARIOS") == "1" else list(CORE_SCENARIOS)


def test_the_core_cases_cover_every_rule() -> None:
    """Every rule some shipped scenario raises offline is raised by one of CORE_SCENARIOS."""
    assert set(CORE_SCENARIOS) <= set(SCENARIOS)
    every = {a["rule"] for name in SCENARIOS for a in _run(name).alerts}
    covered = {a["rule"] for name in CORE_SCENARIOS for a in _run(name).alerts}
    assert every - covered == set(), f"add a scenario raising {sorted(every - covered)} to CORE_SCENARIOS"


@pytest.mark.parametrize("name", _CORE_CASES)
def test_the_worker_core_raises_the_offline_alerts(name: str, tmp_path: Path) -> None:
    """Issue 18.4: the worker (its core, driven here by an in-memory Kafka of 6 partitions; both
    runtimes are thin loops around it) raises the offline replay's alerts, same ids and states."""
    events = list(simulate(load_scenario(name), seed=0).events())
    kafka = FakeKafka(6)
    kafka.publish(events, _CODEC)
    drive(kafka, WorkerOptions(bootstrap="unused", workdir=tmp_path))
    worker = {(a["alert_id"], a["status"]) for a in alerts_of(kafka, _CODEC)}
    offline = {(a["alert_id"], a["status"]) for a in _run(name).alerts}
    assert worker == offline, (
        f"{name}: missing {sorted(offline - worker)[:5]}, extra {sorted(worker - offline)[:5]}"
    )


def test_a_replay_of_a_scenario_is_deterministic() -> None:
    first = _run("straggler_gpu").output
    again = run_scenario("straggler_gpu", 0, load_config(None), load_router()).output
    assert first == again


def _alerts(name: str) -> list[str]:
    return [
        f"{a['status']} {a['rule']} {a['job_id']} rank={a['rank']} node={a['node']}"
        for a in _run(name).alerts
    ]


def _lasting(alerts: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """rank_hang's and job_stall's records as the worker and offline replay agree on them: each
    record's alert, state, copy, muting and refresh period (a minute of event time from the alert's
    start; the worker's job stage hears its findings a few seconds after offline replay does)."""
    return sorted(
        (
            a["rule"],
            a["alert_id"],
            a["status"],
            a["team"],
            a["inhibited_by"],
            (a["ts"] - a["starts_at"]) // 60_000,
        )
        for a in alerts
        if a["rule"] in ("rank_hang", "job_stall")
    )


def test_a_lasting_hang_is_republished_as_it_grows_the_same_by_the_worker_and_offline(tmp_path: Path) -> None:
    """Issue 34.2: rank_hang and the job_stall it mutes fire once each and are refreshed while they
    fire (same alert, one record a minute of event time, the summary and value grown, the stall
    still muted), never counted as another page; the worker publishes the same records."""
    offline = _run("rank_hang").alerts
    for rule in ("rank_hang", "job_stall"):
        records = [a for a in offline if a["rule"] == rule and a["team"] == "platform"]
        firing = [a for a in records if a["status"] == "firing"]
        assert len({a["alert_id"] for a in records}) == 1 and len(firing) >= 5, rule
        periods = [(a["ts"] - a["starts_at"]) // 60_000 for a in firing]
        assert periods == sorted(set(periods)), rule  # at most one record a minute
        assert firing[-1]["summary"] != firing[0]["summary"], rule
        if rule == "job_stall":
            assert [a["observed"] for a in firing] == sorted({a["observed"] for a in firing})
            assert all(a["inhibited_by"] for a in records)  # muted by the hang from first to last
            assert all(a["history"][-1] == {"ts": a["ts"], "value": a["observed"]} for a in firing)
    result = _result("rank_hang")
    assert (
        result.rules.get("rank_hang") == [1, 1] and "job_stall" not in result.rules
    )  # one page, muted stall
    events = list(simulate(load_scenario("rank_hang"), seed=0).events())
    kafka = FakeKafka(6)
    kafka.publish(events, _CODEC)
    drive(kafka, WorkerOptions(bootstrap="unused", workdir=tmp_path))
    assert _lasting(alerts_of(kafka, _CODEC)) == _lasting(offline)
