"""One partition's detection in one stage: its inputs in event-time order into one engine, and its snapshot.

Pure: records and time in, actions out (`streams.runtime.checkpoint`); no Kafka or Faust here.
A worker runs two kinds of task per partition p (issue 19):

* the rank stage: partition p of every job-keyed topic (a job's records keyed by job and node, so
  one job spreads over many partitions) into a rank-stage engine, which runs the rules of a job's
  node and summarises its ranks; what it passes on (`StageEngine.drain_forwarded`: summaries,
  job-level records, bindings, faults, the leader rank's steps, its alerts) goes to
  `rs.internal.summaries` keyed by job, followed by a `StageProgress` marker to every partition
  saying how far it has sent everything;
* the job stage: partition p of `rs.internal.summaries` into a job-stage engine, released in
  event-time order (then a fixed tie order) once every rank-stage partition's marker has passed it.

The task holds records in an `Aligner` until every input that still has records to read has
reached their event time, feeds them to its engine, encodes the engine's outputs as sends, and
checkpoints when due: its snapshot is one changelog value, a JSON header (sequence number, the next
offset of every input partition the engine already holds, the newest telemetry time per source,
the markers) and the engine's own snapshot.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from schemas.codec import Codec
from schemas.errors import EncodeError
from schemas.eventtime import MIN_EVENT_TS, event_ts
from schemas.records import Event
from schemas.topics import (
    SCHEDULER_STATES,
    TELEMETRY_JOB,
    TRAINING_EVENTS,
    TRAINING_STEPS,
    job_keys,
    key_for,
    shard_key,
    topic_for,
)
from streams.alerting.routing import Router
from streams.config import EngineConfig
from streams.errors import StreamsError
from streams.runtime.aligner import Aligner, LagFn, tp_key
from streams.runtime.changelog import MAX_SNAPSHOT_BYTES, SNAPSHOT_TABLE, changelog_topic, state_key
from streams.runtime.checkpoint import Action, Checkpoint, Send
from streams.runtime.guard import WallClockGuard
from streams.runtime.handoff import Handoff
from streams.runtime.intake import ClockRejected, Intake, Record
from streams.runtime.options import (
    CONTROL,
    JOB_TOPICS,
    STAGE_TOPICS,
    SUMMARIES,
    TELEMETRY_BY_JOB,
    WorkerOptions,
)
from streams.stages.engine import StageEngine, tiebreak
from streams.stages.placement import Placement, is_shared

__all__ = [
    "TASK_COUNTS",
    "PartitionTask",
    "decode_snapshot",
    "decode_snapshot_meta",
    "encode_snapshot",
    "pick_latest_snapshot",
]

log = logging.getLogger("ranksight.worker")
# The job stage forgets what it took below its watermark once it remembers this many records.
_TAKEN_PRUNE_AT = 10_000


def encode_snapshot(
    seq: int,
    offsets: dict[str, int],
    engine_bytes: bytes,
    seen: dict[str, int] | None = None,
    markers: dict[str, list[Any]] | None = None,
    silence: dict[str, Any] | None = None,
) -> bytes:
    """Changelog value: one JSON header line (sequence, next offset per source partition, telemetry
    seen, the rank stages' markers, the worker's firing `input_silent`) + the snapshot."""
    meta: dict[str, Any] = {"seq": seq, "offsets": dict(sorted(offsets.items()))}
    if seen:
        meta["seen"] = dict(sorted(seen.items()))
    if markers:
        meta["markers"] = dict(sorted(markers.items()))
    if silence:
        meta["silence"] = silence
    header = json.dumps(meta, separators=(",", ":"))
    return header.encode() + b"\n" + engine_bytes


def decode_snapshot_meta(value: bytes) -> tuple[dict[str, Any], bytes]:
    """The header dict and the engine bytes of a changelog value."""
    head, _, body = value.partition(b"\n")
    try:
        meta = json.loads(head)
        meta["seq"] = int(meta["seq"])
        meta["offsets"] = {str(k): int(v) for k, v in meta["offsets"].items()}
        meta["seen"] = {str(k): int(v) for k, v in meta.get("seen", {}).items()}
        meta["markers"] = {str(k): list(v) for k, v in meta.get("markers", {}).items()}
        meta["silence"] = _silence(meta.get("silence"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StreamsError(
            f"engine snapshot header is corrupt ({exc}); delete the worker's changelog topic"
        ) from None
    return meta, body


def _silence(value: Any) -> dict[str, Any] | None:
    """A header's firing `input_silent` (`InputSilence.state`), checked; None when absent."""
    if not value:
        return None
    inherited = [
        {"since": int(i["since"]), "tracker": dict(i["tracker"])} for i in value.get("inherited", [])
    ]
    return {"since": int(value["since"]), "tracker": dict(value["tracker"]), "inherited": inherited}


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
    """ "G|node|gpu" / "H|node" for telemetry (the at-least-once side path may repeat it), else None."""
    r = event.record
    if event.type == "GpuSample":
        return f"G|{r['node']}|{r.get('gpu_uuid')}"
    if event.type == "HostSample":
        return f"H|{r['node']}"
    return None


