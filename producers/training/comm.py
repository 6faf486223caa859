"""Collective time without hand timing: a DDP communication hook and torch.distributed's collectives, timed.

DDP overlaps its gradient all-reduce with backward inside the framework, so no user code can put
a `comm` segment around it. The SDK measures it itself:

- `reporter.watch_ddp(model)` registers a communication hook on a `DistributedDataParallel`
  model that wraps the default all-reduce (or the hook passed in): each bucket's collective is
  marked when launched and when its future completes.
- `reporter.watch_collectives()` wraps `torch.distributed`'s collectives (all_reduce,
  all_gather[_into_tensor|_single], reduce_scatter[_tensor|_single], broadcast,
  all_to_all[_single], reduce, barrier) for every caller that looks them up through the module (`dist.all_reduce(...)`):
  plain collectives and FSDP's all-gathers and reduce-scatters. A blocking call is marked around
  the call; an asynchronous one (`async_op=True`) when its work's future completes.

Marks come from the reporter's timer: host clocks on CPU; on a GPU, CUDA events recorded on the
current stream (at launch, and in the future's callback, where the stream waits for the
collective), resolved off the training thread with the step.

Per step, the reporter turns the collectives launched during the step into `comm_s`, the time the
rank was blocked in communication rather than computing (the schema's "not overlapped"):

- a blocking collective: its whole duration;
- asynchronous ones (DDP's buckets, overlapped with backward): the tail from the last launch
  (when the last bucket's gradients were ready, i.e. backward's compute was done) to the last
  completion -- the wait DDP makes backward do before it returns.

That exposed time is taken out of the segment it fell in (DDP: backward), so a segment's
compute no longer counts the wait for a slow peer; the straggler rule sees who waited for whom.
Every `interval_s` the reporter also publishes one CollectiveSample per operation: calls, bytes,
and the exposed time (`time_s`: blocked in it).

Nothing here imports torch at module level: `watch_*` take the module from the caller or from
`sys.modules`.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from schemas.records import Event

if TYPE_CHECKING:
    from producers.training.identity import RankIdentity
    from producers.training.step import Step
    from producers.training.timing import SegmentTimer

__all__ = [
    "COLLECTIVES",
    "Collective",
    "CommAccount",
    "CommMeter",
    "OpTotals",
    "exposed_spans",
    "subtract_spans",
]

# torch.distributed functions wrapped by `watch_collectives` (those absent in a version are skipped).
COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "barrier",
)
_OP_NAME = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "all_gather_into_tensor": "allgather",
    "all_gather_single": "allgather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "broadcast": "broadcast",
    "all_to_all": "alltoall",
    "all_to_all_single": "alltoall",
    "reduce": "reduce",
    "barrier": "barrier",
}
_MAX_OPEN = 65_536  # collectives kept for one step: a loop that never ends a step must not grow forever


class Collective:
    """One collective call: its operation, bytes, and timer marks at launch and completion (None until done)."""

    __slots__ = ("blocking", "bytes", "end", "launched_ns", "op", "start")

    def __init__(self, op: str, nbytes: int | None, start: Any, blocking: bool, launched_ns: int) -> None:
        self.op = op
        self.bytes = nbytes
        self.start = start
        self.end: Any = None
        self.blocking = blocking
        self.launched_ns = launched_ns  # host monotonic ns: how long a rank has been blocked (heartbeat)


@dataclass
class OpTotals:
    """One operation's calls, bytes and exposed seconds over a reporting interval."""

    count: int = 0
    bytes: int = 0
    exposed_s: float = 0.0
    sized: bool = field(default=False)  # whether any call's size was known


def exposed_spans(spans: Iterable[tuple[str, float, float, bool]]) -> list[tuple[str, float, float]]:
    """The time blocked in communication, as disjoint (op, start, end) spans in seconds since the step began.

    `spans` are (op, start, end, blocking). A blocking call is exposed for its whole duration;
    of the asynchronous ones only the tail from the last launch to the last completion is (the
    rest overlapped the compute that launched them). Overlapping pieces are merged, the merged
    piece named after the operation that ended last.
    """
    pieces: list[tuple[str, float, float]] = []
    tail_start: float | None = None
    tail_end: float | None = None
    tail_op = ""
    for op, start, end, blocking in spans:
        if end <= start and not blocking:
            end = start
        if blocking:
            if end > start:
                pieces.append((op, start, end))
            continue
        tail_start = start if tail_start is None else max(tail_start, start)
        if tail_end is None or end >= tail_end:
            tail_end, tail_op = end, op
    if tail_start is not None and tail_end is not None and tail_end > tail_start:
        pieces.append((tail_op, tail_start, tail_end))
    pieces.sort(key=lambda p: p[1])
    merged: list[tuple[str, float, float]] = []
    for op, start, end in pieces:
        if merged and start <= merged[-1][2]:
            last = merged[-1]
            merged[-1] = (op if end >= last[2] else last[0], last[1], max(last[2], end))
        else:
            merged.append((op, start, end))
    return merged


