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
import importlib
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from time import perf_counter_ns, time_ns
from types import TracebackType
from typing import Any, Literal

from producers.publisher import Publisher, open_publisher
from producers.training.allocator import AllocatorProbe, torch_memory_stats
from producers.training.bindings import Binding, bindings_dir, process_start_time, write_binding
from producers.training.faults import fault_detail, fault_kind
from producers.training.identity import RankIdentity, job_nodes, resolve_identity
from producers.training.layout import env_layout, merge_layout
from producers.training.loader import MonitoredLoader
from producers.training.restore_test import DEFAULT_LOSS_TOLERANCE, restore_test_event
from producers.training.timing import HostTimer, SegmentTimer, TimingMode, choose_timer
from producers.training.verify import CheckpointVerifier, Verification
from schemas.errors import RanksightError
from schemas.records import Event

__all__ = ["SEGMENTS", "CheckpointReport", "EvaluationReport", "Reporter", "Step", "visible_gpu"]

log = logging.getLogger(__name__)
# Per-rank records that carry the rank's node: with the job it keys them (one job over many partitions).
_NODE_KEYED = frozenset({"CollectiveSample", "DataLoaderSample"})

SEGMENTS: tuple[str, ...] = ("data_wait", "forward", "backward", "optimizer", "comm", "checkpoint")
_SEGMENT_SET = frozenset(SEGMENTS)
_RECORD_FIELDS = frozenset(
    ("samples", "tokens", "loss", "lr", "grad_norm", "skipped", "batch_fingerprint", "epoch")
)
_JOB_STATES = frozenset(("pending", "running", "restarting", "preempted", "failed", "completed"))
_FLOAT_FIELDS = ("loss", "lr", "grad_norm")
_INT_FIELDS = ("samples", "tokens", "epoch")


