"""The training SDK: `Reporter` turns a training loop's steps, checkpoints and faults into events.

On the training thread a call only reads clocks, builds a dict and appends it to a deque; a
background thread converts values (tensors -> floats), encodes and publishes. No call raises
into the training loop: SDK-internal errors are counted (`reporter.stats["sdk_errors"]`) and
logged once per kind. Exceptions of the user's own code (inside `step` / `checkpoint` blocks)
are reported and re-raised untouched.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from time import perf_counter_ns, time_ns
from typing import Any

from producers.publisher import Publisher, open_publisher
from producers.training.allocator import AllocatorProbe, torch_memory_stats
from producers.training.bindings import Binding, bindings_dir, process_start_time, write_binding
from producers.training.comm import CommAccount, CommMeter
from producers.training.faults import fault_detail, fault_kind
from producers.training.identity import RankIdentity, job_nodes, resolve_identity, visible_gpu
from producers.training.layout import env_layout, merge_layout
from producers.training.loader import MonitoredLoader
from producers.training.records import coerce, heartbeat_record, step_record
from producers.training.reports import CheckpointReport, EvaluationReport
from producers.training.restore_test import DEFAULT_LOSS_TOLERANCE, restore_test_event
from producers.training.step import SEGMENTS, Step
from producers.training.timing import HostTimer, SegmentTimer, TimingMode, choose_timer
from producers.training.verify import CheckpointVerifier
from schemas.errors import RanksightError
from schemas.records import Event

__all__ = ["SEGMENTS", "CheckpointReport", "EvaluationReport", "Reporter", "Step", "visible_gpu"]

log = logging.getLogger(__name__)
# Per-rank records that carry the rank's node: with the job it keys them (one job over many partitions).
_NODE_KEYED = frozenset({"CollectiveSample", "DataLoaderSample"})

_JOB_STATES = frozenset(("pending", "running", "restarting", "preempted", "failed", "completed"))


class Reporter:
    """Reports one rank of a training job; identity from arguments or the launcher environment."""

    def __init__(
        self,
        job_id: str | None = None,
        rank: int | None = None,
        *,
        world_size: int | None = None,
        local_rank: int | None = None,
        node: str | None = None,
        run_id: str | None = None,
        cluster: str | None = None,
        publisher: Publisher | None = None,
        destination: str | None = None,
        kafka_conf: dict[str, Any] | None = None,
        topic_prefix: str | None = None,
        spool_dir: Path | None = None,
        bind: bool = True,
        max_pending: int = 100_000,
        env: Mapping[str, str] | None = None,
        nvml: Any = None,
        timing: TimingMode | SegmentTimer | None = None,
        heartbeat_s: float | None = None,
        runtime_dir: Path | str | None = None,
        verify_checkpoints: bool | None = None,
        comm_interval_s: float = 10.0,
        wall_ns: Callable[[], int] = time_ns,
        mono_ns: Callable[[], int] = perf_counter_ns,
        allocator_stats: Callable[[], Mapping[str, Any] | None] = torch_memory_stats,
    ) -> None:
        env = os.environ if env is None else env
        # Completed local checkpoints are read back off the training thread unless turned off.
        if verify_checkpoints is None:
            verify_checkpoints = env.get("RANKSIGHT_VERIFY_CHECKPOINTS", "1") != "0"
        self._verifier: CheckpointVerifier | None = CheckpointVerifier() if verify_checkpoints else None
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self._allocator_probe = AllocatorProbe(
            mono_ns, interval_s=_seconds(env.get("RANKSIGHT_ALLOCATOR_S"), 10.0), stats=allocator_stats
        )
        self.identity: RankIdentity = resolve_identity(
            job_id,
            rank,
            world_size=world_size,
            local_rank=local_rank,
            node=node,
            run_id=run_id,
            cluster=cluster,
            env=env,
        )
        self._counts = {"enqueued": 0, "published": 0, "dropped": 0, "sdk_errors": 0, "heartbeats": 0}
        self._logged: set[str] = set()
        try:
            self._timer: SegmentTimer = choose_timer(timing, env)
        except Exception as exc:
            self._internal("timing", exc, f"ranksight: {exc}; segments are timed with host clocks")
            self._timer = HostTimer()
        if isinstance(self._timer, HostTimer):
            self._timer = HostTimer(mono_ns)  # the reporter's clock, so tests can pass a fake one
        # Host marks are monotonic nanoseconds: they double as the live-step clock of the heartbeat.
        self._host_marks = self._timer.clock == "host"
        # Host clocks: the clock itself marks (one call per edge on the training thread, not two).
        self._mark: Callable[[], Any] = mono_ns if isinstance(self._timer, HostTimer) else self._timer.mark
        self._live_step: Step | None = None  # the step open on the training thread (for the heartbeat)
        # Collectives timed by the SDK itself (watch_ddp / watch_collectives), and their per-op
        # totals over the current CollectiveSample interval (touched on the reporter thread only).
        self.comm = CommMeter(self._mark, self._internal, mono_ns)
        self._comm_account = CommAccount(int(comm_interval_s * 1000))
        self._loader_fp: str | None = None  # the last batch a wrapped loader delivered, for the next step
        self._loader_wait: float | None = None
        self._epoch: int | None = (
            None  # set_epoch(), or the epoch of the last batch a wrapped loader delivered
        )
        beat = heartbeat_s if heartbeat_s is not None else float(env.get("RANKSIGHT_HEARTBEAT_S", "10"))
        self._heartbeat_ns = int(beat * 1e9) if beat > 0 else 0
        self._last_beat_ns: int | None = None
        self._runtime_dir = runtime_dir if runtime_dir is not None else bindings_dir(env)
        self._binding_file: Path | None = None
        self._warned_owner = False
        self._owns_publisher = publisher is None
        self.publisher: Publisher | None = publisher
        if publisher is None:
            self.publisher = self._open_publisher(destination, kafka_conf, topic_prefix, spool_dir, env)
        self._outbox: deque[Event | Callable[[], Event | None] | tuple[Step, int]] = deque()
        self._max_pending = max_pending
        self._env = env
        self._current: Step | None = None
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ranksight-reporter", daemon=True)
        self._thread.start()
        # A weak reference: the exit hook must not keep an abandoned reporter alive.
        ref = weakref.ref(self)
        atexit.register(_close_at_exit, ref)
        if bind:
            self._outbox.append(lambda: self._rank_bound(env, nvml))

    # -- plumbing ---------------------------------------------------------------------------

    def _open_publisher(
        self,
        destination: str | None,
        kafka_conf: dict[str, Any] | None,
        topic_prefix: str | None,
        spool_dir: Path | None,
        env: Mapping[str, str],
    ) -> Publisher | None:
        dest = destination or env.get("RANKSIGHT_DESTINATION") or "kafka"
        if dest.startswith("file://") and self.identity.world_size > 1:
            # One file per rank: ranks must not write the same container file.
            path = dest[len("file://") :]
            path = (
                path.format(rank=self.identity.rank)
                if "{rank}" in path
                else _with_rank(path, self.identity.rank)
            )
            dest = f"file://{path}"
        conf = kafka_conf
        if conf is None and dest == "kafka":
            bootstrap = env.get("KAFKA_BOOTSTRAP") or env.get("RANKSIGHT_KAFKA_BOOTSTRAP")
            conf = {"bootstrap.servers": bootstrap} if bootstrap else {}
        prefix = topic_prefix if topic_prefix is not None else env.get("RANKSIGHT_TOPIC_PREFIX", "")
        try:
            return open_publisher(dest, kafka_conf=conf, topic_prefix=prefix, spool_dir=spool_dir)
        except RanksightError as exc:
            self._internal("publisher", exc, f"ranksight reporting is off for this run: {exc}")
            return None

    def _internal(self, kind: str, exc: BaseException, message: str | None = None) -> None:
        self._counts["sdk_errors"] += 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.error(
                "%s", message or f"ranksight SDK error ({kind}), further ones are only counted: {exc!r}"
            )

    def _now_ms(self) -> int:
        return self._wall_ns() // 1_000_000

    def _verify_checkpoint(self, ck: CheckpointReport) -> None:
        """Queue a completed local checkpoint for read-back verification (one append on this thread)."""
        if self._verifier is not None and ck.path and not self._closed:
            self._verifier.submit(ck.path, ck._verification)

    def _job_event(self, record_type: str, fields: dict[str, Any], *, per_rank: bool) -> None:
        """Enqueue a record stamped now with this process's job and run (and rank, when per rank)."""
        ident = self.identity
        head: dict[str, Any] = {"ts": self._now_ms(), "job_id": ident.job_id, "run_id": ident.run_id}
        if per_rank:
            head["rank"] = ident.rank
            if record_type in _NODE_KEYED:
                head["node"] = ident.node
        self._emit(record_type, {**head, **fields})

    def _emit(self, record_type: str, record: dict[str, Any]) -> None:
        if len(self._outbox) >= self._max_pending:
            self._counts["dropped"] += 1
            return
        self._outbox.append(Event(record_type, record))
        self._counts["enqueued"] += 1

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                self._heartbeat(self._mono_ns())
            except Exception as exc:
                self._internal("heartbeat", exc)
            self._drain(final=stopping)
            if stopping:
                self._flush_comm()
                self._unbind()
                return
            self._stop.wait(0.02)

    def _heartbeat(self, now_ns: int) -> None:
        """While a step stays open longer than the heartbeat, say so every heartbeat (off-thread).

        A rank stuck in a step sends nothing else, and when every rank is stuck (one hangs, the
        others block in its collective) no event moves event time, so a replay of the job's own
        events could never see the stall. The heartbeat is a CollectiveSample: the share of the
        last interval this rank spent blocked in its open `comm` segment (1.0 for the peers
        waiting in the all-reduce, 0.0 for the rank they wait for), which is what `rank_hang`
        reads to name the hung rank.
        """
        every = self._heartbeat_ns
        live = self._live_step
        if not every or live is None:
            self._last_beat_ns = None
            return
        started = live._begin_host
        if now_ns - started < every:
            return
        last = self._last_beat_ns
        if last is not None and last >= started and now_ns - last < every:
            return
        since = max(started, last if last is not None and last >= started else now_ns - every)
        interval = now_ns - since
        if interval <= 0:
            return
        segment = live._open  # read once: the training thread may replace it
        blocked = 0
        if segment is not None and segment[0] == "comm":
            blocked = now_ns - max(since, live._open_host)
        waiting = self.comm.blocked_since_ns()  # a DDP bucket or a wrapped collective not back yet
        if waiting is not None:
            blocked = max(blocked, now_ns - max(since, waiting))
        self._last_beat_ns = now_ns
        self._outbox.appendleft(heartbeat_record(self.identity, self._now_ms(), interval, blocked))
        self._counts["heartbeats"] += 1

    def _drain(self, final: bool = False) -> None:
        # An item leaves the outbox only once handed to the publisher, so `flush()` (which waits
        # for an empty outbox) never returns while one is still being converted.
        outbox = self._outbox
        while outbox:
            item = outbox[0]
            try:
                event: Event | None
                if isinstance(item, tuple) and not isinstance(item, Event):
                    if not self._resolved(item[0], final, item[1]):
                        return  # its GPU work is still running: keep the order, look again at the next poll
                    event = self._step_record(*item)
                elif callable(item):
                    event = item()
                else:
                    event = item
                if event is not None and self.publisher is not None:
                    self.publisher.publish(coerce(event))
                    self._counts["published"] += 1
                due, self._comm_account.due = self._comm_account.due, []
                for sample in due:
                    if self.publisher is not None:
                        self.publisher.publish(sample)
                        self._counts["published"] += 1
            except Exception as exc:
                self._internal(f"publish-{getattr(item, 'type', 'task')}", exc)
            outbox.popleft()

    def _flush_comm(self) -> None:
        """At close: the collectives of the last, unfinished CollectiveSample interval."""
        try:
            if self._comm_account.totals and self.publisher is not None:
                for sample in self._comm_account.samples(self._now_ms(), self.identity):
                    self.publisher.publish(sample)
                    self._counts["published"] += 1
        except Exception as exc:
            self._internal("comm", exc)

    def _resolved(self, step: Step, final: bool, ts_ms: int) -> bool:
        """Whether every mark of the step has been reached; at close, wait for them.

        A collective launched in the step and not complete yet holds the step back, for at most
        `_COMM_PATIENCE_MS` (a fire-and-forget async op, a peer gone): then it is left out.
        """
        timer = self._timer
        marks = [step._begin, step._end, *(m for _, b, e in step._marks for m in (b, e))]
        if step._comm:
            if any(c.end is None for c in step._comm):
                if not final and self._now_ms() - ts_ms < _COMM_PATIENCE_MS:
                    return False
                step._comm = [c for c in step._comm if c.end is not None]
            marks.extend(m for c in step._comm for m in (c.start, c.end))
        for mark in marks:
            if not timer.ready(mark):
                if not final:
                    return False
                timer.wait(mark)
        return True

    def _rank_bound(self, env: Mapping[str, str], nvml: Any) -> Event:
        ident = self.identity
        index, uuid = visible_gpu(ident.local_rank, env, nvml)
        if self._runtime_dir:
            self._binding_file = write_binding(
                Path(self._runtime_dir),
                Binding(
                    pid=os.getpid(),
                    job_id=ident.job_id,
                    run_id=ident.run_id,
                    rank=ident.rank,
                    local_rank=ident.local_rank,
                    gpu_uuid=uuid,
                    gpu_index=index,
                    node=ident.node,
                    start_time=process_start_time(os.getpid()),
                ),
            )
        return Event(
            "RankBound",
            {
                "ts": self._now_ms(),
                "job_id": ident.job_id,
                "run_id": ident.run_id,
                "rank": ident.rank,
                "local_rank": ident.local_rank,
                "node": ident.node,
                "gpu_index": index,
                "gpu_uuid": uuid,
                "pid": os.getpid(),
            },
        )

    def _unbind(self) -> None:
        if self._binding_file is not None:
            with contextlib.suppress(OSError):
                self._binding_file.unlink()
            self._binding_file = None

    def _step_done(self, step: Step, exc: BaseException | None) -> None:
        if exc is not None:
            self.comm.take()  # the failed step's collectives go with it
            self.exception(exc, f"step {step.step}")
            return
        # The batch a wrapped loader delivered last is the one this step consumed.
        fp, self._loader_fp = self._loader_fp, None
        wait, self._loader_wait = self._loader_wait, None
        if fp is not None:
            step._fields.setdefault("batch_fingerprint", fp)
        if self._epoch is not None:
            step._fields.setdefault("epoch", self._epoch)
        step._loader_wait_s = wait
        step._comm = self.comm.take()
        step._allocator = self._allocator_probe.sample()
        # The training thread only stamps the time and enqueues; the record is built off-thread.
        if len(self._outbox) >= self._max_pending:
            self._counts["dropped"] += 1
            return
        self._outbox.append((step, self._now_ms()))
        self._counts["enqueued"] += 1

    def _step_record(self, step: Step, ts_ms: int) -> Event:
        return step_record(step, ts_ms, self.identity, self._timer, self._internal, self._comm_account)

    # -- public API -------------------------------------------------------------------------

    def watch_ddp(
        self, model: Any, *, hook: Callable[[Any, Any], Any] | None = None, state: Any = None
    ) -> None:
        """Time a DistributedDataParallel model's gradient all-reduce per step (`comm_s`), before its first backward.

        Registers a communication hook wrapping `hook` (default: DDP's own all-reduce); DDP takes
        one hook per model, so pass yours here instead of registering it. See `comm.py`.
        """
        self.comm.watch_ddp(model, hook=hook, state=state)

    def watch_collectives(self, dist: Any = None) -> Callable[[], None]:
        """Time torch.distributed's collectives (plain calls, FSDP's) per step; returns the undo. See `comm.py`."""
        return self.comm.watch_collectives(dist)

    def step(self, step: int) -> Step:
        """`with reporter.step(n) as s:` -> one StepCompleted (time of the block, segments summed)."""
        return Step(self, step)

    def step_begin(self, step: int) -> Step:
        """Start step `step` without a `with` block; end it with `step_end()` (for framework hooks)."""
        current = Step(self, step).begin()
        self._current = current
        return current

    def segment_begin(self, name: str) -> None:
        """Start a segment of the step begun with `step_begin` (ends the open one, if any)."""
        current = self._current
        if current is not None:
            current.segment_begin(name)

    def segment_end(self) -> None:
        """End the open segment of the current step."""
        current = self._current
        if current is not None:
            current.segment_end()

    def step_end(self, **values: Any) -> None:
        """End the step begun with `step_begin`, with its loss, lr, grad_norm, samples, tokens, skipped."""
        current, self._current = self._current, None
        if current is not None:
            if values:
                current.record(**values)
            current.end()

    @property
    def current_step(self) -> Step | None:
        """The step begun with `step_begin` and not yet ended."""
        return self._current

    @property
    def timer_clock(self) -> str:
        """Which clock times segments and steps: "host" or "cuda"."""
        return self._timer.clock

    def evaluation(
        self,
        step: int,
        name: str | None = None,
        *,
        evaluation_id: str | None = None,
        expected_duration_s: float | None = None,
    ) -> EvaluationReport:
        """`with reporter.evaluation(step, "val"):` -> EvaluationEvent started, then completed or failed."""
        return EvaluationReport(
            self, step, name, evaluation_id or f"{self.identity.job_id}-eval{step}", expected_duration_s
        )

    def checkpoint(
        self,
        step: int,
        uri: str | None = None,
        *,
        checkpoint_id: str | None = None,
        version: str | None = None,
        keep: int | None = None,
    ) -> CheckpointReport:
        """`with reporter.checkpoint(step, uri, keep=3) as ck:` -> started, then completed or failed.

        `keep`: the retention policy (checkpoints kept); `ck.deleted = [...]` names what saving removed.
        """
        return CheckpointReport(
            self, step, uri, checkpoint_id or f"{self.identity.job_id}-step{step}", version, keep
        )

    def checkpoint_restored(
        self, step: int, uri: str | None = None, *, checkpoint_id: str | None = None
    ) -> None:
        """The job resumed from the checkpoint of `step`."""
        try:
            ck = self.checkpoint(step, uri, checkpoint_id=checkpoint_id)
            ck._emit("restored")
        except Exception as internal:
            self._internal("checkpoint", internal)

    def job_started(
        self,
        *,
        owner: str | None = None,
        team: str | None = None,
        model_name: str = "",
        model_version: str = "",
        dataset_version: str = "",
        workload_family: str = "",
        nodes: list[str] | None = None,
        data_parallel: int | None = None,
        tensor_parallel: int | None = None,
        pipeline_parallel: int | None = None,
        expert_parallel: int | None = None,
        zero_stage: int | None = None,
        sharding: str = "",
        storage_tier: str = "",
        image: str = "",
        workspace: str = "",
        global_batch_size: int | None = None,
        seq_len: int | None = None,
        gpu_class: str = "",
        checkpoint_max_age_s: float | None = None,
        checkpoint_timeout_s: float | None = None,
        restore_test_max_age_s: float | None = None,
        target_steps: int | None = None,
        target_tokens: int | None = None,
        target_epochs: float | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """Describe the job (typically from rank 0): owner, team, model, parallelism, checkpoint policy, target.

        Owner and team default to RANKSIGHT_OWNER / RANKSIGHT_TEAM, then Slurm's job user and
        account; without them one warning says the job's alerts go to the `platform` team. The
        target (steps, tokens or epochs) is what progress and the time to completion are measured
        against. Nodes default to Slurm's node list (or this node for a one-node job); a
        multi-node job launched otherwise should pass them. The parallel layout, storage tier,
        image and workspace not passed come from the launcher environment (`layout.env_layout`:
        accelerate's FSDP/DeepSpeed variables, RANKSIGHT_TENSOR_PARALLEL, RANKSIGHT_IMAGE, ...).
        """
        try:
            env = self._env
            given = {
                "data_parallel": data_parallel,
                "tensor_parallel": tensor_parallel,
                "pipeline_parallel": pipeline_parallel,
                "expert_parallel": expert_parallel,
                "zero_stage": zero_stage,
                "sharding": sharding,
                "storage_tier": storage_tier,
                "image": image,
                "workspace": workspace,
            }
            layout = merge_layout(env_layout(env), given)
            tp = int(layout.get("tensor_parallel") or 1)
            pp = int(layout.get("pipeline_parallel") or 1)
            owner = owner or env.get("RANKSIGHT_OWNER") or env.get("SLURM_JOB_USER") or ""
            team = team or env.get("RANKSIGHT_TEAM") or env.get("SLURM_JOB_ACCOUNT") or ""
            if (not owner or not team) and not self._warned_owner:
                self._warned_owner = True
                missing = " and ".join(n for n, v in (("owner", owner), ("team", team)) if not v)
                log.warning(
                    "ranksight: job %s has no %s (pass job_started(owner=..., team=...) or set "
                    "RANKSIGHT_OWNER / RANKSIGHT_TEAM); its alerts will go to the `platform` team",
                    self.identity.job_id,
                    missing,
                )
            ident = self.identity
            world = ident.world_size
            self._emit(
                "JobStarted",
                {
                    "ts": self._now_ms(),
                    "job_id": ident.job_id,
                    "run_id": ident.run_id,
                    "owner": owner,
                    "team": team,
                    "cluster": ident.cluster,
                    "model_name": model_name,
                    "model_version": model_version,
                    "dataset_version": dataset_version,
                    "workload_family": workload_family,
                    "world_size": world,
                    "nodes": list(nodes) if nodes is not None else job_nodes(ident, env),
                    "data_parallel": layout.get("data_parallel") or max(1, world // (tp * pp)),
                    "tensor_parallel": tp,
                    "pipeline_parallel": pp,
                    "expert_parallel": layout.get("expert_parallel"),
                    "zero_stage": layout.get("zero_stage"),
                    "sharding": layout.get("sharding", ""),
                    "storage_tier": layout.get("storage_tier", ""),
                    "image": layout.get("image", ""),
                    "workspace": layout.get("workspace", ""),
                    "global_batch_size": global_batch_size,
                    "seq_len": seq_len,
                    "gpu_class": gpu_class,
                    "checkpoint_max_age_s": checkpoint_max_age_s,
                    "checkpoint_timeout_s": checkpoint_timeout_s,
                    "restore_test_max_age_s": restore_test_max_age_s,
                    "target_steps": _positive_int(target_steps),
                    "target_tokens": _positive_int(target_tokens),
                    "target_epochs": None
                    if target_epochs is None or target_epochs <= 0
                    else float(target_epochs),
                    "labels": dict(labels or {}),
                },
            )
        except Exception as internal:
            self._internal("job_started", internal)

    def validation(self, step: int, metrics: Mapping[str, Any], *, duration_s: float | None = None) -> None:
        """Evaluation metrics at `step` (values may be tensors)."""
        try:
            self._job_event(
                "ValidationResult",
                {
                    "step": step,
                    "metrics": dict(metrics),
                    "duration_s": duration_s,
                },
                per_rank=False,
            )
        except Exception as internal:
            self._internal("validation", internal)

    def exception(self, exc: BaseException, where: str | None = None) -> None:
        """The rank failed with `exc`: a RankFault of its kind (cuda_oom, collective_timeout, storage_timeout, exception).

        Steps ended by an exception call this themselves; an exception already reported (by the
        data loader's wrapper) is not reported twice.
        """
        if getattr(exc, "_ranksight_reported", False):
            return
        try:
            self.fault(fault_kind(exc), fault_detail(exc, where))
            exc._ranksight_reported = True  # type: ignore[attr-defined]
        except Exception as internal:
            self._internal("fault", internal)

    def set_epoch(self, epoch: int | None) -> None:
        """The epoch of the steps that follow (a wrapped loader sets it from its sampler by itself)."""
        self._epoch = None if epoch is None else int(epoch)

    def fault(self, kind: str, detail: str | None = None, *, exit_code: int | None = None) -> None:
        """A rank fault: exception, exit, cuda_oom, oom, collective_timeout, storage_timeout, ..."""
        try:
            self._job_event(
                "RankFault",
                {
                    "node": self.identity.node,
                    "kind": kind,
                    "detail": detail,
                    "exit_code": exit_code,
                },
                per_rank=True,
            )
        except Exception as internal:
            self._internal("fault", internal)

    def state(
        self, state: str, reason: str | None = None, *, exit_code: int | None = None, restart_count: int = 0
    ) -> None:
        """A job state change: pending, running, restarting, preempted, failed, completed."""
        try:
            if state not in _JOB_STATES:
                raise ValueError(f"unknown job state {state!r}; known: {', '.join(sorted(_JOB_STATES))}")
            self._job_event(
                "JobStateChanged",
                {
                    "state": state,
                    "reason": reason,
                    "exit_code": exit_code,
                    "restart_count": restart_count,
                },
                per_rank=False,
            )
        except Exception as internal:
            self._internal("state", internal)

    def collective(
        self,
        op: str,
        *,
        interval_s: float,
        count: int,
        time_s: float,
        bytes: int | None = None,
        bus_bw_gbps: float | None = None,
    ) -> None:
        """Aggregated collective timings of this rank over an interval."""
        try:
            self._job_event(
                "CollectiveSample",
                {
                    "op": op,
                    "interval_s": interval_s,
                    "count": count,
                    "bytes": bytes,
                    "time_s": time_s,
                    "bus_bw_gbps": bus_bw_gbps,
                },
                per_rank=True,
            )
        except Exception as internal:
            self._internal("collective", internal)

    def dataloader(
        self,
        *,
        interval_s: float,
        batches: int | None = None,
        wait_s: float | None = None,
        queue_depth: int | None = None,
        workers: int | None = None,
        workers_expected: int | None = None,
        batch_prep_s: float | None = None,
        read_bytes_s: float | None = None,
        read_latency_s: float | None = None,
        cache_hit_ratio: float | None = None,
        file_opens_s: float | None = None,
        errors: int | None = None,
        file_open_errors: int | None = None,
    ) -> None:
        """Data-loader health of this rank over an interval (`wrap_loader` calls this for you); `workers` are live ones."""
        try:
            self._job_event(
                "DataLoaderSample",
                {
                    "interval_s": interval_s,
                    "batches": batches,
                    "wait_s": wait_s,
                    "queue_depth": queue_depth,
                    "workers": workers,
                    "workers_expected": workers_expected,
                    "batch_prep_s": batch_prep_s,
                    "read_bytes_s": read_bytes_s,
                    "read_latency_s": read_latency_s,
                    "cache_hit_ratio": cache_hit_ratio,
                    "file_opens_s": file_opens_s,
                    "errors": errors,
                    "file_open_errors": file_open_errors,
                },
                per_rank=True,
            )
        except Exception as internal:
            self._internal("dataloader", internal)

    def wrap_loader(
        self,
        loader: Iterable[Any],
        *,
        interval_s: float = 10.0,
        fingerprint: bool | Callable[[Any], str | None] = True,
        count_opens: bool = True,
    ) -> MonitoredLoader:
        """`for batch in reporter.wrap_loader(loader):` data wait, batch fingerprints and DataLoaderSamples.

        Works with a PyTorch `DataLoader` or any iterable; see `producers.training.loader` for
        what is measured. `fingerprint=False` skips hashing batches; a callable replaces the hash.
        `count_opens=False` leaves the loader's `worker_init_fn` alone (no file-open counting).
        """
        return MonitoredLoader(
            self, loader, interval_s=interval_s, fingerprint=fingerprint, count_opens=count_opens
        )

    def _loader_delivered(self, wait_s: float, fingerprint: str | None, epoch: int | None = None) -> None:
        """A wrapped loader handed out a batch: the next step to end consumed it."""
        self._loader_wait = wait_s
        self._loader_fp = fingerprint
        if epoch is not None:
            self._epoch = epoch

    def restore_test(
        self,
        checkpoint_id: str,
        *,
        restored: Iterable[str],
        steps_resumed: int,
        step: int | None = None,
        loss_before: float | None = None,
        loss_after: float | None = None,
        loss_tolerance: float | None = DEFAULT_LOSS_TOLERANCE,
        code_version: str | None = None,
        runtime_version: str | None = None,
        passed: bool | None = None,
        error: str | None = None,
        duration_s: float | None = None,
        run_id: str | None = None,
    ) -> None:
        """A restore test of `checkpoint_id` (rank 0 only: one per job); `passed=None` lets `judge` decide.

        `restored` names what was actually loaded (model, optimizer, scheduler, data); `run_id` is
        the run that wrote the checkpoint (default: this reporter's run).
        """
        if self.identity.rank != 0:
            return
        try:
            event = restore_test_event(
                self.identity.job_id,
                checkpoint_id,
                run_id=self.identity.run_id if run_id is None else run_id,
                restored=list(restored),
                steps_resumed=steps_resumed,
                step=step,
                loss_before=None if loss_before is None else float(loss_before),
                loss_after=None if loss_after is None else float(loss_after),
                loss_tolerance=loss_tolerance,
                code_version=code_version,
                runtime_version=runtime_version,
                passed=passed,
                error=error,
                duration_s=duration_s,
                ts_ms=self._now_ms(),
            )
            self._emit(event.type, event.record)
        except Exception as internal:
            self._internal("restore_test", internal)

    def flush(self, timeout: float = 10.0) -> int:
        """Wait until queued events are handed to the publisher and delivered; returns what is left."""
        try:
            deadline = time.monotonic() + timeout
            if self._verifier is not None:
                self._verifier.wait(timeout)
                deadline = max(deadline, time.monotonic())
            while self._outbox and time.monotonic() < deadline:
                time.sleep(0.005)
            left = len(self._outbox)
            if self.publisher is not None:
                left += self.publisher.flush(max(0.0, deadline - time.monotonic()))
            return left
        except Exception as internal:
            self._internal("flush", internal)
            return len(self._outbox)

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (up to `timeout` s) and stop; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._verifier is not None:  # the verdicts on the last checkpoints go out with the rest
                self._verifier.close(timeout)
            self.comm.close()
            self._stop.set()
            self._thread.join(timeout)
            if self.publisher is not None and self._owns_publisher:
                self.publisher.close(timeout)
            elif self.publisher is not None:
                self.publisher.flush(timeout)
        except Exception as internal:
            self._internal("close", internal)

    @property
    def stats(self) -> dict[str, Any]:
        """enqueued, published, dropped (outbox full), sdk_errors, and the publisher's counters."""
        out: dict[str, Any] = dict(self._counts)
        out["pending"] = len(self._outbox)
        if self.publisher is not None:
            out["publisher"] = self.publisher.stats
        return out

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _seconds(text: str | None, default: float) -> float:
    """A period from the environment; the default when unset or not a number."""
    try:
        return default if text is None or not text.strip() else float(text)
    except ValueError:
        return default


_COMM_PATIENCE_MS = 60_000  # a step waits this long (wall time) for its collectives to complete


def _close_at_exit(ref: weakref.ref[Reporter]) -> None:
    reporter = ref()
    if reporter is not None:
        reporter.close(timeout=5)


def _positive_int(value: Any) -> int | None:
    """A target count as an int; None for unknown (None, 0, negative: frameworks say -1 for unset)."""
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # inf: an epoch-bound loop whose length is unknown
        return None
    return number if number > 0 else None


def _with_rank(path: str, rank: int) -> str:
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))
