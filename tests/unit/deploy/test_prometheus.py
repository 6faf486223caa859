"""deploy/prometheus: the alerting rules about ranksight load, fire on what they watch, and name real metrics."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "ranksight-rules.yml"
PACKAGES = ("producers", "streams", "sinks", "ranksight", "infra")


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("RANKSIGHT_REQUIRE_DEPLOY_TOOLS") == "1":
            pytest.fail("promtool is required here: apt-get install prometheus", pytrace=False)
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return promtool


def test_rules_check_and_their_unit_tests_pass() -> None:
    """`promtool check rules` accepts the file and `promtool test rules` sees the alerts fire (and not early)."""
    promtool = _promtool()
    for argv in (["check", "rules", RULES.name], ["test", "rules", "ranksight-rules.test.yml"]):
        done = subprocess.run(
            [promtool, *argv], cwd=RULES.parent, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_rules_name_only_metrics_ranksight_exports() -> None:
    """Every ranksight_* series a rule reads is one the code exports (a counter's `_total` aside)."""
    source = "\n".join(p.read_text(encoding="utf-8") for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    exported = set(re.findall(r"ranksight_[a-z_]+", source))
    used = set(re.findall(r"ranksight_[a-z_]+", RULES.read_text(encoding="utf-8")))
    assert used
    missing = {m for m in used if m.removesuffix("_total") not in exported and m not in exported}
    assert not missing, f"rules read metrics nothing exports: {sorted(missing)}"
