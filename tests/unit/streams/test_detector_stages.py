"""Every detector class says where its rules run: `stage` "rank" (where a job's node's records are) or "job"."""

from __future__ import annotations

import pytest

from streams.detectors import ALL_DETECTORS

# The rules that run where a job's node's records are; every other rule runs on the job's records.
RANK_RULES = frozenset(
    {
        "repeated_data",
        "data_errors",
        "data_path_slow",
        "cache_hit_collapse",
        "file_open_drop",
        "loader_workers_lost",
        "rank_failed",
        "foreign_process",
        "xid_error",
        "ecc_uncorrectable",
        "gpu_throttling",
        "gpu_memory_pressure",
        "host_memory_pressure",
        "ib_port_degraded",
        "telemetry_missing",
        "gpu_outside_allocation",
        "gpu_idle_allocated",
        "clock_skew",
        "allocator_churn",  # every rank's own allocator counter, read where its steps are
        # The leader rank's steps are judged where they are read: a critical page at once.
        "nonfinite_loss",
        "nonfinite_grad",
    }
)


@pytest.mark.parametrize("cls", ALL_DETECTORS, ids=lambda c: c.__name__)
def test_a_detector_class_runs_all_its_rules_in_the_stage_it_names(cls: type) -> None:
    rules = set(cls.rules)  # type: ignore[attr-defined]
    expected = "rank" if rules <= RANK_RULES else "job"
    assert rules <= RANK_RULES or not rules & RANK_RULES, "a class's rules run in one stage"
    assert cls.stage == expected  # type: ignore[attr-defined]
