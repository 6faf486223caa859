"""Values no producer can measure: removed before any detector sees them.

A schema-valid record can still carry a value that no instrument produces: a negative duration,
GPU activity of 140 %, more device memory used than the device has, a negative power draw, an
infinite step time. A detector judging such a value alerts on a fault that does not exist (a
"straggler" with a negative step time, "memory pressure" at 300 %). `clean` returns the record
with every such value replaced by "unknown" (None for optional fields, NaN for required floats,
which every detector already treats as missing) and the names of the fields it replaced, so the
engine can count them.

Non-finite *loss* and *gradient norm* are kept: they are real measurements and the numerical
detector's signal. Timestamps are the engine's business (`streams.stages.engine`), not this module's.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from schemas.records import Event

__all__ = ["MAX_DURATION_S", "clean"]

_NONNEG = "nonneg"  # finite and >= 0
_POSITIVE = "positive"  # finite and > 0
_PERCENT = "percent"  # finite, 0..100
_FINITE = "finite"  # any finite number
_DURATION = "duration"  # seconds, 0 .. MAX_DURATION_S
_POSITIVE_DURATION = "positive_duration"  # seconds, > 0 and <= MAX_DURATION_S

# No step, checkpoint, evaluation or sampling interval lasts longer than this (~116 days); a
# larger value is a unit or overflow bug, and would overflow when turned into milliseconds.
MAX_DURATION_S = 1e7

# record type -> field -> (kind, required). Required fields become NaN, optional ones None.
# Only fields some detector reads are checked: this runs on every event (the sink stores the rest).
_RULES: dict[str, dict[str, tuple[str, bool]]] = {
    "StepCompleted": {
        "step_time_s": (_DURATION, True),
        "data_wait_s": (_DURATION, False),
        "forward_s": (_DURATION, False),
        "backward_s": (_DURATION, False),
        "optimizer_s": (_DURATION, False),
        "comm_s": (_DURATION, False),
        "samples": (_NONNEG, False),
        "tokens": (_NONNEG, False),
    },
    "GpuSample": {
        "gpu_util_pct": (_PERCENT, False),
        "mem_used_bytes": (_NONNEG, False),
        "mem_total_bytes": (_POSITIVE, False),
        "power_w": (_NONNEG, False),
        "sm_clock_mhz": (_NONNEG, False),
        "sm_clock_max_mhz": (_POSITIVE, False),
        "clock_event_reasons": (_NONNEG, False),
        "ecc_uncorrected": (_NONNEG, False),
        "remapped_rows_uncorrectable": (_NONNEG, False),
        "xid": (_NONNEG, False),
    },
    "HostSample": {
        "mem_used_bytes": (_NONNEG, False),
        "mem_available_bytes": (_NONNEG, False),
        "mem_total_bytes": (_POSITIVE, False),
        "tcp_retrans_segs_s": (_NONNEG, False),
        "oom_kills": (_NONNEG, False),
    },
    "CheckpointEvent": {"duration_s": (_DURATION, False)},
    "CollectiveSample": {"interval_s": (_POSITIVE_DURATION, True), "time_s": (_DURATION, True)},
    "DataLoaderSample": {"interval_s": (_POSITIVE_DURATION, True)},
    "ValidationResult": {"duration_s": (_DURATION, False)},
    "JobStarted": {
        "checkpoint_max_age_s": (_POSITIVE_DURATION, False),
        "checkpoint_timeout_s": (_POSITIVE_DURATION, False),
        "world_size": (_NONNEG, True),
    },
}

# Pairs (part, whole): a part larger than its whole was not measured.
_PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "GpuSample": (("mem_used_bytes", "mem_total_bytes"),),
    "HostSample": (("mem_used_bytes", "mem_total_bytes"), ("mem_available_bytes", "mem_total_bytes")),
}


# kind -> the closed range of believable values. NaN fails every comparison and infinities fall
# outside, so one chained comparison checks a value.
_TINY = 5e-324  # the smallest positive float: "> 0" as an inclusive bound that ints pass too
_RANGES: dict[str, tuple[float, float]] = {
    _NONNEG: (0.0, sys.float_info.max),
    _POSITIVE: (_TINY, sys.float_info.max),
    _PERCENT: (0.0, 100.0),
    _FINITE: (-sys.float_info.max, sys.float_info.max),
    _DURATION: (0.0, MAX_DURATION_S),
    _POSITIVE_DURATION: (_TINY, MAX_DURATION_S),
}
# record type -> ((field, low, high, required), ...): the table above, compiled once.
_CHECKS: dict[str, tuple[tuple[str, float, float, bool], ...]] = {
    kind: tuple((name, *_RANGES[rule], required) for name, (rule, required) in fields.items())
    for kind, fields in _RULES.items()
}


def clean(event: Event) -> tuple[Event, tuple[str, ...]]:
    """The event with unmeasurable values made unknown, and the fields replaced (empty: unchanged)."""
    checks = _CHECKS.get(event.type)
    if checks is None:
        return event, ()
    r = event.record
    get = r.get
    bad: dict[str, Any] = {}
    for name, low, high, required in checks:
        value = get(name)
        if value is None:
            continue
        try:
            if low <= value <= high:
                continue
        except TypeError:  # not a number at all (a caller bypassing the schema)
            pass
        if required:
            bad[name] = math.nan if name.endswith("_s") else 0
        else:
            bad[name] = None
    for part, whole in _PARTS.get(event.type, ()):
        p, w = bad.get(part, r.get(part)), bad.get(whole, r.get(whole))
        if p is not None and w is not None and p > w:
            bad[part] = None
    if not bad:
        return event, ()
    return Event(event.type, {**r, **bad}), tuple(sorted(bad))