def visible_gpu(
    local_rank: int | None, env: Mapping[str, str] | None = None, nvml: Any = None
) -> tuple[int | None, str | None]:
    """(index, uuid) of the GPU this rank uses (CUDA_VISIBLE_DEVICES[local_rank]) through NVML, or (None, None)."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return None, None
    slot = local_rank or 0
    if visible is not None:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if slot >= len(entries):
            return None, None
        target = entries[slot]
    else:
        target = str(slot)
    try:
        if nvml is None:
            nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # no driver, no library: this rank has no visible GPU to report
        return None, None
    try:
        if target.startswith(("GPU-", "MIG-")):
            handle = nvml.nvmlDeviceGetHandleByUUID(target)
        else:
            handle = nvml.nvmlDeviceGetHandleByIndex(int(target))
        uuid = nvml.nvmlDeviceGetUUID(handle)
        index = int(nvml.nvmlDeviceGetIndex(handle))
        return index, uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    except Exception:
        return None, None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


class _Segment:
    """Times one named part of a step; `with step.segment(name):`."""

    __slots__ = ("_name", "_step")

    def __init__(self, step: Step, name: str) -> None:
        self._step = step
        self._name = name

    def __enter__(self) -> _Segment:
        step = self._step
        if step._open is not None:
            step.segment_end()
        try:
            mark = step._mark()
            step._open = (self._name, mark)
            step._open_host = mark if step._host is None else step._host()
        except Exception as internal:
            step._reporter._internal("segment", internal)
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self._step.segment_end()
        return False


class Step:
    """One training step: `with reporter.step(n) as s:` (or `reporter.step_begin(n)` ... `step_end()`).

    On the training thread a segment edge only takes a mark of the reporter's timer (a host clock
    reading, or a CUDA event recorded on the current stream); the reporter's thread turns the
    marks into seconds once they are reached.
    """

    __slots__ = (
        "_allocator",
        "_begin",
        "_begin_host",
        "_end",
        "_fields",
        "_host",
        "_loader_wait_s",
        "_mark",
        "_marks",
        "_open",
        "_open_host",
        "_reporter",
        "step",
    )

    def __init__(self, reporter: Reporter, step: int) -> None:
        self._reporter = reporter
        self._mark = reporter._mark
        # Host monotonic ns for the heartbeat: the marks themselves with host clocks, a clock read with CUDA.
        self._host = None if reporter._host_marks else reporter._mono_ns
        self.step = step
        self._marks: list[tuple[str, Any, Any]] = []  # (segment, begin mark, end mark)
        self._open: tuple[str, Any] | None = None
        self._open_host = 0
        self._begin_host = 0
        self._fields: dict[str, Any] = {}
        self._begin: Any = None
        self._end: Any = None
        self._loader_wait_s: float | None = None  # time blocked in a wrapped loader's next() for this batch
        self._allocator: dict[str, int] | None = None  # the allocator's counters, when read at this step

    def segment(self, name: str) -> _Segment:
        """Time a part of the step: data_wait, forward, backward, optimizer, comm or checkpoint."""
        return _Segment(self, name)

    def segment_begin(self, name: str) -> None:
        """Start a segment (ends the one still open, if any)."""
        try:
            if self._open is not None:
                self.segment_end()
            mark = self._mark()
            self._open = (name, mark)
            self._open_host = mark if self._host is None else self._host()
        except Exception as internal:
            self._reporter._internal("segment", internal)

    def segment_end(self) -> None:
        """End the open segment (a no-op when none is open)."""
        opened = self._open
        if opened is None:
            return
        try:
            self._open = None
            self._marks.append((opened[0], opened[1], self._mark()))
        except Exception as internal:
            self._reporter._internal("segment", internal)

    def record(self, **values: Any) -> None:
        """Attach loss, lr, grad_norm, samples, tokens (tensors are fine), `skipped`, `batch_fingerprint`, `epoch`."""
        self._fields.update(values)

    def begin(self) -> Step:
        """Start the step (what `with` does on enter)."""
        try:
            mark = self._mark()
            self._begin = mark
            self._begin_host = mark if self._host is None else self._host()
            self._reporter._live_step = self
        except Exception as internal:
            self._reporter._internal("step", internal)
        return self

    def stop_clock(self) -> None:
        """Take the step's end mark now but publish later with `end()` (when values arrive after the step)."""
        try:
            if self._open is not None:
                self.segment_end()
            if self._end is None:
                self._end = self._mark()
            r = self._reporter
            if r._live_step is self:
                r._live_step = None
        except Exception as internal:
            self._reporter._internal("step", internal)

    def end(self, exc: BaseException | None = None) -> None:
        """End the step (what `with` does on exit); `exc` makes it a RankFault instead of a step."""
        self.stop_clock()
        try:
            self._reporter._step_done(self, exc)
        except Exception as internal:
            self._reporter._internal("step", internal)

    def __enter__(self) -> Step:
        return self.begin()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        self.end(exc)
        return False


