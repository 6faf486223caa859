"""Scoring alerts against labels: detection window, identity, team, resolution and false positives."""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

from ranksight.cli import app
from schemas.files import format_ts
from streams.config import load_config
from streams.offline.evaluate import evaluate_alerts, rule_delay_ms
from tests.unit.streams.builders import T0

CFG = load_config(None)
LABEL = {
    "fault": "straggler_gpu",
    "alert": "straggler",
    "also": ["gpu_throttling"],
    "job_id": "j",
    "node": "n1",
    "rank": 5,
    "gpu_uuid": "G",
    "gpu_index": 5,
    "start": format_ts(T0),
    "end": format_ts(T0 + 300_000),
    "team": "llm",
    "scenario": "s",
}


def _alert(
    rule: str = "straggler", status: str = "firing", ts: int = T0 + 90_000, **kw: Any
) -> dict[str, Any]:
    a = {
        "rule": rule,
        "status": status,
        "ts": ts,
        "job_id": "j",
        "rank": 5,
        "node": "n1",
        "gpu_uuid": "G",
        "team": "llm",
        "fingerprint": f"{rule}/j/5",
        "ends_at": ts if status == "resolved" else None,
    }
    a.update(kw)
    return a


def test_an_alert_in_time_for_the_right_rank_and_team_detects_the_label_and_its_resolution_counts() -> None:
    r = evaluate_alerts("s", [_alert(), _alert(status="resolved", ts=T0 + 330_000)], [LABEL], CFG)
    lab = r.labels[0]
    assert lab.detected and lab.time_to_detect_s == 90.0 and lab.resolved and lab.resolve_delay_s == 30.0
    assert r.false_positives == [] and r.matched == 1


def test_late_wrong_rank_or_wrong_team_alerts_do_not_detect() -> None:
    assert not evaluate_alerts("s", [_alert(ts=T0 + 121_000)], [LABEL], CFG).labels[0].detected
    assert (
        not evaluate_alerts("s", [_alert(rank=4, fingerprint="straggler/j/4")], [LABEL], CFG)
        .labels[0]
        .detected
    )
    wrong = evaluate_alerts("s", [_alert(team="platform")], [LABEL], CFG).labels[0]
    assert not wrong.detected and wrong.wrong_team


def test_co_firing_rules_are_not_false_positives_but_other_rules_are() -> None:
    r = evaluate_alerts("s", [_alert(), _alert("gpu_throttling"), _alert("xid_error")], [LABEL], CFG)
    assert [a["rule"] for a in r.false_positives] == ["xid_error"]


def test_every_alert_in_the_healthy_scenario_is_a_false_positive() -> None:
    assert len(evaluate_alerts("healthy", [_alert()], [], CFG).false_positives) == 1


def test_rules_with_an_inherent_delay_get_it_added_to_the_deadline() -> None:
    assert rule_delay_ms("zombie_job", CFG) == 600_000
    assert rule_delay_ms("checkpoint_stuck", CFG, LABEL, {"checkpoint_timeout_s": 300.0}) == 300_000
    assert rule_delay_ms("straggler", CFG) == 0


def test_the_cli_prints_the_table_and_fails_under_the_recall_threshold() -> None:
    result = CliRunner().invoke(app, ["evaluate", "--only", "straggler_gpu", "--fail-under", "0.5"])
    assert result.exit_code == 0, result.output
    assert "straggler_gpu" in result.output and "recall 1.00" in result.output
    bad = CliRunner().invoke(app, ["evaluate", "--only", "nope"])
    assert bad.exit_code == 1 and "no scenario named nope" in bad.output


def test_each_alert_counts_once_whatever_its_receiver_copies_and_updates() -> None:
    """Routing publishes one record per receiver copy; a late cause re-sends the symptom muted."""
    copies = [
        _alert(alert_id="a1", team="llm", receiver="llm-pager"),
        _alert(alert_id="a1", team="infra", receiver="infra-pager"),
        _alert("xid_error", alert_id="a2", team="infra", receiver="infra-pager"),
        _alert("xid_error", alert_id="a2", team="llm", receiver="llm-chat"),
    ]
    r = evaluate_alerts("s", copies, [LABEL], CFG)
    assert r.firing == 2 and r.matched == 1 and [a["rule"] for a in r.false_positives] == ["xid_error"]
    assert r.rules == {"straggler": [1, 1], "xid_error": [1, 0]}


