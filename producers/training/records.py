"""The records the reporter's thread builds: a step's StepCompleted from its marks, the heartbeat, plain numbers.

Off the training thread: the loop only took marks and enqueued; these turn marks into seconds and
tensors into floats.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from producers.training.identity import RankIdentity
from producers.training.step import _RECORD_FIELDS, _SEGMENT_SET, SEGMENTS
from producers.training.timing import SegmentTimer
from schemas.records import Event

if TYPE_CHECKING:
    from producers.training.comm import CommAccount
    from producers.training.step import Step

__all__ = ["coerce", "heartbeat_record", "step_record"]

_FLOAT_FIELDS = ("loss", "lr", "grad_norm")
_INT_FIELDS = ("samples", "tokens", "epoch")


def step_record(
    step: Step,
    ts_ms: int,
    ident: RankIdentity,
    timer: SegmentTimer,
    internal: Callable[[str, BaseException], None],
    comm: CommAccount | None = None,
) -> Event:
    """The StepCompleted of a step whose marks are all reached (off the training thread): segments
    summed, the collectives the SDK timed (`comm`) taken out of the segments they fell in."""
    seg: dict[str, float] = {}
    for name, begin, end in step._marks:
        seg[name] = seg.get(name, 0.0) + timer.elapsed_s(begin, end)
    if step._comm and comm is not None:
        comm.step_segments(step, seg, ts_ms, timer, ident)
    for _, begin, end in step._marks:
        timer.release(begin)
        timer.release(end)
    step_time = timer.elapsed_s(step._begin, step._end)
    timer.release(step._begin)
    timer.release(step._end)
    fields = step._fields
    if not seg.keys() <= _SEGMENT_SET:
        internal(
            "segment",
            ValueError(f"unknown segment(s) {sorted(seg.keys() - _SEGMENT_SET)}; known: {SEGMENTS}"),
        )
    if not fields.keys() <= _RECORD_FIELDS:
        internal("record", ValueError(f"unknown field(s) {sorted(fields.keys() - _RECORD_FIELDS)}"))
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


def heartbeat_record(ident: RankIdentity, ts_ms: int, interval_ns: int, blocked_ns: int) -> Event:
    """The heartbeat of a rank in a long step: a CollectiveSample of the share it spent blocked in `comm`."""
    return Event(
        "CollectiveSample",
        {
            "ts": ts_ms,
            "job_id": ident.job_id,
            "run_id": ident.run_id,
            "rank": ident.rank,
            "node": ident.node,
            "op": "comm",
            "interval_s": interval_ns / 1e9,
            "count": 0,
            "bytes": None,
            "time_s": max(0, blocked_ns) / 1e9,
            "bus_bw_gbps": None,
        },
    )


def coerce(event: Event) -> Event:
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
