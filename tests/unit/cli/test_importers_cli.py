"""`ranksight events import-*` output, as a script reads it."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from ranksight.cli import app

runner = CliRunner()


def test_an_import_prints_its_result_first_without_a_leading_blank_line(tmp_path: Path) -> None:
    """Issue 24.8: captured or piped, the live counter is not drawn and leaves no blank line behind."""
    src = tmp_path / "70m-0.csv"
    src.write_text("step,train/lm_loss\n0,11.0\n1,10.5\n2,10.1\n")
    result = runner.invoke(app, ["events", "import-pythia", str(src), "-o", str(tmp_path / "p.avro")])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("wrote 6 events to "), repr(
        result.output
    )  # JobStarted, RankBound, ... steps
    assert result.output.count("\n") == 1
