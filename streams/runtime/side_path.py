"""The side path: unattributed telemetry, re-keyed by job through the bindings the tasks read.

Pure: records and time in, actions out; no Kafka or Faust here. Telemetry the node agent could not
attribute to a job arrives keyed by node on `rs.telemetry.unattributed`. The tasks forward every
RankBound (and job end) they read to `rs.internal.bindings`, keyed by node; the side path reads both
in event-time order, keeps each node's routes (`NodeRoutes`, persisted to the routes changelog as
they change) and forwards each sample to `rs.internal.telemetry-by-job`, keyed by the job its GPU /
node is bound to, which the tasks read like any other input.

A GPU fault (an XID, an uncorrectable ECC error) concerns every job on its node: recovering the
GPU takes a reset or a drain that stops them all. A task that reads one forwards a copy to the side
path (on `rs.internal.bindings`, keyed by node), which sends it on to the node's other jobs, so each
job's task raises the alert its team gets (what the offline replay's single engine does).

The two stages wait on each other's progress, never on time (`fronts`): a task holds its engine
at the oldest event time the side path has not forwarded yet (so a re-keyed sample is not late for
its job), and the side path holds at the oldest event time whose bindings it may not have yet (so
a sample does not overtake the RankBound that names its job).
"""

from __future__ import annotations

import collections
import json
import logging
from collections.abc import Callable
from typing import Any

from schemas.eventtime import MIN_EVENT_TS
from schemas.records import Event
from schemas.topics import SCHEDULER_STATES, TELEMETRY_JOB, TELEMETRY_UNATTRIBUTED, TRAINING_EVENTS
from streams.runtime.aligner import Aligner, LagFn, tp_key
from streams.runtime.changelog import ROUTES_TABLE, changelog_topic, state_key
from streams.runtime.checkpoint import Action, Checkpoint, Send
from streams.runtime.intake import Intake, Record
from streams.runtime.options import (
    BINDINGS,
    CONTROL,
    FORWARD_BATCH,
    FORWARD_HOP_S,
    TELEMETRY_BY_JOB,
    WorkerOptions,
)
from streams.runtime.task import PartitionTask
from streams.stages.placement import FaultCopies, Placement
from streams.stages.routes import NodeRoutes

__all__ = ["InFlight", "SidePath"]

log = logging.getLogger("ranksight.worker")


class InFlight:
    """Records one stage sent to a topic the other stage reads, until that stage has read them:
    [sent at, event time, partition, offset once delivered]. Progress, not time: a send is pending
    until delivered and the reader's last offset of its partition is past it. Only a partition this
    worker does not hold (another worker reads it) falls back to a time bound, `FORWARD_HOP_S`."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.sent: collections.deque[list[Any]] = collections.deque()

    def add(self, ts: int, partition: int, now: float) -> list[Any]:
        """Note one send; the runtime passes the entry to `delivered` when Kafka acknowledged it."""
        entry = [now, ts, partition, None]
        self.sent.append(entry)
        return entry

    @staticmethod
    def delivered(entry: list[Any], offset: int | None) -> None:
        """The send's offset (None: it failed; the worker stops on failed sends anyway)."""
        entry[3] = -1 if offset is None else offset

    def oldest(self, read: Callable[[str], int | None], assigned: set[int], now: float) -> int | None:
        """The oldest event time among the sends not read yet (None: all read); `read(tp)` is the
        reader's last offset of a partition, asked once per partition."""
        last: dict[int, int | None] = {}

        def done(entry: list[Any]) -> bool:
            sent_at, _, part, offset = entry
            if part not in assigned:
                return bool(now - sent_at > FORWARD_HOP_S)
            if offset is None:
                return False
            if part not in last:
                last[part] = read(tp_key(self.topic, part))
            seen = last[part]
            return offset < 0 or (seen is not None and seen >= offset)

        while self.sent and done(self.sent[0]):
            self.sent.popleft()
        return min((entry[1] for entry in self.sent if not done(entry)), default=None)

    def delivering(self) -> bool:
        """Some send is not acknowledged by Kafka yet."""
        return any(entry[3] is None for entry in self.sent)

    def clear(self) -> None:
        self.sent.clear()


