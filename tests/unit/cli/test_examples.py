"""The example files the README names ship with ranksight and load (issue 24.8)."""

from __future__ import annotations

import re
from pathlib import Path

from streams.config import load_config

REPO = Path(__file__).resolve().parents[3]


def test_every_example_the_readme_names_exists() -> None:
    named = set(re.findall(r"\bexamples/[\w.-]+\w", (REPO / "README.md").read_text()))
    assert "examples/my-rules.yaml" in named
    missing = sorted(name for name in named if not (REPO / name).exists())
    assert missing == []


def test_the_rules_example_is_a_valid_override_that_changes_the_defaults() -> None:
    """Unknown keys are errors in load_config, so a loaded file holds only real knobs."""
    mine = load_config(REPO / "examples" / "my-rules.yaml")
    shipped = load_config(None)
    assert mine != shipped
