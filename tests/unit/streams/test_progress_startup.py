"""Start-up: a run before its first step is never stalled; a start-up that never ends is `startup_hang`."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.importers import convert_nanogpt
from schemas.records import Event
from streams.detectors.base import Finding
from streams.offline.detection import DetectionEngine
from tests.unit.streams.builders import (
    T0,
    collective,
    gpu_sample,
    job_started,
    job_state,
    rank_bound,
    step,
    validation,
)
from tests.unit.streams.test_progress import _first, _run
from tests.unit.streams.test_real_data import real  # noqa: F401  (the fixture)


def _launch(job: str = "job-1", start: int = T0, world_size: int = 4, bound: int = 4) -> list[Event]:
    events = [job_started(job, start, world_size=world_size), job_state(job, start, "running")]
    return events + [rank_bound(job, r, start) for r in range(bound)]


def _steps(job: str, first_s: int, seconds: int, start: int = T0) -> list[Event]:
    return [step(job, r, i, start + (first_s + i) * 1000) for i in range(1, seconds + 1) for r in range(4)]


def test_a_long_compilation_before_the_first_step_is_no_stall() -> None:
    """74 s from launch to the first step (a torch.compile), an evaluation at step 0 before it: no
    alert (the job_stall rule once fired 'at step None' here)."""
    events = [*_launch(), validation("job-1", T0 + 1000, 0, duration_s=1.0), *_steps("job-1", 74, 60)]
    _, out = _run(events, until_s=140)
    assert [f.rule for f in out] == []


def test_a_start_up_that_never_ends_is_a_startup_hang_after_its_allowance() -> None:
    _, out = _run(_launch(), until_s=1199)
    assert _first(out, "startup_hang") is None and _first(out, "job_stall") is None
    _, out = _run(_launch(), until_s=1201)
    hang = _first(out, "startup_hang")
    assert hang is not None and hang.since == T0 and hang.expected == 1200.0
    assert "completed no step" in hang.summary and _first(out, "job_stall") is None


def test_the_start_up_allowance_is_learned_per_workload_family() -> None:
    """A family whose first run starts in ~100 s (the rank stage's 5 s bucket: 104 s) lets the next
    run take 3 x that before it is hung; another family keeps the 20 min default."""
    first = [*_launch("job-1"), *_steps("job-1", 99, 5)]
    second = [*_launch("job-2", start=T0 + 200_000)]
    other = [
        job_started("job-3", T0 + 200_000, workload_family="bert-finetune"),
        job_state("job-3", T0 + 200_000, "running"),
    ]
    det, out = _run([*first, *second, *other], until_s=200 + 313)
    assert det.families == {"llama-pretrain": [104_000]}
    hung = [f for f in out if f.rule == "startup_hang" and f.active]
    assert {f.job_id for f in hung} == {"job-2"}
    assert hung[0].expected == 312.0 and hung[0].ts == T0 + 513_000 and "learned" in hung[0].summary


@pytest.mark.parametrize(
    ("extra", "bound", "phase"),
    [
        ([], 2, "2 of 4 ranks bound"),
        (
            [collective("job-1", r, T0 + 1_000_000 + k * 5000, 0.95) for r in range(4) for k in range(3)],
            4,
            "NCCL",
        ),
        (
            [
                gpu_sample("node-01", r, T0 + 1_000_000 + k * 5000, util=0.0)
                for r in range(4)
                for k in range(3)
            ],
            4,
            "idle",
        ),
    ],
)
def test_a_startup_hang_names_its_phase(extra: list[Event], bound: int, phase: str) -> None:
    events = sorted([*_launch(bound=bound), *extra], key=lambda e: e.record["ts"])
    _, out = _run(events, until_s=1201)
    hang = _first(out, "startup_hang")
    assert hang is not None and phase in hang.summary, hang.summary if hang else out


def test_the_first_step_resolves_a_startup_hang_and_later_stalls_name_their_step() -> None:
    events = [*_launch(), *_steps("job-1", 1300, 20)]
    _, out = _run(events, until_s=1400)
    assert [(f.rule, f.active) for f in out if f.rule == "startup_hang"][-1] == ("startup_hang", False)
    stall: Finding | None = _first(out, "job_stall")
    assert stall is not None and "since step 20" in stall.summary


def test_real_modded_nanogpt_runs_raise_no_job_stall_before_their_first_step(real: Path) -> None:  # noqa: F811
    """The three real runs, replayed through the importer: no alert at all (two of them once paged
    job_stall 'at step None' during their 70-80 s compilation)."""
    for path in sorted((real / "modded-nanogpt").glob("*.txt")):
        events = sorted(convert_nanogpt(path), key=lambda e: e.record["ts"])
        alerts = [e.record for e in DetectionEngine().run(events) if e.type == "Alert"]
        assert [(a["rule"], a["summary"]) for a in alerts] == [], path.name