# Counters of one task (summed over tasks in the progress line).
TASK_COUNTS: tuple[str, ...] = (
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
    "flow_resets",  # paused partitions resumed because nothing was released (never expected)
    "forwarded",  # records the rank stage passed to the job stage
    "markers",  # StageProgress markers sent (rank stage) or read (job stage)
    "repeated",  # job stage: a record the rank stage sent again after a restart, dropped
    "shed_jobs",  # jobs evicted because the partition's snapshot outgrew the changelog's limit
    "finishes",  # the end of a finite input: everything held released, event time at the newest read
    "untrusted_states",  # JobStateChanged on the training topic not believed (--job-states scheduler)
)


class PartitionTask:
    """Partition p of one stage's topics: aligner, engine, and what a checkpoint must cover."""

    COUNTS = TASK_COUNTS

    def __init__(
        self,
        partition: int,
        config: EngineConfig,
        router: Router,
        options: WorkerOptions,
        codec: Codec,
        intake: Intake,
        now: float,
        kind: str = "rank",
    ) -> None:
        self.partition = partition
        self.kind = kind  # "rank" or "job": the stage this task runs
        self.config = config
        self.router = router
        self.options = options
        self.codec = codec
        self.intake = intake
        self.inputs = JOB_TOPICS if kind == "rank" else STAGE_TOPICS
        # Records another stage of this worker re-keyed (unattributed telemetry, control copies, the
        # rank stages' summaries) hold the others back only while they are known to be coming.
        passive_topics = frozenset({TELEMETRY_BY_JOB, CONTROL}) if kind == "rank" else frozenset({SUMMARIES})
        self.snapshot_topic = changelog_topic(options.app_id, SNAPSHOT_TABLE)
        self.snapshot_name = f"{'engine' if kind == 'rank' else 'jobs'}@{partition}"
        self.place = Placement(options.partitions)
        self.holds = self.place.holder(partition) if kind == "rank" else None
        self.engine = StageEngine(config, router, kind, self.holds)
        self.aligner = Aligner(
            options.align_idle_s,
            options.align_max_buffer,
            end_grace_s=options.align_end_grace_s,
            passive_topics=passive_topics,
        )
        self.aligner.expect([tp_key(t, partition) for t in self.inputs], now)
        self.seq = 0
        self.offsets: dict[str, int] = {}  # next offset per input partition already in the engine
        # Newest event time per telemetry source ("G|node|gpu", "H|node") already in the engine:
        # the side path is at-least-once, so a re-forwarded sample is dropped here.
        self.seen: dict[str, int] = {}
        # The worker's `input_silent` while it fires (`InputSilence.state`), carried in this
        # partition's checkpoints so that a worker restarted during the silence goes on with it.
        self.silence: dict[str, Any] | None = None
        # Records that entered the state (released into the engine, rejected, or skipped as already
        # in it) since the last checkpoint: a held record counts once it leaves the aligner.
        self.uncommitted = 0
        self.last_checkpoint_at: float | None = None  # monotonic time of the last checkpoint
        self.last_receive: float | None = None  # when a record last came (None: never)
        self.counts = dict.fromkeys(TASK_COUNTS, 0)
        self.telemetry_ts: int | None = None  # newest telemetry sample fed to the engine
        self.checkpointed_offsets: dict[str, int] = {}  # the offsets of the last snapshot taken
        self.max_snapshot_bytes = MAX_SNAPSHOT_BYTES  # what the changelog takes (tests set less)
        # Job stage: each rank-stage partition's marker, str(source) -> [ts, idle].
        self.markers: dict[str, list[Any]] = {}
        # Job stage: when each rank-stage partition's marker last moved forward (monotonic): another
        # worker's input still flows while its markers move (`WorkerCore.input_silent_s`).
        self.marker_moved_at: dict[str, float] = {}
        # Rank stage: the last marker sent, [ts, idle].
        self.marker_sent: list[Any] = [None, None]
        # Job stage: what it took at or after its watermark (a record the rank stage sends again
        # after a restart from its checkpoint is the same bytes; older ones are late anyway).
        self._taken: dict[tuple[Any, ...], int] = {}
        self._prune_at = _TAKEN_PRUNE_AT
        # (target, records processed) of the last `finish`: not repeated until one of them changes.
        self._finished: tuple[int | None, int] | None = None
        # What this process's rank stages sent its job stages, not decoded again (`Handoff`; the core sets it).
        self.handoff: Handoff | None = None

    # -- state -----------------------------------------------------------------------------
    def restore(self, value: bytes | None) -> None:
        """Load this partition's snapshot (None: start from an empty engine)."""
        if not value:
            log.info("partition %d: no engine snapshot, starting from empty state", self.partition)
            return
        meta, body = decode_snapshot_meta(value)
        self.seq, self.offsets, self.seen = meta["seq"], meta["offsets"], meta["seen"]
        self.silence = meta["silence"]
        self.engine = StageEngine.restore(body, self.config, self.router, self.kind, self.holds)
        # A rank-stage partition idle then may not be now (it restarts from its own checkpoint and
        # sends again): wait for each one's next marker before following the worker past it. Nor
        # past the engine's own time: the snapshot's markers were read past its offsets (those stop
        # at the oldest record still held), so the records read again after them would be late.
        wm = self.engine.watermark
        self.markers = {
            k: [v[0] if wm is None or v[0] is None else min(int(v[0]), wm), False]
            for k, v in meta["markers"].items()
        }
        log.warning(
            "partition %d: restored engine snapshot seq=%d (%d bytes, %d alerts firing)",
            self.partition,
            self.seq,
            len(body),
            len(self.engine.firing()),
        )

    def checkpoint_due(self, alert_changed: bool, now: float) -> bool:
        """An alert transition, `checkpoint_events` records, or `checkpoint_interval_ms` of processing.

        The interval is wall-clock time (`now`, monotonic seconds), like Kafka Streams' commit
        interval: it bounds the work a restart repeats. In event time a catch-up of an hour-old
        backlog checkpointed every few hundred records, a snapshot and two broker round trips each.
        """
        if alert_changed or self.uncommitted >= self.options.checkpoint_events:
            return True
        if self.last_checkpoint_at is None:
            self.last_checkpoint_at = now
            return False
        return bool(self.uncommitted) and (
            now - self.last_checkpoint_at >= self.options.checkpoint_interval_ms / 1000
        )

    def checkpoint(self, now: float) -> Checkpoint:
        """The next snapshot as a checkpoint; its offsets never claim records still held here."""
        self.seq += 1
        self.last_checkpoint_at = now
        offsets = {}
        for tp, nxt in self.offsets.items():
            held = self.aligner.lowest_held(tp)
            offsets[tp] = nxt if held is None else min(nxt, held)
        self.checkpointed_offsets = offsets
        outputs: list[Action] = []
        value = self._snapshot_value(offsets)
        while len(value) > self.max_snapshot_bytes and self.engine.jobs_held:
            # Too big for the changelog (Kafka would refuse it and the worker would stop and re-read
            # the same records forever): shed a quarter of the jobs, least recently heard first.
            shed = max(1, self.engine.jobs_held // 4)
            log.warning(
                "partition %d (%s stage): snapshot of %d bytes is over the changelog's %d; evicting %d of %d jobs",
                self.partition,
                self.kind,
                len(value),
                self.max_snapshot_bytes,
                shed,
                self.engine.jobs_held,
            )
            self._send_outputs(self.engine.shed(shed), outputs)
            self.counts["shed_jobs"] += shed
            value = self._snapshot_value(offsets)
        self.counts["checkpoints"] += 1
        self.uncommitted = 0
        return Checkpoint(
            f"partition {self.partition} ({self.kind} stage)",
            offsets,
            [Send(self.snapshot_topic, state_key(self.snapshot_name), value, partition=self.partition)],
            [a for a in outputs if isinstance(a, Send)],
        )

    def _snapshot_value(self, offsets: dict[str, int]) -> bytes:
        body = self.engine.snapshot()
        self.counts["snapshot_bytes"] = len(body)
        return encode_snapshot(self.seq, offsets, body, self.seen, self.markers, self.silence)

    # -- records in ----------------------------------------------------------------------------
    def already_seen(self, tp: str, offset: int) -> bool:
        """True when the snapshot already holds this record (redelivered after a restart)."""
        return offset < self.offsets.get(tp, -1)

    def receive(self, rec: Record, now: float) -> tuple[Event | None, list[Action]]:
        """A record of this partition: skipped (already in the state), rejected (dead-lettered when
        the worker owns its topic) or held for alignment. Returns its event (None unless held) and
        what to send now: its dead letter, or the alerts its instant rules raise on arrival."""
        tp = rec.tp
        self.last_receive = now
        # Job stage: a summary this process's rank stage sent (taken here whatever happens next).
        local = self.handoff.take(rec.value) if self.kind == "job" and self.handoff is not None else None
        if self.already_seen(tp, rec.offset):
            self.uncommitted += 1  # its offset is committed with the next checkpoint
            self.counts["skipped"] += 1
            self.aligner.note(tp, rec.offset, None, now)  # read: no longer part of the backlog
            return None, []
        self.counts["events"] += 1
        event, dead = (local, []) if local is not None else self.intake.read(rec)
        if event is None:
            self.counts["rejected"] += 1
            self._mark(tp, rec.offset)
            self.aligner.note(tp, rec.offset, None, now)
            return None, list(dead)
        if self.kind == "rank" and self._untrusted_state(rec, event):
            # A job state from the training topic while only the scheduler's are believed: read and
            # counted (the sink still stores it), never fed to the engine nor copied to others.
            self.counts["untrusted_states"] += 1
            self._mark(tp, rec.offset)
            self.aligner.note(tp, rec.offset, None, now)
            return None, []
        if self.kind == "job":
            if event.type == "StageProgress":
                if self._marker(event.record):
                    self.marker_moved_at[str(event.record["source"])] = now
                self._mark(tp, rec.offset)
                self.aligner.note(tp, rec.offset, None, now)
                return None, []
            self.aligner.push(tp, rec.offset, event_ts(event), (rec, event), now, tiebreak(event))
            return event, []
        self.aligner.push(tp, rec.offset, self.intake.held_ts(rec, event), (rec, event), now)
        return event, self._instant(rec, event)

    def _instant(self, rec: Record, event: Event) -> list[Action]:
        """Rank stage: page the instant rules this record raises now, before alignment releases it
        (`StageEngine.instant`). Not for a copy of a record another partition owns, a GPU fault
        shared with a co-located job, or a telemetry sample the engine already holds."""
        if not self.engine.may_page(event):
            return []  # most records: nothing more to look at
        if rec.topic == CONTROL or (rec.topic == TELEMETRY_BY_JOB and is_shared(rec.key)):
            return []
        ident = _telemetry_source(event)
        if ident is not None and int(event.record["ts"]) <= self.seen.get(ident, -(2**63)):
            return []
        out: list[Action] = []
        try:
            early = self.engine.instant(event, received_ts=self.intake.reference(rec))
        except Exception:
            # The ordered pass judges it again (and skips it there if it breaks a detector).
            log.exception("the instant rules failed on %s at %s@%d", event.type, rec.tp, rec.offset)
            return []
        self._send_outputs(early, out)
        return out

    def _untrusted_state(self, rec: Record, event: Event) -> bool:
        """A JobStateChanged someone other than the scheduler watcher could have written, while the
        worker believes only the scheduler's (`--job-states scheduler`)."""
        return (
            event.type == "JobStateChanged"
            and rec.topic == TRAINING_EVENTS
            and self.options.job_states == "scheduler"
        )

    def _marker(self, r: dict[str, Any]) -> bool:
        """A rank-stage partition says how far it has sent everything (never backwards). True when
        its time moved forward (not the first marker after a start: that may be a restored one)."""
        self.counts["markers"] += 1
        key, ts = str(r["source"]), int(r["ts"])
        old = self.markers.get(key)
        self.markers[key] = [
            ts if old is None or old[0] is None else max(ts, int(old[0])),
            bool(r.get("idle")),
        ]
        return old is not None and old[0] is not None and ts > int(old[0])

    def stage_front(self) -> int | None:
        """Job stage: the event time every rank-stage partition has sent everything through (the
        oldest marker of those not idle; MIN while one has not said; None when all are idle)."""
        fronts = []
        for source in range(self.options.partitions):
            marker = self.markers.get(str(source))
            if marker is None:
                return MIN_EVENT_TS
            if not marker[1]:
                fronts.append(int(marker[0]))
        return min(fronts) if fronts else None

    def _mark(self, tp: str, offset: int) -> None:
        """This record is part of the state now (the next checkpoint's offsets cover it)."""
        self.uncommitted += 1
        if offset + 1 > self.offsets.get(tp, -1):
            self.offsets[tp] = offset + 1

    def drain(
        self, now: float, lag: LagFn, front: int | None, totals: dict[str, int], *, everything: bool = False
    ) -> list[Action]:
        """Feed the engine what the aligner releases; checkpoint when due. `front`: the side path's
        (rank stage); the job stage holds at its markers' front. `everything`: all it holds (`finish`)."""
        self.aligner.set_upstream_front(front if self.kind == "rank" else self.stage_front())
        out: list[Action] = []
        due = False
        released = (
            self.aligner.pop_all()
            if everything
            else self.aligner.pop_ready(now, lag, self.options.release_batch)
        )
        # The batch left the aligner at once: a checkpoint waits for the end of it (its offsets
        # would claim the records of the batch not yet in the engine).
        for tp, offset, (rec, event) in released:
            confirmed = self.engine.stats.get("instant_confirmed", 0)
            if self.kind == "job":
                outputs = self._feed_job(tp, offset, rec, event)
                rejected = None
            else:
                outputs, rejected = self._feed(tp, offset, rec, event, totals)
            if rejected is not None:
                out += self.intake.rejected_for_time(rec, rejected)
                continue
            alert = self._send_outputs(outputs, out)
            # An alert paged on arrival changes the state when the ordered pass raises it (not sent
            # again): a checkpoint then, as for any alert, so that a restart does not page it again.
            alert = alert or self.engine.stats.get("instant_confirmed", 0) != confirmed
            due = self.checkpoint_due(alert, now) or due
        if due:
            out += self._marker_sends(idle=False)  # what the job stage reads goes out first
            out.append(self.checkpoint(now))
        if self.kind == "job":
            # Every rank-stage partition sent everything through its marker: the job stage's event
            # time follows them (a stall is judged on time passing, not only on records coming).
            front = self.stage_front()
            oldest = self.aligner.oldest_held()
            if front is not None and oldest is not None:
                # Never past a record still held here: it would be late for the engine. (Held by this
                # partition's own frontier, the last summary read, which a slower source sets.)
                front = min(front, oldest - 1)
            if (
                front is not None
                and front > MIN_EVENT_TS
                and (self.engine.watermark is None or front > self.engine.watermark)
            ):
                out += self.advance(front, now)
        return out + self._marker_sends(idle=False)

    def _feed_job(self, tp: str, offset: int, rec: Record, event: Event) -> list[Event]:
        """Job stage: one released record into the engine, unless it already took the same bytes
        (the rank stage sends again what it sent after its last checkpoint when it restarts)."""
        self._mark(tp, offset)
        ts = event_ts(event)
        ident = (tiebreak(event), rec.value)
        if ident in self._taken:
            self.counts["repeated"] += 1
            return []
        watermark = self.engine.watermark
        if watermark is not None and len(self._taken) > self._prune_at:
            # Older records are late for the engine anyway; pruning again only once the rest doubled
            # keeps this linear while the watermark stands still.
            self._taken = {k: t for k, t in self._taken.items() if t >= watermark}
            self._prune_at = max(_TAKEN_PRUNE_AT, 2 * len(self._taken))
        self._taken[ident] = ts
        self.counts["processed"] += 1
        return self.engine.process(event)

    def _marker_sends(self, *, idle: bool, force: bool = False) -> list[Action]:
        """Rank stage: what it passed to the job stage since the last call, then (when its front
        moved a bucket, or it went idle or busy) a marker to every job-stage partition."""
        if self.kind != "rank":
            return []
        out: list[Action] = []
        for item in self.engine.drain_forwarded():
            try:
                value = self.codec.encode(item)
            except EncodeError as exc:
                self.counts["unencodable"] += 1
                log.error("dropped a record for the job stage the worker cannot encode: %s", exc)
                continue
            job = str(item.record.get("job_id") or "")
            q = self.place.job(job)
            out.append(Send(SUMMARIES, job.encode(), value, partition=q))
            if self.handoff is not None:
                self.handoff.put(q, value, item)
            self.counts["forwarded"] += 1
        front = self.engine.release_front()
        # Idle (the job stage stops waiting for it) only with nothing left to send: a record held
        # for the watermark would be late once the job stage moved on.
        idle = idle and not self.engine.holds_forwards()
        last, was_idle = self.marker_sent
        bucket = self.config.summary_bucket_ms
        if front is None or (
            not force
            and last is not None
            and was_idle == idle
            and front < last + bucket
            and not (out and idle)
        ):
            return out
        self.marker_sent = [front, idle]
        marker = self.codec.encode(
            Event("StageProgress", {"ts": front, "source": self.partition, "idle": idle})
        )
        out += [Send(SUMMARIES, None, marker, partition=q) for q in self.place.every()]
        self.counts["markers"] += 1
        return out

    def _feed(
        self, tp: str, offset: int, rec: Record, event: Event, totals: dict[str, int]
    ) -> tuple[list[Event], ClockRejected | None]:
        """One released record into the engine: marked as part of the state, counted,
        deduplicated, processed. Returns the outputs, and for a record the engine rejected for its
        time the error to dead-letter it with."""
        self._mark(tp, offset)
        if rec.topic == TELEMETRY_JOB:
            # One source record, one count: a HostSample of N jobs has N copies; count the first.
            keys = job_keys(event.type, event.record)
            if keys and (rec.key or b"") == shard_key(keys[0], event.record.get("node")).encode():
                totals["telemetry_in"] += 1
        elif rec.topic in (TRAINING_STEPS, TRAINING_EVENTS, SCHEDULER_STATES):
            totals["training_in"] += 1  # not the worker's own copies (control, summaries)
        ident = _telemetry_source(event)
        if ident is not None:
            ts = int(event.record["ts"])
            if ts <= self.seen.get(ident, -(2**63)):
                self.counts["duplicates"] += 1
                return [], None
            if self.telemetry_ts is None or ts > self.telemetry_ts:
                self.telemetry_ts = ts
        engine = self.engine
        reference = self.intake.reference(rec)
        # A copy of a job-level record this partition does not own (a broadcast), or a GPU fault a
        # co-located job shares (its own job's engine raises that GPU's alerts).
        forward = rec.topic != CONTROL
        shared = rec.topic == TELEMETRY_BY_JOB and event.type == "GpuSample" and is_shared(rec.key)
        try:
            outputs = engine.process(event, received_ts=reference, forward=forward, shared=shared)
        except Exception:
            # A record that breaks a detector must not crash-loop the worker (it would be
            # redelivered forever): log it with the traceback and go on without it.
            self._remember(ident, event)
            self.counts["engine_errors"] += 1
            log.exception("the engine failed on %s at %s@%d; skipped", event.type, tp, offset)
            return [], None
        if engine.rejection is not None:
            # Wrong in time for detection: the engine raises clock_skew; the record is dead-lettered
            # by the topic's owner (the sink for the topics it stores).
            self.counts["clock_rejected"] += 1
            return [], ClockRejected(engine.rejection, event_ts(event), reference)
        # Not a sample the engine rejected for its time: one stamped 2199 would make every later
        # sample of its GPU look re-forwarded.
        self._remember(ident, event)
        self.counts["processed"] += 1
        return outputs, None

    def _remember(self, ident: str | None, event: Event) -> None:
        if ident is not None:
            ts = int(event.record["ts"])
            if ts > self.seen.get(ident, -(2**63)):
                self.seen[ident] = ts

    def _send_outputs(self, outputs: list[Event], out: list[Action]) -> bool:
        """Encode the engine's outputs as sends; True when one of them is an alert."""
        alert = False
        for output in outputs:
            if output.type == "BaselineRun":
                out += self._share_learned(output)
                continue
            name = topic_for(output.type)
            self.counts["outputs"] += 1
            if output.type == "Alert":
                self.counts["alerts"] += 1
                alert = True
            try:
                value = self.codec.encode(output)
            except EncodeError as exc:
                # A detector produced what its schema cannot hold: lose that output, not the worker.
                self.counts["unencodable"] += 1
                log.error("dropped an output the worker cannot encode: %s", exc)
                continue
            out.append(Send(name, key_for(name, output.record), value))
        return alert

    def _share_learned(self, output: Event) -> list[Action]:
        """Job stage: a run its baselines learned, to every other job-stage partition (what one
        partition learns, all judge with; see `BaselineDetector.adopt`)."""
        learned = Event("BaselineRun", {**output.record, "source": self.partition})
        try:
            value = self.codec.encode(learned)
        except EncodeError as exc:
            self.counts["unencodable"] += 1
            log.error("dropped a learned baseline run the worker cannot encode: %s", exc)
            return []
        key = str(output.record.get("job_id") or "").encode()
        return [Send(SUMMARIES, key, value, partition=q) for q in self.place.others(self.partition)]

    def flow(self, paused: set[str], now: float) -> tuple[list[str], list[str]]:
        """(partitions to pause, to resume): an input with `align_pause_at` records held is ahead
        of a slower one; it is fetched again once half of them left. The partition the others wait
        for holds none (its records are the oldest and leave at once), and records coming from the
        side path are never paused, so pausing never stops what would release the held records.
        Should the aligner still stop releasing (a case this reasoning missed), every partition of
        the task is resumed after `align_idle_s` of no release."""
        pause_at = self.options.align_pause_at
        pause: list[str] = []
        resume: list[str] = []
        stuck = self.aligner.stuck_for(now) >= 2 * self.options.align_idle_s
        for topic in self.inputs:
            if topic in self.aligner.passive_topics:
                continue
            tp = tp_key(topic, self.partition)
            held = self.aligner.held(tp)
            if tp in paused:
                if stuck or held <= pause_at // 2:
                    resume.append(tp)
            elif held >= pause_at and not stuck:
                pause.append(tp)
        if stuck and resume:
            self.counts["flow_resets"] += 1
            log.warning(
                "partition %d: nothing released for %.0f s with %s paused; fetching them again",
                self.partition,
                self.aligner.stuck_for(now),
                ", ".join(resume),
            )
        return pause, resume

    # -- time --------------------------------------------------------------------------------
    def advance(self, watermark: int, now: float) -> list[Action]:
        """Move the engine's event time without input; checkpoint if that changed an alert."""
        out: list[Action] = []
        if self._send_outputs(self.engine.advance(watermark), out):
            out.append(self.checkpoint(now))
        return out + self._marker_sends(idle=False)

    def upstream_done(self) -> int | None:
        """Job stage: once every rank-stage partition said it is idle (sent everything it read), the
        event time through which all of them sent everything (None before)."""
        fronts = []
        for source in range(self.options.partitions):
            marker = self.markers.get(str(source))
            if marker is None or not marker[1] or marker[0] is None:
                return None
            fronts.append(int(marker[0]))
        return min(fronts) if fronts else None

    def finish(self, target: int | None, now: float, lag: LagFn, totals: dict[str, int]) -> list[Action]:
        """The end of a finite input (`WorkerCore.finish`): everything held goes into the engine, whose
        event time follows the worker's (`target`: the newest event time it read minus the allowed
        lateness, as the offline replay's one watermark; job stage: the rank stages' front) and then moves to the newest it
        read itself, releasing everything it holds, as the offline replay's end
        (`StageEngine.finish`). The rank stage then tells the job stage (a marker) and the state is
        checkpointed, so the committed offsets reach the end. Never past what was read: no time is
        invented. Once per target and state: done again only when a record or a newer target came."""
        if (target, self.counts["processed"]) == self._finished:
            return []
        out = self.drain(now, lag, None, totals, everything=True)
        engine = self.engine
        outputs: list[Event] = []
        if target is not None and (engine.watermark is None or target > engine.watermark):
            outputs += engine.advance(target)
        # The job stage's own newest only once no rank-stage partition can send anything older.
        if self.kind == "rank" or (
            target is not None and engine.max_ts is not None and target >= engine.max_ts
        ):
            outputs += engine.finish()
        self._send_outputs(outputs, out)
        self.counts["finishes"] += 1
        self._finished = (target, self.counts["processed"])
        out += self._marker_sends(idle=True, force=True)
        out.append(self.checkpoint(now))
        return out

    def all_read(self, lag: LagFn) -> bool:
        """Nothing held and no unread record on any input partition of this task."""
        if len(self.aligner):
            return False
        for topic in self.inputs:
            tp = tp_key(topic, self.partition)
            if lag(tp, self.aligner.last_offset(tp)) != 0:
                return False
        return True

    def idle(
        self, now: float, wall_ms: int, newest: int | None, lag: LagFn, guard: WallClockGuard
    ) -> list[Action]:
        """Time passes with nothing to release: follow the worker's event time, let the guard
        advance a live engine whose input stopped, checkpoint once input went quiet."""
        if len(self.aligner) or self.last_receive is None:
            return []
        out: list[Action] = []
        engine = self.engine
        silent = now - self.last_receive
        if newest is not None and silent >= self.options.align_idle_s and self.all_read(lag):
            # Everything of this partition is read and nothing came for a while: its event time
            # follows this worker's newest, so a job whose input stopped times out in a catch-up or
            # replay too. (Not sooner: a backlog being published reads "all read" between two
            # producer batches, and records older than the advanced watermark would be late.)
            front = newest - self.config.allowed_lateness_ms
            if self.kind == "job":
                # The job stage never passes a rank-stage partition that has not sent everything
                # (its records would be late here): it follows the worker only as far as the markers.
                stage = self.stage_front()
                front = front if stage is None else min(front, stage)
            if engine.watermark is None or front > engine.watermark:
                self.counts["front_advances"] += 1
                out += self.advance(front, now)
        wm = guard.watermark(wall_ms, silent, engine.max_ts, engine.watermark)
        if wm is not None:
            # All input stopped while live: let timeouts fire on wall-clock time.
            self.counts["guard_advances"] += 1
            out += self.advance(wm, now)
        # Input went quiet: checkpoint what was read, so the committed offsets reach the end
        # (consumer lag reads 0 once caught up, and a restart replays nothing).
        quiet = silent >= self.options.align_idle_s and self.all_read(lag)
        out += self._marker_sends(idle=quiet)
        if silent >= self.options.align_idle_s and self.uncommitted:
            out.append(self.checkpoint(now))
        return out
