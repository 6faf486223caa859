"""Event-time alignment of a task's input partitions (pure)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.runtime.aligner import Aligner


def test_aligner_holds_fast_partition_until_slow_one_catches_up() -> None:
    al = Aligner(idle_s=2.0)
    al.expect(["a:0", "b:0"], now=0.0)
    al.push("a:0", 0, 1000, "a1000", now=0.1)
    al.push("a:0", 1, 5000, "a5000", now=0.1)
    assert al.pop_ready(0.2) == []  # b:0 has delivered nothing yet
    al.push("b:0", 0, 2000, "b2000", now=0.3)
    assert [item for _, _, item in al.pop_ready(0.3)] == ["a1000", "b2000"]
    al.push("b:0", 1, 6000, "b6000", now=0.4)
    assert [item for _, _, item in al.pop_ready(0.4)] == ["a5000"]


def test_aligner_releases_when_the_slow_partition_is_at_its_end() -> None:
    al = Aligner(idle_s=60.0)
    al.expect(["a:0", "b:0"], now=0.0)
    al.push("a:0", 0, 1000, "x", now=0.0)
    al.push("a:0", 1, 9000, "y", now=0.0)
    al.push("b:0", 0, 500, "z", now=0.0)

    def lag(tp: str, last: int | None) -> int:
        return 0  # everything read

    assert [i for _, _, i in al.pop_ready(0.1, lag)] == ["z", "x", "y"]


def test_a_partition_at_its_end_holds_the_others_for_its_grace_after_its_last_record() -> None:
    """Producers send each partition's batch separately: "at its end" may be a few ms early."""
    al = Aligner(idle_s=60.0, end_grace_s=0.5)
    al.expect(["steps:0", "gpu:0"], now=0.0)
    al.push("steps:0", 0, 14_000, "step at 14 s", now=0.0)
    al.push("gpu:0", 0, 9_000, "gpu at 9 s", now=0.0)

    def lag(tp: str, last: int | None) -> int:
        return 0  # both read to their end, for now

    assert [i for _, _, i in al.pop_ready(0.1, lag)] == ["gpu at 9 s"]  # the step waits for gpu:0
    al.push("gpu:0", 1, 10_000, "gpu at 10 s", now=0.2)  # ... whose next record was in flight
    assert [i for _, _, i in al.pop_ready(0.2, lag)] == ["gpu at 10 s"]
    assert [i for _, _, i in al.pop_ready(0.8, lag)] == ["step at 14 s"]  # gpu:0 quiet past its grace


def test_a_passive_partition_holds_only_for_unread_records_or_its_upstream_front() -> None:
    """Unattributed telemetry re-keyed by `route` holds a job's records back only while some of it is
    known to be coming: unread on the topic, or not yet forwarded by this worker's side path."""
    al = Aligner(idle_s=60.0, passive_topics=frozenset({"by-job"}))
    al.expect(["steps:0", "by-job:0"], now=0.0)
    backlog = {"steps:0": 0, "by-job:0": 0}

    def lag(tp: str, last: int | None) -> int:
        return backlog[tp]

    al.push("steps:0", 0, 5_000, "step", now=0.0)
    assert [i for _, _, i in al.pop_ready(0.1, lag)] == ["step"]  # idle and silent: no hold
    al.push("steps:0", 1, 9_000, "later step", now=0.2)
    al.set_upstream_front(7_000)  # the side path has forwarded everything up to 7 s only
    assert al.pop_ready(0.3, lag) == []
    al.set_upstream_front(None)
    backlog["by-job:0"] = 1  # ... and its sample is now on the topic, unread
    assert al.pop_ready(0.4, lag) == []
    al.push("by-job:0", 0, 8_000, "gpu", now=0.5)
    backlog["by-job:0"] = 0
    assert [i for _, _, i in al.pop_ready(0.6, lag)] == ["gpu", "later step"]  # in event-time order


def test_aligner_keeps_waiting_for_a_partition_with_backlog_despite_wall_time() -> None:
    al = Aligner(idle_s=1.0, stall_s=30.0)
    al.expect(["a:0", "b:0"], now=0.0)
    al.push("a:0", 0, 9000, "late-in-time", now=0.0)
    al.push("b:0", 0, 1000, "b1", now=0.0)
    backlog = {"a:0": 0, "b:0": 500}

    def lag(tp: str, last: int | None) -> int:
        return backlog[tp]

    assert [i for _, _, i in al.pop_ready(5.0, lag)] == ["b1"]  # 5 s > idle_s, but b:0 has records left
    assert al.pop_ready(5.0, lag) == []
    assert [i for _, _, i in al.pop_ready(31.0, lag)] == ["late-in-time"]  # b:0 stalled past stall_s


