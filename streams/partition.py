"""One partition's detection engine in the worker, and the snapshot that checkpoints it.

The worker runs one `DetectionEngine` per assigned partition (all records of a job meet on one
partition). Its state is checkpointed as one table value: a JSON header (sequence number, the next
offset of every input partition already in the engine, the newest telemetry time per source) and
the engine's own snapshot. No Kafka or Faust here: `streams.app` writes and reads the values.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from schemas.records import Event
from streams.alerting.routing import Router
from streams.aligner import Aligner
from streams.config import EngineConfig
from streams.engine import DetectionEngine
from streams.errors import StreamsError

if TYPE_CHECKING:
    from streams.app import WorkerOptions

__all__ = [
    "WorkerRuntime",
    "decode_snapshot",
    "decode_snapshot_meta",
    "encode_snapshot",
    "pick_latest_snapshot",
]

log = logging.getLogger("ranksight.worker")


def encode_snapshot(
    seq: int, offsets: dict[str, int], engine_bytes: bytes, seen: dict[str, int] | None = None
) -> bytes:
    """Table value: one JSON header line (sequence, next offset per source partition, telemetry seen) + the snapshot."""
    meta: dict[str, Any] = {"seq": seq, "offsets": dict(sorted(offsets.items()))}
    if seen:
        meta["seen"] = dict(sorted(seen.items()))
    header = json.dumps(meta, separators=(",", ":"))
    return header.encode() + b"\n" + engine_bytes


def decode_snapshot_meta(value: bytes) -> tuple[dict[str, Any], bytes]:
    """The header dict and the engine bytes of a table value."""
    head, _, body = value.partition(b"\n")
    try:
        meta = json.loads(head)
        meta["seq"] = int(meta["seq"])
        meta["offsets"] = {str(k): int(v) for k, v in meta["offsets"].items()}
        meta["seen"] = {str(k): int(v) for k, v in meta.get("seen", {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StreamsError(
            f"engine snapshot header is corrupt ({exc}); delete the worker's changelog topic"
        ) from None
    return meta, body


def decode_snapshot(value: bytes) -> tuple[int, dict[str, int], bytes]:
    """Inverse of `encode_snapshot` (sequence, offsets, engine bytes)."""
    meta, body = decode_snapshot_meta(value)
    return meta["seq"], meta["offsets"], body


def pick_latest_snapshot(values: list[bytes]) -> tuple[int, dict[str, int], bytes] | None:
    """The snapshot with the highest sequence number among `values` (empty ones ignored)."""
    best: tuple[int, dict[str, int], bytes] | None = None
    for value in values:
        if not value:
            continue
        decoded = decode_snapshot(value)
        if best is None or decoded[0] > best[0]:
            best = decoded
    return best


def _telemetry_source(event: Event) -> str | None:
    """ "G|node|gpu" / "H|node" for telemetry (the at-least-once forwarder may repeat it), else None."""
    r = event.record
    if event.type == "GpuSample":
        return f"G|{r['node']}|{r.get('gpu_uuid')}"
    if event.type == "HostSample":
        return f"H|{r['node']}"
    return None


# Counters of one partition's engine runtime (summed over partitions in the progress line).
RUNTIME_COUNTS: tuple[str, ...] = (
    "events",
    "skipped",
    "duplicates",
    "rejected",
    "engine_errors",
    "unencodable",
    "processed",
    "outputs",
    "alerts",
    "checkpoints",
    "snapshot_bytes",
    "guard_advances",
    "front_advances",
    "clock_rejected",
)


class WorkerRuntime:
    """One partition's engine plus what is needed to checkpoint it consistently with the consumed offsets."""

    COUNTS = RUNTIME_COUNTS

    def __init__(
        self,
        config: EngineConfig,
        router: Router,
        options: WorkerOptions,
        partition: int = 0,
        passive_topics: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        self.router = router
        self.options = options
        self.partition = partition
        self.engine: DetectionEngine | None = None
        self.aligner = Aligner(
            options.align_idle_s,
            options.align_max_buffer,
            end_grace_s=options.align_end_grace_s,
            passive_topics=passive_topics,
        )
        self.seq = 0
        self.offsets: dict[str, int] = {}  # next offset per source partition already in the engine
        # Newest event time per telemetry source ("G|node|gpu", "H|node") already in the engine:
        # the forwarder is at-least-once, so a re-forwarded sample is dropped here.
        self.seen: dict[str, int] = {}
        self.pending: list[Any] = []  # faust events processed but not yet acked
        self.futures: list[Any] = []  # output sends not yet known delivered
        self.last_checkpoint_at: float | None = None  # monotonic time of the last checkpoint
        self.last_event: Any = None  # a faust event of this partition (table writes need one)
        self.last_receive = time.monotonic()  # when the agent last got an event (wall clock: idleness only)
        self.counts = dict.fromkeys(RUNTIME_COUNTS, 0)
        self.checkpointed_offsets: dict[str, int] = {}  # the offsets of the last snapshot taken

    def restore(self, values: list[bytes]) -> None:
        """Load the newest snapshot among `values` (this partition's), or start an empty engine."""
        self.pending, self.futures = [], []
        best: tuple[dict[str, Any], bytes] | None = None
        for value in values:
            if value:
                meta, body = decode_snapshot_meta(value)
                if best is None or meta["seq"] > best[0]["seq"]:
                    best = (meta, body)
        if best is None:
            self.engine = DetectionEngine(self.config, self.router)
            self.seq, self.offsets, self.seen = 0, {}, {}
            log.info("partition %d: no engine snapshot, starting from empty state", self.partition)
            return
        meta, body = best
        self.seq, self.offsets, self.seen = meta["seq"], meta["offsets"], meta["seen"]
        self.engine = DetectionEngine.restore(body, self.config, self.router)
        log.warning(
            "partition %d: restored engine snapshot seq=%d (%d bytes, %d alerts firing)",
            self.partition,
            self.seq,
            len(body),
            len(self.engine.firing()),
        )

    def already_seen(self, tp: str, offset: int) -> bool:
        """True when the snapshot already contains this record (redelivered after a restart)."""
        return offset < self.offsets.get(tp, -1)

    def duplicate(self, event: Event) -> bool:
        """True for a telemetry sample this engine already has (re-forwarded)."""
        ident = _telemetry_source(event)
        return ident is not None and int(event.record["ts"]) <= self.seen.get(ident, -(2**63))

    def remember(self, event: Event) -> None:
        """Note a telemetry sample the engine took (not one it rejected for its time: a sample
        stamped 2199 would make every later sample of its GPU look re-forwarded)."""
        ident = _telemetry_source(event)
        if ident is not None:
            self.seen[ident] = max(int(event.record["ts"]), self.seen.get(ident, -(2**63)))

    def mark(self, tp: str, offset: int) -> None:
        """Record that this offset is now part of the engine state."""
        if offset + 1 > self.offsets.get(tp, -1):
            self.offsets[tp] = offset + 1

    def checkpoint_due(self, outputs: list[Event], now: float | None = None) -> bool:
        """An alert transition, `checkpoint_events` records, or `checkpoint_interval_ms` of processing.

        The interval is wall-clock time (`now`, monotonic seconds), like Kafka Streams' commit
        interval: it bounds the work a restart repeats. In event time it made a catch-up of an
        hour-old backlog checkpoint every few hundred records, a snapshot and two broker round
        trips each, which was most of the worker's time.
        """
        if any(o.type == "Alert" for o in outputs):
            return True
        if len(self.pending) >= self.options.checkpoint_events:
            return True
        now = time.monotonic() if now is None else now
        if self.last_checkpoint_at is None:
            self.last_checkpoint_at = now
            return False
        return (
            bool(self.pending) and now - self.last_checkpoint_at >= self.options.checkpoint_interval_ms / 1000
        )

    def snapshot_value(self) -> bytes:
        """Next sequence number's table value; offsets never claim events still held by the aligner."""
        assert self.engine is not None
        self.seq += 1
        self.last_checkpoint_at = time.monotonic()
        offsets = {}
        for tp, nxt in self.offsets.items():
            held = self.aligner.lowest_held(tp)
            offsets[tp] = nxt if held is None else min(nxt, held)
        self.checkpointed_offsets = offsets
        body = self.engine.snapshot()
        self.counts["checkpoints"] += 1
        self.counts["snapshot_bytes"] = len(body)
        return encode_snapshot(self.seq, offsets, body, self.seen)
