"""The Faust runtime: the worker core driven by one Faust agent (`ranksight worker --runtime faust`).

The stack the project was specified with, kept as a thin adapter over the same core as the default
librdkafka loop (`streams.runtime.loop`), so both give the same alerts from the same state. Faust
provides the consumption, its own consumer-group protocol (its assignor gives a worker the same
partition numbers of every co-partitioned topic) and offset commits of acknowledged events; the
core does the rest. Sends go through the same librdkafka producer as the default runtime
(`KafkaIO`): a `Checkpoint` flushes it, writes the snapshot to the changelog, flushes again, and
only then "commits", which here means acknowledging the events the checkpoint covers (Faust
commits acknowledged offsets every `broker_commit_interval`). Faust's `exactly_once` is not used
(against Apache Kafka 4.1 it committed offsets of aborted transactions); its tables are not used
either: state is the changelog topics both runtimes share, read back at assignment.

Backpressure: none beyond the aligners' cap (`align_max_buffer`: past it the oldest held records
leave, possibly late). Faust's `pause_partitions` makes its fetch loop drop what it already fetched
of a partition without moving back, and resuming with a seek did not bring the partition back
reliably in our tests (a partition stayed unread with records left), so this runtime never pauses.

Private Faust APIs this adapter relies on (checked against faust-streaming 0.11):
`Consumer._committed_offset` (the committed offsets at assignment, for backlogs),
`Consumer.highwater` / `highwaters` (public, but only filled by fetches), and in
`streams.runtime.faust_transport` `AIOKafkaConsumerThread._create_worker_consumer` and aiokafka's
`AIOKafkaConsumer._fetch_max_wait_ms`.
"""

from __future__ import annotations

import collections
import logging
import ssl
import time
from typing import Any

import faust
from faust.types import TP

from streams.errors import StreamsError
from streams.runtime.aligner import tp_key
from streams.runtime.changelog import restore
from streams.runtime.checkpoint import Action, perform
from streams.runtime.core import WorkerCore
from streams.runtime.faust_transport import App
from streams.runtime.health import WorkerHealth
from streams.runtime.intake import Record
from streams.runtime.kafka_io import KafkaIO
from streams.runtime.loop import ensure_topics
from streams.runtime.options import ASK_ENDS_S, INPUT_TOPICS, METRICS_S, WorkerOptions, kafka_config

__all__ = ["broker_credentials", "build_app", "run_faust"]

log = logging.getLogger("ranksight.worker")


def broker_credentials(options: WorkerOptions) -> Any:
    """Faust's credentials for `options.security_protocol` (None for PLAINTEXT)."""
    protocol = options.security_protocol
    if protocol == "PLAINTEXT":
        return None
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=options.ssl_ca_location)
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        return faust.SASLCredentials(
            username=options.sasl_username,
            password=options.sasl_password,
            ssl_context=context,
            mechanism=options.sasl_mechanism or "PLAIN",
        )
    raise StreamsError(
        f"unknown Kafka security protocol {protocol!r}: use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
    )


class _FaustRuntime:
    """The core, its producer, and the Faust events not acknowledged yet."""

    def __init__(self, app: Any, options: WorkerOptions) -> None:
        self.app = app
        self.options = options
        self.prefix = options.topic_prefix
        self.conf = kafka_config(options)
        # No pausing here (see the module docstring): the core never asks for it.
        self.core = WorkerCore(options, self.lag, pausing=False)
        self.health = WorkerHealth(self.core, options.metrics_port)
        self.io = KafkaIO(
            self.conf,
            self.prefix,
            self._committed,
            self.health.produced,
        )
        self.unacked: dict[str, collections.deque[tuple[int, Any]]] = collections.defaultdict(
            collections.deque
        )
        self.to_ack: dict[str, int] = {}
        self.asked: dict[TP, int] = {}
        self.stream: Any = None

    # -- offsets: a commit acknowledges the events it covers ---------------------------------------
    def _committed(self, offsets: dict[str, int]) -> None:
        for tp, nxt in offsets.items():
            if nxt > self.to_ack.get(tp, -1):
                self.to_ack[tp] = nxt

    async def perform(self, actions: list[Action]) -> None:
        """Carry the core's actions out, then acknowledge what their checkpoints committed."""
        if actions:
            perform(actions, self.io)
        self.io.poll()
        if not self.to_ack or self.stream is None:
            return
        todo, self.to_ack = self.to_ack, {}
        for tp, nxt in todo.items():
            pending = self.unacked.get(tp)
            while pending and pending[0][0] < nxt:
                await self.stream.ack(pending.popleft()[1])

    # -- backlogs ----------------------------------------------------------------------------------
    def _ktp(self, tp: str) -> TP:
        topic, _, partition = tp.rpartition(":")
        return TP(self.prefix + topic, int(partition))

    def _fetched(self, ktp: TP) -> int | None:
        try:
            hw = self.app.consumer.highwater(ktp)
        except Exception:  # not known yet (no fetch answered for this partition)
            return None
        return None if hw is None or hw < 0 else int(hw)

    def lag(self, tp: str, last_offset: int | None) -> int | None:
        """Records of partition `tp` ("topic:n", unprefixed) after `last_offset` (None: unknown yet)."""
        ktp = self._ktp(tp)
        hw = self._fetched(ktp)
        if hw is None:
            hw = self.asked.get(ktp)
        if hw is None:
            return None
        if last_offset is None:
            # Nothing read yet: the backlog starts at the committed offset (private: see the module).
            committed = getattr(self.app.consumer, "_committed_offset", {}).get(ktp)
            last_offset = -1 if committed is None else int(committed) - 1
        return max(0, hw - (last_offset + 1))

    async def ask_ends(self) -> None:
        """Ask the broker for the end offsets of the assigned partitions no fetch has answered for."""
        tps = [self._ktp(tp_key(t, p)) for t in INPUT_TOPICS for p in sorted(self.core.assigned)]
        unknown = [tp for tp in tps if self._fetched(tp) is None]
        if not unknown:
            return
        try:
            ends = await self.app.consumer.highwaters(*unknown)
        except Exception as exc:  # the broker will answer a later tick
            log.debug("end offsets of %d partitions not known yet: %s", len(unknown), exc)
            return
        self.asked.update({tp: int(end) for tp, end in ends.items() if end is not None})

    # -- records and rebalances ------------------------------------------------------------------
    def unprefix(self, topic: str) -> str:
        return topic[len(self.prefix) :] if self.prefix and topic.startswith(self.prefix) else topic

    def assign(self, parts: set[int]) -> None:
        new = parts - self.core.assigned
        if new:
            self.core.assign(new, restore(self.conf, self.options, new))

    async def receive(self, fevent: Any) -> None:
        msg = fevent.message
        topic = self.unprefix(msg.topic)
        if msg.partition not in self.core.assigned:
            # Faust delivered a record before its assignment signal reached us: restore first.
            self.assign({msg.partition})
        timestamp = msg.timestamp
        rec = Record(
            topic,
            msg.partition,
            msg.offset,
            msg.key,
            msg.value,
            int(timestamp * 1000) if timestamp and timestamp > 0 else None,
        )
        self.unacked[rec.tp].append((msg.offset, fevent))
        await self.perform(self.core.receive([rec]))

    async def revoked(self) -> None:
        """Checkpoint everything, acknowledge it, and forget it (the next owner restores it)."""
        if self.core.assigned:
            try:
                await self.perform(self.core.revoke())
            except StreamsError as exc:  # the next owner re-reads from the last checkpoint
                log.warning("no checkpoint at revocation: %s", exc)
        self.core.lose()
        self.unacked.clear()
        self.to_ack.clear()
        self.asked.clear()


