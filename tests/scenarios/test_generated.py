"""Issues 10.6 and 20.5: `evaluate` on generated cases (faults and their must-not-alert twins).

The target is the issues': recall 1.00 and precision >= 0.99 on cases the detectors were not
written against (faults drawn at random sizes, places and noise, each with a must-not-alert twin).
Cycles 1-3 of the generator's classes run here: every class three times, both GPU states of a
hang and both sides of the first evaluation. Cycle 0 is left to `ranksight evaluate --generated`
(README: 1,000 cases): its healthy 1,000-rank boundary pair costs more than a whole cycle of the
rest, and CI must stay under 30 minutes (the 128-rank boundary runs of cycles 1-3 stay here).
What the detectors miss today is an explicit, strict list (issue 20's classes, for the detector
work to close): a gap that closes fails this test until it is struck from the list, and a new one
fails it at once.
"""

from __future__ import annotations

import os

from producers.simulator.generator import GENERATED_FAULTS
from ranksight.evaluation import generated_cases
from streams.alerting.routing import load_router
from streams.config import load_config
from streams.offline.evaluate import evaluate_cases

CYCLE = 2 * len(GENERATED_FAULTS)  # cases per cycle of classes (a fault and its twin each)
FIRST, CASES = CYCLE, 4 * CYCLE  # cycles 1-3
SEED = 0

# (case, rule, what went wrong) on seed 0's cases FIRST..CASES, as `ranksight evaluate --generated`
# prints them.
KNOWN_GAPS: set[tuple[str, str, str]] = set()


def test_generated_cases_reach_full_recall_and_precision_but_for_the_known_gaps() -> None:
    """Every generated fault is detected for the right job, identity and team; twins stay quiet."""
    report = evaluate_cases(
        generated_cases(CASES, SEED)[FIRST:],
        load_config(None),
        load_router(),
        workers=min(2, os.cpu_count() or 1),
    )
    gaps = {
        (s.name, lab.alert, "missed")
        for s in report.scenarios
        for lab in s.labels
        if lab.alert is not None and not lab.detected
    }
    gaps |= {(s.name, a["rule"], "false positive") for s in report.scenarios for a in s.false_positives}
    assert sorted(gaps - KNOWN_GAPS) == [], "new gaps"
    assert sorted(KNOWN_GAPS - gaps) == [], "closed gaps: strike them from KNOWN_GAPS"
    rest = [s for s in report.scenarios if not any(g[0] == s.name for g in KNOWN_GAPS)]
    firing = sum(s.firing for s in rest)
    assert firing and sum(s.matched for s in rest) == firing
