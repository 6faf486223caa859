"""Which rank a stalled job waits for (`rank_hang`): read from steps, collective samples and GPU activity.

Pure functions of a job's state as `ProgressDetector` keeps it (its ranks' last steps, collective
and GPU rows since the stall began) and the detector's knobs; the rule and its finding stay in
`progress.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streams.detectors.stats import median, stat_mean

if TYPE_CHECKING:
    from streams.detectors.progress import ProgressDetector

__all__ = ["hung_rank"]


def hung_rank(detector: ProgressDetector, job_id: str, job: dict[str, Any]) -> int | None:
    """The one rank the others wait for, if the evidence names exactly one (else None).

    In order: a rank behind the others' last step; the one rank out of the collective its peers
    are blocked in; the one GPU out of line in every sample; a kernel that never returns (GPM)
    or a hot GPU among cold spinning peers (power); the one GPU that never started the next step.
    """
    ranks = job["ranks"]
    if len(ranks) < 2:
        return None
    limit = max(1, int(detector.hang_max_fraction * len(ranks)))
    top = max(s for s, _ in ranks.values())
    behind = sorted(int(k) for k, (s, _) in ranks.items() if s < top)
    if 0 < len(behind) <= limit:
        return min(behind, key=lambda k: (ranks[str(k)][0], k))
    since = job["last_activity"]
    # Peers blocked in the collective, one rank not in it: that rank is the one they wait for.
    # Only a rank out of the collective in *every* sample since the stall began counts: the
    # first rank of a resuming job leaves the collective while its peers' samples still say
    # blocked, and that is recovery, not a hang.
    # Rows [ts, last fraction, highest fraction] of the buckets since the stall began.
    coll = {int(k): [x for x in v if x[0] > since] for k, v in job["coll"].items()}
    coll = {k: v for k, v in coll.items() if v}
    if len(coll) >= 2:
        blocked = [k for k, v in coll.items() if v[-1][1] >= detector.hang_coll_frac]
        free = sorted(k for k, v in coll.items() if max(x[-1] for x in v) < detector.hang_coll_frac)
        if blocked and 0 < len(free) <= limit:
            return free[0]
    # GPU activity since the stall began: a hung rank is out of line in *every* sample (its
    # lowest and highest reading on the same side of its peers); a GPU that only just came
    # back (a stalled job resuming) is not.
    spans = {int(k): [x for x in v if x[0] > since] for k, v in job["gpu"].items()}
    spans = {k: v for k, v in spans.items() if len(v) >= detector.hang_min_samples}
    if len(spans) >= 3:
        mid = median([median([x[1] for x in v]) or 0.0 for v in spans.values()])
        assert mid is not None
        odd = sorted(
            k
            for k, v in spans.items()
            if min(_low(x) for x in v) - mid >= detector.hang_gpu_gap
            or mid - max(_high(x) for x in v) >= detector.hang_gpu_gap
        )
        if len(odd) == 1:
            return odd[0]
    # Every GPU busy: the peers spin in the collective the hung rank never joins, and the hung
    # rank's own kernel does something else. The first sample after the last step still holds
    # the step every rank began, so these read the samples after it.
    later = {k: v[1:] for k, v in spans.items() if len(v) > detector.hang_min_samples}
    if len(later) >= 3:
        # GPM where every GPU has it (it tells spinning from work); power where it does not.
        gpm = all(_sm(x) is not None for v in later.values() for x in v)
        found = _hung_kernel(detector, later, limit) if gpm else _hot_rank(detector, job, later, limit)
        if found is not None:
            return found
    return _never_started(detector, job_id, job, spans)


def _hung_kernel(detector: ProgressDetector, rows: dict[int, list[list[Any]]], limit: int) -> int | None:
    """GPM: peers busy with few SMs active and no tensor work (a collective's spinning channel
    blocks); one rank busy with its SMs active (a kernel that never returns, or one still
    computing: either way the one they wait for)."""
    # Per rank and sample: (activity, SM activity, tensor activity).
    gpm = {k: [(float(x[1]), float(_sm(x) or 0.0), _tensor(x)) for x in v] for k, v in rows.items()}
    busy, quiet = detector.eval_busy_util, detector.hang_tensor_idle
    spinning = [
        k
        for k, v in gpm.items()
        if all(u >= busy and a <= detector.hang_spin_sm and t <= quiet for u, a, t in v)
    ]
    if len(rows) - len(spinning) > limit or not spinning:
        return None
    level = median([median([a for _, a, _ in gpm[k]]) or 0.0 for k in spinning]) or 0.0
    hung = [
        k
        for k, v in gpm.items()
        if k not in spinning and all(u >= busy and a - level >= detector.hang_gpu_gap for u, a, _ in v)
    ]
    return hung[0] if len(hung) == 1 else None


def _hot_rank(
    detector: ProgressDetector, job: dict[str, Any], rows: dict[int, list[list[Any]]], limit: int
) -> int | None:
    """No GPM: peers busy but cold (spinning draws a fraction of training power); one rank busy
    and drawing well above them in every sample (a kernel that keeps every SM resident)."""
    if len(job["power_train"]) < detector.hang_min_samples:
        return None
    reference = median(job["power_train"]) or 0.0
    if any(_power_low(x) is None for v in rows.values() for x in v):
        return None
    watts = {k: [float(_power_low(x) or 0.0) for x in v] for k, v in rows.items()}
    if not all(x[1] >= detector.eval_busy_util for v in rows.values() for x in v):
        return None
    level = median([median([x[2] for x in v]) or 0.0 for v in rows.values()]) or 0.0
    if level <= 0.0 or level > detector.hang_power_cold * reference:
        return None
    hot = sorted(k for k, ws in watts.items() if min(ws) >= detector.hang_power_ratio * level)
    return hot[0] if 0 < len(hot) <= min(1, limit) else None


def _never_started(
    detector: ProgressDetector, job_id: str, job: dict[str, Any], spans: dict[int, list[list[Any]]]
) -> int | None:
    """Every GPU idle now: the peers' GPUs ran the next step's forward and backward right after
    the last step, then waited; the hung rank's never started it. Read per node, whose GPUs the
    agent samples at the same instants (the last step's tail is in the same samples)."""
    if len(spans) < 3 or any(x[1] > detector.hang_idle for v in spans.values() for x in v[-1:]):
        return None
    since = job["last_activity"]
    starts = {
        int(k): m[2]
        for k, m in job["start"].items()
        if m[0] == since and m[1] >= detector.hang_start_samples and int(k) in spans
    }
    by_node: dict[str, list[int]] = {}
    for k in starts:
        binding = detector.topology.bindings.get((job_id, k))
        if binding is not None:
            by_node.setdefault(binding.node, []).append(k)
    late = []
    for ranks in by_node.values():
        for k in ranks:
            others = [starts[o] for o in ranks if o != k]
            if others and min(others) - starts[k] >= detector.hang_start_gap:
                late.append(k)
    return late[0] if len(late) == 1 else None


def _gpu_row(r: dict[str, Any], ts: int, power: float | None) -> list[Any]:
    """One rank's GPU in one summary bucket: [ts, mean activity, mean power, lowest activity,
    highest activity, lowest power, highest power, mean SM activity, mean tensor activity] (GPM
    values None where the GPU has none)."""
    util, watts = r["gpu_util_pct"], r.get("power_w")
    return [
        ts,
        float(util["sum"]) / int(util["n"]),
        power,
        float(util["min"]),
        float(util["max"]),
        float(watts["min"]) if watts else None,
        float(watts["max"]) if watts else None,
        stat_mean([r.get("sm_active_pct")]),
        stat_mean([r.get("tensor_active_pct")]),
    ]


def _sm(row: list[Any]) -> float | None:
    return float(row[7]) if len(row) > 7 and row[7] is not None else None


def _tensor(row: list[Any]) -> float:
    return float(row[8]) if len(row) > 8 and row[8] is not None else 0.0


def _power_low(row: list[Any]) -> float | None:
    return float(row[5]) if len(row) > 5 and row[5] is not None else None


def _activity(row: list[Any]) -> float:
    """How much of the interval the GPU worked: GPM SM activity (an average over the interval)
    where read, else the activity reading."""
    sm = _sm(row)
    return sm if sm is not None else float(row[1])


def _low(row: list[Any]) -> float:
    """A GPU row's lowest activity (snapshots before summaries held one sample: [ts, util, power])."""
    return float(row[3]) if len(row) > 3 else float(row[1])


def _high(row: list[Any]) -> float:
    return float(row[4]) if len(row) > 4 else float(row[1])