class CheckpointReport:
    """One checkpoint: started on enter, completed (with `bytes`) or failed on exit; `verified(checksum)`.

    Retention: `keep` is how many checkpoints the policy keeps; set `deleted` to the checkpoint ids
    that saving this one removed, before the block ends (they are reported with the completion).
    A read-back that fails is `verification_failed(error)`.
    """

    def __init__(
        self,
        reporter: Reporter,
        step: int,
        uri: str | None,
        checkpoint_id: str,
        version: str | None,
        keep: int | None = None,
    ) -> None:
        self._reporter = reporter
        self.step = step
        self.uri = uri
        self.checkpoint_id = checkpoint_id
        self.version = version
        self.keep = keep
        self.bytes: int | None = None
        self.deleted: list[str] = []
        # The local file or folder written; verified off the training thread once completed.
        self.path: str | None = _local_path(uri)
        self._t0 = 0

    def _emit(self, phase: str, **extra: Any) -> None:
        r = self._reporter
        r._emit(
            "CheckpointEvent",
            {
                "ts": r._now_ms(),
                "job_id": r.identity.job_id,
                "run_id": r.identity.run_id,
                "rank": r.identity.rank,
                "checkpoint_id": self.checkpoint_id,
                "step": self.step,
                "phase": phase,
                "uri": self.uri,
                "bytes": extra.get("bytes"),
                "duration_s": extra.get("duration_s"),
                "version": self.version,
                "checksum": extra.get("checksum"),
                "error": extra.get("error"),
                "retention_keep": self.keep,
                "deleted": [str(d) for d in extra.get("deleted", ())],
            },
        )

    def __enter__(self) -> CheckpointReport:
        try:
            self._emit("started")
        except Exception as internal:
            self._reporter._internal("checkpoint", internal)
        self._t0 = perf_counter_ns()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        duration = (perf_counter_ns() - self._t0) / 1e9
        try:
            if exc is None:
                self._emit("completed", bytes=self.bytes, duration_s=duration, deleted=self.deleted)
                self._reporter._verify_checkpoint(self)
            else:
                self._emit(
                    "failed",
                    bytes=self.bytes,
                    duration_s=duration,
                    error=f"{type(exc).__name__}: {exc}"[:2000],
                )
        except Exception as internal:
            self._reporter._internal("checkpoint", internal)
        return False  # the user's exception is theirs: re-raised

    def _verification(self, result: Verification) -> None:
        """The verifier's outcome for this checkpoint (called on its thread)."""
        if result.ok:
            self.bytes = self.bytes if self.bytes is not None else result.bytes
            self.verified(result.checksum)
        else:
            self.verification_failed(result.error or "verification failed")

    def verified(self, checksum: str | None = None) -> None:
        """The checkpoint was read back and its checksum matches."""
        try:
            self._emit("verified", bytes=self.bytes, checksum=checksum)
        except Exception as internal:
            self._reporter._internal("checkpoint", internal)

    def verification_failed(self, error: str | BaseException, checksum: str | None = None) -> None:
        """Reading the checkpoint back failed, or its checksum does not match: it is no recovery point."""
        try:
            text = fault_detail(error) if isinstance(error, BaseException) else str(error)[:2000]
            self._emit("verify_failed", bytes=self.bytes, checksum=checksum, error=text)
        except Exception as internal:
            self._reporter._internal("checkpoint", internal)


class EvaluationReport:
    """One evaluation pass: EvaluationEvent `started` on enter, `completed` or `failed` on exit."""

    def __init__(
        self,
        reporter: Reporter,
        step: int,
        name: str | None,
        evaluation_id: str,
        expected_duration_s: float | None,
    ) -> None:
        self._reporter = reporter
        self.step = step
        self.name = name
        self.evaluation_id = evaluation_id
        self.expected_duration_s = expected_duration_s
        self.batches: int | None = None
        self._t0 = 0

    def _emit(self, phase: str, duration_s: float | None = None, error: str | None = None) -> None:
        self._reporter._job_event(
            "EvaluationEvent",
            {
                "rank": self._reporter.identity.rank,
                "evaluation_id": self.evaluation_id,
                "step": self.step,
                "phase": phase,
                "name": self.name,
                "expected_duration_s": self.expected_duration_s,
                "duration_s": duration_s,
                "batches": self.batches,
                "error": error,
            },
            per_rank=False,
        )

    def begin(self) -> EvaluationReport:
        """Send `started` (what `with` does on enter)."""
        try:
            self._t0 = self._reporter._mono_ns()
            self._emit("started")
        except Exception as internal:
            self._reporter._internal("evaluation", internal)
        return self

    def end(self, exc: BaseException | None = None) -> None:
        """Send `completed`, or `failed` with the exception (what `with` does on exit)."""
        try:
            duration = (self._reporter._mono_ns() - self._t0) / 1e9
            if exc is None:
                self._emit("completed", duration)
            else:
                self._emit("failed", duration, f"{type(exc).__name__}: {exc}"[:2000])
        except Exception as internal:
            self._reporter._internal("evaluation", internal)

    def __enter__(self) -> EvaluationReport:
        return self.begin()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        self.end(exc)
        return False


