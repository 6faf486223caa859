"""`ranksight simulate` in a newcomer's first hour (issue 24.8): typos, a shortened run, where labels go."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ranksight.cli import app

runner = CliRunner()


def test_a_misspelt_scenario_suggests_the_built_in(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "--scenario", "stragler_gpu", "--out", str(tmp_path / "s.avro")])
    assert result.exit_code == 1
    assert "did you mean straggler_gpu" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "s.avro").exists()


def test_a_duration_that_drops_a_fault_names_it(tmp_path: Path) -> None:
    """xid_error's fault starts after the first minutes: a 2-minute run cannot contain it."""
    result = runner.invoke(
        app, ["simulate", "-s", "xid_error", "--duration", "2m", "-o", str(tmp_path / "e.avro"), "-q"]
    )
    assert result.exit_code == 0, result.output
    assert "--duration 2 min drops fault xid_error on job" in result.output, result.output
    assert "wrote 0 label(s)" in result.output  # and indeed nothing is labelled


def test_the_full_length_drops_nothing(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["simulate", "-s", "healthy", "--duration", "1m", "-o", str(tmp_path / "e.avro"), "-q"]
    )
    assert result.exit_code == 0 and "drops fault" not in result.output


def test_labels_go_next_to_out_never_into_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    out = tmp_path / "data" / "e.avro"
    result = runner.invoke(app, ["simulate", "-s", "xid_error", "--duration", "20m", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert (out.parent / "labels.jsonl").is_file()
    assert list(cwd.iterdir()) == []