def subtract_spans(
    segments: dict[str, list[tuple[float, float]]], spans: Iterable[tuple[str, float, float]]
) -> dict[str, float]:
    """Seconds of each segment (name -> its (start, end) intervals) that the exposed spans cover."""
    out: dict[str, float] = {}
    spans = list(spans)
    for name, intervals in segments.items():
        covered = 0.0
        for seg_start, seg_end in intervals:
            for _, start, end in spans:
                covered += max(0.0, min(end, seg_end) - max(start, seg_start))
        if covered > 0:
            out[name] = covered
    return out


def _nbytes(value: Any) -> int | None:
    """Bytes of a tensor (or of a list of tensors); None when unknown."""
    if isinstance(value, (list, tuple)):
        sizes = [_nbytes(v) for v in value]
        known = [s for s in sizes if s is not None]
        return sum(known) if known else None
    try:
        return int(value.numel()) * int(value.element_size())
    except (AttributeError, TypeError, RuntimeError):
        return None


class CommMeter:
    """Marks the collectives this rank launches; the reporter takes those of each step when it ends.

    `mark` is the reporter's timer mark (host clock or CUDA event); it is called on the training
    thread at launch and on the communication thread at completion.
    """

    def __init__(
        self,
        mark: Callable[[], Any],
        on_error: Callable[[str, BaseException], None],
        clock_ns: Callable[[], int] = perf_counter_ns,
    ) -> None:
        self._mark = mark
        self._clock = clock_ns
        self._on_error = on_error
        self._open: list[Collective] = []
        self._quiet = threading.local()  # set while a hook's own collective runs: counted once
        self._undo: list[Callable[[], None]] = []
        self.dropped = 0

    # -- marking ----------------------------------------------------------------------------

    def begin(self, op: str, nbytes: int | None, *, blocking: bool) -> Collective | None:
        """A collective is launched now (None when this thread is inside a hook already timing it)."""
        if getattr(self._quiet, "on", False):
            return None
        if len(self._open) >= _MAX_OPEN:
            self.dropped += 1
            return None
        c = Collective(op, nbytes, self._mark(), blocking, self._clock())
        self._open.append(c)  # list.append is atomic: a completion thread never appends
        return c

    def finish(self, c: Collective | None) -> None:
        """The collective completed (called on whichever thread saw it complete)."""
        if c is not None:
            try:
                c.end = self._mark()
            except Exception as exc:
                self._on_error("comm", exc)

    def finish_when_done(self, c: Collective | None, future: Any) -> None:
        """Mark `c` complete when `future` (a torch.futures.Future) completes."""
        if c is None:
            return
        try:
            future.add_done_callback(lambda _fut: self.finish(c))
        except Exception as exc:
            self._on_error("comm", exc)

    def blocked_since_ns(self) -> int | None:
        """Host clock at the launch of the oldest collective of this step still running (None: none is)."""
        waiting = [c.launched_ns for c in list(self._open) if c.end is None]
        return min(waiting) if waiting else None

    def take(self) -> list[Collective]:
        """The collectives launched since the last take (the step that just ended)."""
        taken, self._open = self._open, []
        return taken

    # -- DDP --------------------------------------------------------------------------------

    def ddp_hook(self, inner: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """A DDP communication hook timing `inner` (e.g. `default_hooks.allreduce_hook`) per bucket."""

        @functools.wraps(inner)
        def timed(state: Any, bucket: Any) -> Any:
            try:
                nbytes = _nbytes(bucket.buffer())
            except Exception:
                nbytes = None
            c = self.begin("allreduce", nbytes, blocking=False)
            self._quiet.on = True  # the hook's own dist.all_reduce is this collective, not another
            try:
                future = inner(state, bucket)
            finally:
                self._quiet.on = False
            self.finish_when_done(c, future)
            return future

        return timed

    def watch_ddp(
        self, model: Any, *, hook: Callable[[Any, Any], Any] | None = None, state: Any = None
    ) -> None:
        """Register the timing hook on a DistributedDataParallel `model` (before its first backward)."""
        if hook is None:
            default_hooks = importlib.import_module(
                "torch.distributed.algorithms.ddp_comm_hooks.default_hooks"
            )
            hook = default_hooks.allreduce_hook
        model.register_comm_hook(state, self.ddp_hook(hook))

    # -- torch.distributed ------------------------------------------------------------------

    def watch_collectives(self, dist: Any = None, names: Iterable[str] = COLLECTIVES) -> Callable[[], None]:
        """Wrap `torch.distributed`'s collectives in this process; returns the function that unwraps them."""
        if dist is None:
            dist = sys.modules.get("torch.distributed") or importlib.import_module("torch.distributed")
        undo: list[tuple[str, Any]] = []
        for name in names:
            original = getattr(dist, name, None)
            if original is None or getattr(original, "_ranksight_wrapped", False):
                continue
            setattr(dist, name, self._wrap(name, original))
            undo.append((name, original))

        def unwrap() -> None:
            for name, original in undo:
                setattr(dist, name, original)
            undo.clear()

        self._undo.append(unwrap)
        return unwrap

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        op = _OP_NAME.get(name, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._quiet, "on", False):
                return original(*args, **kwargs)
            asynchronous = bool(kwargs.get("async_op", False))
            try:
                c = self.begin(op, _nbytes(args[0]) if args else None, blocking=not asynchronous)
            except Exception as exc:
                self._on_error("comm", exc)
                c = None
            # A wrapped collective that calls another (all_gather via all_gather_into_tensor)
            # counts once.
            self._quiet.on = True
            try:
                result = original(*args, **kwargs)
            finally:
                self._quiet.on = False
            if c is not None:
                if asynchronous and result is not None:
                    try:
                        self.finish_when_done(c, result.get_future())
                    except Exception as exc:  # a backend without futures: the wait is not seen
                        self._on_error("comm", exc)
                        c.end = c.start
                else:
                    self.finish(c)
            return result

        timed._ranksight_wrapped = True  # type: ignore[attr-defined]
        return timed

    def close(self) -> None:
        """Unwrap every collective this meter wrapped."""
        while self._undo:
            self._undo.pop()()


class CommAccount:
    """The reporter thread's side: a resolved step's SDK-timed collectives -> its `comm` segment,
    and per-op totals published as one CollectiveSample per operation every `interval_ms`."""

    def __init__(self, interval_ms: int) -> None:
        self.interval_ms = interval_ms
        self.since_ms: int | None = None
        self.totals: dict[str, OpTotals] = {}
        self.due: list[Event] = []  # samples whose interval ended with the last step, to publish

    def step_segments(
        self, step: Step, seg: dict[str, float], ts_ms: int, timer: SegmentTimer, ident: RankIdentity
    ) -> None:
        """The step's collectives -> its `comm` segment (exposed time, taken out of the segments it fell in)."""
        begin = step._begin
        spans = [
            (c.op, timer.elapsed_s(begin, c.start), timer.elapsed_s(begin, c.end), c.blocking)
            for c in step._comm
        ]
        exposed = exposed_spans(spans)
        if "comm" not in seg:  # a `comm` segment the user timed by hand stays theirs
            intervals: dict[str, list[tuple[float, float]]] = {}
            for name, b, e in step._marks:
                intervals.setdefault(name, []).append((timer.elapsed_s(begin, b), timer.elapsed_s(begin, e)))
            for name, covered in subtract_spans(intervals, exposed).items():
                seg[name] = max(0.0, seg[name] - covered)
            seg["comm"] = sum(e - s for _, s, e in exposed)
        totals = self.totals
        for c in step._comm:
            t = totals.get(c.op)
            if t is None:
                t = totals[c.op] = OpTotals()
            t.count += 1
            if c.bytes is not None:
                t.bytes += c.bytes
                t.sized = True
            timer.release(c.start)
            timer.release(c.end)
        for op, s, e in exposed:
            totals.setdefault(op, OpTotals()).exposed_s += e - s
        step._comm = []
        if self.since_ms is None:  # the interval starts at the first timed step's beginning
            self.since_ms = ts_ms - int(timer.elapsed_s(begin, step._end) * 1000)
        if ts_ms - self.since_ms >= self.interval_ms:
            self.due.extend(self.samples(ts_ms, ident))

    def samples(self, ts_ms: int, ident: RankIdentity) -> list[Event]:
        """One CollectiveSample per operation over the interval that ends now; the next one starts."""
        since = self.since_ms if self.since_ms is not None else ts_ms
        interval_s = max(1e-3, (ts_ms - since) / 1000)
        out = [
            Event(
                "CollectiveSample",
                {
                    "ts": ts_ms,
                    "job_id": ident.job_id,
                    "run_id": ident.run_id,
                    "rank": ident.rank,
                    "node": ident.node,
                    "op": op,
                    "interval_s": interval_s,
                    "count": t.count,
                    "bytes": t.bytes if t.sized else None,
                    "time_s": min(t.exposed_s, interval_s),
                    "bus_bw_gbps": None,
                },
            )
            for op, t in sorted(self.totals.items())
        ]
        self.totals = {}
        self.since_ms = ts_ms
        return out