def test_aligner_idle_partition_stops_blocking_after_idle_s() -> None:
    al = Aligner(idle_s=2.0)
    al.expect(["a:0", "empty:0"], now=0.0)
    al.push("a:0", 0, 1000, "x", now=0.5)
    assert al.pop_ready(1.0) == []
    assert [i for _, _, i in al.pop_ready(2.1)] == ["x"]


def test_aligner_lowest_held_is_the_offset_a_snapshot_may_claim() -> None:
    al = Aligner(idle_s=2.0)
    al.push("a:0", 10, 3000, "x", now=0.0)
    al.push("a:0", 11, 1000, "y", now=0.0)
    al.push("b:0", 0, 2000, "z", now=0.0)
    assert al.lowest_held("a:0") == 10
    released = al.pop_ready(0.0)  # a:0 at 3000, b:0 at 2000 -> frontier 2000
    assert [i for _, _, i in released] == ["y", "z"]
    assert al.lowest_held("a:0") == 10
    assert al.lowest_held("b:0") is None


def test_aligner_bounds_its_buffer() -> None:
    al = Aligner(idle_s=100.0, max_buffer=3)
    al.expect(["a:0", "b:0"], now=0.0)
    for i in range(5):
        al.push("a:0", i, 1000 + i, i, now=0.0)
    assert [i for _, _, i in al.pop_ready(0.0)] == [0, 1]
    assert len(al) == 3


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a:0", "b:0", "c:0"]), st.integers(0, 10_000)), max_size=60))
def test_aligner_output_is_event_time_ordered_and_complete(items: list[tuple[str, int]]) -> None:
    al = Aligner(idle_s=1.0)
    out: list[int] = []
    offsets: dict[str, int] = {}
    # Each partition delivers in its own time order, like a producer publishing in event time.
    for tp, ts in sorted(items, key=lambda x: x[1]):
        offsets[tp] = offsets.get(tp, -1) + 1
        al.push(tp, offsets[tp], ts, ts, now=0.0)
        out.extend(i for _, _, i in al.pop_ready(0.0))
    out.extend(i for _, _, i in al.pop_ready(10.0))
    assert out == sorted(ts for _, ts in items)
    assert len(al) == 0


def test_a_rejected_last_record_does_not_hold_the_other_partitions_back() -> None:
    """The 13.3 stall: a partition's last record was rejected, so its backlog read 1 forever."""
    al = Aligner(idle_s=1.0, stall_s=1e9)
    al.expect(["a:0", "b:0"], now=0.0)
    high = {"a:0": 2, "b:0": 1}  # a:0 holds offsets 0 and 1 (1 is bad); b:0 holds offset 0

    def lag(tp: str, last: int | None) -> int:
        return high[tp] - (-1 if last is None else last) - 1

    al.push("a:0", 0, 1_000, "a1000", now=0.0)
    al.push("b:0", 0, 5_000, "b5000", now=0.0)
    assert [i for _, _, i in al.pop_ready(100.0, lag)] == ["a1000"]  # a:0 still has offset 1 to read
    assert al.stuck_for(100.0) == 0.0
    assert al.pop_ready(200.0, lag) == []
    assert al.stuck_for(200.0) == 100.0
    assert "a:0 (event time 1000, last offset 0, 1 records left" in al.blocker(200.0, lag)
    al.note("a:0", 1, None, now=200.0)  # offset 1 was rejected: read all the same
    assert [i for _, _, i in al.pop_ready(200.0, lag)] == ["b5000"]
    assert al.stuck_for(200.0) == 0.0


def test_pop_all_releases_everything_held_in_event_time_order_whatever_the_frontier() -> None:
    """The end of a finite input (issue 37.3): what waits for a partition or an upstream stage
    that will send nothing more leaves, oldest first, and no longer counts as held."""
    al = Aligner(idle_s=60.0)
    al.expect(["a:0", "b:0"], now=0.0)
    al.push("a:0", 0, 3000, "a3000", now=0.0)
    al.push("a:0", 1, 1000, "a1000", now=0.0)
    al.set_upstream_front(500)
    assert al.pop_ready(0.1) == []  # b:0 silent, the upstream at 500
    assert [(tp, off, item) for tp, off, item in al.pop_all()] == [("a:0", 1, "a1000"), ("a:0", 0, "a3000")]
    assert len(al) == 0 and al.held("a:0") == 0 and al.lowest_held("a:0") is None
