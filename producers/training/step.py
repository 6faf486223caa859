"""A training step as the SDK times it: the step's marks and its named segments (`with step.segment(...)`)."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from producers.training.comm import Collective
    from producers.training.reporter import Reporter

__all__ = ["SEGMENTS", "Step"]

SEGMENTS: tuple[str, ...] = ("data_wait", "forward", "backward", "optimizer", "comm", "checkpoint")

_SEGMENT_SET = frozenset(SEGMENTS)

_RECORD_FIELDS = frozenset(
    ("samples", "tokens", "loss", "lr", "grad_norm", "skipped", "batch_fingerprint", "epoch")
)


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
        "_comm",
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
        self._comm: list[Collective] = []  # collectives the SDK timed during the step (comm.py)
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
