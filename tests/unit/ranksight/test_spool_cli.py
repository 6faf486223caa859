"""With Kafka away, producers spool to <home>/spool/<producer>, say so, and `ranksight spool` finds it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ranksight.cli import app
from schemas.files import iter_container

runner = CliRunner()


def _spooled_events(directory: Path) -> list[dict[str, object]]:
    return [event.record for path in sorted(directory.glob("seg-*.avro")) for event in iter_container(path)]


def test_simulate_to_an_absent_broker_spools_live_events_says_so_and_exits_non_zero(
    home: Path, closed_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing reached Kafka: a script must not go on as if it had (issue 24.8); the spool keeps all."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", f"127.0.0.1:{closed_port}")
    before_ms = int(time.time() * 1000)
    result = runner.invoke(
        app, ["simulate", "--scenario", "mixed", "--duration", "2m", "--to-kafka", "--speed", "1000", "-q"]
    )
    after_ms = int(time.time() * 1000)
    assert result.exit_code == 1, result.output
    spool = home / "spool" / "simulate"
    assert "took none of the" in result.output and f"wait in {spool}" in result.output
    assert "published" not in result.output.replace("unpublished", "")
    assert not (tmp_path / "labels.jsonl").exists()  # a Kafka-only run writes no labels unless asked
    records = _spooled_events(spool)
    assert records
    # Live data: the scenario starts `duration` before now (not on the scenario's 2026-01-01).
    timestamps = [int(r["ts"]) for r in records]  # type: ignore[call-overload]
    assert min(timestamps) >= before_ms - 2 * 60_000 - 60_000
    assert max(timestamps) <= after_ms + 60_000
    # Its jobs end after its last event, so a worker does not take the silence for three stalls.
    ends = [r for r in records if r.get("reason") == "simulation ended"]
    assert len(ends) == 3 and {r["state"] for r in ends} == {"completed"}
    assert all(r["ts"] == max(timestamps) for r in ends)

    listed = runner.invoke(app, ["spool", "list"])
    assert listed.exit_code == 0
    assert f"simulate: {len(records):,} events" in listed.output


def test_an_explicit_start_is_kept_for_live_simulation(
    home: Path, closed_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", f"127.0.0.1:{closed_port}")
    result = runner.invoke(
        app,
        ["simulate", "-s", "mixed", "--duration", "1m", "--to-kafka", "--speed", "1000", "-q",
         "--start", "2026-11-30T07:00:00Z"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output  # nothing delivered: Kafka is away
    timestamps = [int(r["ts"]) for r in _spooled_events(home / "spool" / "simulate")]  # type: ignore[call-overload]
    assert min(timestamps) >= 1_796_022_000_000  # 2026-11-30T07:00:00Z


def test_spool_list_with_nothing_spooled(home: Path) -> None:
    result = runner.invoke(app, ["spool", "list"])
    assert result.exit_code == 0
    assert f"no spooled events in {home / 'spool'}" in result.output
