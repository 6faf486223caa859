"""Every rule's alert carries everything it could (issue 23.7): walked through the Alert schema, each firing
alert of every shipped scenario must have its cluster, the node and GPU of the rank it names, a metric
history, a suspected layer, an invariant, a summary and a runbook page that exists.

Rules whose gaps are known and owned elsewhere are listed in `EXPECTED_GAPS`, one line each with the
reason; the list is strict: a gap that closes fails the test until its entry is removed.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from schemas.codec import Codec
from schemas.records import Event
from streams.detectors import rules_of
from tests.scenarios.test_scenarios import SCENARIOS, _run

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"

# rule -> fields it leaves empty although it could fill them. For the lead to empty (issues 19/20/23):
EXPECTED_GAPS: dict[str, frozenset[str]] = {}

# Rules no shipped scenario makes fire (tested by their unit tests instead).
NOT_IN_SCENARIOS = frozenset(
    {
        "clock_skew",  # needs a record stamped in the future: tests/unit/streams/test_event_time.py
        "evaluation_stuck",  # tests/unit/streams/test_progress_evaluations.py
        # the worker's own, from the wall clock (every input silent while live): no replay raises it;
        # tests/unit/streams/runtime/test_input_silence.py
        "input_silent",
        "restore_test_stale",  # a week by default: tests/unit/streams/test_invariants_readiness.py
        # Issue 35: a team's declared rules and the learning-rate / evaluation invariants, which no
        # shipped scenario breaks: tests/unit/streams/test_acceptance.py, test_overrides.py
        "acceptance_violation",
        "lr_invalid",
        "validation_nonfinite",
        # Issue 35.5: the simulator does not model the CUDA allocator: tests/unit/streams/test_allocator_churn.py
        "allocator_churn",
        # Off until a team sets a floor; no scenario sets one: tests/unit/streams/test_scaling_efficiency.py
        "scaling_efficiency_low",
        "startup_hang",  # a start-up that never ends: tests/unit/streams/test_progress_startup.py
    }
)


@cache
def _firing() -> dict[str, list[dict[str, Any]]]:
    by_rule: dict[str, list[dict[str, Any]]] = {}
    for name in SCENARIOS:
        for alert in _run(name).alerts:
            if alert["status"] == "firing":
                by_rule.setdefault(alert["rule"], []).append({**alert, "_scenario": name})
    return by_rule


def _gaps(alert: dict[str, Any]) -> set[str]:
    """Fields of one alert that are empty although the rule could fill them."""
    gaps = set()
    record = {k: v for k, v in alert.items() if not k.startswith("_")}
    try:
        Codec().encode(Event("Alert", record))
    except Exception:  # any failure to encode is a gap of the whole record
        gaps.add("schema")
    for field in ("summary", "invariant", "history_metric", "cluster"):
        if not alert.get(field):
            gaps.add(field)
    if not alert.get("history"):
        gaps.add("history")
    if alert.get("suspected_layer") in (None, "", "unknown"):
        gaps.add("suspected_layer")
    if alert.get("rank") is not None:
        # Every simulated rank is bound to a node and a GPU: a rank alert can always name both.
        if not alert.get("node"):
            gaps.add("node")
        if not alert.get("gpu_uuid") or alert.get("gpu_index") is None:
            gaps.add("gpu")
    if not (RUNBOOKS / f"{alert['rule']}.md").is_file() or not str(alert.get("runbook_url", "")).endswith(
        alert["rule"]
    ):
        gaps.add("runbook")
    return gaps


@pytest.mark.parametrize("rule", sorted(rules_of()))
def test_every_alert_of_a_rule_carries_what_the_rule_could_fill(rule: str) -> None:
    alerts = _firing().get(rule, [])
    if rule in NOT_IN_SCENARIOS:
        assert not alerts, f"{rule} fires in a shipped scenario now: take it off NOT_IN_SCENARIOS"
        return
    assert alerts, f"no shipped scenario makes {rule} fire: add one, or list it in NOT_IN_SCENARIOS"
    found: dict[str, list[str]] = {}
    for alert in alerts:
        for gap in _gaps(alert):
            found.setdefault(gap, []).append(alert["_scenario"])
    expected = EXPECTED_GAPS.get(rule, frozenset())
    unexpected = {gap: sorted(set(where))[:3] for gap, where in found.items() if gap not in expected}
    assert not unexpected, f"{rule}: empty fields {unexpected} (all gaps found: {sorted(found)})"
    closed = sorted(expected - set(found))
    assert not closed, (
        f"{rule}: {closed} filled now: remove them from EXPECTED_GAPS (gaps left: {sorted(found)})"
    )
