"""The worker core: one process's partition tasks and side path; records and time in, actions out.

Pure: no Kafka or Faust here. A runtime (the librdkafka loop in `streams.runtime.loop`, the Faust
adapter in `streams.runtime.faust_adapter`) hands it what its consumer read (`receive`), calls
`tick` a few times a second, tells it about rebalances (`assign`, `revoke`, `lose`) and carries out
the actions it returns in order (`streams.runtime.checkpoint.perform`). How many records are left
to read per input partition comes from the runtime (`lag`), which knows its consumer's view of the
broker. Everything here is the same whichever runtime drives it, so both give the same alerts.

* Two stages (issue 19): partition p of every job-keyed topic meets in rank-stage task p (a job's
  records are keyed by job and node, so one job spreads over many partitions, while each rank's
  stay in order); what the rank stages pass on reaches job-stage task p of `rs.internal.summaries`
  (keyed by job), which runs the job-level rules. JobStarted / JobStateChanged read by the task of
  the job's partition are copied to every rank-stage partition (`rs.internal.jobs`).
* Unattributed telemetry takes the side path (`SidePath`), which never holds a job's own records back.
* Event time moves without input too: a task whose inputs are all read follows the newest event time
  of this worker's other tasks (as the offline replay's one watermark does), and a wall-clock guard
  advances a task silent for `guard_s` while its event time is live, so timeouts fire when a job's
  input stops (never for historical data). When every source input of the worker stops at once (and
  no other worker's rank stage moves on either), the guard holds instead and the worker raises one
  `input_silent` alert (`InputSilence`) rather than a stall for every job; a record resolves it.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable

from schemas.codec import Codec
from schemas.records import Event
from schemas.topics import ALERTS, TELEMETRY_JOB, key_for
from streams.alerting.routing import Router, load_router
from streams.config import EngineConfig, load_config
from streams.runtime.aligner import Aligner, LagFn, tp_key
from streams.runtime.changelog import Restored
from streams.runtime.checkpoint import Action, Flow, Send
from streams.runtime.guard import InputSilence, WallClockGuard
from streams.runtime.handoff import Handoff
from streams.runtime.intake import Intake, Record
from streams.runtime.options import (
    CONTROL,
    JOB_EVENT_TOPICS,
    NODE_TOPICS,
    SIDE_FRONT_S,
    SOURCE_TOPICS,
    SUMMARIES,
    WorkerOptions,
)
from streams.runtime.side_path import SidePath
from streams.runtime.task import PartitionTask

__all__ = ["TOTALS", "WorkerCore", "worker_codec"]

log = logging.getLogger("ranksight.worker")

# Counters of the whole worker (the tasks count their own: `PartitionTask.COUNTS`).
TOTALS: tuple[str, ...] = (
    "telemetry_in",
    "training_in",
    "forwarded",
    "unbound_thinned",
    "bindings",
    "faults_shared",  # GPU faults sent on to the other jobs of their node
    "bad_input",
    "deadletter",
    "stuck_reports",  # an aligner held records without releasing any for `stuck_log_s` (logged)
    "paused",  # times an input partition was paused because it ran ahead of a slower one
    "input_silent",  # times every source input went silent while live (one input_silent alert each)
)


def worker_codec(options: WorkerOptions) -> Codec:
    """The codec the worker reads and writes with (a schema registry's framing when configured)."""
    if not options.schema_registry_url:
        return Codec()
    from schemas.codec import codec_from_settings

    return codec_from_settings(options.schema_registry_url)


class WorkerCore:
    """The tasks of the assigned partitions, the side path, and the worker's counters."""

    def __init__(
        self,
        options: WorkerOptions,
        lag: LagFn,
        *,
        config: EngineConfig | None = None,
        router: Router | None = None,
        codec: Codec | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        pausing: bool = True,
    ) -> None:
        self.options = options
        self.pausing = pausing  # the runtime can pause partitions (backpressure)
        self.config = config or load_config(options.config_path)
        self.router = router or load_router(options.routing_path)
        self.codec = codec or worker_codec(options)
        # `lag` is called a lot and compared by identity (the aligners reuse their frontier while
        # it is the same function): keep one reference.
        self.lag = lag
        self.monotonic = monotonic
        self.wall_ms = wall_ms
        self.totals = dict.fromkeys(TOTALS, 0)
        # Per topic (unprefixed): records read; dead letters per reason.
        self.consumed: collections.Counter[str] = collections.Counter()
        self.dead_letters: collections.Counter[str] = collections.Counter()
        max_skew_ms = int(1000 * float(getattr(self.config, "max_clock_skew_s", 300.0)))
        self.intake = Intake(
            self.codec, max_skew_ms, self.totals, self.dead_letters, wall_ms, monotonic, options.topic_prefix
        )
        self.guard = WallClockGuard(options.guard_s, options.guard_live_ms, self.config.allowed_lateness_ms)
        # While every input is silent the guard holds (one `input_silent` alert instead of a stall per job).
        self._held_guard = WallClockGuard(0.0)
        self.silence = InputSilence(
            self.guard,
            options.app_id,
            self.router.runbook_base_url or self.config.runbook_base_url,
            refresh_every_ms=self.config.alert_refresh_ms,
            refresh_min_change=self.config.alert_refresh_min_change,
        )
        self.input_at: float | None = None  # monotonic time of the last record of a source topic
        self.input_ms: int | None = None  # the same on the wall clock (UTC ms)
        self.record_at: float | None = None  # monotonic time of the last record of any input
        self.tasks: dict[int, PartitionTask] = {}  # rank stage, by partition
        self.job_tasks: dict[int, PartitionTask] = {}  # job stage, by partition
        # Summaries a rank stage sends a job stage of this worker, not decoded again when read back.
        self.handoff = Handoff(self.job_tasks)
        self.side = SidePath(options, self.intake, self.totals, frozenset(self.config.job_end_states))
        self.assigned: set[int] = set()
        self._front_at = -1e18
        self.paused: set[str] = set()  # input partitions ("topic:p") not fetched for backpressure
        self._stuck_logged: dict[int, float] = {}  # id(aligner) -> when it was last reported stuck

    # -- rebalances ------------------------------------------------------------------------------
    def assign(self, parts: set[int], restored: Restored) -> None:
        """Partitions `parts` (of every input topic) are this worker's now, with their restored state."""
        now = self.monotonic()
        for p in sorted(parts - self.assigned):
            for kind, tasks in (("rank", self.tasks), ("job", self.job_tasks)):
                task = PartitionTask(
                    p, self.config, self.router, self.options, self.codec, self.intake, now, kind
                )
                task.restore(restored.snapshots.get(task.snapshot_name))
                task.handoff = self.handoff
                tasks[p] = task
        self.assigned |= parts
        self.side.assign(parts, restored.routes, now)
        for task in self._all_tasks():  # a silence that fired before a restart goes on
            self.silence.adopt(task.silence)
        self._carry_silence()
        log.info("assigned partitions %s", sorted(self.assigned))

    def revoke(self) -> list[Action]:
        """A graceful revocation or stop: checkpoint everything, then forget it (the next owner
        restores it). The runtime performs the returned actions before it lets the partitions go."""
        actions = self.checkpoint_all()
        if self.paused:  # a paused partition stays paused across a rebalance in librdkafka
            actions.append(Flow(resume=sorted(self.paused)))
        self.lose()
        return actions

    def lose(self) -> None:
        """Partitions gone without a checkpoint (session lost): unacknowledged records will be
        redelivered to the next owner, which restores the last checkpoint."""
        self.tasks.clear()
        self.job_tasks.clear()
        self.handoff.clear()
        self.side.forget()
        self.assigned.clear()
        self.paused.clear()

    def checkpoint_all(self) -> list[Action]:
        """A checkpoint of every task with uncommitted records, and of the side path."""
        now = self.monotonic()
        actions: list[Action] = [task.checkpoint(now) for task in self._all_tasks() if task.uncommitted]
        if self.side.uncommitted:
            actions.append(self.side.checkpoint())
        return actions

    # -- records in ------------------------------------------------------------------------------
    def receive(self, records: Iterable[Record]) -> list[Action]:
        """A batch the consumer read (any topics, any partitions): hold, then release what may go."""
        now = self.monotonic()
        actions: list[Action] = []
        touched: dict[tuple[bool, int], PartitionTask] = {}
        routed = False
        sourced = False
        for rec in records:
            self.consumed[rec.topic] += 1
            if not sourced and rec.topic in SOURCE_TOPICS:
                sourced = True
            if rec.topic in NODE_TOPICS:
                actions += self.side.receive(rec, now)
                routed = True
                continue
            tasks = self.job_tasks if rec.topic == SUMMARIES else self.tasks
            task = tasks.get(rec.partition)
            if task is None:  # a record of a partition revoked a moment ago: redelivered to its owner
                continue
            # Its dead letter (no event then), or the alerts its instant rules raise on arrival.
            event, sent = task.receive(rec, now)
            actions += sent
            if event is not None and rec.topic in JOB_EVENT_TOPICS:
                actions += self.side.binding_read(rec, event, self.assigned, now)
                actions += self._broadcast(rec, event, now)
            elif event is not None and rec.topic == TELEMETRY_JOB:
                actions += self.side.fault_read(rec, event, now)
            touched[(rec.topic == SUMMARIES, rec.partition)] = task
        self.record_at = now
        if sourced:
            self.input_at, self.input_ms = now, self.wall_ms()
        if now - self._front_at >= SIDE_FRONT_S:
            self._update_front(now)
        if routed:
            actions += self.side.drain(now, self.lag)
        self._share_telemetry_front()
        for task in touched.values():
            actions += task.drain(now, self.lag, self.side.front, self.totals)
        return self._flow(touched.values(), now, actions)

    def ready(self) -> bool:
        """Some task holds records it may release now (more than one call's `release_batch`)."""
        now = self.monotonic()
        return self.side.aligner.ready(now, self.lag) or any(
            task.aligner.ready(now, self.lag) for task in self._all_tasks()
        )

    def release(self) -> list[Action]:
        """Release what the tasks may release now, `release_batch` records each: the loop calls it
        until nothing is ready, sending what each call produced before the next."""
        now = self.monotonic()
        actions: list[Action] = []
        if self.side.aligner.ready(now, self.lag):
            actions += self.side.drain(now, self.lag)
        self._share_telemetry_front()
        ready = [task for task in self._all_tasks() if task.aligner.ready(now, self.lag)]
        for task in ready:
            actions += task.drain(now, self.lag, self.side.front, self.totals)
        return self._flow(ready, now, actions)

    def _share_telemetry_front(self) -> None:
        """Each rank-stage engine hears the nodes of its keys: tell them all how fresh this worker's
        telemetry is (a node's silence is news only while other nodes still report)."""
        front = max((t.telemetry_ts for t in self.tasks.values() if t.telemetry_ts is not None), default=None)
        if front is not None:
            for task in self.tasks.values():
                task.engine.topology.telemetry_front = front

    def _flow(self, tasks: Iterable[PartitionTask], now: float, actions: list[Action]) -> list[Action]:
        """Append the pauses and resumes these tasks' held records call for."""
        if not self.pausing:
            return actions
        pause: list[str] = []
        resume: list[str] = []
        for task in tasks:
            p, r = task.flow(self.paused, now)
            pause += p
            resume += r
        if pause or resume:
            self.paused.difference_update(resume)
            self.paused.update(pause)
            self.totals["paused"] += len(pause)
            actions.append(Flow(pause, resume))
        return actions

    def _broadcast(self, rec: Record, event: Event, now: float) -> list[Action]:
        """JobStarted / JobStateChanged read on the job's own partition: a copy for every other
        rank-stage partition (its rules need the job's identity and state)."""
        copies = self.side.place.copies(event, rec.partition)
        if not copies:
            return []
        ts = self.intake.held_ts(rec, event)
        return [
            Send(CONTROL, rec.key, rec.value, partition=q, flight=self.side.controls.add(ts, q, now))
            for q in copies
        ]

    def _all_tasks(self) -> list[PartitionTask]:
        return [*self.tasks.values(), *self.job_tasks.values()]

    def _update_front(self, now: float) -> None:
        self.side.fronts(self.tasks, self.assigned, self.lag, now)
        self._front_at = now

    # -- time -----------------------------------------------------------------------------------
    def tick(self) -> list[Action]:
        """Release held records, move event time when input stops, checkpoint when input goes quiet."""
        now = self.monotonic()
        self._update_front(now)
        actions: list[Action] = []
        if len(self.side.aligner):
            actions += self.side.drain(now, self.lag)
            self._log_if_stuck("unattributed telemetry", self.side.aligner, now)
        if self.side.uncommitted:
            actions.append(self.side.checkpoint())
        newest = max((t.engine.max_ts for t in self.tasks.values() if t.engine.max_ts), default=None)
        wall_ms = self.wall_ms()
        self._share_telemetry_front()
        actions += self._check_silence(now, wall_ms, newest)
        guard = self.guard
        if self.silence.holding:
            guard = self._held_guard
            actions += self._flush_to(newest, now)
        for task in self._all_tasks():
            if len(task.aligner):
                actions += task.drain(now, self.lag, self.side.front, self.totals)
                self._log_if_stuck(f"partition {task.partition}", task.aligner, now)
            actions += task.idle(now, wall_ms, newest, self.lag, guard)
        actions += self.finish(now)
        return self._flow(self.tasks.values(), now, actions)

    def finish(self, now: float) -> list[Action]:
        """The end of a finite input (a backlog, a `replay --to-kafka`): every input partition of this
        worker read to its end, nothing sent unacknowledged, and no record for `finish_idle_s`.

        What the streaming engines do for a bounded source that went idle, and what the offline
        replay does at its end (`DetectionEngine.finish`): everything held is released and each
        engine's event time moves to the newest it read (after following this worker's newest minus
        the allowed lateness, as the replay's one watermark). Never past what was read, so no
        stall or timeout is invented (the wall-clock guard and `input_silent` are for that, and
        only while data is live). In rounds, each after `finish_idle_s` without records: the side
        path's held records first (they come back as the rank stage's input), then the rank stage
        (its last summaries and a marker go to the job stage), then the job stage, as far as every
        rank-stage partition said it sent everything. A record that comes later is processed as
        usual (one older than what an engine already passed is late for it)."""
        wait = self.options.finish_idle_s
        if wait <= 0 or not self.tasks or self.record_at is None or now - self.record_at < wait:
            return []
        if self.side.delivering() or not self._read_to_end():
            return []
        if len(self.side.aligner):
            return self.side.drain(now, self.lag, everything=True)
        newest = max((t.engine.max_ts for t in self.tasks.values() if t.engine.max_ts), default=None)
        if newest is None:
            return []
        target = newest - self.config.allowed_lateness_ms
        out: list[Action] = []
        for task in self.tasks.values():
            out += task.finish(target, now, self.lag, self.totals)
        for task in self.job_tasks.values():
            front = task.upstream_done()
            if front is not None:
                out += task.finish(front, now, self.lag, self.totals)
        return out

    def _read_to_end(self) -> bool:
        """No input partition of this worker has a record left to read (nor an unknown backlog)."""
        for p in self.assigned:
            for topic in NODE_TOPICS:
                tp = tp_key(topic, p)
                if self.lag(tp, self.side.aligner.last_offset(tp)) != 0:
                    return False
        for task in self._all_tasks():
            for topic in task.inputs:
                tp = tp_key(topic, task.partition)
                if self.lag(tp, task.aligner.last_offset(tp)) != 0:
                    return False
        return True

    def _flush_to(self, newest: int | None, now: float) -> list[Action]:
        """All input silent: every rank-stage engine moves to the newest event time this worker read
        (as an offline replay's end does), never past it. What the rank stages still held for the
        job stage (the last summaries, a final JobStateChanged) reaches it, and no time is invented:
        no stall, hang or missing telemetry can follow from it."""
        out: list[Action] = []
        if newest is None:
            return out
        for task in self.tasks.values():
            wm = task.engine.watermark
            if not len(task.aligner) and wm is not None and wm < newest:
                task.counts["front_advances"] += 1
                out += task.advance(newest, now)
        return out

    def input_silent_s(self, now: float) -> float | None:
        """Seconds since the last record of any source input: this worker's own, or (through the
        job stage's markers) another worker's rank stage moving on. None before the first record."""
        last = self.input_at
        own = set(self.tasks)
        for task in self.job_tasks.values():
            for source, at in task.marker_moved_at.items():
                if int(source) not in own and (last is None or at > last):
                    last = at
        return None if last is None else now - last

    def _check_silence(self, now: float, wall_ms: int, newest: int | None) -> list[Action]:
        """Raise `input_silent` when every source input stopped while live, resolve it when one speaks
        again: the alert's routed copies, sent like the engines' alerts (rs.alerts, keyed by team)."""
        if not self.tasks:
            return []
        silent_s = self.input_silent_s(now)
        last_ms = self.input_ms
        if silent_s is not None and self.input_at is not None and now - self.input_at > silent_s:
            # Another worker's input moved on since this worker's last record: count that as input.
            last_ms = wall_ms - int(silent_s * 1000)
        records = self.silence.check(wall_ms, silent_s, last_ms, newest)
        out: list[Action] = []
        for record in records:
            # Firings counted, not their refreshes as the silence grows.
            self.totals["input_silent"] += record[
                "status"
            ] == "firing" and not self.silence.tracker.is_refresh(record)
            log.warning("%s: %s", record["rule"], record["summary"])
            for team, receiver in self.router.route_all(record):
                value = self.codec.encode(Event("Alert", {**record, "team": team, "receiver": receiver}))
                out.append(Send(ALERTS, key_for(ALERTS, {**record, "team": team}), value))
        if records:
            # Fired or resolved: a checkpoint of every partition carries it, after the alert (outputs
            # go before state): no record brings one during a silence, nor to a partition the
            # returning records do not reach, and a restart must know whether the alert still fires.
            self._carry_silence(resolved_at=None if self.silence.holding else now)
            out += [task.checkpoint(now) for task in self._all_tasks()]
        return out

    def _carry_silence(self, resolved_at: float | None = None) -> None:
        """Put the worker's `input_silent` state (None unless it fires) into every task's checkpoints.

        `resolved_at`: records flow again, so the guard counts each partition's silence from then. A
        partition the first records have not reached yet (the job stage, until the rank stage
        releases its summaries) is not silent for the whole outage: its time would jump to the wall
        clock and every job would stall."""
        state = self.silence.state()
        for task in self._all_tasks():
            task.silence = state
            if resolved_at is not None and task.last_receive is not None:
                task.last_receive = resolved_at

    def _log_if_stuck(self, what: str, aligner: Aligner, now: float) -> None:
        """A held-back aligner that does not move for long says which input holds it, and why."""
        stuck = aligner.stuck_for(now)
        every = self.options.stuck_log_s
        if stuck < every or now - self._stuck_logged.get(id(aligner), -1e18) < every:
            return
        self._stuck_logged[id(aligner)] = now
        self.totals["stuck_reports"] += 1
        log.warning(
            "%s: %d events held for %.0f s, none released; waiting for %s",
            what,
            len(aligner),
            stuck,
            aligner.blocker(now, self.lag),
        )
