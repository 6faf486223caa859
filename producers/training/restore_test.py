"""Emit a RestoreTest: the result of restoring a checkpoint in a controlled environment and resuming.

A user's restore script (or `ranksight checkpoint restore-test`) calls `restore_test_event` with
what it restored and how the resumed steps went, then `publish_restore_test`. When the caller
does not say whether the test passed, `judge` decides: every required part restored, at least one
step resumed, and the first resumed loss within `loss_tolerance` (relative) of the loss the
original run reported at the checkpoint step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from producers.errors import ProducerError
from producers.publisher import open_publisher
from schemas.records import Event

__all__ = ["PARTS", "judge", "publish_restore_test", "restore_test_event"]

PARTS: tuple[str, ...] = ("model", "optimizer", "scheduler", "data")
_FIELD = {
    "model": "restored_model",
    "optimizer": "restored_optimizer",
    "scheduler": "restored_scheduler",
    "data": "restored_data_position",
}
DEFAULT_LOSS_TOLERANCE = 0.05


def judge(
    restored: Iterable[str],
    *,
    required: Iterable[str] = PARTS,
    steps_resumed: int,
    loss_before: float | None = None,
    loss_after: float | None = None,
    loss_tolerance: float | None = DEFAULT_LOSS_TOLERANCE,
) -> tuple[bool, str | None]:
    """(passed, why not): required parts restored, steps resumed, loss continuous."""
    missing = [p for p in required if p not in set(restored)]
    if missing:
        return False, f"not restored: {', '.join(missing)}"
    if steps_resumed < 1:
        return False, "no training step resumed after the restore"
    if loss_after is not None and not math.isfinite(loss_after):
        return False, f"the first resumed loss is {loss_after}"
    if loss_before is not None and loss_after is not None and loss_tolerance is not None:
        jump = abs(loss_after - loss_before) / max(abs(loss_before), 1e-12)
        if jump > loss_tolerance:
            return False, (
                f"loss jumped from {loss_before:g} to {loss_after:g} ({jump:.1%} > {loss_tolerance:.1%}): "
                "the restored state is not the saved one"
            )
    return True, None


def restore_test_event(
    job_id: str,
    checkpoint_id: str,
    *,
    restored: Iterable[str] = (),
    steps_resumed: int = 0,
    run_id: str = "",
    step: int | None = None,
    loss_before: float | None = None,
    loss_after: float | None = None,
    loss_tolerance: float | None = DEFAULT_LOSS_TOLERANCE,
    code_version: str | None = None,
    runtime_version: str | None = None,
    config_hash: str | None = None,
    checkpoint_format: str | None = None,
    passed: bool | None = None,
    error: str | None = None,
    duration_s: float | None = None,
    ts_ms: int | None = None,
) -> Event:
    """A RestoreTest event; `passed=None` lets `judge` decide (and explain a failure in `error`)."""
    parts = set(restored)
    unknown = parts - set(PARTS)
    if unknown:
        raise ProducerError(
            f"unknown restored part(s) {', '.join(sorted(unknown))}; known: {', '.join(PARTS)}"
        )
    if passed is None:
        passed, why = judge(
            parts,
            steps_resumed=steps_resumed,
            loss_before=loss_before,
            loss_after=loss_after,
            loss_tolerance=loss_tolerance,
        )
        error = error or why
    record: dict[str, Any] = {
        "ts": int(time.time() * 1000) if ts_ms is None else int(ts_ms),
        "job_id": job_id,
        "run_id": run_id,
        "checkpoint_id": checkpoint_id,
        "step": step,
        **{field: part in parts for part, field in _FIELD.items()},
        "steps_resumed": int(steps_resumed),
        "loss_before": loss_before,
        "loss_after": loss_after,
        "loss_tolerance": loss_tolerance,
        "code_version": code_version,
        "config_hash": config_hash,
        "checkpoint_format": checkpoint_format,
        "runtime_version": runtime_version,
        "passed": bool(passed),
        "error": error,
        "duration_s": duration_s,
    }
    return Event("RestoreTest", record)


def publish_restore_test(
    event: Event,
    destination: str = "kafka",
    *,
    kafka_conf: dict[str, Any] | None = None,
    topic_prefix: str = "",
    spool_dir: Path | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Publish one RestoreTest and wait for it; `ProducerError` when it was not delivered."""
    publisher = open_publisher(
        destination, kafka_conf=kafka_conf, topic_prefix=topic_prefix, spool_dir=spool_dir
    )
    try:
        publisher.publish(event)
        left = publisher.flush(timeout_s)
    finally:
        publisher.close(timeout_s)
    if left:
        raise ProducerError(
            f"the restore test was not delivered within {timeout_s:g}s (kept in the spool {spool_dir}); "
            "it is sent when the broker answers again"
        )
