"""What an alert's numbers are: for each rule, what its observed and expected values measure and in
which unit, and the unit of the metric history it carries.

A rule states its values as bare floats (`Finding.observed`, `.expected`); this table says what
they are, so the alert record carries each value with its own unit and meaning (`observed_unit`,
`observed_what`, ...) and a reader never borrows one value's unit for another (rank_hang's step
numbers were once shown under its SM activity's "%").

Units: `s`, `%` (0-100), `ratio` (a share, 0-1), `count`, `steps` (how many), `step` (a step
number), `GiB`, `W`, `MHz`, `code`, a
rate (`tokens/s per GPU`, `MB/s`, `/s`), or `` for a dimensionless number (a loss, a gradient norm,
a score).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RULE_MEASURES", "Measure", "measures_of", "unit_of_metric"]


@dataclass(frozen=True, slots=True)
class Measure:
    """What a value measures, in words, and its unit."""

    what: str
    unit: str


_COUNT_METRICS = frozenset(
    {
        "restarts", "failed_checkpoints", "failed_verifications", "foreign_pids", "failed_restore_tests",
        "unverified_newer_checkpoints", "ranks_timed_out", "loader_errors", "rank_faults",
        "ranks_outside_nodes", "ecc_uncorrected", "workers", "alloc_retries",
    }
)  # fmt: skip
_NAMED_UNITS = {
    "step": "steps",
    "xid": "code",
    "cache_hit_ratio": "ratio",
    "file_opens_s": "/s",
    "read_mb_s": "MB/s",
    "tokens_per_s_per_gpu": "tokens/s per GPU",
    "loss_window_median": "",
    "val_loss": "",
    "grad_norm": "",
}


def unit_of_metric(name: str) -> str:
    """The unit of a metric from its name (the detectors' naming: `*_s` seconds, `*_pct` %, ...)."""
    if name in _NAMED_UNITS:
        return _NAMED_UNITS[name]
    if name in _COUNT_METRICS:
        return "count"
    if name.startswith("steps_"):
        return "steps"
    if name.endswith("_pct"):
        return "%"
    if name.endswith("_per_s_per_gpu"):
        return f"{name.split('_per_s')[0]}/s per GPU"
    if name.endswith("_s") or name.startswith("seconds_"):
        return "s"
    if name.endswith("_gib"):
        return "GiB"
    if name.endswith("_w"):
        return "W"
    if name.endswith("_mhz"):
        return "MHz"
    if name.endswith(("ratio", "fraction")):
        return "ratio"
    return ""


def _same(what: str, unit: str, expected: str) -> tuple[Measure, Measure]:
    return Measure(what, unit), Measure(expected, unit)


def _count(what: str) -> tuple[Measure, Measure]:
    return _same(what, "count", "allowed")


# rule -> (observed, expected). Rules absent here measure their history metric (`measures_of`).
RULE_MEASURES: dict[str, tuple[Measure, Measure]] = {
    "checkpoint_failed": _count("failed checkpoints"),
    "checkpoint_retention": _same("newer checkpoints not yet verified", "count", "newer checkpoints kept"),
    "checkpoint_stale": _same("age of the latest verified checkpoint", "s", "maximum age"),
    "checkpoint_stuck": _same("time the checkpoint has been open", "s", "timeout"),
    "checkpoint_verify_failed": _count("failed verifications"),
    "clock_skew": _same("clock offset", "s", "expected offset"),
    "data_errors": _count("loader errors"),
    "dependency_timeout": _count("ranks timed out"),
    "ecc_uncorrectable": _count("uncorrectable ECC errors"),
    "gpu_idle_allocated": _same("GPU activity", "%", "idle below"),
    "gpu_memory_pressure": _same("GPU memory used (share of total)", "ratio", "limit"),
    "gpu_outside_allocation": _count("processes on GPUs outside the allocation"),
    "foreign_process": _count("foreign processes on the GPU"),
    "gpu_throttling": _same("SM clock (share of its maximum)", "ratio", "throttled below"),
    "grad_spike": _same("gradient norm", "", "rolling median"),
    "host_memory_pressure": _same("host memory available (share of total)", "ratio", "pressure below"),
    "ib_port_degraded": _same("InfiniBand/RoCE link errors in the window", "count", "allowed"),
    "straggler": _same("straggler score: the job's median time / the rank's", "", "threshold"),
    "network_degradation": _same("communication time per step", "s", "normal"),
    "long_pending": _same("time pending", "s", "limit"),
    "loss_divergence": _same("loss (window median)", "", "run's minimum"),
    "job_stall": _same("time without a step", "s", "allowed"),
    "rank_hang": _same("the rank's last step", "step", "the job's newest step"),
    "evaluation_stuck": _same("time the evaluation has been open", "s", "limit"),
    "zombie_job": _same("time without progress", "s", "grace"),
    "rank_failed": _count("failed ranks"),
    "rank_outside_nodes": _count("ranks outside the job's nodes"),
    "repeated_data": _same("distinct batches (share of the window)", "ratio", "minimum"),
    "restart_loop": _same("restarts in the window", "count", "allowed"),
    "restore_test_failed": _count("failed restore tests"),
    "restore_test_stale": _same("age of the newest restore-tested checkpoint", "s", "maximum age"),
    "allocator_churn": _same("CUDA allocator retries per minute", "/min", "expected"),
    "scaling_efficiency_low": _same(
        "tokens/s per GPU against the same configuration on fewer nodes", "ratio", "floor"
    ),
    "step_skip_rate": _same("skipped steps (share of the window)", "ratio", "limit"),
    "telemetry_missing": _same("time since the node's last sample", "s", "limit"),
    "validation_divergence": _same("relative rise of the validation loss", "", "expected rise"),
    "validation_missing": _same("steps since the last validation", "steps", "validation period"),
    "xid_error": (Measure("XID code", "code"), Measure("", "")),
}


def measures_of(rule: str, history_metric: str) -> tuple[Measure, Measure, str]:
    """The observed and expected measures of a rule's alert, and the unit of its history."""
    history_unit = unit_of_metric(history_metric) if history_metric else ""
    known = RULE_MEASURES.get(rule)
    if known is not None:
        return known[0], known[1], history_unit
    # Baseline deviations, GPU imbalance, throughput and the data-path rules measure their metric.
    what = history_metric.replace("_", " ") if history_metric else "value"
    return Measure(what, history_unit), Measure(_REFERENCE.get(rule, "expected"), history_unit), history_unit


# What the expected value of a rule that measures its history metric is.
_REFERENCE = {
    "baseline_deviation": "baseline of earlier runs",
    "gpu_imbalance": "median of the job's GPUs",
    "throughput_drop": "the run's recent windows",
}
