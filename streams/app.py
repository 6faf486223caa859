"""The Faust app: one thin agent around the pure `DetectionEngine`, its state in a changelog table.

Design (see docs/worker.md):

* One agent, concurrency 1, reads the four source topics (GPU and host telemetry keyed by node,
  steps and training events keyed by job). The engine's watermark is global (max event time
  across every input), and stragglers/zombies join telemetry to jobs through RankBound, so the
  whole engine lives in one process: a consumer group runs ONE worker (a second worker of the
  same group would split the partitions between two engines; run one per group).
* An `Aligner` hands events to the engine in event-time order across partitions (a consumer
  drains a GPU-sample backlog and a step backlog at different event-time speeds, and the engine
  drops events behind its watermark).
* The snapshot table is written with the partition of the current event, so it keeps up to one
  snapshot per changelog partition; the one with the highest sequence number wins on restore.
* Delivery is at-least-once with deterministic alert ids. Faust's `exactly_once` was tried
  against Apache Kafka 4.1: it committed source offsets of transactions that were never
  committed (40 of 100 records lost in a 100-record test), so it is not used.
* Events are not acked as they are processed (`noack`). At a checkpoint the worker waits until
  every output it sent is delivered, writes the engine snapshot (with the next offset of every
  source partition) to the table, waits for the changelog write, and only then acks the
  events, so Faust commits offsets that are never ahead of the saved state. After a crash the
  engine restarts from the snapshot; redelivered events older than its offsets are skipped,
  later ones are processed again and may re-send outputs with the same `alert_id`.
* A checkpoint is written when the engine emits an alert, every `checkpoint_interval_ms` of
  event time and every `checkpoint_events` events, not per event: that bounds changelog traffic.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from faust.streams import _current_event
from faust.types import TP

from schemas.codec import Codec
from schemas.errors import DecodeError
from schemas.records import Event
from schemas.topics import (
    DEADLETTER,
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TRAINING_EVENTS,
    TRAINING_STEPS,
    key_for,
    topic_for,
)
from streams.config import EngineConfig, load_config
from streams.engine import DetectionEngine, event_ts
from streams.errors import StreamsError
from streams.routing import Router, load_router

__all__ = [
    "DEFAULT_APP_ID",
    "SOURCE_TOPICS",
    "Aligner",
    "WorkerOptions",
    "WorkerRuntime",
    "build_app",
    "decode_snapshot",
    "encode_snapshot",
    "pick_latest_snapshot",
]

log = logging.getLogger("ranksight.worker")

DEFAULT_APP_ID = "ranksight-detect"
SOURCE_TOPICS: tuple[str, ...] = (TELEMETRY_GPU, TELEMETRY_HOST, TRAINING_STEPS, TRAINING_EVENTS)
_SNAPSHOT_TABLE = "engine-snapshot"


@dataclass(frozen=True)
class WorkerOptions:
    """Everything the worker needs; the CLI fills it from settings and flags."""

    bootstrap: str
    workdir: Path
    app_id: str = DEFAULT_APP_ID
    topic_prefix: str = ""
    partitions: int = 6
    replication_factor: int = 1
    config_path: Path | None = None
    routing_path: Path | None = None
    checkpoint_interval_ms: int = 10_000
    checkpoint_events: int = 5_000
    store: str | None = None  # None: rocksdb:// when rocksdict imports, else memory://
    log_level: str = "warning"
    align_idle_s: float = 2.0
    align_max_buffer: int = 200_000
    stats_interval_s: float = 30.0
    schema_registry_url: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def default_store() -> str:
    """`rocksdb://` when `rocksdict` is importable, else `memory://`; both recover from the changelog."""
    try:
        import rocksdict  # noqa: F401
    except ImportError:
        return "memory://"
    return "rocksdb://"


def encode_snapshot(seq: int, offsets: dict[str, int], engine_bytes: bytes) -> bytes:
    """Table value: one JSON header line (sequence, next offset per source partition) + the snapshot."""
    header = json.dumps({"seq": seq, "offsets": dict(sorted(offsets.items()))}, separators=(",", ":"))
    return header.encode() + b"\n" + engine_bytes


def decode_snapshot(value: bytes) -> tuple[int, dict[str, int], bytes]:
    """Inverse of `encode_snapshot`."""
    head, _, body = value.partition(b"\n")
    try:
        meta = json.loads(head)
        return int(meta["seq"]), {str(k): int(v) for k, v in meta["offsets"].items()}, body
    except (ValueError, KeyError, TypeError) as exc:
        raise StreamsError(
            f"engine snapshot header is corrupt ({exc}); delete the worker's changelog topic"
        ) from None


def pick_latest_snapshot(values: list[bytes]) -> tuple[int, dict[str, int], bytes] | None:
    """The snapshot with the highest sequence number (the table keeps one per changelog partition)."""
    best: tuple[int, dict[str, int], bytes] | None = None
    for value in values:
        if not value:
            continue
        decoded = decode_snapshot(value)
        if best is None or decoded[0] > best[0]:
            best = decoded
    return best


def _tp_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


# (partition "topic:n", last offset delivered or None) -> records left to read, None if unknown.
LagFn = Callable[[str, "int | None"], "int | None"]


@dataclass(order=True)
class _Held:
    ts: int
    seq: int
    tp: str = field(compare=False)
    offset: int = field(compare=False)
    arrived: float = field(compare=False)
    item: Any = field(compare=False)


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

    def __init__(self, idle_s: float = 2.0, max_buffer: int = 200_000, stall_s: float = 30.0) -> None:
        self.idle_s = idle_s
        self.stall_s = stall_s
        self.max_buffer = max_buffer
        self._heap: list[_Held] = []
        self._seq = 0
        self._last_ts: dict[str, int] = {}
        self._last_seen: dict[str, float] = {}
        self._last_offset: dict[str, int] = {}
        self._held_offsets: dict[str, list[int]] = {}
        self._released: dict[str, set[int]] = {}  # lazy deletion from `_held_offsets`

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, tp: str, offset: int, ts: int, item: Any, now: float) -> None:
        """Hold one decoded event of partition `tp`."""
        self._seq += 1
        heapq.heappush(self._heap, _Held(ts, self._seq, tp, offset, now, item))
        if ts > self._last_ts.get(tp, ts - 1):
            self._last_ts[tp] = ts
        self._last_seen[tp] = now
        if offset > self._last_offset.get(tp, -1):
            self._last_offset[tp] = offset
        heapq.heappush(self._held_offsets.setdefault(tp, []), offset)

    def expect(self, tps: list[str], now: float) -> None:
        """Newly assigned partitions: hold everything back until each delivers or stays silent `idle_s`."""
        for tp in tps:
            self._last_seen.setdefault(tp, now)

    def frontier(self, now: float, lag: LagFn | None = None) -> int | None:
        """Event time every partition still delivering has reached (None: no partition holds back).

        A partition holds the others back while it has unread records (`lag(tp, last_offset)`
        says how many), for at most `stall_s` without a delivery; when its backlog is unknown,
        while it delivered (or was assigned) within `idle_s`.
        """
        blocking: list[int | None] = []
        for tp, seen in self._last_seen.items():
            quiet = now - seen
            backlog = lag(tp, self._last_offset.get(tp)) if lag is not None else None
            holds = backlog > 0 and quiet < self.stall_s if backlog is not None else quiet < self.idle_s
            if holds:
                blocking.append(self._last_ts.get(tp))
        if not blocking:
            return None
        if None in blocking:
            return -(2**63)  # an assigned partition has not delivered yet: nothing is safe to release
        return min(t for t in blocking if t is not None)

    def pop_ready(self, now: float, lag: LagFn | None = None) -> list[tuple[str, int, Any]]:
        """Events that may go to the engine now, oldest first, as (tp, offset, item)."""
        out: list[tuple[str, int, Any]] = []
        frontier = self.frontier(now, lag)
        heap = self._heap
        while heap:
            top = heap[0]
            if not (
                len(heap) > self.max_buffer
                or (frontier is not None and top.ts <= frontier)
                or frontier is None
            ):
                break
            heapq.heappop(heap)
            self._released.setdefault(top.tp, set()).add(top.offset)
            out.append((top.tp, top.offset, top.item))
        return out

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
        self._released.clear()
        self._last_ts.clear()
        self._last_seen.clear()
        self._last_offset.clear()


class WorkerRuntime:
    """The engine plus what is needed to checkpoint it consistently with the consumed offsets."""

    def __init__(self, config: EngineConfig, router: Router, options: WorkerOptions) -> None:
        self.config = config
        self.router = router
        self.options = options
        self.engine: DetectionEngine | None = None
        self.aligner = Aligner(options.align_idle_s, options.align_max_buffer)
        self.seq = 0
        self.offsets: dict[str, int] = {}  # next offset per source partition already in the engine
        self.pending: list[Any] = []  # faust events processed but not yet acked
        self.futures: list[Any] = []  # output sends not yet known delivered
        self.last_checkpoint_ts: int | None = None
        self.last_receive = time.monotonic()  # when the agent last got an event (wall clock: idleness only)
        self.counts = dict.fromkeys(
            (
                "events",
                "skipped",
                "deadletter",
                "processed",
                "outputs",
                "alerts",
                "checkpoints",
                "snapshot_bytes",
            ),
            0,
        )

    def restore(self, values: list[bytes]) -> None:
        """Load the newest snapshot of the table, or start an empty engine."""
        self.pending, self.futures = [], []
        latest = pick_latest_snapshot(values)
        if latest is None:
            self.engine = DetectionEngine(self.config, self.router)
            self.seq, self.offsets = 0, {}
            log.info("no engine snapshot: starting from empty state")
            return
        self.seq, self.offsets, body = latest
        self.engine = DetectionEngine.restore(body, self.config, self.router)
        self.last_checkpoint_ts = self.engine.max_ts
        log.warning(
            "restored engine snapshot seq=%d (%d bytes, %d alerts firing)",
            self.seq,
            len(body),
            len(self.engine.firing()),
        )

    def already_seen(self, tp: str, offset: int) -> bool:
        """True when the snapshot already contains this record (redelivered after a restart)."""
        return offset < self.offsets.get(tp, -1)

    def mark(self, tp: str, offset: int) -> None:
        """Record that this offset is now part of the engine state."""
        if offset + 1 > self.offsets.get(tp, -1):
            self.offsets[tp] = offset + 1

    def checkpoint_due(self, outputs: list[Event]) -> bool:
        """Alert transition, or enough event time / events since the last checkpoint."""
        if any(o.type == "Alert" for o in outputs):
            return True
        if len(self.pending) >= self.options.checkpoint_events:
            return True
        engine = self.engine
        if engine is None or engine.max_ts is None:
            return False
        if self.last_checkpoint_ts is None:
            self.last_checkpoint_ts = engine.max_ts
            return False
        return engine.max_ts - self.last_checkpoint_ts >= self.options.checkpoint_interval_ms

    def snapshot_value(self) -> bytes:
        """Next sequence number's table value; offsets never claim events still held by the aligner."""
        assert self.engine is not None
        self.seq += 1
        self.last_checkpoint_ts = self.engine.max_ts
        offsets = {}
        for tp, nxt in self.offsets.items():
            held = self.aligner.lowest_held(tp)
            offsets[tp] = nxt if held is None else min(nxt, held)
        body = self.engine.snapshot()
        self.counts["checkpoints"] += 1
        self.counts["snapshot_bytes"] = len(body)
        return encode_snapshot(self.seq, offsets, body)


