"""Issue 20.1: a 1.25x straggler pages in seconds; jitter, warm-up, evaluations and checkpoints stay quiet.

A synthetic synchronous data-parallel run (16 ranks on 2 nodes, ~2 s steps): per-step work shared
by every rank (+-5 %), per-rank jitter (+-3 %) and persistent speed (+-3 %), noisy data wait,
ranks that wait in the collective for the slowest one, a warm-up in which ranks compile at
different speeds, an evaluation pause every 60 steps and, every 90 steps, a checkpoint that rank 0
writes inside its step while the others wait for it (a 2.5x step of one rank, once).
"""

from __future__ import annotations

import math
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.records import Event
from streams.detectors.base import Finding
from streams.detectors.stats import median
from streams.detectors.windows import _median_without
from tests.unit.streams.builders import T0, job_started, job_state, rank_bound, step
from tests.unit.streams.test_imbalance import _active, _run

RANKS = 16
FAULT_S = 300
SLOW_RANK = 5


def _run_events(
    seconds: int, slow: float | None, seed: int = 3, *, ddp: bool = False, slow_data: float = 0.0
) -> list[Event]:
    """The run; `ddp`: the all-reduce overlaps backward and no comm segment is timed, so every
    rank's backward timer runs until the slowest rank's gradients are reduced (DDP); `slow_data`:
    extra data wait of the slow rank from FAULT_S on."""
    rng = random.Random(seed)
    events = [job_started("job-1", T0, world_size=RANKS, nodes=2), job_state("job-1", T0, "running")]
    events += [rank_bound("job-1", r, T0, gpus_per_node=8) for r in range(RANKS)]
    speed = [math.exp(rng.gauss(0.0, 0.03)) for _ in range(RANKS)]
    compile_factor = [rng.uniform(1.0, 3.0) for _ in range(RANKS)]
    t, n = 5.0, 0
    while t < seconds:
        content = math.exp(rng.gauss(0.0, 0.05))
        busy = []
        for r in range(RANKS):
            compute = 1.6 * content * speed[r] * math.exp(rng.gauss(0.0, 0.03))
            if n < 5:
                compute *= compile_factor[r]
            if slow is not None and r == SLOW_RANK and t >= FAULT_S:
                compute *= slow
            if n % 90 == 89 and r == 0:
                compute += 3.0  # rank 0 writes the checkpoint inside its optimizer step
            wait = 0.05 * math.exp(rng.gauss(0.0, 0.25))
            if slow_data and r == SLOW_RANK and t >= FAULT_S:
                wait += slow_data
            busy.append((compute, wait))
        ready = max(c + w for c, w in busy)
        coll = 0.25 * math.exp(rng.gauss(0.0, 0.05))
        step_time = ready + coll
        # DDP: gradients leave as backward produces them; the last bucket's when the slowest rank's
        # backward ends (forward 1/3, backward 1/2 of compute), then a short exposed tail.
        grads = max(w + c * 5 / 6 for c, w in busy)
        for r, (compute, wait) in enumerate(busy):
            comm = ready - (compute + wait) + coll
            ts = T0 + round((t + step_time) * 1000) + rng.randint(0, 4)
            event = step("job-1", r, n, ts, step_time=step_time, data_wait=wait, compute=compute, comm=comm)
            if ddp:
                event.record["backward_s"] = grads + 0.3 * coll - (wait + compute / 3)
                event.record["comm_s"] = None
            events.append(event)
        t += step_time
        n += 1
        if n % 60 == 0:
            t += 20.0  # an evaluation: no training step for 20 s
    return sorted(events, key=lambda e: e.record["ts"])


def _stragglers(findings: list[Finding]) -> list[Finding]:
    return _active(findings, "straggler")


def test_a_1_25x_straggler_is_paged_within_30_s_and_only_it() -> None:
    _, findings, _ = _run(_run_events(600, 1.25))
    flagged = _stragglers(findings)
    assert flagged and {f.rank for f in flagged} == {SLOW_RANK}, [f.summary for f in flagged]
    first = flagged[0]
    assert first.ts - (T0 + FAULT_S * 1000) <= 30_000, (first.ts - T0) / 1000
    assert first.suspected_layer == "gpu" and first.history
    assert T0 + (FAULT_S - 10) * 1000 <= (first.since or 0) <= first.ts


def test_healthy_jitter_warm_up_evaluations_and_checkpoint_steps_stay_quiet() -> None:
    _, findings, _ = _run(_run_events(1200, None))
    assert [f.summary for f in findings if f.active] == []


def test_a_1_5x_straggler_is_paged_within_20_s() -> None:
    _, findings, _ = _run(_run_events(600, 1.5))
    flagged = _stragglers(findings)
    assert {f.rank for f in flagged} == {SLOW_RANK}
    assert flagged[0].ts - (T0 + FAULT_S * 1000) <= 20_000


def test_under_ddp_a_1_3x_straggler_is_paged_within_30_s_from_its_forward_pass() -> None:
    """Its peers' backward timers absorb the wait: busy times even out, its forward still differs."""
    _, findings, _ = _run(_run_events(600, 1.3, ddp=True))
    flagged = _stragglers(findings)
    assert flagged and {f.rank for f in flagged} == {SLOW_RANK}, [f.summary for f in flagged]
    assert flagged[0].ts - (T0 + FAULT_S * 1000) <= 30_000, (flagged[0].ts - T0) / 1000
    assert flagged[0].suspected_layer == "gpu"
    assert "inside backward" in flagged[0].summary


def test_under_ddp_a_slow_loader_is_a_data_straggler() -> None:
    _, findings, _ = _run(_run_events(600, None, ddp=True, slow_data=0.8))
    flagged = _stragglers(findings)
    assert flagged and {f.rank for f in flagged} == {SLOW_RANK}, [f.summary for f in flagged]
    assert flagged[0].suspected_layer == "data"


def test_under_ddp_jitter_warm_up_evaluations_and_checkpoint_steps_stay_quiet() -> None:
    _, findings, _ = _run(_run_events(1200, None, ddp=True))
    assert [f.summary for f in findings if f.active] == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=2, max_size=40).flatmap(
        lambda xs: st.tuples(st.just(xs), st.sets(st.integers(0, len(xs) - 1), max_size=len(xs) - 1))
    )
)
def test_the_median_of_the_other_nodes_ranks_is_the_plain_median_of_the_rest(
    case: tuple[list[int], set[int]],
) -> None:
    """The node test's reference (median of every rank but the node's, in O(log^2 n)) equals the plain median."""
    values, removed_at = case
    everyone = sorted(float(v) for v in values)
    removed = sorted(float(values[i]) for i in removed_at)
    rest = list(values)
    for i in sorted(removed_at, reverse=True):
        del rest[i]
    assert _median_without(everyone, removed) == median([float(v) for v in rest])


def test_summaries_carry_forward_and_backward_only_for_steps_that_time_no_collective() -> None:
    """The work-before-the-first-wait score reads them only there; its median, without the values."""
    from tests.unit.streams.stages import job_stage_input

    def summaries(ddp: bool) -> list[dict[str, Any]]:
        return [
            e.record
            for e in job_stage_input(_run_events(60, None, ddp=ddp))
            if e.type == "RankSummary" and e.record.get("rank") is not None and e.record.get("steps")
        ]

    timed, untimed = summaries(False), summaries(True)
    assert timed and all(r["forward_s"] is None and r["backward_s"] is None for r in timed)
    assert untimed and all(r["forward_s"] is not None and r["backward_s"] is not None for r in untimed)
    assert all(r["forward_s"]["values"] is None and r["forward_s"]["med"] > 0 for r in untimed)
