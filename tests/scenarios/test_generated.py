"""Issue 10.6: `evaluate` on a few hundred generated cases (faults and their must-not-alert twins).

The target is the issue's: recall 1.00 and precision >= 0.99 on cases the detectors were not
written against. Today's detectors miss whole classes the generator now expresses, listed in
the xfail reason; the detector work of issue 10 items 1-5 removes the xfail.
"""

from __future__ import annotations

import os

import pytest

from streams.config import load_config
from streams.evaluate import evaluate_generated
from streams.routing import load_router

CASES = 300
SEED = 0


@pytest.mark.xfail(
    strict=True,
    reason=(
        "detector gaps of issue 10: a node fault on a shared node reaches only one job's team "
        "(10.1: xid_error, ecc_uncorrectable, host_memory_pressure for the co-located job); no "
        "self-baseline rule (10.5: throughput_drop under contention); a node's slow storage is no "
        "straggler when it holds half the job (10.3: storage_slowdown); network_degradation does "
        "not name the node by InfiniBand errors (ib_degradation); a long evaluation raises job_stall "
        "(10.2: the job_stall twins)"
    ),
)
def test_generated_cases_reach_full_recall_and_precision() -> None:
    """Every generated fault is detected for the right job, identity and team; twins stay quiet."""
    report = evaluate_generated(
        CASES, SEED, load_config(None), load_router(), workers=min(2, os.cpu_count() or 1)
    )
    missed = [
        f"{s.name}: {lab.alert} for {lab.job_id} {lab.identity}" + (" (wrong team)" if lab.wrong_team else "")
        for s in report.scenarios
        for lab in s.labels
        if lab.alert is not None and not lab.detected
    ]
    unexplained = [
        f"{s.name}: {a['rule']} job={a['job_id']} rank={a['rank']} node={a['node']}"
        for s in report.scenarios
        for a in s.false_positives
    ]
    assert report.recall == 1.0, f"recall {report.recall:.3f}; missed: {missed}"
    assert report.precision >= 0.99, f"precision {report.precision:.3f}; unexplained: {unexplained}"
