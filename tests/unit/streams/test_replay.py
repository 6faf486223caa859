"""Offline replay: files merged in event-time order, alerts written as JSON lines, byte-identical reruns."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ranksight.cli import app
from schemas.files import write_container
from streams.errors import ReplayError
from streams.offline.replay import merged_events, replay_offline
from tests.unit.streams.builders import T0, gpu_sample, training_job


def _files(tmp_path: Path) -> list[Path]:
    training = training_job(seconds=100)
    # The GPUs go idle when the steps stop at 100 s: a stall, not an evaluation (GPUs computing).
    telemetry = [
        gpu_sample(
            "node-01", i, T0 + s * 1000, pids=[1000 + i], **({} if s <= 100 else {"util": 0.0, "power": 80.0})
        )
        for s in range(0, 400, 5)
        for i in range(4)
    ]
    a, b = tmp_path / "training.avro", tmp_path / "telemetry.avro"
    write_container(a, training)
    write_container(b, telemetry)
    return [a, b]


def test_files_are_merged_in_event_time_order_with_ties_by_file_then_position(tmp_path: Path) -> None:
    files = _files(tmp_path)
    merged = list(merged_events(files))
    stamps = [e.record["ts"] for e in merged]
    assert stamps == sorted(stamps) and len(merged) == 2 + 4 + 400 + 320
    at_t0 = [e.type for e in merged if e.record["ts"] == T0]
    assert at_t0[:6] == ["JobStarted", "JobStateChanged", "RankBound", "RankBound", "RankBound", "RankBound"]
    assert at_t0[6:] == ["GpuSample"] * 4


def test_replay_yields_the_stall_and_reports_progress(tmp_path: Path) -> None:
    seen: list[int] = []
    out = list(replay_offline(_files(tmp_path), on_progress=lambda n, ts: seen.append(n)))
    assert any(e.type == "Alert" and e.record["rule"] == "job_stall" for e in out)
    assert seen[-1] == 726


def test_a_missing_file_is_a_replay_error(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match="no such events file"):
        list(replay_offline([tmp_path / "missing.avro"]))


def test_the_cli_writes_identical_alert_files_on_every_run(tmp_path: Path) -> None:
    files = [str(p) for p in _files(tmp_path)]
    runner = CliRunner()
    outputs = []
    for i in range(2):
        alerts, derived = tmp_path / f"alerts{i}.jsonl", tmp_path / f"derived{i}.jsonl"
        result = runner.invoke(
            app,
            ["replay", *files, "--offline", "--alerts-out", str(alerts), "--derived-out", str(derived), "-q"],
        )
        assert result.exit_code == 0, result.output
        assert "job_stall" in result.output
        outputs.append((alerts.read_bytes(), derived.read_bytes()))
    assert outputs[0] == outputs[1]
    assert b'"rule": "job_stall"' in outputs[0][0] and b"JobWindowStats" in outputs[0][1]


def test_the_cli_reports_a_bad_config_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("detectors: {progres: {}}\n")
    result = CliRunner().invoke(
        app, ["replay", *map(str, _files(tmp_path)), "--offline", "--config", str(bad)]
    )
    assert result.exit_code == 1 and "detectors.progres" in result.output and "Traceback" not in result.output


def test_a_failed_replay_leaves_no_output_behind(tmp_path: Path) -> None:
    alerts = tmp_path / "alerts.jsonl"
    result = CliRunner().invoke(
        app, ["replay", str(tmp_path / "missing.avro"), "--offline", "--alerts-out", str(alerts)]
    )
    assert result.exit_code == 1 and "no such events file" in result.output
    assert list(tmp_path.iterdir()) == []


def test_replay_without_files_or_a_time_range_says_what_to_give() -> None:
    from typer.testing import CliRunner

    from ranksight.cli import app

    result = CliRunner().invoke(app, ["replay"])
    assert result.exit_code == 1
    assert "give event files" in result.output


def test_replay_by_time_takes_no_files(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ranksight.cli import app

    result = CliRunner().invoke(app, ["replay", str(tmp_path / "x.avro"), "--from", "-1h"])
    assert result.exit_code == 1
    assert "--from replays Kafka history" in result.output
