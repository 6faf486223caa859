"""`ranksight routing explain`: the route, team, receiver and reason for an alert given as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ranksight.cli import app

XID = {
    "type": "Alert",
    "rule": "xid_error",
    "category": "infra",
    "severity": "critical",
    "team": "llm-pretrain",
    "job_id": "j1",
    "cluster": "c1",
}


def test_explain_names_the_owner_the_informed_team_and_the_key_that_decided(tmp_path: Path) -> None:
    path = tmp_path / "alert.json"
    path.write_text(json.dumps(XID))
    result = CliRunner().invoke(app, ["routing", "explain", str(path)])
    assert result.exit_code == 0, result.output
    assert "pages infrastructure-operations at receiver infra-pager" in result.output
    assert "owners.infra = infrastructure-operations" in result.output
    assert "informs llm-pretrain at receiver llm-pretrain-chat" in result.output


def test_explain_json_and_the_job_team_override() -> None:
    """A published copy carries its routed team; --job-team says whose job it is."""
    alert = {**XID, "category": "model", "rule": "nonfinite_loss", "team": "platform"}
    result = CliRunner().invoke(
        app, ["routing", "explain", json.dumps(alert), "--json", "--job-team", "vision"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["deliveries"] == [
        {
            "team": "vision",
            "receiver": "multimodal-pager",
            "kind": "page",
            "why": "ownership: owners.model = {job.team}: the job's team vision; critical: pages",
        }
    ]


def test_the_provider_cluster_and_jsonl_input(tmp_path: Path) -> None:
    path = tmp_path / "alerts.jsonl"
    path.write_text(json.dumps(XID) + "\n" + json.dumps({**XID, "cluster": "provider-east"}) + "\n")
    result = CliRunner().invoke(app, ["routing", "explain", str(path), "--json"])
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert first["deliveries"][0]["team"] == "infrastructure-operations"
    assert second["deliveries"][0]["team"] == "provider-noc"
    assert "clusters.provider-east.infra" in second["deliveries"][0]["why"]


def test_bad_input_is_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    result = CliRunner().invoke(app, ["routing", "explain", str(bad)])
    assert result.exit_code == 1 and "not JSON" in result.output and "Traceback" not in result.output
    missing = CliRunner().invoke(app, ["routing", "explain", str(tmp_path / "none.json")])
    assert missing.exit_code == 1 and "no such file" in missing.output


def test_am_config_prints_the_shipped_configuration_and_names_a_missing_ownership_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ranksight alerts am-config` run from the repository root reproduces infra/alertmanager/alertmanager.yml."""
    root = Path(__file__).resolve().parents[3]
    monkeypatch.chdir(root)
    result = CliRunner().invoke(app, ["alerts", "am-config"])
    assert result.exit_code == 0, result.output
    assert result.stdout == (root / "infra/alertmanager/alertmanager.yml").read_text()
    missing = CliRunner().invoke(app, ["alerts", "am-config", "--ownership", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 1 and "does not exist" in missing.output
