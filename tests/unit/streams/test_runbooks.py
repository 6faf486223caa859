"""Every rule the engine can emit has a runbook at docs/runbooks/<rule>.md with the four sections."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from streams.config import DEFAULT_CONFIG_PATH, EngineConfig, load_config
from streams.detectors import rules_of

ROOT = Path(__file__).resolve().parents[3]
RUNBOOKS = ROOT / "docs" / "runbooks"
SECTIONS = ("What it means", "How to confirm", "What to do", "Who owns it")
# Rules the detector work of issue 10 adds: clock_skew (in flight) and throughput_drop (the
# self-baseline rule the simulator's labels expect, 10.5). Their runbooks ship ahead of them.
UPCOMING_RULES = ("clock_skew", "throughput_drop")


def _rules_named_in_config() -> set[str]:
    """Rule names the shipped config mentions (disabled_rules, per-rule knobs)."""
    data = yaml.safe_load(DEFAULT_CONFIG_PATH.read_text(encoding="utf-8"))
    return set(data.get("engine", {}).get("disabled_rules") or ())


ALL_RULES = sorted(set(rules_of()) | set(UPCOMING_RULES) | _rules_named_in_config())


def _runbook_path(url: str, base: str) -> Path:
    """Where a runbook URL under the default base lives in the repository."""
    assert url.startswith(base), url
    return ROOT / (url + ".md")


@pytest.mark.parametrize("rule", ALL_RULES)
def test_every_rule_has_a_runbook_with_the_four_sections(rule: str) -> None:
    """The runbook exists, says what the rule means, how to confirm it (with SQL), what to do, who owns it."""
    config = load_config(None)
    url = config.runbook_base_url + rule
    path = _runbook_path(url, config.runbook_base_url)
    assert path.is_file(), f"no runbook for rule {rule}: expected {path.relative_to(ROOT)}"
    text = path.read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert headings == list(SECTIONS), f"{path.name}: sections {headings}"
    confirm = text.split("## How to confirm", 1)[1].split("## What to do", 1)[0]
    assert "```sql" in confirm and "SELECT" in confirm, f"{path.name}: no ClickHouse query to confirm"
    for section in SECTIONS:
        body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
        assert len(body.strip()) > 20, f"{path.name}: section {section!r} is empty"


def test_default_runbook_base_points_at_the_repository_runbooks() -> None:
    """The shipped default and the dataclass default agree and name docs/runbooks/."""
    assert load_config(None).runbook_base_url == "docs/runbooks/"
    assert EngineConfig().runbook_base_url == "docs/runbooks/"


def test_runbook_base_url_is_a_setting() -> None:
    """A site that publishes docs/runbooks elsewhere is one override away."""
    config = load_config(None, {"engine": {"runbook_base_url": "https://runbooks.example.com/ranksight"}})
    assert config.runbook_base_url == "https://runbooks.example.com/ranksight/"


def test_no_runbook_without_a_rule() -> None:
    """Every runbook page names a rule the engine knows (a renamed rule leaves no orphan page)."""
    pages = {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"}
    assert pages <= set(ALL_RULES), sorted(pages - set(ALL_RULES))