def test_an_alert_refreshed_while_it_fires_is_one_page_detected_at_its_firing_only() -> None:
    """A lasting condition is republished while it fires (issue 34.2): its refreshes are neither
    pages nor detections of their own."""
    refreshed = [_alert(alert_id="a1", ts=T0 + 90_000 + i * 60_000, observed=float(i)) for i in range(5)]
    r = evaluate_alerts("s", refreshed, [LABEL], CFG)
    assert (r.firing, r.matched, r.false_positives) == (1, 1, [])
    assert r.labels[0].time_to_detect_s == 90.0
    # An alert that fired before the fault began (another incident) is not made on time by its refresh.
    early = [_alert(alert_id="a0", ts=T0 - 60_000), _alert(alert_id="a0", ts=T0 + 30_000, observed=2.0)]
    assert not evaluate_alerts("s", early, [LABEL], CFG).labels[0].detected


def test_a_symptom_muted_within_the_grace_is_no_page_and_one_muted_later_is() -> None:
    fired = T0 + 90_000
    soon = [
        _alert("xid_error", alert_id="a2"),
        _alert("xid_error", alert_id="a2", ts=fired + 20_000, inhibited_by="c"),
    ]
    r = evaluate_alerts("s", soon, [LABEL], CFG)
    assert r.firing == 0 and r.inhibited == 1 and r.false_positives == []
    late = [
        _alert("xid_error", alert_id="a2"),
        _alert("xid_error", alert_id="a2", ts=fired + 40_000, inhibited_by="c"),
    ]
    r = evaluate_alerts("s", late, [LABEL], CFG)
    assert r.firing == 1 and r.muted_late == 1 and len(r.false_positives) == 1
    assert evaluate_alerts("s", late, [LABEL], CFG, mute_grace_s=60).firing == 0
    # A muted alert still detects its label, at its first firing.
    muted = evaluate_alerts("s", [_alert(alert_id="a1", inhibited_by="c")], [LABEL], CFG)
    assert muted.labels[0].detected and muted.labels[0].time_to_detect_s == 90.0 and muted.firing == 0


def test_the_report_gives_recall_ttd_percentiles_and_precision_per_rule() -> None:
    from streams.offline.evaluate import EvaluationReport, percentile

    assert percentile([], 50) is None
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([float(x) for x in range(1, 11)], 90) == 9.0
    results = []
    for i, ttd in enumerate((10, 20, 30, 40)):
        label = {**LABEL, "start": format_ts(T0 + i), "end": None}
        results.append(
            evaluate_alerts(f"s{i}", [_alert(alert_id=f"a{i}", ts=T0 + i + ttd * 1000)], [label], CFG)
        )
    missed = {**LABEL, "rank": 7}
    results.append(evaluate_alerts("s9", [_alert("xid_error", alert_id="x")], [missed], CFG))
    row = EvaluationReport(results).by_rule()
    assert row["straggler"] == {
        "labels": 5,
        "detected": 4,
        "paged": 4,
        "matched": 4,
        "recall": 0.8,
        "median_ttd_s": 20.0,
        "p90_ttd_s": 40.0,
        "max_ttd_s": 40.0,
        "ramped": 0,
        "ramped_p90_from_full_s": None,
        "precision": 1.0,
    }
    assert row["xid_error"]["paged"] == 1 and row["xid_error"]["precision"] == 0.0


def test_a_ramped_fault_counts_from_its_start_and_says_how_it_stood_to_full_strength() -> None:
    from streams.offline.evaluate import EvaluationReport

    ramped = {**LABEL, "end": None, "detail": {"ramp": 180}}
    result = evaluate_alerts("s", [_alert(ts=T0 + 150_000)], [ramped], CFG)
    assert result.labels[0].detected and result.labels[0].time_to_detect_s == 150.0  # due at full strength
    row = EvaluationReport([result]).by_rule()["straggler"]
    assert row["p90_ttd_s"] == 150.0 and row["ramped"] == 1 and row["ramped_p90_from_full_s"] == -30.0


def test_a_label_detected_too_late_says_when_its_alert_came() -> None:
    lab = evaluate_alerts("s", [_alert(ts=T0 + 200_000)], [LABEL], CFG).labels[0]
    assert not lab.detected and lab.late_s == 200.0


def test_a_node_faults_co_firing_rule_on_another_job_of_the_node_is_explained() -> None:
    """A degraded port pages every job on its node: the co-located job's copy is not a false page;
    the fault's own rule on another job, or a co-firing rule on another node, still is."""
    from streams.offline.evaluate import _related

    label = {"alert": "network_degradation", "also": ["ib_port_degraded"], "job_id": "a", "node": "n1"}
    assert _related({"rule": "ib_port_degraded", "job_id": "b", "node": "n1"}, label)
    assert not _related({"rule": "ib_port_degraded", "job_id": "b", "node": "n2"}, label)
    assert not _related({"rule": "network_degradation", "job_id": "b", "node": "n1"}, label)
    assert _related({"rule": "network_degradation", "job_id": "a", "node": "n1"}, label)
