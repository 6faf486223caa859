"""Event-time alignment of the partitions one engine reads (its watermark is global to them).

Pure: no Kafka or Faust here. The worker feeds it records with their partition and offset and
asks, now and then, which may go to the engine; `lag` callbacks say how many records a partition
still has unread (the consumer's view of the broker), so a partition at its end stops holding the
others back at once instead of after a timeout.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

__all__ = ["Aligner", "LagFn", "tp_key"]

# How long a computed frontier is reused while the partition that sets it delivers nothing new:
# the backlogs it depends on change only with fetches, so recomputing it per record (every
# partition's lag, per record) cost the worker a tenth of its time.
FRONTIER_REUSE_S = 0.05


def tp_key(topic: str, partition: int) -> str:
    """The name the aligner knows a partition by: "topic:n"."""
    return f"{topic}:{partition}"


# (partition "topic:n", last offset delivered or None) -> records left to read, None if unknown.
LagFn = Callable[[str, int | None], int | None]


# A held record: (event time, tie order, arrival sequence, partition, offset, item). A plain tuple:
# the heap compares (ts, order, seq) in C, never reaching the rest (seq is unique); a dataclass with
# `order=True` compared in Python and was half of the alignment time. `order` (default ()) puts
# records of one event time in an order that does not depend on their arrival (the job stage).
_Held = tuple[int, tuple[Any, ...], int, str, int, Any]


class Aligner:
    """Event-time alignment of many partitions before the engine (whose watermark is global).

    A consumer reads partitions at different event-time speeds (a backlog of GPU samples and
    one of steps are not drained at the same rate), and the engine drops events older than
    max event time - allowed lateness. So events wait here and leave in event-time order once
    every partition that still has unread records has delivered something at least as new
    (`frontier`); a partition at its end (or, backlog unknown, silent for `idle_s`) stops
    holding the others back. `max_buffer` bounds
    memory during a large catch-up (past it the oldest events leave, possibly too early).
    """

    def __init__(
        self,
        idle_s: float = 2.0,
        max_buffer: int = 200_000,
        stall_s: float = 30.0,
        end_grace_s: float = 0.0,
        passive_topics: frozenset[str] = frozenset(),
    ) -> None:
        self.idle_s = idle_s
        self.end_grace_s = end_grace_s
        # Partitions of these topics hold the others back only while they have unread records, or
        # up to `upstream_front`: their records come from another stage of this process (the
        # unattributed side path), which says how far it got; otherwise they join the event-time
        # order when they come, and are late for the engine if they come after it moved on.
        self.passive_topics = passive_topics
        self.upstream_front: int | None = None
        self.stall_s = stall_s
        self.max_buffer = max_buffer
        self._heap: list[_Held] = []
        self._seq = 0
        self._last_ts: dict[str, int] = {}
        self._last_seen: dict[str, float] = {}
        self._last_offset: dict[str, int] = {}
        self._held_offsets: dict[str, list[int]] = {}
        self._held_count: dict[str, int] = {}  # records held per partition
        self._released: dict[str, set[int]] = {}  # lazy deletion from `_held_offsets`
        self.moved_at: float | None = None  # when events last left (or nothing was held)
        # The last frontier computed, the partition that set it, and when (None: recompute).
        self._front: int | None = None
        self._front_tp: str | None = None
        self._front_at: float | None = None
        self._front_lag: LagFn | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, tp: str, offset: int, ts: int, item: Any, now: float, order: tuple[Any, ...] = ()) -> None:
        """Hold one decoded event of partition `tp` (`order`: its place among records of the same time)."""
        self._seq += 1
        heapq.heappush(self._heap, (ts, order, self._seq, tp, offset, item))
        self._held_count[tp] = self._held_count.get(tp, 0) + 1
        if ts > self._last_ts.get(tp, ts - 1):
            self._last_ts[tp] = ts
        self._last_seen[tp] = now
        if offset > self._last_offset.get(tp, -1):
            self._last_offset[tp] = offset
        heapq.heappush(self._held_offsets.setdefault(tp, []), offset)
        self._touched(tp)

    def note(self, tp: str, offset: int | None, ts: int | None, now: float) -> None:
        """Progress of an input that holds no event here: a record that was rejected or
        skipped (already in the restored state). Every consumed offset must reach `push` or `note`,
        or the partition's backlog never reads 0 and it holds the others back."""
        if ts is not None and ts > self._last_ts.get(tp, ts - 1):
            self._last_ts[tp] = ts
        self._last_seen[tp] = now
        if offset is not None and offset > self._last_offset.get(tp, -1):
            self._last_offset[tp] = offset
        self._touched(tp)

    def _touched(self, tp: str) -> None:
        """`tp` delivered: the frontier moves if it was the partition setting it (or none did)."""
        if tp == self._front_tp or self._front_tp is None:
            self._front_at = None

    def expect(self, tps: list[str], now: float) -> None:
        """Newly assigned partitions: hold everything back until each delivers or stays silent `idle_s`."""
        for tp in tps:
            self._last_seen.setdefault(tp, now)
        self._front_at = None

    def frontier(self, now: float, lag: LagFn | None = None) -> int | None:
        """Event time every partition still delivering has reached (None: no partition holds back).

        A partition holds the others back while it has unread records (`lag(tp, last_offset)`
        says how many), for at most `stall_s` without a delivery; when its backlog is unknown,
        while it delivered (or was assigned) within `idle_s`; at its end, while it delivered
        within `end_grace_s`.
        """
        front, _ = self._frontier_of(self._holding(now, lag))
        return front

    @staticmethod
    def _frontier_of(
        holding: list[tuple[str, int | None, int | None, float]],
    ) -> tuple[int | None, str | None]:
        """(frontier, the partition setting it) of the holding partitions."""
        if not holding:
            return None, None
        # One that has not delivered yet (no event time) holds everything back.
        tp, ts, _, _ = min(holding, key=lambda h: -(2**63) if h[1] is None else h[1])
        return (-(2**63) if ts is None else ts), tp

    def _reused_frontier(self, now: float, lag: LagFn | None) -> int | None:
        """`frontier`, recomputed only when the partition that set it delivered, or every
        `FRONTIER_REUSE_S` (backlogs change with fetches, not per record)."""
        if self._front_at is None or now - self._front_at >= FRONTIER_REUSE_S or lag is not self._front_lag:
            self._front, self._front_tp = self._frontier_of(self._holding(now, lag))
            self._front_at, self._front_lag = now, lag
        return self._front

    def _holding(self, now: float, lag: LagFn | None) -> list[tuple[str, int | None, int | None, float]]:
        """The partitions that hold the others back: (tp, event time, backlog, seconds silent)."""
        out: list[tuple[str, int | None, int | None, float]] = []
        if self.upstream_front is not None:
            out.append(("@upstream", self.upstream_front, None, 0.0))
        for tp, seen in self._last_seen.items():
            if self.passive_topics and tp.rpartition(":")[0] in self.passive_topics:
                backlog = lag(tp, self._last_offset.get(tp)) if lag is not None else None
                if backlog:  # records already forwarded, not read yet
                    out.append((tp, self._last_ts.get(tp), backlog, now - seen))
                continue
            quiet = now - seen
            backlog = lag(tp, self._last_offset.get(tp)) if lag is not None else None
            if backlog is None:
                holds = quiet < self.idle_s
            elif backlog > 0:
                holds = quiet < self.stall_s
            else:
                # At its end, but it delivered just now: a producer publishing a backlog sends each
                # partition's batch separately, so its next records may be a few ms from landing.
                holds = quiet < self.end_grace_s
            if holds:
                out.append((tp, self._last_ts.get(tp), backlog, quiet))
        return out

    def pop_ready(
        self, now: float, lag: LagFn | None = None, limit: int | None = None
    ) -> list[tuple[str, int, Any]]:
        """Events that may go to the engine now, oldest first, as (tp, offset, item); at most
        `limit` of them (the rest stay ready: `ready`)."""
        if not self._heap:
            self.moved_at = now  # nothing held: no frontier to compute
            return []
        out: list[tuple[str, int, Any]] = []
        frontier = self._reused_frontier(now, lag)
        heap = self._heap
        released = self._released
        counts = self._held_count
        while heap and (limit is None or len(out) < limit):
            if not (frontier is None or heap[0][0] <= frontier or len(heap) > self.max_buffer):
                break
            _, _, _, tp, offset, item = heapq.heappop(heap)
            done = released.get(tp)
            if done is None:
                done = released[tp] = set()
            done.add(offset)
            counts[tp] -= 1
            out.append((tp, offset, item))
        if out or not heap or self.moved_at is None:
            self.moved_at = now
        return out

    def pop_all(self) -> list[tuple[str, int, Any]]:
        """Every held event, oldest first, whatever the frontier: the end of a finite input, when
        nothing more can come that the frontier waits for (`WorkerCore.finish`)."""
        out: list[tuple[str, int, Any]] = []
        heap = self._heap
        while heap:
            _, _, _, tp, offset, item = heapq.heappop(heap)
            self._released.setdefault(tp, set()).add(offset)
            self._held_count[tp] -= 1
            out.append((tp, offset, item))
        return out

    def ready(self, now: float, lag: LagFn | None = None) -> bool:
        """Whether `pop_ready` would release something now."""
        heap = self._heap
        if not heap:
            return False
        frontier = self._reused_frontier(now, lag)
        return frontier is None or heap[0][0] <= frontier or len(heap) > self.max_buffer

    def stuck_for(self, now: float) -> float:
        """Seconds events have been held without any leaving (0 when nothing is held)."""
        if not self._heap or self.moved_at is None:
            return 0.0
        return now - self.moved_at

    def blocker(self, now: float, lag: LagFn | None = None) -> str:
        """Which partition holds the held events back, and why (for a log line)."""
        holding = self._holding(now, lag)
        oldest = self._heap[0][0] if self._heap else None
        if not holding:
            return f"nothing (oldest held event time {oldest})"
        # The one furthest behind in event time (one that delivered nothing yet comes first).
        tp, ts, backlog, quiet = min(holding, key=lambda h: -(2**63) if h[1] is None else h[1])
        left = "unknown" if backlog is None else str(backlog)
        return (
            f"{tp} (event time {ts}, last offset {self._last_offset.get(tp)}, {left} records left,"
            f" silent {quiet:.0f} s; oldest held event time {oldest})"
        )

    def set_upstream_front(self, ts: int | None) -> None:
        """How far the stage feeding the passive topics got (None: it has nothing pending)."""
        if ts != self.upstream_front:
            self.upstream_front = ts
            self._front_at = None

    def held(self, tp: str) -> int:
        """Records of partition `tp` held here now."""
        return self._held_count.get(tp, 0)

    def oldest_held(self) -> int | None:
        """The event time of the oldest record held here."""
        return self._heap[0][0] if self._heap else None

    def last_ts(self, tp: str) -> int | None:
        """The newest event time `tp` delivered."""
        return self._last_ts.get(tp)

    def last_offset(self, tp: str) -> int | None:
        """The newest offset of `tp` delivered here (held, released or noted)."""
        return self._last_offset.get(tp)

    def lowest_held(self, tp: str) -> int | None:
        """The smallest offset of `tp` still waiting here (not yet in the engine state)."""
        offsets = self._held_offsets.get(tp)
        released = self._released.get(tp, set())
        while offsets and offsets[0] in released:
            released.discard(heapq.heappop(offsets))
        return offsets[0] if offsets else None

    def describe(self, now: float, lag: LagFn | None = None) -> dict[str, Any]:
        """Per partition: last event time, last offset, backlog, seconds since the last delivery."""
        return {
            tp: (
                self._last_ts.get(tp),
                self._last_offset.get(tp),
                lag(tp, self._last_offset.get(tp)) if lag else None,
                round(now - seen, 1),
            )
            for tp, seen in sorted(self._last_seen.items())
        }

    def clear(self) -> None:
        """Forget everything held (the partitions were revoked; they will be redelivered)."""
        self._heap.clear()
        self._held_offsets.clear()
        self._held_count.clear()
        self._released.clear()
        self._last_ts.clear()
        self._last_seen.clear()
        self._last_offset.clear()
        self.moved_at = None
        self._front_at = None