class SidePath:
    """Routes of this worker's nodes, the node-keyed aligner, and what is forwarded but not read yet."""

    def __init__(
        self, options: WorkerOptions, intake: Intake, totals: dict[str, int], end_states: frozenset[str]
    ) -> None:
        self.options = options
        self.end_states = end_states  # job states after which a job's routes are dropped
        self.intake = intake
        self.totals = totals
        self.n = options.partitions
        self.place = Placement(options.partitions)
        self.routes_topic = changelog_topic(options.app_id, ROUTES_TABLE)
        self.routes = NodeRoutes(options.unbound_interval_ms)
        self.aligner = Aligner(
            options.align_idle_s, options.align_max_buffer, end_grace_s=options.align_end_grace_s
        )
        self.offsets: dict[str, int] = {}  # next offset per node-topic partition forwarded / applied
        self.uncommitted = 0
        self.forwards = InFlight(TELEMETRY_BY_JOB)  # forwards the tasks have not read yet
        self.bindings = InFlight(BINDINGS)  # bindings the side path has not read yet
        self.faults = InFlight(BINDINGS)  # GPU fault copies the side path has not read yet
        self.controls = InFlight(CONTROL)  # job-level copies a rank-stage task has not read yet
        # The last healthy sample of each GPU: sent along before the GPU's first fault copy.
        self.faults_seen: FaultCopies[Record] = FaultCopies()
        # Event time through which every unattributed sample is forwarded and read (None: nothing
        # pending); the tasks hold their engines there. MIN until first computed.
        self.front: int | None = MIN_EVENT_TS

    # -- assignment ---------------------------------------------------------------------------
    def assign(self, parts: set[int], routes: dict[str, dict[str, Any]], now: float) -> None:
        """Newly assigned partitions: their nodes' routes, and hold until their inputs deliver."""
        for node, state in routes.items():
            self.routes.load(node, state)
        self.aligner.expect(
            sorted(tp_key(t, p) for t in (TELEMETRY_UNATTRIBUTED, BINDINGS) for p in parts), now
        )

    def forget(self) -> None:
        """Everything unacknowledged will be redelivered: drop all state (restored at the next assignment)."""
        self.routes.forget_nodes(lambda node: False)
        self.aligner.clear()
        self.offsets.clear()
        self.uncommitted = 0
        self.forwards.clear()
        self.bindings.clear()
        self.faults.clear()
        self.controls.clear()
        self.faults_seen.clear()
        self.front = MIN_EVENT_TS

    # -- records in ---------------------------------------------------------------------------
    def receive(self, rec: Record, now: float) -> list[Action]:
        """A record of `rs.telemetry.unattributed` or `rs.internal.bindings`: held for alignment,
        or rejected (counted as read, so a bad last record does not leave a backlog of 1)."""
        event, dead = self.intake.read(rec)
        if event is None:
            self.aligner.note(rec.tp, rec.offset, None, now)
            self._done(rec.tp, rec.offset)
            return list(dead)
        self.aligner.push(rec.tp, rec.offset, self.intake.held_ts(rec, event), (rec, event), now)
        return []

    def binding_read(self, rec: Record, event: Event, assigned: set[int], now: float) -> list[Action]:
        """A task read a training event: a RankBound goes to `rs.internal.bindings` keyed by node,
        a job's end to every partition (the nodes of a job are known where its bindings are).

        The sends are part of the task's outputs: delivered before its checkpoint commits the record.
        """
        if event.type == "RankBound":
            key = str(event.record["node"]).encode()
            part = self.place.node(event.record["node"])
            if part in assigned:
                self.routes.bind(event.record)  # local fast path; the topic copy makes it durable
            self.totals["bindings"] += 1
            flight = self.bindings.add(self.intake.held_ts(rec, event), part, now)
            return [Send(BINDINGS, key, rec.value, partition=part, flight=flight)]
        if event.type == "JobStateChanged" and event.record["state"] in self.end_states:
            key = str(event.record["job_id"]).encode()
            return [Send(BINDINGS, key, rec.value, partition=part) for part in self.place.every()]
        return []

    def fault_read(self, rec: Record, event: Event, now: float) -> list[Action]:
        """A task read job telemetry: a GPU fault goes to the side path of its node, to be shared
        with the node's other jobs (part of the task's outputs, like a binding)."""
        if event.type != "GpuSample":
            return []
        r = event.record
        copies = self.faults_seen.copies(r, rec)
        key = str(r["node"]).encode()
        part = self.place.node(r["node"])
        out: list[Action] = []
        for copy in copies:
            ts = self.intake.held_ts(copy, event if copy is rec else self.intake.codec.decode(copy.value))
            flight = self.faults.add(ts, part, now)
            out.append(
                Send(BINDINGS, key, copy.value, partition=part, timestamp_ms=copy.timestamp_ms, flight=flight)
            )
        return out

    # -- release ------------------------------------------------------------------------------
    def drain(self, now: float, lag: LagFn, *, everything: bool = False) -> list[Action]:
        """Apply bindings and forward unattributed telemetry, in event-time order (`everything`: all
        that is held, the end of a finite input)."""
        out: list[Action] = []
        released = (
            self.aligner.pop_all()
            if everything
            else self.aligner.pop_ready(now, lag, self.options.release_batch)
        )
        for tp, offset, (rec, event) in released:
            self._done(tp, offset)
            if event.type in ("RankBound", "JobStateChanged"):
                out += self._apply_binding(rec, event)
                continue
            if rec.topic == BINDINGS:
                # A GPU fault a task read: to the node's other jobs, unless their task already has it.
                parts = self.place.shared(self.routes, event, self.place.source(event))
                self.totals["faults_shared"] += bool(parts)
            else:
                parts = self.place.routed(self.routes, event)
                self.totals["telemetry_in"] += 1
                if not parts:
                    self.totals["unbound_thinned"] += 1
                if event.type == "GpuSample":
                    out += self._share_routed(rec, event, parts, now)
            if not parts:
                continue
            ts = self.intake.held_ts(rec, event)
            for part, key in sorted(parts.items()):
                flight = self.forwards.add(ts, part, now)
                out.append(
                    Send(
                        TELEMETRY_BY_JOB,
                        key.encode(),
                        rec.value,
                        partition=part,
                        timestamp_ms=rec.timestamp_ms,
                        flight=flight,
                    )
                )
                self.totals["forwarded"] += 1
        if self.uncommitted >= FORWARD_BATCH:
            out.append(self.checkpoint())
        return out

    def _share_routed(self, rec: Record, event: Event, parts: dict[int, str], now: float) -> list[Action]:
        """An unattributed GPU sample: a fault also goes to the node's other jobs (those not in
        `parts`), after the GPU's last healthy sample, which their engines have not seen; both name
        the GPU's job (its binding), which those engines do not hold."""
        copies = self.faults_seen.copies(event.record, rec)
        if not copies:
            return []
        shared = self.place.shared(self.routes, event, parts)
        self.totals["faults_shared"] += bool(shared)
        out: list[Action] = []
        for copy in copies:
            copy_event = event if copy is rec else self.intake.codec.decode(copy.value)
            named = self.routes.with_holder(copy_event)
            value = copy.value if named is copy_event else self.intake.codec.encode(named)
            ts = self.intake.held_ts(copy, copy_event)
            for part, key in sorted(shared.items()):
                out.append(
                    Send(
                        TELEMETRY_BY_JOB,
                        key.encode(),
                        value,
                        partition=part,
                        timestamp_ms=copy.timestamp_ms,
                        flight=self.forwards.add(ts, part, now),
                    )
                )
                self.totals["forwarded"] += 1
        return out

    def _done(self, tp: str, offset: int) -> None:
        if offset + 1 > self.offsets.get(tp, -1):
            self.offsets[tp] = offset + 1
        self.uncommitted += 1

    def _apply_binding(self, rec: Record, event: Event) -> list[Action]:
        """A binding read on partition p: update (and persist) the routes of p's nodes it changes."""
        p = rec.partition
        if event.type == "RankBound":
            changed = [self.routes.bind(event.record)]
        else:
            mine = [name for name in self.routes.nodes if self.place.node(name) == p]
            changed = self.routes.end_job(str(event.record["job_id"]), mine)
        out: list[Action] = []
        for node in changed:
            state = self.routes.state_of(node)
            value = json.dumps(state).encode() if state else b""
            out.append(Send(self.routes_topic, state_key(node), value, partition=p))
        return out

    def checkpoint(self) -> Checkpoint:
        """Forwards and route changes delivered -> the side path's offsets committed."""
        self.uncommitted = 0
        offsets = {}
        for tp, nxt in self.offsets.items():
            held = self.aligner.lowest_held(tp)
            offsets[tp] = nxt if held is None else min(nxt, held)
        return Checkpoint("the side path", offsets)

    def delivering(self) -> bool:
        """Something this worker sent to a topic it reads back is not acknowledged yet."""
        return any(f.delivering() for f in (self.forwards, self.bindings, self.faults, self.controls))

    # -- the two stages' fronts ------------------------------------------------------------------
    def fronts(
        self, tasks: dict[int, PartitionTask], assigned: set[int], lag: LagFn, now: float
    ) -> int | None:
        """How far each stage got, for the other to wait on (neither waits when the other has
        nothing pending, as live). Sets the side path's upstream front and returns the tasks':

        - tasks hold their engines at the oldest event time the side path has not forwarded yet and
          they have not read: records held here, unread unattributed partitions, forwards not read
          back; so a re-keyed sample is not late for its job;
        - the side path holds at the oldest event time whose bindings it may not have yet: unread
          `rs.training.events` partitions, bindings it has not read back; so a sample does not
          overtake the RankBound that names its job.
        """

        def task_read(tp: str) -> int | None:
            task = tasks.get(int(tp.rpartition(":")[2]))
            return task.aligner.last_offset(tp) if task is not None else None

        pending = [
            ts
            for ts in (
                self.forwards.oldest(task_read, assigned, now),
                self.faults.oldest(self.aligner.last_offset, assigned, now),
                self.controls.oldest(task_read, assigned, now),
                self.aligner.oldest_held(),
            )
            if ts is not None
        ]
        waiting = [
            ts for ts in (self.bindings.oldest(self.aligner.last_offset, assigned, now),) if ts is not None
        ]
        for p in assigned:
            tp = tp_key(TELEMETRY_UNATTRIBUTED, p)
            left = lag(tp, self.aligner.last_offset(tp))
            if left is None or left > 0:
                pending.append(self.aligner.last_ts(tp) or MIN_EVENT_TS)
            task = tasks.get(p)
            # Unread job telemetry may hold a GPU fault to share with another job's task.
            tp = tp_key(TELEMETRY_JOB, p)
            left = lag(tp, task.aligner.last_offset(tp) if task else None)
            if left is None or left > 0:
                pending.append((task.aligner.last_ts(tp) if task else None) or MIN_EVENT_TS)
            tp = tp_key(TRAINING_EVENTS, p)
            left = lag(tp, task.aligner.last_offset(tp) if task else None)
            if left is None or left > 0:
                at = (task.aligner.last_ts(tp) if task else None) or MIN_EVENT_TS
                waiting.append(at)
                pending.append(at)  # may hold a JobStarted every rank-stage task needs a copy of
            tp = tp_key(SCHEDULER_STATES, p)
            left = lag(tp, task.aligner.last_offset(tp) if task else None)
            if left is None or left > 0:  # may hold a job's end every rank-stage task needs a copy of
                pending.append((task.aligner.last_ts(tp) if task else None) or MIN_EVENT_TS)
        self.aligner.set_upstream_front(min(waiting) if waiting else None)
        self.front = min(pending) if pending else None
        return self.front
