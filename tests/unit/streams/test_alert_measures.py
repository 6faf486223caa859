"""Every alert value carries its own unit (streams/alerting/measures.py): the rule table names only
real rules, metric names map to their units, and the tracker writes the typed fields."""

from __future__ import annotations

from streams.alerting.lifecycle import AlertTracker
from streams.alerting.measures import RULE_MEASURES, measures_of, unit_of_metric
from streams.detectors import rules_of
from streams.detectors.base import Finding, Topology


def test_the_rule_table_names_only_rules_that_exist() -> None:
    assert set(RULE_MEASURES) <= set(rules_of())


def test_rank_hang_values_are_step_numbers_not_its_histories_percent() -> None:
    observed, expected, history = measures_of("rank_hang", "sm_active_pct")
    assert (observed.unit, expected.unit, history) == ("step", "step", "%")


def test_a_rule_without_a_row_measures_its_history_metric() -> None:
    observed, expected, history = measures_of("baseline_deviation", "tokens_per_s_per_gpu")
    assert observed.unit == expected.unit == history == "tokens/s per GPU"
    assert expected.what == "baseline of earlier runs"
    for name, unit in {
        "step_time_s": "s",
        "gpu_util_pct": "%",
        "cache_hit_ratio": "ratio",
        "restarts": "count",
        "steps_since_validation": "steps",
        "gpu_mem_used_gib": "GiB",
        "straggler_score": "",
    }.items():
        assert unit_of_metric(name) == unit, name


def test_the_alert_record_carries_each_values_unit() -> None:
    tracker = AlertTracker()
    finding = Finding(
        rule="rank_hang",
        key=("j", "3"),
        active=True,
        ts=1_000,
        job_id="j",
        rank=3,
        observed=399.0,
        expected=412.0,
        history_metric="sm_active_pct",
        history=((900, 95.0),),
    )
    [record] = tracker.observe(finding, Topology())
    assert (record["observed"], record["observed_unit"], record["observed_what"]) == (
        399.0,
        "step",
        "the rank's last step",
    )
    assert (record["expected_unit"], record["history_unit"]) == ("step", "%")
