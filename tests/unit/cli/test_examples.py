"""The example files the README and the docs name ship with ranksight and load (issue 24.8)."""

from __future__ import annotations

import re
from pathlib import Path

from streams.config import load_config

REPO = Path(__file__).resolve().parents[3]


def test_every_example_the_readme_names_exists() -> None:
    """The README's and the docs' references to examples/ (the README's reference moved to docs/, issue 31.6)."""
    text = "\n".join(p.read_text() for p in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))))
    named = set(re.findall(r"\bexamples/[\w.-]+\w", text))
    assert "examples/my-rules.yaml" in named
    missing = sorted(name for name in named if not (REPO / name).exists())
    assert missing == []


def test_the_rules_example_is_a_valid_override_that_changes_the_defaults() -> None:
    """Unknown keys are errors in load_config, so a loaded file holds only real knobs."""
    mine = load_config(REPO / "examples" / "my-rules.yaml")
    shipped = load_config(None)
    assert mine != shipped
