"""Progress heartbeats: stalls, open checkpoints, evaluations, hung ranks and zombies."""

from __future__ import annotations

from schemas.records import Event
from streams.detectors.base import Finding, Topology
from streams.detectors.progress import ProgressDetector
from tests.unit.streams.builders import (
    T0,
    checkpoint,
    collective,
    gpu_sample,
    rank_bound,
    step,
    training_job,
    validation,
)
from tests.unit.streams.stages import job_stage_input


def _run(
    events: list[Event], until_s: int, params: dict[str, object] | None = None
) -> tuple[ProgressDetector, list[Finding]]:
    """Feed events (summarised as the rank stage does), advancing the watermark second by second up
    to `until_s` after T0."""
    topo = Topology()
    det = ProgressDetector(topo, params)
    out: list[Finding] = []
    events = job_stage_input(events)
    i = 0
    for sec in range(until_s + 1):
        wm = T0 + sec * 1000
        while i < len(events) and events[i].record["ts"] <= wm:
            topo.observe(events[i])
            out += det.observe(events[i])
            i += 1
        out += det.advance(wm)
    return det, out


def _first(findings: list[Finding], rule: str, active: bool = True) -> Finding | None:
    return next((f for f in findings if f.rule == rule and f.active is active), None)


def test_a_stall_is_reported_after_the_floor_and_not_before() -> None:
    _, out = _run(training_job(seconds=100), until_s=159)
    assert _first(out, "job_stall") is None
    _, out = _run(training_job(seconds=100), until_s=161)
    stall = _first(out, "job_stall")
    assert stall is not None and stall.ts == T0 + 161_000 and stall.since == T0 + 100_000


def test_the_stall_threshold_follows_the_learned_step_interval() -> None:
    # 10 s steps: 10 x interval = 100 s > the 60 s floor.
    _, out = _run(training_job(seconds=200, step_s=10.0), until_s=290)
    assert _first(out, "job_stall") is None
    _, out = _run(training_job(seconds=200, step_s=10.0), until_s=302)
    assert _first(out, "job_stall") is not None


def test_no_stall_while_a_checkpoint_is_open_and_none_right_after_it_completes() -> None:
    events = [*training_job(seconds=100), checkpoint("job-1", T0 + 100500, "started")]
    events += [checkpoint("job-1", T0 + 400_000, "completed")]
    _, out = _run(events, until_s=440)
    assert _first(out, "job_stall") is None
    _, out = _run(events, until_s=470)
    assert _first(out, "job_stall") is not None


def test_a_learned_evaluation_pause_is_not_a_stall() -> None:
    # Evaluations every 50 steps: the first takes 50 s (under the floor), the second 90 s,
    # which the learned allowance (2 x 50 s) covers because step 100 is an evaluation step.
    events = list(training_job(seconds=50))
    events.append(validation("job-1", T0 + 100_000, 50, duration_s=50.0))
    for i in range(51, 101):
        ts = T0 + 100_000 + (i - 50) * 1000
        events += [step("job-1", r, i, ts) for r in range(4)]
    events.append(validation("job-1", T0 + 240_000, 100, duration_s=90.0))
    _, out = _run(events, until_s=245)
    assert _first(out, "job_stall") is None
    # The same pause after a step that is not an evaluation step is a stall.
    events = [e for e in events if not (e.type == "StepCompleted" and e.record["step"] > 90)]
    events = [e for e in events if e.type != "ValidationResult" or e.record["step"] != 100]
    _, out = _run(events, until_s=245)
    assert _first(out, "job_stall") is not None


def test_progress_resolves_the_stall() -> None:
    events = training_job(seconds=100) + [step("job-1", r, 101, T0 + 200_000) for r in range(4)]
    _, out = _run(events, until_s=210)
    assert _first(out, "job_stall") is not None
    cleared = _first(out, "job_stall", active=False)
    assert cleared is not None and cleared.ts == T0 + 200_000


def test_a_rank_behind_its_peers_is_named_as_hung() -> None:
    events = training_job(seconds=100)
    events += [step("job-1", r, 101, T0 + 101_000) for r in (0, 1, 3)]  # rank 2 never finishes step 101
    _, out = _run(events, until_s=170)
    hang = _first(out, "rank_hang")
    assert hang is not None and hang.rank == 2 and hang.key == ("job-1", "2") and hang.node == "node-01"


def test_the_rank_not_blocked_in_the_collective_is_named_as_hung() -> None:
    events = training_job(seconds=100)
    events += [collective("job-1", r, T0 + 120_000, 0.0 if r == 1 else 1.0) for r in range(4)]
    _, out = _run(events, until_s=170)
    hang = _first(out, "rank_hang")
    assert hang is not None and hang.rank == 1


def test_a_stall_where_every_rank_looks_alike_names_no_rank() -> None:
    _, out = _run(training_job(seconds=100), until_s=200)
    assert _first(out, "job_stall") is not None and _first(out, "rank_hang") is None


def test_peers_reporting_collective_timeouts_name_the_rank_that_did_not() -> None:
    events = training_job(seconds=100)
    for r in (0, 1, 3):
        events.append(
            Event(
                "RankFault",
                {
                    "ts": T0 + 150_000 + r,
                    "job_id": "job-1",
                    "run_id": "",
                    "rank": r,
                    "node": None,
                    "kind": "collective_timeout",
                    "detail": None,
                    "exit_code": None,
                },
            )
        )
    _, out = _run(events, until_s=155)
    hang = _first(out, "rank_hang")
    assert hang is not None and hang.rank == 2


def test_a_job_holding_its_gpus_without_progress_is_a_zombie_after_the_grace_period() -> None:
    events = training_job(seconds=100)
    events += [
        gpu_sample("node-01", i, T0 + s * 1000, pids=[1000 + i])
        for s in range(105, 800, 10)
        for i in range(4)
    ]
    _, out = _run(events, until_s=699, params={"zombie_grace_s": 600})
    assert _first(out, "zombie_job") is None
    _, out = _run(events, until_s=702, params={"zombie_grace_s": 600})
    zombie = _first(out, "zombie_job")
    assert zombie is not None and zombie.since == T0 + 100_000


def test_no_zombie_when_the_processes_are_gone() -> None:
    events = training_job(seconds=100)
    events += [
        gpu_sample("node-01", i, T0 + s * 1000, pids=[]) for s in range(105, 800, 10) for i in range(4)
    ]
    _, out = _run(events, until_s=790, params={"zombie_grace_s": 600})
    assert _first(out, "zombie_job") is None


def test_state_round_trips_and_continues_identically() -> None:
    events = [*training_job(seconds=100), rank_bound("job-1", 0, T0)]
    det, _ = _run(events, until_s=120)
    clone = ProgressDetector(det.topology)
    clone.from_bytes(det.to_bytes())
    assert clone.to_bytes() == det.to_bytes()
    assert clone.advance(T0 + 200_000) == det.advance(T0 + 200_000)
