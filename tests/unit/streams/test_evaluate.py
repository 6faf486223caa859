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
