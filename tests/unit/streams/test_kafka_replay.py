"""Kafka replay's pure parts: time arguments, pacing a recording by event time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer

from ranksight.commands.record import parse_time
from schemas.files import write_container
from schemas.records import Event
from streams.offline.kafka_replay import KafkaReplayError, publish_file


def test_parse_time_accepts_now_relative_iso_and_ms() -> None:
    now = 1_767_225_600_000
    assert parse_time("now", now) == now
    assert parse_time("-30m", now) == now - 1_800_000
    assert parse_time("-1.5h", now) == now - 5_400_000
    assert parse_time("2026-01-01T00:00:00Z", now) == 1_767_225_600_000
    assert parse_time("1767225600123", now) == 1_767_225_600_123
    with pytest.raises(typer.BadParameter):
        parse_time("yesterday", now)


class _Pub:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def publish(self, event: Event) -> None:
        self.events.append(event)


def _step(ts: int, step: int) -> Event:
    from schemas.records import default_schemas

    # A minimal valid StepCompleted: every field at its zero/default value, then ts/job/step.
    schema = default_schemas().records["StepCompleted"].parsed
    record: dict[str, Any] = {}
    for f in schema["fields"]:
        t = f["type"]
        if "default" in f:
            record[f["name"]] = f["default"]
        elif t in ("int", "long"):
            record[f["name"]] = 0
        elif t in ("float", "double"):
            record[f["name"]] = 0.0
        elif t == "string":
            record[f["name"]] = ""
        elif t == "boolean":
            record[f["name"]] = False
        elif isinstance(t, dict) and t.get("type") in ("long", "int"):
            record[f["name"]] = 0
    record.update(ts=ts, job_id="j", step=step)
    return Event("StepCompleted", record)


def test_publish_file_paces_by_event_time(tmp_path: Path) -> None:
    path = tmp_path / "e.avro"
    write_container(path, [_step(0, 1), _step(10_000, 2), _step(20_000, 3)])
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    pub = _Pub()
    assert publish_file(path, pub, speed=10.0, sleep=sleep, clock=lambda: now[0]) == 3
    assert sleeps == pytest.approx([1.0, 1.0])  # 10 s of event time at 10x
    assert [e.record["step"] for e in pub.events] == [1, 2, 3]


def test_publish_file_speed_zero_never_sleeps_and_negative_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "e.avro"
    write_container(path, [_step(0, 1), _step(60_000, 2)])
    pub = _Pub()

    def no_sleep(s: float) -> None:
        raise AssertionError("slept")

    assert publish_file(path, pub, speed=0, sleep=no_sleep) == 2
    with pytest.raises(KafkaReplayError):
        publish_file(path, pub, speed=-1)
