"""The disk spool: bounded size, oldest-first drop with a counter, ordered drain, survives a reopen."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.errors import SpoolLockedError
from producers.spool import Spool
from schemas.records import Event

_RNG = random.Random(7)


def _step(n: int, job: str = "job-1") -> Event:
    return Event(
        "StepCompleted",
        {
            "ts": 1_700_000_000_000 + n,
            "job_id": job,
            "run_id": "",
            "rank": n % 8,
            "step": n,
            "samples": None,
            "tokens": None,
            "loss": _RNG.random(),
            "lr": None,
            "grad_norm": None,
            "step_time_s": 0.1,
            "data_wait_s": None,
            "forward_s": None,
            "backward_s": None,
            "optimizer_s": None,
            "comm_s": None,
            "checkpoint_s": None,
            "skipped": False,
        },
    )


def test_drain_returns_events_in_append_order_across_segments(tmp_path: Path) -> None:
    with Spool(tmp_path, segment_bytes=64 * 1024, max_bytes=10_000_000) as spool:
        for n in range(10_000):
            spool.append(_step(n))
        assert len(spool) == 10_000
        assert len(list(tmp_path.glob("seg-*.avro"))) > 2, "segments rotate by size"
        steps = [e.record["step"] for e in spool.pop_all()]
    assert steps == list(range(10_000))


def test_over_the_bound_the_oldest_segments_are_dropped_and_counted(tmp_path: Path) -> None:
    with Spool(tmp_path, segment_bytes=64 * 1024, max_bytes=256 * 1024) as spool:
        for n in range(20_000):
            spool.append(_step(n))
        spool.sync()
        assert spool.size_bytes <= 256 * 1024 + 16 * 1024
        kept = [e.record["step"] for e in spool.pop_all()]
        assert spool.dropped > 0
        assert spool.dropped + len(kept) == 20_000
        # What survives is the newest, contiguous tail: only whole old segments were dropped.
        assert kept == list(range(20_000 - len(kept), 20_000))


def test_spool_on_disk_never_exceeds_the_bound_by_more_than_one_segment(tmp_path: Path) -> None:
    bound = 256 * 1024
    with Spool(tmp_path, segment_bytes=64 * 1024, max_bytes=bound) as spool:
        for n in range(20_000):
            spool.append(_step(n))
            if n % 1000 == 0:
                spool.sync()
                on_disk = sum(p.stat().st_size for p in tmp_path.glob("seg-*.avro"))
                assert on_disk <= bound + 16 * 1024  # one block of slack


def test_events_survive_closing_and_reopening_the_spool(tmp_path: Path) -> None:
    with Spool(tmp_path, segment_bytes=64 * 1024) as spool:
        for n in range(500):
            spool.append(_step(n))
    with Spool(tmp_path) as reopened:
        assert len(reopened) == 500
        reopened.append(_step(500))
        assert [e.record["step"] for e in reopened.pop_all()] == list(range(501))


def test_a_segment_left_open_by_a_crash_is_recovered(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=10_000_000)
    for n in range(300):
        spool.append(_step(n))
    spool.sync()
    # Simulate a crash: the open segment is never sealed and the lock is released by the OS.
    assert spool._lock_fh is not None
    spool._lock_fh.close()
    spool._lock_fh = None
    with Spool(tmp_path) as reopened:
        assert [e.record["step"] for e in reopened.pop_all()] == list(range(300))


def test_two_publishers_cannot_share_a_spool_directory(tmp_path: Path) -> None:
    with Spool(tmp_path), pytest.raises(SpoolLockedError, match="own spool directory"):
        Spool(tmp_path)


def test_spool_segments_are_readable_as_event_files(tmp_path: Path) -> None:
    from schemas.files import iter_container

    with Spool(tmp_path) as spool:
        spool.append(_step(7))
        segment = spool.oldest()
        assert segment is not None
        assert [e.record["step"] for e in iter_container(segment.path)] == [7]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=6))
def test_drain_interleaved_with_appends_keeps_order(
    tmp_path_factory: pytest.TempPathFactory, batches: list[int]
) -> None:
    directory = tmp_path_factory.mktemp("spool")
    drained: list[int] = []
    n = 0
    with Spool(directory, segment_bytes=64 * 1024) as spool:
        for size in batches:
            for _ in range(size):
                spool.append(_step(n))
                n += 1
            segment = spool.oldest()
            assert segment is not None
            drained += [e.record["step"] for e in segment.events()]
            spool.remove(segment)
        drained += [e.record["step"] for e in spool.pop_all()]
    assert drained == list(range(n))