def build_app(options: WorkerOptions) -> faust.App:
    """The Faust app: one agent feeding the worker core, timers for its ticks and health."""
    options.workdir.mkdir(parents=True, exist_ok=True)
    prefix = options.topic_prefix
    app = App(
        prefix + options.app_id,
        broker=[f"kafka://{host.strip()}" for host in options.bootstrap.split(",") if host.strip()],
        store="memory://",
        datadir=str(options.workdir / "faust"),
        processing_guarantee="at_least_once",
        topic_partitions=options.partitions,
        # Faust's own assignor topic; it cannot ask for the broker's default.
        topic_replication_factor=max(1, options.replication_factor),
        broker_credentials=broker_credentials(options),
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=2.0,
        # A killed worker's membership blocks its successor until the session times out.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=3.0,
        stream_wait_empty=False,
        stream_buffer_maxsize=16_384,
        broker_max_poll_records=5_000,
        consumer_max_fetch_size=8 * 1024 * 1024,
        key_serializer="raw",
        value_serializer="raw",
        **options.extra,
    )
    runtime = _FaustRuntime(app, options)
    app.ranksight_runtime = runtime  # type: ignore[attr-defined]
    names = [prefix + t for t in INPUT_TOPICS]
    inputs = app.topic(*names, key_serializer="raw", value_serializer="raw")

    @app.agent(inputs, concurrency=1)
    async def detect(stream: Any) -> None:
        runtime.stream = stream
        async for fevent in stream.noack().events():
            await runtime.receive(fevent)

    @app.timer(min(0.25, options.align_idle_s / 4))
    async def _tick() -> None:
        await runtime.perform(runtime.core.tick())

    @app.timer(ASK_ENDS_S)
    async def _ends() -> None:
        if runtime.core.assigned:
            await runtime.ask_ends()

    @app.timer(METRICS_S)
    async def _metrics() -> None:
        runtime.health.publish_metrics()

    @app.timer(options.stats_interval_s)
    async def _stats() -> None:
        runtime.health.log_progress()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def _assigned(app_: Any, assigned: Any, **kwargs: Any) -> None:
        runtime.asked.clear()
        runtime.assign({tp.partition for tp in assigned if tp.topic in names})

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def _revoked(app_: Any, revoked: Any, **kwargs: Any) -> None:
        await runtime.revoked()

    return app


def run_faust(options: WorkerOptions) -> None:
    """Start the Faust worker and block until it is stopped (SIGINT/SIGTERM stop it within seconds)."""
    from aiokafka.codec import has_lz4
    from faust.worker import Worker

    from streams.runtime.stop import install_stop_deadline

    if not has_lz4():
        # Producers compress with lz4; aiokafka cannot read such batches without cramjam.
        raise StreamsError(
            "the worker cannot read lz4-compressed topics: pip install cramjam (aiokafka[lz4])"
        )
    ensure_topics(options, kafka_config(options))

    class _Worker(Worker):
        def install_signal_handlers(self, *args: Any, **kwargs: Any) -> None:
            super().install_signal_handlers(*args, **kwargs)
            install_stop_deadline()

    started = time.monotonic()
    app = build_app(options)
    log.info("app built in %.2f s", time.monotonic() - started)
    worker = _Worker(app, loglevel=options.log_level, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
