"""The rank stage's records handed to a job stage of the same process: once, only its own, bounded."""

from __future__ import annotations

from schemas.records import Event
from streams.runtime.handoff import Handoff


def test_a_record_sent_to_a_local_job_stage_is_taken_once_by_its_bytes() -> None:
    handoff = Handoff({0, 1})
    event = Event("StageProgress", {"ts": 1, "source": 0, "idle": False})
    handoff.put(1, b"bytes", event)
    assert handoff.take(b"other") is None
    assert handoff.take(b"bytes") is event
    assert handoff.take(b"bytes") is None  # read again (a restart): decoded as before
    assert handoff.taken == 1


def test_a_record_for_another_workers_job_stage_is_not_kept() -> None:
    local: set[int] = {0}
    handoff = Handoff(local)
    handoff.put(3, b"theirs", Event("StageProgress", {"ts": 1, "source": 0, "idle": False}))
    assert len(handoff) == 0 and handoff.take(b"theirs") is None


def test_the_table_is_bounded_and_cleared_with_the_partitions() -> None:
    handoff = Handoff({0}, max_waiting=2)
    for i in range(5):
        handoff.put(0, bytes([i]), Event("StageProgress", {"ts": i, "source": 0, "idle": False}))
    assert len(handoff) == 2
    assert handoff.take(bytes([4])) is None  # no room: its bytes are decoded when they come back
    handoff.clear()
    assert len(handoff) == 0 and handoff.take(bytes([0])) is None
