"""Acceptance rules teams declare (issue 35.3), the learning-rate invariant and non-finite
evaluation metrics: each rule fires on what breaks it, resolves on what meets it, and a bad rule
file is one clear error."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from schemas.records import Event
from streams.config import load_config
from streams.detectors.acceptance import AcceptanceDetector, parse_rules
from streams.detectors.base import Detector, Finding, Topology
from streams.detectors.lr_invalid import LrInvalidDetector
from streams.detectors.validation_nonfinite import ValidationNonfiniteDetector
from streams.errors import ConfigError
from tests.unit.streams.builders import T0, job_started, step

JOB = "job-1"
EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "acceptance"


def evaluation(n: int, ts: int, **metrics: float) -> Event:
    """A ValidationResult at step `n` with the given metrics."""
    return Event(
        "ValidationResult",
        {"ts": ts, "job_id": JOB, "run_id": f"{JOB}-run-1", "step": n, "metrics": metrics, "duration_s": 5.0},
    )


def run(det: Detector, events: list[Event]) -> list[Finding]:
    out: list[Finding] = []
    for ev in events:
        det.topology.observe(ev)
        out += det.observe(ev)
    return out


def acceptance(*rules: dict) -> AcceptanceDetector:
    det = AcceptanceDetector(Topology(), {"rules": list(rules)})
    run(det, [job_started(JOB, T0, team="llm-finetune", workload_family="rlhf-7b")])
    return det


def test_a_threshold_is_judged_only_after_its_gate_and_resolves_when_met() -> None:
    """val/accuracy >= 0.62 from step 40k: a low value before 40k is not judged, after it fires."""
    det = acceptance(
        {
            "name": "acc",
            "metric": "val/accuracy",
            "check": {"op": ">=", "value": 0.62},
            "after": {"steps": 40000},
        }
    )
    assert run(det, [evaluation(30000, T0 + 1000, **{"val/accuracy": 0.40})]) == []
    [fired] = run(det, [evaluation(40000, T0 + 2000, **{"val/accuracy": 0.55})])
    assert (fired.rule, fired.key, fired.active, fired.observed, fired.expected) == (
        "acceptance_violation",
        (JOB, "acc"),
        True,
        0.55,
        0.62,
    )
    assert "val/accuracy >= 0.62 from step 40000" in fired.invariant and fired.category == "model"
    assert run(det, [evaluation(41000, T0 + 3000, **{"val/accuracy": 0.58})]) == []  # still open: no repeat
    [resolved] = run(det, [evaluation(42000, T0 + 4000, **{"val/accuracy": 0.63})])
    assert resolved.active is False and resolved.since == T0 + 2000


def test_a_non_finite_value_is_a_violation_never_skipped() -> None:
    det = acceptance({"name": "acc", "metric": "val/accuracy", "check": {"op": ">=", "value": 0.5}})
    [fired] = run(det, [evaluation(10, T0 + 1000, **{"val/accuracy": math.nan})])
    assert fired.active and fired.observed is None and "nan" in fired.summary


def test_a_trend_fires_at_the_third_fall_in_a_row_and_resolves_when_it_stops() -> None:
    """The reward model score must not fall 3 evaluations in a row."""
    det = acceptance(
        {
            "name": "reward",
            "metric": "reward_model_score",
            "trend": {"direction": "falling", "evaluations": 3},
        }
    )
    scores = [0.70, 0.69, 0.71, 0.68, 0.66]  # two falls, a rise, two falls: no three in a row
    out = run(det, [evaluation(100 * i, T0 + 1000 * i, reward_model_score=s) for i, s in enumerate(scores)])
    assert out == []
    [fired] = run(det, [evaluation(600, T0 + 7000, reward_model_score=0.65)])
    assert fired.active and [v for _, v in fired.history][-4:] == [0.71, 0.68, 0.66, 0.65]
    [resolved] = run(det, [evaluation(700, T0 + 8000, reward_model_score=0.67)])
    assert not resolved.active


def test_a_training_metric_from_the_leader_rank_and_a_token_gate() -> None:
    """Training loss < 6 once 1M tokens are in: rank 1's steps are not the job's value."""
    det = acceptance(
        {
            "name": "loss",
            "source": "training",
            "metric": "loss",
            "check": {"op": "<", "value": 6.0},
            "after": {"tokens": 1_000_000},
        }
    )
    # 4 ranks x 65,536 tokens per step: 262,144 tokens per step, so the gate opens at step 3.
    early = [step(JOB, 0, n, T0 + 1000 * n, loss=7.0) for n in range(0, 3)]
    assert run(det, early) == []
    assert run(det, [step(JOB, 1, 5, T0 + 5000, loss=9.0)]) == []
    [fired] = run(det, [step(JOB, 0, 5, T0 + 5000, loss=7.0)])
    assert fired.active and fired.observed == 7.0


def test_selectors_choose_the_jobs_and_the_owner_becomes_the_alerts_team() -> None:
    det = acceptance(
        {"name": "other", "metric": "x", "check": {"op": ">", "value": 1}, "jobs": {"team": "vision"}},
        {
            "name": "mine",
            "metric": "x",
            "check": {"op": ">", "value": 1},
            "jobs": {"team": "llm-*", "workload_family": "rlhf*"},
            "owner": "safety-evals",
        },
    )
    [fired] = run(det, [evaluation(1, T0 + 1000, x=0.5)])
    assert fired.key == (JOB, "mine") and fired.team == "safety-evals"


def test_the_state_survives_a_snapshot() -> None:
    rule = {"name": "r", "metric": "m", "trend": {"direction": "rising", "evaluations": 2}}
    det = acceptance(rule)
    run(det, [evaluation(1, T0 + 1000, m=1.0), evaluation(2, T0 + 2000, m=2.0)])
    again = AcceptanceDetector(det.topology, {"rules": [rule]})
    again.from_bytes(det.to_bytes())
    [fired] = run(again, [evaluation(3, T0 + 3000, m=3.0)])
    assert fired.active


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ({"name": "a b", "metric": "m", "check": {"op": ">", "value": 1}}, "`name`"),
        ({"name": "a", "metric": "m"}, "exactly one of"),
        ({"name": "a", "metric": "m", "check": {"op": "=>", "value": 1}}, "check.op"),
        ({"name": "a", "metric": "m", "check": {"op": ">", "value": "x"}}, "finite number"),
        ({"name": "a", "metric": "m", "trend": {"direction": "down", "evaluations": 3}}, "trend.direction"),
        ({"name": "a", "metric": "m", "check": {"op": ">", "value": 1}, "after": {"epochs": 2}}, "`after`"),
        ({"name": "a", "metric": "m", "check": {"op": ">", "value": 1}, "jobs": {"owner": "x"}}, "`jobs`"),
        (
            {"name": "a", "source": "training", "metric": "accuracy", "check": {"op": ">", "value": 1}},
            "step field",
        ),
        (
            {"name": "a", "metric": "m", "check": {"op": ">", "value": 1}, "exec": "rm -rf /"},
            "unknown key 'exec'",
        ),
    ],
)
def test_a_bad_rule_is_one_clear_error(rule: dict, says: str) -> None:
    with pytest.raises(ConfigError, match="acceptance rule 1") as info:
        parse_rules([rule])
    assert says in str(info.value)


def test_duplicate_names_are_refused() -> None:
    rule = {"name": "a", "metric": "m", "check": {"op": ">", "value": 1}}
    with pytest.raises(ConfigError, match="two acceptance rules are named 'a'"):
        parse_rules([rule, dict(rule)])


def test_rule_files_load_through_the_config_and_bad_ones_fail_at_load(tmp_path: Path) -> None:
    """The shipped examples load; a config naming a broken file fails when loaded, naming the file."""
    config = tmp_path / "config.yaml"
    files = [str(EXAMPLES / name) for name in ("pretrain.yaml", "finetune.yaml", "safety.yaml")]
    config.write_text(yaml.safe_dump({"detectors": {"acceptance": {"files": files}}}))
    rules = load_config(config).detectors["acceptance"]["rules"]
    assert {r["name"] for r in rules} == {
        "val-loss-ceiling",
        "val-loss-not-rising",
        "train-loss-ceiling",
        "val-accuracy-floor",
        "reward-not-falling",
        "safety-pass-rate",
    }
    (tmp_path / "bad.yaml").write_text("rules:\n  - {name: x, metric: m, check: {op: '>', value: nan}}\n")
    config.write_text(yaml.safe_dump({"detectors": {"acceptance": {"files": ["bad.yaml"]}}}))
    with pytest.raises(ConfigError, match="finite number"):
        load_config(config)
    (tmp_path / "bad.yaml").write_text("- just a list\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml must be a mapping"):
        load_config(config)


def test_lr_out_of_range_or_not_finite_fires_and_resolves() -> None:
    det = LrInvalidDetector(Topology(), {"lr_max": 0.01})

    def lr_step(n: int, lr: float) -> Event:
        ev = step(JOB, 0, n, T0 + 1000 * n)
        ev.record["lr"] = lr
        return ev

    assert run(det, [lr_step(1, 3e-4), lr_step(2, 0.0)]) == []
    [fired] = run(det, [lr_step(3, 3e-2)])
    assert fired.rule == "lr_invalid" and fired.observed == 3e-2 and fired.expected == 0.01
    [resolved] = run(det, [lr_step(4, 3e-4)])
    assert not resolved.active
    [nan] = run(det, [lr_step(5, math.inf)])
    assert nan.active and nan.observed is None
    assert run(LrInvalidDetector(Topology()), [lr_step(6, -1e-4)])[0].active


def test_a_non_finite_validation_metric_fires_per_metric_and_resolves() -> None:
    det = ValidationNonfiniteDetector(Topology())
    [fired] = run(det, [evaluation(10, T0 + 1000, val_loss=math.nan, acc=0.5)])
    assert fired.key == (JOB, "val_loss") and fired.active
    assert run(det, [evaluation(20, T0 + 2000, val_loss=math.nan, acc=0.5)]) == []
    [resolved] = run(det, [evaluation(30, T0 + 3000, val_loss=2.0, acc=0.5)])
    assert not resolved.active and resolved.since == T0 + 1000
