"""The rule catalogue (issue 31.4): each rule's constant fields declared once, in streams/rules.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.detectors import ALL_DETECTORS, rules_of
from streams.detectors import catalogue as catalogue_module
from streams.detectors.catalogue import Rule, catalogue, catalogued, table

ROOT = Path(__file__).resolve().parents[3]
# Every rule is declared in the catalogue now: a new rule that is not fails here.
NOT_CATALOGUED: set[str] = set()
# Rules that declare no layer: the evidence's metric names it, or nothing does (an evaluation that
# never ends may be stuck anywhere).
NO_LAYER = {"baseline_deviation", "evaluation_stuck"}


def test_every_rule_a_detector_raises_is_catalogued_but_the_unconverted_ones() -> None:
    declared = catalogue()
    raised = set(rules_of(ALL_DETECTORS))
    assert set(declared) <= raised, "a catalogued rule no detector raises"
    assert raised - set(declared) == NOT_CATALOGUED


def test_the_table_holds_exactly_the_rules_the_detectors_take() -> None:
    """No entry that no detector raises (a renamed rule's leftover), none missing."""
    assert set(table()) == set(catalogue())
    assert all(catalogue()[name] == table()[name] for name in table())


def test_the_table_refuses_what_it_does_not_know(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = {
        "x:\n  category: model\n  severity: loud\n  invariant: i\n": "severity must be one of",
        "x:\n  category: gpu\n  severity: info\n  invariant: i\n": "category must be one of",
        "x:\n  category: model\n  severity: info\n  invariant: i\n  owner: me\n": "unknown field",
        "x:\n  category: model\n  severity: info\n": "at least an invariant",
        "- x\n": "one mapping",
    }
    for text, error in cases.items():
        path = tmp_path / "rules.yaml"
        path.write_text(text)
        monkeypatch.setattr(catalogue_module, "RULES_PATH", path)
        table.cache_clear()
        try:
            with pytest.raises(ValueError, match=error):
                table()
        finally:
            monkeypatch.undo()
            table.cache_clear()
    with pytest.raises(KeyError, match="not in"):
        catalogued("no_such_rule")


def test_each_entry_names_a_category_an_invariant_and_a_runbook_that_exists() -> None:
    for name, rule in catalogue().items():
        assert rule.category in ("model", "data", "platform", "infra"), name
        assert rule.severity in ("info", "warning", "critical"), name
        assert rule.invariant, name
        assert rule.suspected_layer != "unknown" or name in NO_LAYER, name
        assert (ROOT / rule.runbook_path).is_file(), f"{name}: no runbook at {rule.runbook_path}"


def test_a_finding_states_only_what_varies_and_may_name_another_severity() -> None:
    rule = Rule(
        "disk_full",
        category="infra",
        severity="warning",
        invariant="a disk keeps {free_pct:g}% free",
        suspected_layer="host",
    )
    found = rule.finding(("node-1",), True, 5, node="node-1", invariant=rule.says(free_pct=10))
    assert (found.rule, found.category, found.severity, found.suspected_layer) == (
        "disk_full",
        "infra",
        "warning",
        "host",
    )
    assert found.invariant == "a disk keeps 10% free" and found.fingerprint == "disk_full/node-1"
    assert rule.finding(("node-1",), True, 5, severity="critical").severity == "critical"
    assert rule.runbook_path == "docs/runbooks/disk_full.md"