def build_app(options: WorkerOptions) -> faust.App:
    """A Faust app running the detection engine over the (prefixed) source topics."""
    config = load_config(options.config_path)
    router = load_router(options.routing_path)
    codec = Codec() if not options.schema_registry_url else _registry_codec(options.schema_registry_url)
    prefix = options.topic_prefix
    app_id = prefix + options.app_id
    options.workdir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        app_id,
        broker=_broker_url(options.bootstrap),
        store=options.store or default_store(),
        datadir=str(options.workdir / "faust"),
        processing_guarantee="at_least_once",
        topic_partitions=options.partitions,
        topic_replication_factor=options.replication_factor,
        topic_allow_declare=True,  # the broker does not auto-create: Faust declares its own topics
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        # A snapshot can be large: let the producer send it (topic-level max.message.bytes below).
        producer_max_request_size=16 * 1024 * 1024,
        broker_commit_interval=2.0,
        # A killed worker's membership blocks its successor until the session times out.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=3.0,
        stream_wait_empty=False,
        stream_buffer_maxsize=16_384,
        broker_max_poll_records=5_000,
        # Table keys are short strings, values snapshot bytes: no JSON around either.
        key_serializer="raw",
        value_serializer="raw",
        **options.extra,
    )
    source = app.topic(*(prefix + t for t in SOURCE_TOPICS), key_serializer="raw", value_serializer="raw")
    out_topics: dict[str, Any] = {}

    def out_topic(name: str) -> Any:
        if name not in out_topics:
            out_topics[name] = app.topic(prefix + name, key_serializer="raw", value_serializer="raw")
        return out_topics[name]

    snapshots = app.Table(
        _SNAPSHOT_TABLE,
        default=None,
        partitions=options.partitions,
        key_type=str,
        value_type=bytes,
        # Compaction keeps one snapshot per key; small segments let it run soon.
        extra_topic_configs={
            "max.message.bytes": str(16 * 1024 * 1024),
            "segment.ms": "600000",
            "min.cleanable.dirty.ratio": "0.1",
        },
    )
    runtime = WorkerRuntime(config, router, options)
    lock = asyncio.Lock()
    streams: list[Any] = []
    app.ranksight_runtime = runtime  # type: ignore[attr-defined]

    @app.agent(source, concurrency=1)
    async def detect(stream: Any) -> None:
        streams[:] = [stream]
        async for fevent in stream.noack().events():
            async with lock:
                await _receive(stream, fevent)

    async def _receive(stream: Any, fevent: Any) -> None:
        msg = fevent.message
        runtime.last_receive = time.monotonic()
        topic = msg.topic[len(prefix) :] if prefix and msg.topic.startswith(prefix) else msg.topic
        tp = f"{topic}:{msg.partition}"
        if runtime.engine is None:
            runtime.restore([bytes(v) for _, v in sorted(snapshots.items()) if v])
        if runtime.already_seen(tp, msg.offset):
            runtime.counts["skipped"] += 1
            await stream.ack(fevent)
            return
        runtime.counts["events"] += 1
        try:
            event = codec.decode(fevent.value)
        except DecodeError as exc:
            err = exc.located(msg.topic, msg.partition, msg.offset)
            runtime.counts["deadletter"] += 1
            runtime.futures.append(
                await out_topic(DEADLETTER).send(
                    key=fevent.key,
                    value=fevent.value,
                    headers={"ranksight.error": str(err).encode(), "ranksight.source": topic.encode()},
                    force=True,
                )
            )
            runtime.mark(tp, msg.offset)
            runtime.pending.append(fevent)
        else:
            runtime.aligner.push(tp, msg.offset, event_ts(event), (fevent, event), time.monotonic())
        await _drain(stream)

    def _lag(tp: str, last_offset: int | None) -> int | None:
        topic, _, partition = tp.rpartition(":")
        ktp = TP(prefix + topic, int(partition))
        try:
            hw = app.consumer.highwater(ktp)
            if last_offset is None:
                # Nothing delivered yet: the backlog starts at the committed offset.
                committed = getattr(app.consumer, "_committed_offset", {}).get(ktp)
                last_offset = -1 if committed is None else int(committed) - 1
        except Exception:  # not known yet (no fetch answered for this partition)
            return None
        return None if hw is None or hw < 0 else max(0, int(hw) - (last_offset + 1))

    async def _drain(stream: Any) -> None:
        engine = runtime.engine
        if engine is None:
            return
        for tp, offset, (fevent, event) in runtime.aligner.pop_ready(time.monotonic(), _lag):
            outputs = engine.process(event)
            runtime.counts["processed"] += 1
            runtime.mark(tp, offset)
            for out in outputs:
                name = topic_for(out.type)
                runtime.counts["outputs"] += 1
                if out.type == "Alert":
                    runtime.counts["alerts"] += 1
                # force=True: send now, not when the offset commits; the checkpoint waits for delivery.
                runtime.futures.append(
                    await out_topic(name).send(
                        key=key_for(name, out.record), value=codec.encode(out), force=True
                    )
                )
            runtime.pending.append(fevent)
            if runtime.checkpoint_due(outputs):
                await _checkpoint(stream, fevent)

    async def _checkpoint(stream: Any, fevent: Any) -> None:
        # 1. every output delivered, 2. snapshot written and delivered, 3. only then ack (commit).
        futures, runtime.futures = runtime.futures, []
        for fut in futures:
            await fut
        # The table writes its changelog to the partition of the current event; a timer has none.
        token = _current_event.set(weakref.ref(fevent))
        try:
            snapshots[f"engine@{fevent.message.partition}"] = runtime.snapshot_value()
        finally:
            _current_event.reset(token)
        await app.producer.flush()
        pending, runtime.pending = runtime.pending, []
        for done in pending:
            await stream.ack(done)

    @app.timer(options.align_idle_s / 4)
    async def _tick() -> None:
        if not streams or runtime.engine is None:
            return
        async with lock:
            # Release events held for idle partitions when no new event arrives to do it.
            if len(runtime.aligner):
                await _drain(streams[0])
            # Input went quiet: checkpoint what was processed, so the committed offsets reach the
            # end (consumer lag reads 0 once the worker has caught up, and a restart replays nothing).
            idle = time.monotonic() - runtime.last_receive >= options.align_idle_s
            if idle and runtime.pending and not len(runtime.aligner):
                await _checkpoint(streams[0], runtime.pending[-1])

    @app.timer(options.stats_interval_s)
    async def _stats() -> None:
        engine = runtime.engine
        log.info(
            "worker: %s held=%d watermark=%s late_dropped=%s",
            runtime.counts,
            len(runtime.aligner),
            engine.watermark if engine else None,
            engine.stats["late_dropped"] if engine else None,
        )
        log.debug("partitions: %s", runtime.aligner.describe(time.monotonic(), _lag))

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def _assigned(app_: Any, assigned: Any, **kwargs: Any) -> None:
        names = {prefix + t: t for t in SOURCE_TOPICS}
        tps = [f"{names[tp.topic]}:{tp.partition}" for tp in assigned if tp.topic in names]
        runtime.aligner.expect(sorted(tps), time.monotonic())

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def _revoked(app_: Any, revoked: Any, **kwargs: Any) -> None:
        # Unacked events will be redelivered: reload the engine from the table at the next event.
        runtime.engine = None
        runtime.aligner.clear()
        runtime.pending = []
        runtime.futures = []

    return app


def _broker_url(bootstrap: str) -> list[str]:
    return [f"kafka://{host.strip()}" for host in bootstrap.split(",") if host.strip()]


def _registry_codec(url: str) -> Codec:
    from schemas.codec import codec_from_settings

    return codec_from_settings(url)


def env_options(**overrides: Any) -> WorkerOptions:
    """Options from `KAFKA_BOOTSTRAP` / `RANKSIGHT_TOPIC_PREFIX` (for scripts and tests)."""
    base: dict[str, Any] = {
        "bootstrap": os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        "workdir": Path(os.environ.get("RANKSIGHT_HOME", "var")) / "worker",
        "topic_prefix": os.environ.get("RANKSIGHT_TOPIC_PREFIX", ""),
    }
    base.update(overrides)
    return WorkerOptions(**base)
