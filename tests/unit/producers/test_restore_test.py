"""The restore-test emitter and `ranksight checkpoint restore-test`: the verdict, the record, the CLI."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from producers.errors import ProducerError
from producers.training.restore_test import judge, restore_test_event
from ranksight.cli import app
from schemas.codec import Codec
from schemas.files import iter_container

ALL = ("model", "optimizer", "scheduler", "data")


def test_judge_passes_a_full_restore_with_continuous_loss_and_names_each_failure() -> None:
    assert judge(ALL, steps_resumed=5, loss_before=2.0, loss_after=2.05) == (True, None)
    assert judge(("model", "data"), steps_resumed=5) == (False, "not restored: optimizer, scheduler")
    assert judge(ALL, steps_resumed=0) == (False, "no training step resumed after the restore")
    ok, why = judge(ALL, steps_resumed=5, loss_before=2.0, loss_after=2.5)
    assert not ok and why is not None and "loss jumped from 2 to 2.5 (25.0% > 5.0%)" in why
    assert judge(ALL, steps_resumed=5, loss_after=math.nan)[0] is False
    # A team that does not restore the data position can say so.
    assert judge(
        ("model", "optimizer", "scheduler"), required=("model", "optimizer", "scheduler"), steps_resumed=1
    )[0]


def test_the_event_encodes_against_the_contract_and_carries_the_verdict() -> None:
    event = restore_test_event(
        "job-1", "ckpt-7", restored=("model", "optimizer"), steps_resumed=3, step=700, code_version="abc123",
        runtime_version="torch 2.4.0", ts_ms=1_790_000_000_000,
    )  # fmt: skip
    r = event.record
    assert (r["passed"], r["error"]) == (False, "not restored: scheduler, data")
    assert (r["restored_model"], r["restored_optimizer"], r["restored_scheduler"], r["restored_data_position"]) == (
        True, True, False, False,
    )  # fmt: skip
    codec = Codec()
    assert codec.decode(codec.encode(event)).record == r
    # An explicit verdict wins; unknown parts are a one-sentence error.
    assert restore_test_event("j", "c", passed=True).record["passed"] is True
    with pytest.raises(ProducerError, match="unknown restored part"):
        restore_test_event("j", "c", restored=("weights",))


def test_the_cli_writes_one_restore_test_and_prints_the_verdict(tmp_path: Path) -> None:
    out = tmp_path / "events.avro"
    result = CliRunner().invoke(
        app,
        ["checkpoint", "restore-test", "--job", "job-1", "--checkpoint", "ckpt-7", "--restored",
         "model,optimizer,scheduler,data", "--steps-resumed", "10", "--loss-before", "2.0", "--loss-after", "2.02",
         "--code-version", "abc123", "--to", f"file://{out}"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "passed" in result.output
    [event] = list(iter_container(out))
    assert event.type == "RestoreTest" and event.record["passed"] and event.record["steps_resumed"] == 10
    failed = CliRunner().invoke(
        app, ["checkpoint", "restore-test", "--job", "j", "--checkpoint", "c", "--failed", "--error", "OOM on restore",
              "--to", f"file://{tmp_path / 'f.avro'}"],
    )  # fmt: skip
    assert failed.exit_code == 0 and "failed: OOM on restore" in failed.output
    bad = CliRunner().invoke(
        app,
        [
            "checkpoint",
            "restore-test",
            "--job",
            "j",
            "--checkpoint",
            "c",
            "--restored",
            "weights",
            "--to",
            f"file://{tmp_path / 'b.avro'}",
        ],
    )
    assert bad.exit_code == 1 and "unknown restored part" in bad.output and "Traceback" not in bad.output
