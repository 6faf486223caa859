"""The detectors: pure event-time classes the engine runs over every event (see `base.py`).

`ALL_DETECTORS` lists every detector class the engine loads, in a fixed order (findings of one
event are handled in this order, which keeps replays deterministic).
"""

from __future__ import annotations

import importlib

from streams.detectors.base import Detector

__all__ = ["ALL_DETECTORS", "WORKER_RULES", "rules_of"]

# Rules no detector raises: the worker raises them itself from the wall clock, which detectors
# never read (rule -> where). Runbooks, routing and the checks that walk every rule include them.
WORKER_RULES: dict[str, str] = {"input_silent": "streams.runtime.guard.InputSilence"}

# (module, class) in engine order. A module that does not exist (yet) is skipped; any other
# import error propagates, so a broken detector is never silently dropped.
_DETECTOR_CLASSES: tuple[tuple[str, str], ...] = (
    ("streams.detectors.progress", "ProgressDetector"),
    ("streams.detectors.imbalance", "ImbalanceDetector"),
    ("streams.detectors.baseline", "BaselineDetector"),
    ("streams.detectors.throughput", "ThroughputDetector"),
    # Rules split out of one detector keep its config section and its place, in the order its
    # findings of one event came out of it (a replay gives the same alerts in the same order).
    # Section `numerical`.
    ("streams.detectors.nonfinite_loss", "NonfiniteLossDetector"),
    ("streams.detectors.nonfinite_grad", "NonfiniteGradDetector"),
    ("streams.detectors.loss_divergence", "LossDivergenceDetector"),
    ("streams.detectors.grad_spike", "GradSpikeDetector"),
    # Section `recovery`.
    ("streams.detectors.checkpoint_stuck", "CheckpointStuckDetector"),
    ("streams.detectors.checkpoint_failed", "CheckpointFailedDetector"),
    ("streams.detectors.checkpoint_stale", "CheckpointStaleDetector"),
    ("streams.detectors.resource", "ResourceDetector"),
    # Section `infrastructure`.
    ("streams.detectors.telemetry_missing", "TelemetryMissingDetector"),
    ("streams.detectors.xid_error", "XidErrorDetector"),
    ("streams.detectors.ecc_uncorrectable", "EccUncorrectableDetector"),
    ("streams.detectors.gpu_throttling", "GpuThrottlingDetector"),
    ("streams.detectors.gpu_memory_pressure", "GpuMemoryPressureDetector"),
    ("streams.detectors.host_memory_pressure", "HostMemoryPressureDetector"),
    ("streams.detectors.ib_port_degraded", "IbPortDegradedDetector"),
    # Section `platform`.
    ("streams.detectors.long_pending", "LongPendingDetector"),
    ("streams.detectors.restart_loop", "RestartLoopDetector"),
    # Section `readiness`.
    ("streams.detectors.restore_test_failed", "RestoreTestFailedDetector"),
    ("streams.detectors.restore_test_stale", "RestoreTestStaleDetector"),
    ("streams.detectors.clock", "ClockDetector"),
    # Section `datapath`.
    ("streams.detectors.repeated_data", "RepeatedDataDetector"),
    ("streams.detectors.data_errors", "DataErrorsDetector"),
    ("streams.detectors.validation", "ValidationDetector"),
    # Issue 23: one rule per file.
    ("streams.detectors.data_path_slow", "DataPathSlowDetector"),
    ("streams.detectors.cache_hit_collapse", "CacheHitCollapseDetector"),
    ("streams.detectors.file_open_drop", "FileOpenDropDetector"),
    ("streams.detectors.loader_workers_lost", "LoaderWorkersLostDetector"),
    ("streams.detectors.rank_failed", "RankFailedDetector"),
    ("streams.detectors.dependency_timeout", "DependencyTimeoutDetector"),
    ("streams.detectors.step_skip_rate", "StepSkipRateDetector"),
    ("streams.detectors.gpu_outside_allocation", "GpuOutsideAllocationDetector"),
    ("streams.detectors.rank_outside_nodes", "RankOutsideNodesDetector"),
    ("streams.detectors.gpu_idle_allocated", "GpuIdleAllocatedDetector"),
    ("streams.detectors.checkpoint_verify_failed", "CheckpointVerifyFailedDetector"),
    ("streams.detectors.checkpoint_retention", "CheckpointRetentionDetector"),
    # Issue 35: what "good" means, declared by teams; the learning rate; non-finite evaluations.
    ("streams.detectors.acceptance", "AcceptanceDetector"),
    ("streams.detectors.lr_invalid", "LrInvalidDetector"),
    ("streams.detectors.validation_nonfinite", "ValidationNonfiniteDetector"),
    ("streams.detectors.allocator_churn", "AllocatorChurnDetector"),
)


def _load() -> list[type[Detector]]:
    classes: list[type[Detector]] = []
    for module_name, class_name in _DETECTOR_CLASSES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        classes.append(getattr(module, class_name))
    return classes


ALL_DETECTORS: list[type[Detector]] = _load()


def rules_of(classes: list[type[Detector]] | None = None) -> dict[str, str]:
    """Rule name -> detector class name, for every loaded detector (with no `classes`: also the
    worker's own rules, `WORKER_RULES`, so every rule an alert can carry is listed)."""
    out: dict[str, str] = dict(WORKER_RULES) if classes is None else {}
    for cls in classes if classes is not None else ALL_DETECTORS:
        for rule in cls.rules:
            out[rule] = cls.__name__
    return out