def _seconds(text: str | None, default: float) -> float:
    """A period from the environment; the default when unset or not a number."""
    try:
        return default if text is None or not text.strip() else float(text)
    except ValueError:
        return default


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
        self._last_beat_ns = now_ns
        ident = self.identity
        self._outbox.appendleft(
            Event(
                "CollectiveSample",
                {
                    "ts": self._now_ms(),
                    "job_id": ident.job_id,
                    "run_id": ident.run_id,
                    "rank": ident.rank,
                    "node": ident.node,
                    "op": "comm",
                    "interval_s": interval / 1e9,
                    "count": 0,
                    "bytes": None,
                    "time_s": max(0, blocked) / 1e9,
                    "bus_bw_gbps": None,
                },
            )
        )
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
                    if not self._resolved(item[0], final):
                        return  # its GPU work is still running: keep the order, look again at the next poll
                    event = self._step_record(*item)
                elif callable(item):
                    event = item()
                else:
                    event = item
                if event is not None and self.publisher is not None:
                    self.publisher.publish(_coerce(event))
                    self._counts["published"] += 1
            except Exception as exc:
                self._internal(f"publish-{getattr(item, 'type', 'task')}", exc)
            outbox.popleft()

    def _resolved(self, step: Step, final: bool) -> bool:
        """Whether every mark of the step has been reached; at close, wait for them."""
        timer = self._timer
        marks = [step._begin, step._end, *(m for _, b, e in step._marks for m in (b, e))]
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
        step._allocator = self._allocator_probe.sample()
        # The training thread only stamps the time and enqueues; the record is built off-thread.
        if len(self._outbox) >= self._max_pending:
            self._counts["dropped"] += 1
            return
        self._outbox.append((step, self._now_ms()))
        self._counts["enqueued"] += 1

    def _step_record(self, step: Step, ts_ms: int) -> Event:
        ident = self.identity
        timer = self._timer
        seg: dict[str, float] = {}
        for name, begin, end in step._marks:
            seg[name] = seg.get(name, 0.0) + timer.elapsed_s(begin, end)
            timer.release(begin)
            timer.release(end)
        step_time = timer.elapsed_s(step._begin, step._end)
        timer.release(step._begin)
        timer.release(step._end)
        fields = step._fields
        if not seg.keys() <= _SEGMENT_SET:
            self._internal(
                "segment",
                ValueError(f"unknown segment(s) {sorted(seg.keys() - _SEGMENT_SET)}; known: {SEGMENTS}"),
            )
        if not fields.keys() <= _RECORD_FIELDS:
            self._internal("record", ValueError(f"unknown field(s) {sorted(fields.keys() - _RECORD_FIELDS)}"))
        get = seg.get
        return Event(
            "StepCompleted",
            {
                "ts": ts_ms,
                "job_id": ident.job_id,
                "run_id": ident.run_id,
                "rank": ident.rank,
                "node": ident.node,
                "step": step.step,
                "samples": fields.get("samples"),
                "tokens": fields.get("tokens"),
                "loss": fields.get("loss"),
                "lr": fields.get("lr"),
                "grad_norm": fields.get("grad_norm"),
                "step_time_s": step_time,
                "data_wait_s": get("data_wait", step._loader_wait_s),
                "forward_s": get("forward"),
                "backward_s": get("backward"),
                "optimizer_s": get("optimizer"),
                "comm_s": get("comm"),
                "checkpoint_s": get("checkpoint"),
                "skipped": bool(fields.get("skipped", False)),
                "batch_fingerprint": fields.get("batch_fingerprint"),
                "epoch": fields.get("epoch"),
                **(step._allocator or {}),
            },
        )

    # -- public API -------------------------------------------------------------------------

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
    ) -> MonitoredLoader:
        """`for batch in reporter.wrap_loader(loader):` data wait, batch fingerprints and DataLoaderSamples.

        Works with a PyTorch `DataLoader` or any iterable; see `producers.training.loader` for
        what is measured. `fingerprint=False` skips hashing batches; a callable replaces the hash.
        """
        return MonitoredLoader(self, loader, interval_s=interval_s, fingerprint=fingerprint)

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


def _local_path(uri: str | None) -> str | None:
    """The local path of a checkpoint URI (`file://...` or a plain path); None for remote stores."""
    if not uri:
        return None
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None if "://" in uri else uri


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


def _coerce(event: Event) -> Event:
    """Numbers the user passed (tensors, numpy scalars) -> plain floats and ints, on the background thread."""
    record = event.record
    if event.type == "StepCompleted":
        for name in _FLOAT_FIELDS:
            value = record[name]
            if value is not None and type(value) is not float:
                record[name] = float(value)
        for name in _INT_FIELDS:
            value = record[name]
            if value is not None and type(value) is not int:
                record[name] = int(value)
    elif event.type == "ValidationResult":
        record["metrics"] = {str(k): float(v) for k, v in record["metrics"].items()}
    return event
