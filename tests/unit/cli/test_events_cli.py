"""`ranksight events load|dump` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ranksight.cli import app
from schemas.records import default_schemas

runner = CliRunner()

LINES = [
    '{"type": "JobStarted", "ts": "2026-11-30T07:00:00.000Z", "job_id": "job-1", "run_id": "r1", "owner": "ada", '
    '"team": "llm", "cluster": "c1", "model_name": "m", "model_version": "v1", "dataset_version": "d1", '
    '"workload_family": "gpt", "world_size": 2, "nodes": ["n1"], "data_parallel": 2, "tensor_parallel": 1, '
    '"pipeline_parallel": 1, "global_batch_size": 64, "seq_len": 2048, "gpu_class": "H100", '
    '"checkpoint_max_age_s": 3600.0, "checkpoint_timeout_s": 600.0, "restore_test_max_age_s": null, "labels": {"tier": "prod"}}',
    '{"type": "StepCompleted", "ts": "2026-11-30T07:00:01.500Z", "job_id": "job-1", "run_id": "r1", "rank": 1, '
    '"step": 1, "samples": 32, "tokens": 65536, "loss": 2.5, "lr": 0.0003, "grad_norm": 1.25, "step_time_s": 1.5, '
    '"data_wait_s": 0.1, "forward_s": 0.4, "backward_s": 0.8, "optimizer_s": 0.1, "comm_s": 0.1, '
    '"checkpoint_s": null, "skipped": false, "batch_fingerprint": null}',
]


def test_load_then_dump_gives_back_the_same_lines(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(LINES) + "\n")
    out = tmp_path / "out.avro"
    loaded = runner.invoke(app, ["events", "load", str(src), "-o", str(out)])
    assert loaded.exit_code == 0, loaded.output
    assert "wrote 2 events" in loaded.output
    dumped = runner.invoke(app, ["events", "dump", str(out)])
    assert dumped.exit_code == 0
    back = [json.loads(line) for line in dumped.stdout.splitlines()]
    given = [json.loads(line) for line in LINES]
    assert len(back) == len(given)
    for record, original in zip(back, given, strict=True):
        # Every field given comes back as given; fields the schema gained since are their defaults.
        assert {k: record[k] for k in original} == original
        defaults = {
            f["name"]: f.get("default") for f in default_schemas().record(original["type"]).json["fields"]
        }
        assert all(record[k] == defaults[k] for k in record.keys() - original.keys() - {"type"}), record


def test_load_of_an_empty_file_says_so_and_writes_nothing(tmp_path: Path) -> None:
    """Issue 24.8: an empty file is not a successful load of nothing."""
    src = tmp_path / "empty.jsonl"
    src.write_text("\n  \n")
    out = tmp_path / "out.avro"
    result = runner.invoke(app, ["events", "load", str(src), "-o", str(out)])
    assert result.exit_code == 1
    assert "holds no events" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_load_of_a_bad_file_is_one_clear_error_and_exit_1(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(LINES[0] + "\n" + LINES[1].replace('"rank": 1', '"rank": "one"') + "\n")
    result = runner.invoke(app, ["events", "load", str(src), "-o", str(tmp_path / "o.avro")])
    assert result.exit_code == 1
    assert "line 2: field 'rank'" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "o.avro").exists()


def test_dump_of_a_missing_file_says_so(tmp_path: Path) -> None:
    result = runner.invoke(app, ["events", "dump", str(tmp_path / "nope.avro")])
    assert result.exit_code == 1
    assert "no such file" in result.output
