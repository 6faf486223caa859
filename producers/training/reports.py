"""Checkpoints and evaluation passes as the SDK reports them: started on enter, completed or failed on exit."""

from __future__ import annotations

from time import perf_counter_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from producers.training.faults import fault_detail
from producers.training.verify import Verification

if TYPE_CHECKING:
    from producers.training.reporter import Reporter

__all__ = ["CheckpointReport", "EvaluationReport"]


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


def _local_path(uri: str | None) -> str | None:
    """The local path of a checkpoint URI (`file://...` or a plain path); None for remote stores."""
    if not uri:
        return None
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None if "://" in uri else uri
